"""The tab at 10,000 logged steps, in a real TensorBoard (Rust data server) and Chromium.

A run of 3 layers x 10,000 steps (`synthetic.write_large_run`) served with every
step kept: the page throws nothing ("Maximum call stack size exceeded" came from
spreading every step into one call), the layer view draws the last step, and the
depth x time view draws about one column per pixel; clicking a cell opens that
layer at that step.
"""

import re

import pytest
import synthetic
from tbserver import get_json, running_tensorboard
from test_e2e_browser import PLUGIN_FRAME, PageProblems, browser  # noqa: F401 (fixture)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LAYERS, STEPS = 3, 10_000
SAMPLES = ("--samples_per_plugin", "gradviz=0,histograms=0,gradviz_digest=0")


def _all_loaded(url):
    runs = get_json(f"{url}/data/plugin/gradviz/runs")["runs"]
    return len(runs) == 1 and all(layer["max_step"] == STEPS for layer in runs[0]["layers"])


def test_the_tab_at_ten_thousand_steps_draws_and_opens_a_cell(browser, tmp_path):  # noqa: F811
    names, _ = synthetic.write_large_run(tmp_path / "logs" / "long", layers=LAYERS, steps=STEPS)
    with running_tensorboard(
        tmp_path / "logs", tmp_path / "tensorboard.log", _all_loaded, SAMPLES, timeout=300
    ) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(120_000)
        problems = PageProblems(page)
        try:
            page.goto(f"{url}/#gradviz")
            frame = page.frame_locator(PLUGIN_FRAME)
            frame.locator(f'.panel[data-tensor="input_gradient"][data-step="{STEPS}"]').wait_for()
            canvas = frame.locator("canvas.timeline-canvas")
            canvas.wait_for()
            assert int(canvas.get_attribute("data-rows")) == LAYERS
            columns = int(canvas.get_attribute("data-columns"))
            box = canvas.bounding_box()
            # About one column per pixel: never one per step.
            assert columns <= box["width"] + 1 and columns < STEPS, (columns, box)
            status = frame.locator(".timeline-status")
            assert re.search(
                f"{LAYERS} layers, {STEPS} logged steps in {columns} columns", status.inner_text()
            )
            # The middle row, a third of the way along: that layer, at that column's last step.
            canvas.click(position={"x": box["width"] / 3, "y": box["height"] / 2})
            layer = frame.get_by_label("Layer", exact=True)
            page.wait_for_function("() => true")
            frame.locator(".layer-name", has_text=names[1]).wait_for()
            assert layer.input_value() == names[1]
            step = int(frame.locator(".step-value").inner_text().split()[0])
            assert 0.3 * STEPS < step < 0.37 * STEPS, step
            canvas.hover(position={"x": box["width"] / 3, "y": box["height"] / 2})
            tip = frame.locator(".timeline-tip")
            assert tip.inner_text().startswith(f"{names[1]}, steps ")
        finally:
            page.screenshot(path=str(tmp_path / "timeline.png"), full_page=True)
            page.close()
        assert problems.errors == [], problems.errors
