"""The tab at 10,000 logged steps, in a real TensorBoard (Rust data server) and Chromium.

A run of 3 layers x 10,000 steps (`synthetic.write_large_run`) served with every
step kept: the page throws nothing ("Maximum call stack size exceeded" came from
spreading every step into one call), the layer view draws the last step, and the
depth x time view draws about one column per pixel; clicking a cell opens that
layer at that step.
"""

import contextlib
import json
import re

import pytest
import synthetic
from browser import (  # noqa: F401
    PANELS,
    TIMELINE,
    browser,
    gradviz_page,
    show_section,
    tab,
    wait_drawn,
    wait_time_view,
)
from tbserver import get_json, running_tensorboard

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LAYERS, STEPS = 3, 10_000
# Every step kept.
SAMPLES = ("--samples_per_plugin", "gradviz=0,histograms=0,gradviz_digest=0")


def _all_loaded(url):
    runs = get_json(f"{url}/data/plugin/gradviz/runs")["runs"]
    return len(runs) == 1 and all(layer["max_step"] == STEPS for layer in runs[0]["layers"])


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("long")
    names, _ = synthetic.write_large_run(root / "logs" / "long", layers=LAYERS, steps=STEPS)
    return root, names


@contextlib.contextmanager
def _tab(browser, url, fragment, screenshot=None):  # noqa: F811
    """Yields `(page, frame)` of the tab at `url/#fragment`; on leaving, the page threw nothing."""
    with gradviz_page(browser, url, 1400, 1000, fragment) as page:
        try:
            yield page, tab(page)
        finally:
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=True)


def test_the_tab_at_ten_thousand_steps_draws_and_opens_a_cell(browser, long_run, tmp_path):  # noqa: F811
    root, names = long_run
    with running_tensorboard(
        root / "logs", tmp_path / "tensorboard.log", _all_loaded, SAMPLES, timeout=300
    ) as url:
        _check_long_run(browser, url, names, tmp_path)


def test_the_tab_says_when_the_histograms_are_a_sample(browser, long_run, tmp_path):  # noqa: F811
    # The long-run command: the digest whole, a sample of the full records.
    root, names = long_run
    sampled = ("--samples_per_plugin", "gradviz=50,histograms=50,gradviz_digest=0")
    with (
        running_tensorboard(
            root / "logs", tmp_path / "tensorboard.log", _all_loaded, sampled, timeout=300
        ) as url,
        _tab(browser, url, "gradviz&view=timeline") as (_, frame),
    ):
        wait_drawn(frame, TIMELINE, run="long")
        # The note needs the layer view's steps too: its text is the state waited for.
        note = frame.locator(".timeline-sample")
        note.filter(has_text="a sample").wait_for()
        kept = int(
            re.search(r"sample: (\d+) of the run's (\d+) logged steps", note.inner_text())[1]
        )
        assert 2 <= kept <= 60, note.inner_text()
        assert f"of the run's {STEPS} logged steps" in note.inner_text()
        assert f"This view reads every step (1 to {STEPS})" in note.inner_text()
        canvas = frame.locator("canvas.timeline-canvas")
        assert int(canvas.get_attribute("data-columns")) > kept


def _check_long_run(browser, url, names, tmp_path):  # noqa: F811
    """The page at every step kept: no error, the layer view, the time view and a click on it."""
    with _tab(browser, url, "gradviz", screenshot=tmp_path / "timeline.png") as (_, frame):
        wait_drawn(frame, PANELS, run="long", step=STEPS)
        show_section(frame, "timeline")
        canvas = wait_time_view(frame, "long").locator("canvas.timeline-canvas")
        assert int(canvas.get_attribute("data-rows")) == LAYERS
        columns = int(canvas.get_attribute("data-columns"))
        box = canvas.bounding_box()
        # About one column per pixel: never one per step.
        assert columns <= box["width"] + 1 and columns < STEPS, (columns, box)
        status = frame.locator(".timeline-status")
        assert re.search(
            f"{LAYERS} layers, {STEPS} logged steps in {columns} columns", status.inner_text()
        )
        # The middle row, a third of the way along: that layer, at that column's last step,
        # opened in "The layer".
        canvas.hover(position={"x": box["width"] / 3, "y": box["height"] / 2})
        tip = frame.locator(".timeline-tip")
        assert tip.inner_text().startswith(f"{names[1]}, steps ")
        canvas.click(position={"x": box["width"] / 3, "y": box["height"] / 2})
        panels = wait_drawn(frame, PANELS, run="long", layer=names[1])
        assert frame.get_by_label("Layer", exact=True).input_value() == names[1]
        step = json.loads(panels.get_attribute("data-drawn"))["step"]
        assert 0.3 * STEPS < step < 0.37 * STEPS, step
        assert int(frame.locator(".step-value").inner_text().split()[0]) == step
        input_gradient = panels.locator('.panel[data-tensor="input_gradient"]')
        assert input_gradient.get_attribute("data-step") == str(step)


def test_a_link_opens_its_run_layer_and_step_and_the_url_follows(browser, long_run, tmp_path):  # noqa: F811
    root, names = long_run
    with running_tensorboard(
        root / "logs", tmp_path / "tensorboard.log", _all_loaded, SAMPLES, timeout=300
    ) as url:
        fragment = f"gradviz&run=long&layer={names[2].replace('/', '%2F')}&step=1234"
        with _tab(browser, url, fragment) as (page, frame):
            wait_drawn(frame, PANELS, run="long", layer=names[2], step=1234)
            assert frame.get_by_label("Layer", exact=True).input_value() == names[2]
            # Moving on writes the new choice into TensorBoard's URL.
            frame.get_by_label("Layer", exact=True).select_option(names[0])
            wait_drawn(frame, PANELS, run="long", layer=names[0], step=1234)
            page.wait_for_url(
                re.compile(r"#gradviz&run=long&layer=block0%2Fpool&step=1234&view=layer$")
            )
