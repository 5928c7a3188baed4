"""The gradient flow's share that flushes to zero, in Chromium against /step's precision records.

Three runs: the demo's mixed_float16 CNN with the loss scale fixed at 1
(its gradients are float16, most of their values subnormal: "flushes in
float16"), a float32 Dense network fitted on tiny targets (gradients partly
below float16's normal range: "would flush in float16"), and a synthetic
run written without precision records, which shows no share at all.
"""

import math
import re
import urllib.error
import urllib.parse

import eventdata
import numpy as np
import pytest
import synthetic
from browser import (  # noqa: F401 (fixture)
    FLOW,
    GRID,
    TIMELINE,
    HeldRequests,
    browser,
    expect,
    gradviz_page,
    keep_screenshot,
    read_drawn,
    runs_loaded,
    show_section,
    tab,
    wait_drawn,
    wait_time_view,
)
from tbserver import get_json, running_tensorboard

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MIXED, FLOAT32, OLD = "mixed_unscaled", "float32_tiny", "old"
GRADIENT_ROLES = ("output_gradient", "input_gradient", "weight_gradient")


def _fit_float32(log_dir):
    import keras

    import tb_gradviz

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 16)).astype("float32")
    y = (1e-4 * rng.normal(size=(32, 4))).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(16, activation="tanh", name="hidden"),
            keras.layers.Dense(4, name="head"),
        ]
    )
    model.compile("sgd", "mse")
    callback = tb_gradviz.GradVizCallback(log_dir, (x[:8], y[:8]), layers=lambda layer: True)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    pytest.importorskip("keras")
    from tb_gradviz import demos

    root = tmp_path_factory.mktemp("flush")
    logdir = root / "logs"
    demos.train_mixed_cnn(logdir / MIXED, 1.0, steps=5, log_every=5, verbose=0)
    _fit_float32(logdir / FLOAT32)
    synthetic.write_run(logdir / OLD, layers=2, steps=2)
    ready = runs_loaded({run: eventdata.last_step(logdir / run) for run in (MIXED, FLOAT32, OLD)})
    with running_tensorboard(logdir, root / "tensorboard.log", ready) as url:
        yield url, root


def expected_shares(snapshot):
    """`{(layer, role): (share, format, flushed, total)}` from /step's precision records, as the
    server's headroom.shares defines underflow (to zero or subnormal), the role's tensors pooled."""
    shares = {}
    for layer in snapshot["layers"]:
        dtype = layer["layer_dtype"]
        name = dtype if dtype in ("float16", "bfloat16") else "float16"
        for role in GRADIENT_ROLES:
            tensors = [t for t in layer["tensors"].values() if t["role"] == role]
            if not tensors or any(t["precision"] is None for t in tensors):
                continue
            flushed = sum(
                t["precision"]["formats"][name]["as_is"][count]
                for t in tensors
                for count in ("to_zero", "subnormal")
            )
            total = sum(t["precision"]["finite_nonzero"] for t in tensors)
            shares[(layer["layer"], role)] = (flushed / total, name, flushed, total)
    return shares


_READ_FLUSH = """chart => ({  // the flow's container: its chart, strips, hovers and badges
  points: [...chart.querySelectorAll('.flow-point.stat-flush.pin-0')].map(({dataset: d}) => ({
    layer: d.layer, run: d.run, role: d.role, value: Number(d.value), format: d.format,
    flushed: Number(d.flushed), total: Number(d.total)})),
  strips: Object.fromEntries([...chart.querySelectorAll('.flow-panel')].map((panel) => [
    panel.dataset.role, panel.querySelector('.strip-title')?.textContent ?? null])),
  hovers: Object.fromEntries([...chart.querySelectorAll('.flow-hit')].map((hit) => [
    hit.dataset.layer, hit.querySelector('title').textContent])),
  badges: [...chart.querySelectorAll('.flag-badge')].map(({dataset: d}) => [d.run, d.layer, d.flag]),
})"""


def _show(frame, url, run):
    """Selects `run` and reads the flush shares its chart draws, with /step's answer."""
    frame.get_by_label("Run", exact=True).select_option(run)
    snapshot = get_json(f"{url}/data/plugin/gradviz/step?{urllib.parse.urlencode({'run': run})}")
    wait_drawn(frame, GRID, run=run, step=snapshot["step"])
    expect(
        frame.locator("h2", has_text=f"All layers of {run} at step {snapshot['step']}")
    ).to_be_visible()
    return read_drawn(frame, FLOW, _READ_FLUSH, run=run, step=snapshot["step"]), snapshot


def _check(chart, snapshot, run, label):
    expected = expected_shares(snapshot)
    assert expected, "the run has precision records"
    drawn = {
        (p["layer"], p["role"]): (p["value"], p["format"], p["flushed"], p["total"])
        for p in chart["points"]
        if p["run"] == run
    }
    assert drawn == {key: value for key, value in expected.items() if math.isfinite(value[0])}
    for role in GRADIENT_ROLES:
        if role in chart["strips"]:
            assert chart["strips"][role] == f"exact zeros · dotted: share that {label}"
    for (layer, role), (share, _, flushed, total) in expected.items():
        wording = f"{100 * share:.2f} % {label} ({flushed} of {total})"
        assert wording in chart["hovers"][layer], (layer, role, chart["hovers"][layer])
    return expected


def test_flush_share_of_each_gradient_is_the_served_precision_record(browser, tensorboard):  # noqa: F811
    url, root = tensorboard
    with gradviz_page(browser, url) as page:
        frame = tab(page)
        show_section(frame, "layers")
        chart, snapshot = _show(frame, url, MIXED)
        shares = _check(chart, snapshot, MIXED, "flushes in float16")
        # Unscaled float16 gradients: a large share of every layer's flushes.
        assert {name for _, name, _, _ in shares.values()} == {"float16"}
        assert max(share for share, _, _, _ in shares.values()) > 0.5
        # A badge for each flag /step raises, the underflow flag of its gradients among them.
        raised = {
            (MIXED, layer["layer"], f["flag"])
            for layer in snapshot["layers"]
            for f in layer["flags"]
        }
        assert {tuple(badge) for badge in chart["badges"]} == raised
        assert {flag for _, _, flag in raised} >= {"underflow"}
        keep_screenshot(frame.locator(".flow-section"), root / "flush_share.png")

        chart, snapshot = _show(frame, url, FLOAT32)
        shares = _check(chart, snapshot, FLOAT32, "would flush in float16")
        assert any(share > 0 for share, _, _, _ in shares.values())

        # No precision record: no share drawn, and the strips say only what they show.
        chart, snapshot = _show(frame, url, OLD)
        assert expected_shares(snapshot) == {}
        assert [p for p in chart["points"] if p["run"] == OLD] == []
        assert {title for role, title in chart["strips"].items()} == {"exact zeros"}
        assert not any("flush" in hover for hover in chart["hovers"].values())


def test_the_depth_by_time_view_colours_by_the_share_that_flushes(browser, tensorboard):  # noqa: F811
    url, _ = tensorboard
    query = urllib.parse.urlencode({"run": MIXED, "field": "flush_share"})
    body = get_json(f"{url}/data/plugin/gradviz/timeline?{query}")
    snapshot = get_json(f"{url}/data/plugin/gradviz/step?{urllib.parse.urlencode({'run': MIXED})}")
    from_records = expected_shares(snapshot)
    with gradviz_page(browser, url) as page:
        frame = tab(page)
        frame.get_by_label("Run", exact=True).select_option(MIXED)
        show_section(frame, "timeline")
        frame.locator('select[name="timeline-field"]').select_option("flush_share/output_gradient")
        view = wait_time_view(frame, MIXED, colour="flush_share/output_gradient")
        rows = len(body["layers"])
        canvas = view.locator("canvas.timeline-canvas")
        assert canvas.get_attribute("aria-label").startswith(
            f"share that flushes to zero of {rows} layers"
        )
        box = canvas.bounding_box()
        tip = frame.locator(".timeline-tip")
        for r, layer in enumerate(body["layers"]):
            assert layer["format"] == "float16"  # the layers compute in float16
            share = layer["flush_share"]["max"][-1]
            # The digest's share is the full precision records' at the same step.
            assert share == pytest.approx(from_records[(layer["layer"], "output_gradient")][0])
            canvas.hover(position={"x": box["width"] - 2, "y": (r + 0.5) * box["height"] / rows})
            pattern = (
                rf"^{layer['layer']}, step 5: flush_share in float16 ([0-9.e+-]+)(; flags: .*)?$"
            )
            expect(tip).to_have_text(re.compile(pattern))
            shown = float(re.match(pattern, tip.inner_text())[1])
            assert shown == pytest.approx(share, rel=5e-3), (layer["layer"], shown, share)


def test_a_new_run_asks_for_no_step_of_the_previous_run(browser, tensorboard):  # noqa: F811
    """The gradient flow of a new run whose series are still on their way: overlaying a run then
    asks /step for nothing at the previous run's step. The float32 run's last step (4) comes
    before the mixed run's first (5), so such a request was answered 404."""
    url, _ = tensorboard
    last = get_json(f"{url}/data/plugin/gradviz/step?run={FLOAT32}")["step"]
    first = get_json(f"{url}/data/plugin/gradviz/step?run={MIXED}")["step"]
    with pytest.raises(urllib.error.HTTPError, match="404"):
        get_json(f"{url}/data/plugin/gradviz/step?run={MIXED}&step={last}")
    asked = []
    with gradviz_page(browser, url, fragment=f"gradviz&run={FLOAT32}&view=layers") as page:
        page.on(
            "request",
            lambda request: (
                "/step?" in request.url
                and asked.append(
                    dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(request.url).query))
                )
            ),
        )
        frame = tab(page)
        wait_drawn(frame, FLOW, run=FLOAT32, step=last)
        held = HeldRequests(
            page, lambda address: "/series?" in address and f"run={MIXED}&" in address
        )
        frame.get_by_label("Run", exact=True).select_option(MIXED)
        held.wait()
        frame.get_by_label("Overlay run", exact=True).select_option(OLD)
        held.release()
        wait_drawn(frame, FLOW, run=MIXED, step=first, against=OLD)
    assert {"run": MIXED, "step": str(last)} not in asked, asked
