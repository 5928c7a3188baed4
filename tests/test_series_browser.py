"""The layer view of a 10,000-step series, in a real TensorBoard (Rust data server) and Chromium.

A run of 3 layers x 10,000 steps whose gradients are 10,000 times larger at
step 7,777 only (`synthetic.write_large_run(spike=...)`), served with every step
kept. `/series` sends the layer view about one column per pixel, each with its
extremes: the page throws nothing, the spread chart has far fewer columns than
steps, hovering names the real steps of the spike's column, whose band stands
far above the others, and a click there opens that column's last step.
"""

import re

import pytest
import synthetic
from browser import HEATMAPS, PANELS, browser, expect, wait_drawn  # noqa: F401 (fixture)
from tbserver import running_tensorboard
from test_timeline_browser import SAMPLES, _all_loaded, _tab

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LAYERS, STEPS, SPIKE = 3, 10_000, 7_777
# views.SPREAD: the chart's width and its plot's left margin and width, in SVG units.
CHART_WIDTH, PLOT_LEFT, PLOT_WIDTH = 420, 46, 364
TIP = re.compile(r"steps? (\d+)(?:–(\d+))?: std (\S+)(?: to (\S+))?")


@pytest.fixture(scope="module")
def spiked_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("spiked")
    synthetic.write_large_run(
        root / "logs" / "long", layers=LAYERS, steps=STEPS, spike=(SPIKE, 1e4)
    )
    return root


def _hover(chart, fraction):
    """Hovers the spread chart at `fraction` of its plot.

    Returns `(position, first, last, largest)`: where, and what the tip says.
    """
    box = chart.bounding_box()
    position = {
        "x": (PLOT_LEFT + fraction * PLOT_WIDTH) * box["width"] / CHART_WIDTH,
        "y": box["height"] / 2,
    }
    chart.hover(position=position)
    tip = chart.locator(".band-tip")
    expect(tip).to_have_text(TIP)
    first, last, low, high = TIP.fullmatch(tip.text_content()).groups()
    return position, int(first), int(last or first), float(high or low)


def test_the_layer_view_of_ten_thousand_steps_draws_a_one_step_spike(
    browser,  # noqa: F811
    spiked_run,
    tmp_path,
):
    with (
        running_tensorboard(
            spiked_run / "logs", tmp_path / "tensorboard.log", _all_loaded, SAMPLES, timeout=300
        ) as url,
        _tab(browser, url, "gradviz", screenshot=tmp_path / "series.png") as (_, frame),
    ):
        heatmaps = wait_drawn(frame, HEATMAPS, run="long", step=STEPS)
        chart = heatmaps.locator('.heatmap-figure[data-tensor="output_gradient"] svg.spread')
        columns = int(chart.get_attribute("data-columns"))
        plot = chart.bounding_box()["width"] * PLOT_WIDTH / CHART_WIDTH
        # About one column per pixel (the width asked for is rounded up to 100): never one per step.
        assert columns < plot + 100 and columns < STEPS, (columns, plot)
        # The spike's column: the one under step 7,777 (or a neighbour, by a pixel's rounding).
        for offset in (0, -1, 1):
            fraction = (SPIKE - 0.5 + offset * STEPS / columns) / STEPS
            position, first, last, spike = _hover(chart, fraction)
            if first <= SPIKE <= last:
                break
        assert first <= SPIKE <= last, (first, last)
        assert last - first < 2 * STEPS / columns
        _, _, _, elsewhere = _hover(chart, 1 / 3)
        assert spike > 1000 * elsewhere, (spike, elsewhere)
        # A click opens the column's last step, a real step, with its exact record.
        chart.click(position=position)
        wait_drawn(frame, PANELS, run="long", step=last)
        assert frame.locator(".step-value").inner_text().split()[0] == str(last)
