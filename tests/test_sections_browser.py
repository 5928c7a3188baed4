"""The tab's sections, its URL and the onset table, in a real TensorBoard and Chromium.

Runs with a fault at a known step (`test_onset.faulty_run`: a NaN enters the
`scale` layer's output at step FAULT_STEP) and a healthy one. Every wait is
for a state (`expect`, `wait_for`, `wait_for_url`), never a sleep, so the tests
hold on a loaded machine.
"""

import re

import pytest
from tbserver import get_json, running_tensorboard
from test_e2e_browser import (  # noqa: F401 (fixture)
    PLUGIN_FRAME,
    _artifacts_dir,
    _runs_loaded,
    _write_run_with_layer_name,
    browser,
    gradviz_page,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

keras = pytest.importorskip("keras")

from test_onset import FAULT_STEP, STEPS, faulty_run  # noqa: E402 (needs keras)

try:
    from playwright.sync_api import expect
except ImportError:  # the `browser` fixture says so, and fails in CI
    expect = None

# Generous: a CPU hog beside the test slows the first answers several times.
TIMEOUT_MS = 60_000
SECTIONS = {"layer": "The layer", "layers": "Across layers", "timeline": "Over time"}
SECTIONS["compare"] = "Compare runs"


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    root = tmp_path_factory.mktemp("sections")
    logdir = root / "logs"
    faulty_run(logdir / "nan", float("nan"), ["scale", "d2", "logits"])
    # The factor stays 1: nothing goes wrong.
    faulty_run(logdir / "healthy", 1.0, ["scale", "d2", "logits"])
    with running_tensorboard(
        logdir, root / "tensorboard.log", _runs_loaded({"nan": STEPS, "healthy": STEPS})
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
    expect(frame.get_by_role("tab", name=SECTIONS[view])).to_have_attribute(
        "aria-selected", "true", timeout=TIMEOUT_MS
    )
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
        page.set_default_timeout(TIMEOUT_MS)
        frame = page.frame_locator(PLUGIN_FRAME)
        _selected(frame, "timeline")
        frame.locator("canvas.timeline-canvas").wait_for()
        # The onset table: one row per raised flag, in /onset's order, the NaN's where it was put.
        rows = frame.locator("table.onset-table tbody tr")
        expect(rows).to_have_count(len(served["onsets"]), timeout=TIMEOUT_MS)
        assert rows.evaluate_all("rows => rows.map((row) => row.dataset.flag)") == [
            o["flag"] for o in served["onsets"]
        ]
        row = frame.locator('table.onset-table tr[data-flag="nonfinite"]')
        assert row.locator("th, td").all_text_contents() == [
            "NaN / Inf",
            str(FAULT_STEP),
            "scale",
            "activation",
            f"yes, through step {STEPS}",
        ]
        expect(frame.locator(".onset-summary")).to_have_text(
            re.compile(rf"^nan: \d flags? raised in {STEPS} logged steps \(steps 1 to {STEPS}\)")
        )
        page.screenshot(path=str(_artifacts_dir() / "gradviz_over_time.png"))
        # A click opens that layer at that step, in "The layer"; the URL follows.
        row.get_by_role("button", name="scale").click()
        _selected(frame, "layer")
        frame.locator(f'.panel[data-tensor="activation"][data-step="{FAULT_STEP}"]').wait_for()
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
        frame = page.frame_locator(PLUGIN_FRAME)
        expect(frame.locator(".onset-summary")).to_have_text(
            f"healthy: no flag was raised at any of its {STEPS} logged steps (steps 1 to {STEPS}).",
            timeout=TIMEOUT_MS,
        )
        expect(frame.locator("table.onset-table")).to_be_hidden()


def test_switching_sections_updates_the_url_and_fetches_only_what_is_shown(browser, tensorboard):  # noqa: F811
    url = tensorboard
    with _open(browser, url, "gradviz&run=nan") as page:
        page.set_default_timeout(TIMEOUT_MS)
        frame = page.frame_locator(PLUGIN_FRAME)
        _selected(frame, "layer")
        frame.locator(f'.panel[data-tensor="activation"][data-step="{STEPS}"]').wait_for()
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
        frame.locator("table.layer-grid").wait_for()

        # The keyboard: arrows move along the tabs (and choose), Home and End to the ends.
        tab = frame.get_by_role("tab", name="Across layers")
        tab.press("ArrowRight")
        _selected(frame, "timeline")
        expect(frame.get_by_role("tab", name="Over time")).to_be_focused()
        page.wait_for_url(re.compile(r"&view=timeline$"))
        frame.locator("table.onset-table").wait_for()
        frame.locator("canvas.timeline-canvas").wait_for()
        assert fetched("timeline") == fetched("onset") == 1
        frame.get_by_role("tab", name="Over time").press("End")
        _selected(frame, "compare")
        page.wait_for_url(re.compile(r"&view=compare$"))
        frame.locator(".compare-charts .run-legend li").first.wait_for()
        frame.get_by_role("tab", name="Compare runs").press("ArrowRight")  # wraps around
        _selected(frame, "layer")
        page.wait_for_url(re.compile(r"&view=layer$"))
        frame.get_by_role("tab", name="The layer").press("ArrowLeft")
        _selected(frame, "compare")

        # Back to a section shown before: what it fetched is not fetched again.
        frame.get_by_role("tab", name="Over time").click()
        _selected(frame, "timeline")
        frame.locator("canvas.timeline-canvas").wait_for()
        frame.get_by_role("tab", name="The layer").click()
        frame.locator(f'.panel[data-tensor="activation"][data-step="{STEPS}"]').wait_for()
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
            logdir, tmp_path / "tensorboard.log", _runs_loaded({"cnn_avgpool": 3, "resnet50": 3})
        ) as url,
        _open(browser, url, f"gradviz{fragment}") as page,
    ):
        frame = page.frame_locator(PLUGIN_FRAME)
        _selected(frame, "layer")
        frame.locator(".layer-name", has_text="resnet50/pool1_pool").wait_for(timeout=TIMEOUT_MS)
        assert frame.get_by_label("Run", exact=True).input_value() == "resnet50"
        assert frame.get_by_label("Layer", exact=True).input_value() == "resnet50/pool1_pool"
