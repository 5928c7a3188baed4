"""The tab's sections, its URL and the onset table, in a real TensorBoard and Chromium.

Runs with a fault at a known step (`test_onset.faulty_run`: a NaN enters the
`scale` layer's output at step FAULT_STEP) and a healthy one. Every view is read
once it says it has drawn the state asked for (`browser.wait_drawn`), and every
other wait is for a state (`expect`, `wait_for_url`), never a sleep.
"""

import re

import pytest
from browser import (  # noqa: F401 (fixture)
    COMPARE,
    GRID,
    ONSET,
    PANELS,
    SECTIONS,
    TIMELINE,
    artifacts_dir,
    browser,
    expect,
    gradviz_page,
    runs_loaded,
    tab,
    wait_drawn,
)
from tbserver import get_json, running_tensorboard
from test_e2e_browser import _write_run_with_layer_name

pytestmark = [pytest.mark.browser, pytest.mark.slow]

keras = pytest.importorskip("keras")

from test_onset import FAULT_STEP, STEPS, faulty_run  # noqa: E402 (needs keras)


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    root = tmp_path_factory.mktemp("sections")
    logdir = root / "logs"
    faulty_run(logdir / "nan", float("nan"), ["scale", "d2", "logits"])
    # The factor stays 1: nothing goes wrong.
    faulty_run(logdir / "healthy", 1.0, ["scale", "d2", "logits"])
    with running_tensorboard(
        logdir, root / "tensorboard.log", runs_loaded({"nan": STEPS, "healthy": STEPS})
    ) as url:
        yield url


def _open(browser, url, fragment):  # noqa: F811
    return gradviz_page(browser, url, 1400, 1000, fragment=fragment)


def _fetched(frame):
    """The paths the tab's frame requested so far (its resource timing entries, from the start)."""
    return frame.locator("body").evaluate(
        "() => performance.getEntriesByType('resource').map((e) => new URL(e.name).pathname)"
    )


def _selected(frame, view):
    expect(frame.get_by_role("tab", name=SECTIONS[view])).to_have_attribute("aria-selected", "true")
    expect(frame.get_by_role("tabpanel")).to_have_attribute("data-view", view)


def test_a_url_with_view_timeline_opens_over_time_and_the_onset_of_the_nan(browser, tensorboard):  # noqa: F811
    url = tensorboard
    served = get_json(f"{url}/data/plugin/gradviz/onset?run=nan")
    nonfinite = next(o for o in served["onsets"] if o["flag"] == "nonfinite")
    assert (nonfinite["step"], nonfinite["layer"], nonfinite["tensor"]) == (
        FAULT_STEP,
        "scale",
        "activation",
    )
    with _open(browser, url, "gradviz&run=nan&view=timeline") as page:
        frame = tab(page)
        _selected(frame, "timeline")
        wait_drawn(frame, TIMELINE, run="nan")
        wait_drawn(frame, ONSET, run="nan")
        # The onset table: one row per raised flag, in /onset's order, the NaN's where it was put.
        rows = frame.locator("table.onset-table tbody tr")
        assert rows.count() == len(served["onsets"])
        assert rows.evaluate_all("rows => rows.map((row) => row.dataset.flag)") == [
            o["flag"] for o in served["onsets"]
        ]
        row = frame.locator('table.onset-table tr[data-flag="nonfinite"]')
        assert row.locator("th, td").all_text_contents() == [
            "NaN / Inf",
            "flag",
            str(FAULT_STEP),
            "scale",
            "activation",
            f"yes, through step {STEPS}",
            "",  # what to try: a warning's remedy, none for a flag
        ]
        assert re.match(
            rf"^nan: \d flags? raised in {STEPS} logged steps \(steps 1 to {STEPS}\)",
            frame.locator(".onset-summary").text_content(),
        )
        page.screenshot(path=str(artifacts_dir() / "gradviz_over_time.png"))
        # A click opens that layer at that step, in "The layer"; the URL follows.
        row.get_by_role("button", name="scale").click()
        _selected(frame, "layer")
        wait_drawn(frame, PANELS, run="nan", layer="scale", step=FAULT_STEP)
        assert frame.locator(".layer-name").text_content() == "scale"
        assert frame.get_by_label("Layer", exact=True).input_value() == "scale"
        # The keyboard is not left on the hidden row: it is on the layer control.
        expect(frame.get_by_label("Layer", exact=True)).to_be_focused()
        expect(frame.locator(".step-value")).to_have_text(re.compile(f"^{FAULT_STEP} "))
        page.wait_for_url(
            re.compile(rf"#gradviz&run=nan&layer=scale&step={FAULT_STEP}&view=layer$")
        )


def test_a_run_without_flags_says_so_in_one_line(browser, tensorboard):  # noqa: F811
    url = tensorboard
    assert get_json(f"{url}/data/plugin/gradviz/onset?run=healthy")["onsets"] == []
    with _open(browser, url, "gradviz&run=healthy&view=timeline") as page:
        frame = tab(page)
        wait_drawn(frame, ONSET, run="healthy")
        assert frame.locator(".onset-summary").text_content() == (
            f"healthy: no flag was raised at any of its {STEPS} logged steps (steps 1 to {STEPS})."
        )
        assert frame.locator("table.onset-table").is_hidden()


def test_switching_sections_updates_the_url_and_fetches_only_what_is_shown(browser, tensorboard):  # noqa: F811
    url = tensorboard
    with _open(browser, url, "gradviz&run=nan") as page:
        frame = tab(page)
        _selected(frame, "layer")
        wait_drawn(frame, PANELS, run="nan", step=STEPS)
        page.wait_for_url(re.compile(rf"#gradviz&run=nan&layer=\w+&step={STEPS}&view=layer$"))

        def fetched(route):
            return _fetched(frame).count(f"/data/plugin/gradviz/{route}")

        history = page.evaluate("history.length")

        # Hidden sections have asked for nothing.
        assert fetched("timeline") == fetched("onset") == 0
        assert frame.locator("table.layer-grid, .flow-chart, canvas.timeline-canvas").count() == 0

        frame.get_by_role("tab", name="Across layers").click()
        _selected(frame, "layers")
        page.wait_for_url(re.compile(r"&view=layers$"))
        wait_drawn(frame, GRID, run="nan", step=STEPS)

        # The keyboard: arrows move along the tabs (and choose), Home and End to the ends.
        frame.get_by_role("tab", name="Across layers").press("ArrowRight")
        _selected(frame, "timeline")
        expect(frame.get_by_role("tab", name="Over time")).to_be_focused()
        page.wait_for_url(re.compile(r"&view=timeline$"))
        wait_drawn(frame, ONSET, run="nan")
        wait_drawn(frame, TIMELINE, run="nan")
        assert fetched("timeline") == fetched("onset") == 1
        frame.get_by_role("tab", name="Over time").press("End")
        _selected(frame, "compare")
        page.wait_for_url(re.compile(r"&view=compare$"))
        assert wait_drawn(frame, COMPARE, run="nan").locator(".run-legend li").count() > 0
        frame.get_by_role("tab", name="Compare runs").press("ArrowRight")  # wraps around
        _selected(frame, "layer")
        page.wait_for_url(re.compile(r"&view=layer$"))
        frame.get_by_role("tab", name="The layer").press("ArrowLeft")
        _selected(frame, "compare")

        # Back to a section shown before: what it fetched is not fetched again.
        frame.get_by_role("tab", name="Over time").click()
        _selected(frame, "timeline")
        wait_drawn(frame, TIMELINE, run="nan")
        frame.get_by_role("tab", name="The layer").click()
        wait_drawn(frame, PANELS, run="nan", step=STEPS)
        assert fetched("timeline") == fetched("onset") == 1
        # No history entry per switch: the URL is replaced.
        assert page.evaluate("history.length") == history


def test_the_demo_url_opens_resnet50s_pool1_pool_in_the_layer_section(browser, tmp_path):  # noqa: F811
    from tb_gradviz.cli import demo

    logdir = tmp_path / "logs"
    # Another run comes first in the run list, as the demo's small CNNs do.
    _write_run_with_layer_name(logdir / "cnn_avgpool", "pool1")
    _write_run_with_layer_name(logdir / "resnet50", "resnet50/pool1_pool")
    fragment = demo.focus({"cnn_avgpool": ["pool1"], "resnet50": ["resnet50/pool1_pool"]})
    with (
        running_tensorboard(
            logdir, tmp_path / "tensorboard.log", runs_loaded({"cnn_avgpool": 3, "resnet50": 3})
        ) as url,
        _open(browser, url, f"gradviz{fragment}") as page,
    ):
        frame = tab(page)
        _selected(frame, "layer")
        wait_drawn(frame, PANELS, run="resnet50", layer="resnet50/pool1_pool")
        assert frame.get_by_label("Run", exact=True).input_value() == "resnet50"
        assert frame.get_by_label("Layer", exact=True).input_value() == "resnet50/pool1_pool"
