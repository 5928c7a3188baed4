"""The gradient-flow view in a real TensorBoard and Chromium.

Two logdirs' worth of runs in one TensorBoard:
* 176 layers (ResNet50's count with every layer chosen) written by
  `synthetic.write_large_run`; with GRADVIZ_FLOW_RESNET50=1, a real
  keras.applications.ResNet50 at 32 px fitted for one step with every layer
  chosen instead (~85 s here on a busy machine, too slow for every run);
* the demo's two plain CNNs (`demos.train_plain_cnn`): 20 convolutions with
  sigmoid activations, whose gradient vanishes toward the input, and the
  same network with BatchNorm and ReLU.

What the chart draws is read back from its SVG (each point carries the layer,
role, statistic and value it stands for, each panel its axis) and compared
with what /step serves; the flag badges of the chart and of the layer grid
with the flags /step raises. Screenshots go to the test's tmp folder (and to
TB_GRADVIZ_ARTIFACTS when set).
"""

import math
import os
import time

import pytest
import synthetic
from browser import (  # noqa: F401 (fixture)
    FLOW,
    GRID,
    PANELS,
    browser,
    gradviz_page,
    keep_screenshot,
    read_drawn,
    runs_loaded,
    show_section,
    tab,
    wait_drawn,
)
from tbserver import get_json, running_tensorboard

pytestmark = [pytest.mark.browser, pytest.mark.slow]

BIG_LAYERS = 176
BIG_STEPS = 3
REAL_RESNET50 = os.environ.get("GRADVIZ_FLOW_RESNET50") == "1"
BIG_RUN = "resnet50" if REAL_RESNET50 else "layers176"
SIGMOID_RUN, RELU_RUN = "plain_sigmoid", "plain_relu_bn"
PROBE_BATCH = 8
STEPS = [8, 16, 24]  # the demo's plain CNNs: 24 steps, logged every 8
# Going back to a step the page holds redraws the layer view, the flow and the
# grid of 176 layers: ~1.5 s here on a busy machine, the flow ~0.1 s of it.
INTERACTION_BOUND_S = 5.0
# The first visit to an earlier step waits for the server to read every series
# of the run once (docs/API.md, "Scale"): ~3 s here on a busy machine.
FIRST_VISIT_BOUND_S = 20.0
# cy is written to a tenth of a pixel.
Y_TOLERANCE = 0.06
# The role of the update-ratio panel's points (weights=True).
UPDATE_PANEL = "update"

# ---------------------------------------------------------------- logs


def _fit(model, log_dir, x, y, batch_size, every, loss):
    import keras

    import tb_gradviz

    model.compile(keras.optimizers.SGD(0.01), loss)
    callback = tb_gradviz.GradVizCallback(
        log_dir,
        probe_data=(x[:PROBE_BATCH], y[:PROBE_BATCH]),
        layers=lambda layer: True,
        every_n_batches=every,
    )
    model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, callbacks=[callback])


def _train_resnet50(log_dir):
    """ResNet50 nested in a Sequential, as the demo builds it, one step at 32 px; returns its last step."""
    import keras

    from tb_gradviz import demos

    keras.utils.set_random_seed(0)
    x, y = demos.pattern_images(PROBE_BATCH, 32)
    resnet = keras.applications.ResNet50(
        weights=None, input_shape=(32, 32, 3), classes=len(demos.PATTERNS)
    )
    model = keras.Sequential([keras.Input((32, 32, 3)), resnet])
    _fit(model, log_dir, x, y, PROBE_BATCH, 1, keras.losses.SparseCategoricalCrossentropy())
    return 1


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    root = tmp_path_factory.mktemp("flow")
    logdir = root / "logs"
    if REAL_RESNET50:
        big_steps = _train_resnet50(logdir / BIG_RUN)
    else:
        synthetic.write_large_run(logdir / BIG_RUN, layers=BIG_LAYERS, steps=BIG_STEPS)
        big_steps = BIG_STEPS
    from tb_gradviz import demos

    # The demo's own two runs (tb-gradviz demo writes them the same way).
    demos.train_plain_cnn(logdir / SIGMOID_RUN, "sigmoid", verbose=0)
    demos.train_plain_cnn(logdir / RELU_RUN, "relu_bn", verbose=0)
    ready = runs_loaded({BIG_RUN: big_steps, SIGMOID_RUN: STEPS[-1], RELU_RUN: STEPS[-1]})
    with running_tensorboard(logdir, root / "tensorboard.log", ready) as url:
        yield url, root, big_steps


@pytest.fixture
def page(browser, tensorboard):  # noqa: F811
    url = tensorboard[0]
    # The gradient flow and the grid are the "Across layers" section.
    with gradviz_page(browser, url, fragment="gradviz&view=layers") as page:
        yield page


# ---------------------------------------------------------------- reading the chart

# Everything the chart draws that stands for a number, read in one evaluation.
_READ_CHART = """chart => {
  const number = (value) => (value === undefined ? null : Number(value));
  const pin = (node) => [...node.classList].find((name) => name.startsWith('pin-'));
  return {
    panels: [...chart.querySelectorAll('.flow-panel')].map(({dataset: d}) => ({
      role: d.role, top: number(d.top), bottom: number(d.bottom), zeroY: number(d.zeroY),
      zerosTop: number(d.zerosTop), zerosBottom: number(d.zerosBottom),
      low: number(d.logLow), high: number(d.logHigh)})),
    points: [...chart.querySelectorAll('.flow-point')].map((c) => ({
      layer: c.dataset.layer, run: c.dataset.run, step: Number(c.dataset.step), role: c.dataset.role,
      stat: c.dataset.stat, value: Number(c.dataset.value), pin: pin(c),
      cx: Number(c.getAttribute('cx')), cy: Number(c.getAttribute('cy'))})),
    badges: [...chart.querySelectorAll('.flag-badge')].map((b) => ({
      layer: b.dataset.layer, flag: b.dataset.flag, run: b.dataset.run, title: b.querySelector('title').textContent})),
    hits: [...chart.querySelectorAll('.flow-hit')].map((h) => h.dataset.layer),
    labels: [...chart.querySelectorAll('.layer-label')].map((t) => ({
      layer: t.dataset.layer, x: Number(t.getAttribute('x'))})),
    width: chart.getBoundingClientRect().width,
  };
}"""


def _read_chart(frame, **state):
    """What the chart draws, once the flow says it has drawn `state` (run=, step=, against=, ...)."""
    return read_drawn(
        frame, FLOW, f"view => ({_READ_CHART})(view.querySelector('.flow-chart'))", **state
    )


def _step(url, run, step=None):
    query = f"run={run}" + ("" if step is None else f"&step={step}")
    return get_json(f"{url}/data/plugin/gradviz/step?{query}")


def _finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value)


def _check_points(chart, snapshot, run, pin="pin-0"):
    """The points of a run's line are /step's flow values, at the heights its panel's axis gives them.

    Each role with a panel is drawn (the weights' own values have none); a
    panel of role "update" holds each layer's `update_ratio` (weights=True).
    """
    panels = {panel["role"]: panel for panel in chart["panels"]}
    # The share that flushes to zero is checked in test_flush_browser.py.
    points = [
        p for p in chart["points"] if p["run"] == run and p["pin"] == pin and p["stat"] != "flush"
    ]
    assert {p["step"] for p in points} == {snapshot["step"]}
    expected = {
        (layer["layer"], role, stat): value
        for layer in snapshot["layers"]
        for role, flow in layer["flow"].items()
        if role in panels
        for stat, value in flow.items()
        if _finite(value)
    }
    if UPDATE_PANEL in panels:
        expected.update(
            {
                (layer["layer"], UPDATE_PANEL, "update_ratio"): layer["update_ratio"]
                for layer in snapshot["layers"]
                if _finite(layer.get("update_ratio"))
            }
        )
    assert {(p["layer"], p["role"], p["stat"]): p["value"] for p in points} == expected
    for p in points:
        panel, value = panels[p["role"]], p["value"]
        if p["stat"] == "zero_fraction":
            want = panel["zerosBottom"] - value * (panel["zerosBottom"] - panel["zerosTop"])
        elif value == 0:
            want = panel["zeroY"]
        else:
            share = (math.log10(value) - panel["low"]) / (panel["high"] - panel["low"])
            assert 0 <= share <= 1, p
            want = panel["bottom"] - share * (panel["bottom"] - panel["top"])
        assert abs(p["cy"] - want) <= Y_TOLERANCE, (p, want)
    # One column per layer, in model order.
    columns = {}
    for p in points:
        columns.setdefault(p["layer"], set()).add(p["cx"])
    assert all(len(xs) == 1 for xs in columns.values()), columns
    xs = [
        columns[layer["layer"]].pop() for layer in snapshot["layers"] if layer["layer"] in columns
    ]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)
    return points


def _check_badges(chart, snapshot, run):
    """A badge for exactly each flag /step raises, whose hover text holds the flag's rule and detail."""
    rules = snapshot["health"]["rules"]
    expected = {
        (layer["layer"], flag["flag"]): flag["detail"]
        for layer in snapshot["layers"]
        for flag in layer["flags"]
    }
    badges = [b for b in chart["badges"] if b["run"] == run]
    assert {(b["layer"], b["flag"]) for b in badges} == set(expected)
    assert len(badges) == len(expected)
    for badge in badges:
        assert (
            rules[badge["flag"]] in badge["title"]
            and expected[(badge["layer"], badge["flag"])] in badge["title"]
        )
    return expected


def _check_grid_badges(frame, snapshot):
    rows = frame.locator("table.layer-grid tbody tr").evaluate_all("""rows => rows.map((row) => ({
      layer: row.querySelector('th').textContent,
      flags: [...row.querySelectorAll('.flag-badge')].map((b) => [b.dataset.flag, b.title])}))""")
    rules = snapshot["health"]["rules"]
    assert [row["layer"] for row in rows] == [layer["layer"] for layer in snapshot["layers"]]
    for row, layer in zip(rows, snapshot["layers"]):
        assert [flag for flag, _ in row["flags"]] == [flag["flag"] for flag in layer["flags"]]
        for (flag, title), served in zip(row["flags"], layer["flags"]):
            assert title.endswith(f"{rules[flag]}\n{served['detail']}"), title


def test_no_stray_null_under_the_gradient_flow_of_a_run_without_weights(page, tensorboard):
    """A run logged without weights has no update-ratio note under its chart: nothing, no "null"."""
    frame = tab(page)
    frame.get_by_label("Run", exact=True).select_option(BIG_RUN)
    assert _flow_children(frame, BIG_RUN) == ["UL", "DIV"]
    assert "null" not in frame.locator(".flow-section").inner_text()
    # The demo's plain CNNs log their weights: the note is there.
    frame.get_by_label("Run", exact=True).select_option(RELU_RUN)
    assert _flow_children(frame, RELU_RUN) == ["UL", "DIV", "P"]


def _flow_children(frame, run):
    """What the flow's box holds once it draws `run`: tag names, and any text as `text:…`."""
    return read_drawn(
        frame,
        FLOW,
        """box => [...box.childNodes].map((node) =>
          node.nodeType === Node.ELEMENT_NODE ? node.tagName : `text:${node.textContent}`)""",
        run=run,
    )


def _timed(action, done):
    start = time.perf_counter()
    action()
    done()
    return time.perf_counter() - start


# ---------------------------------------------------------------- tests


def test_gradient_flow_of_176_layers(page, tensorboard):
    url, root, last = tensorboard
    frame = tab(page)
    frame.get_by_label("Run", exact=True).select_option(BIG_RUN)
    snapshot = _step(url, BIG_RUN)
    assert len(snapshot["layers"]) >= BIG_LAYERS
    wait_drawn(frame, GRID, run=BIG_RUN, step=last)
    chart = _read_chart(frame, run=BIG_RUN, step=last)
    assert chart["hits"] == [layer["layer"] for layer in snapshot["layers"]]
    points = _check_points(chart, snapshot, BIG_RUN)
    assert len(points) >= 9 * BIG_LAYERS - 2 * 9  # every role and statistic of (nearly) every layer
    _check_badges(chart, snapshot, BIG_RUN)
    _check_grid_badges(frame, snapshot)
    # Names are thinned to readable spacing, and fill the axis: 1 px per SVG unit at the frame's width.
    xs = sorted(label["x"] for label in chart["labels"])
    assert BIG_LAYERS // 4 < len(xs) < BIG_LAYERS
    assert min(b - a for a, b in zip(xs, xs[1:])) >= 12
    assert 1400 < chart["width"] <= 1600
    keep_screenshot(frame.locator(".flow-section"), root / f"gradient_flow_{BIG_RUN}.png")

    if last > 1:
        slider = frame.get_by_label("Step", exact=True)
        slider.focus()
        first_visit = _timed(
            lambda: slider.press("Home"), lambda: wait_drawn(frame, FLOW, run=BIG_RUN, step=1)
        )
        _check_points(_read_chart(frame, run=BIG_RUN, step=1), _step(url, BIG_RUN, 1), BIG_RUN)
        cached = _timed(
            lambda: slider.press("End"), lambda: wait_drawn(frame, FLOW, run=BIG_RUN, step=last)
        )
        print(
            f"\nflow of {BIG_RUN}: first visit to step 1 {first_visit:.2f} s, back to step {last} {cached:.2f} s"
        )
        assert first_visit < FIRST_VISIT_BOUND_S
        assert cached < INTERACTION_BOUND_S

    # Narrower, the chart is drawn again at its new width.
    page.set_viewport_size({"width": 1100, "height": 1000})
    page.wait_for_function("""() => {
      const frame = document.querySelector('iframe[src*="plugin_entry.html?name=gradviz"]').contentDocument;
      return frame.querySelector('.flow-chart').getBoundingClientRect().width < 1100;
    }""")

    # A click on a layer's column opens it in "The layer"; back in "Across layers", it is the current one.
    name = snapshot["layers"][BIG_LAYERS // 2]["layer"]
    frame.locator(f'.flow-hit[data-layer="{name}"]').click()
    wait_drawn(frame, PANELS, run=BIG_RUN, layer=name)
    assert frame.get_by_label("Layer", exact=True).input_value() == name
    show_section(frame, "layers")
    flow = wait_drawn(frame, FLOW, run=BIG_RUN, layer=name)
    assert flow.locator(".flow-hit.current").evaluate_all(
        "hits => hits.map((h) => h.dataset.layer)"
    ) == [name]


def test_gradient_flow_of_a_vanishing_plain_cnn(page, tensorboard):
    url, root, _ = tensorboard
    frame = tab(page)
    frame.get_by_label("Run", exact=True).select_option(SIGMOID_RUN)
    wait_drawn(frame, GRID, run=SIGMOID_RUN, step=STEPS[-1])
    snapshot = _step(url, SIGMOID_RUN)
    from tb_gradviz import demos

    assert (
        len(snapshot["layers"]) == demos.PLAIN_DEPTH + 3
    )  # the input's rescaling, the convolutions, pool, head
    chart = _read_chart(frame, run=SIGMOID_RUN, step=STEPS[-1], against=None)
    _check_points(chart, snapshot, SIGMOID_RUN)
    flags = _check_badges(chart, snapshot, SIGMOID_RUN)
    _check_grid_badges(frame, snapshot)
    # The problem is there to see: the first convolutions are flagged, and their
    # output gradient is drawn orders of magnitude below the head's.
    assert ("conv01", "vanishing") in flags
    rms = {
        p["layer"]: p
        for p in chart["points"]
        if p["role"] == "output_gradient" and p["stat"] == "rms"
    }
    assert (
        rms["conv01"]["value"] * 1e3 < rms["logits"]["value"]
        and rms["conv01"]["cy"] > rms["logits"]["cy"] + 50
    )
    summary = frame.locator(".flow-summary").text_content()
    assert f"{SIGMOID_RUN} at step {STEPS[-1]}: " in summary and "vanishing" in summary

    # The same network with BatchNorm and ReLU, overlaid: shared layers share a column.
    frame.get_by_label("Overlay run", exact=True).select_option(RELU_RUN)
    chart = _read_chart(frame, run=SIGMOID_RUN, step=STEPS[-1], against=RELU_RUN)
    other = _step(url, RELU_RUN)
    _check_points(chart, snapshot, SIGMOID_RUN)
    _check_points(chart, other, RELU_RUN)
    _check_badges(chart, snapshot, SIGMOID_RUN)
    _check_badges(chart, other, RELU_RUN)
    assert len(chart["hits"]) == len(
        other["layers"]
    )  # its layers hold every one of the plain CNN's
    column = {(p["run"], p["layer"]): p["cx"] for p in chart["points"]}
    assert column[(SIGMOID_RUN, "conv05")] == column[(RELU_RUN, "conv05")]
    assert column[(RELU_RUN, "bn05")] > column[(SIGMOID_RUN, "conv05")]
    # The plain CNN's line steps over the columns of BatchNorm and ReLU: one path per role and statistic
    # (RMS, max |value| and zeros per role panel, and a gradient's share that flushes to zero; the
    # update ratio on its panel, when logged).
    paths = sum(
        1 if panel["role"] == UPDATE_PANEL else 4 if panel["role"].endswith("gradient") else 3
        for panel in chart["panels"]
    )
    assert paths >= 9 and frame.locator("path.flow-line.series-0.pin-0").count() == paths
    keep_screenshot(frame.locator(".flow-section"), root / "gradient_flow_overlay.png")

    # Keep the last step, go back to the first: one line per step and run.
    frame.get_by_role("button", name=f"Keep step {STEPS[-1]}").click()
    slider = frame.get_by_label("Step", exact=True)
    slider.focus()
    slider.press("Home")
    chart = _read_chart(frame, run=SIGMOID_RUN, step=STEPS[0], against=RELU_RUN, kept=[STEPS[-1]])
    _check_points(chart, _step(url, SIGMOID_RUN, STEPS[0]), SIGMOID_RUN)
    _check_points(chart, _step(url, RELU_RUN, STEPS[0]), RELU_RUN)
    assert frame.locator(".flow-legend li:not(.stat-key)").all_text_contents() == [
        f"{SIGMOID_RUN}, step {STEPS[0]}",
        f"{SIGMOID_RUN}, step {STEPS[-1]} (kept)",
        f"{RELU_RUN}, step {STEPS[0]}",
        f"{RELU_RUN}, step {STEPS[-1]} (kept)",
    ]
    assert frame.locator(f".kept-steps li[data-step='{STEPS[-1]}']").count() == 1
    kept = frame.locator("path.flow-line.pin-1.series-0.stat-rms")
    assert (
        kept.count() >= 3
        and f"{SIGMOID_RUN}, step {STEPS[-1]}" in kept.first.locator("title").text_content()
    )
    keep_screenshot(frame.locator(".flow-section"), root / "gradient_flow_plain_cnn.png")

    # A click on a layer opens it in "The layer", and TensorBoard's dark mode reaches the chart.
    frame.locator('.flow-hit[data-layer="conv03"]').click()
    wait_drawn(frame, PANELS, run=SIGMOID_RUN, layer="conv03")
    show_section(frame, "layers")
    flow = wait_drawn(frame, FLOW, run=SIGMOID_RUN, layer="conv03")
    assert flow.locator('.flow-hit.current[data-layer="conv03"]').count() == 1
    page.get_by_role("button", name="Menu for changing light or dark theme").click()
    page.get_by_role("menuitem", name="Dark").click()
    frame.locator("html.dark-mode").wait_for(state="attached")
    page.get_by_role("menu").wait_for(state="detached")
    frame.locator(".flow-section").scroll_into_view_if_needed()
    stroke = frame.locator(".flow-line.series-0").first.evaluate(
        "line => getComputedStyle(line).stroke"
    )
    assert stroke == "rgb(255, 183, 77)"  # --series-0's dark value
    keep_screenshot(frame.locator(".flow-section"), root / "gradient_flow_plain_cnn_dark.png")
