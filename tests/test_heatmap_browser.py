"""The depth x time view read at a glance, in a real TensorBoard and Chromium.

A run of 12 layers x 300 steps (`synthetic.write_large_run`) whose layer 5 alone has its
gradient 1e6 times larger at step SPIKE: it raises `exploding` there and nowhere else, and
`/onset` names that step and layer. The view names every row, puts round steps on its axis
where those steps are drawn, titles its colour bar, draws the flag as a mark in its legend's
colour and the onset where it began, says what is under the crosshair, and zooms to the
steps a drag crosses ("Whole run" and Escape go back). Every reading waits for the view's
marker to name the state asked for (`browser.wait_drawn`).
"""

import re

import pytest
import synthetic
from browser import (  # noqa: F401 (fixture)
    ONSET,
    TIMELINE,
    browser,
    expect,
    gradviz_page,
    keep_screenshot,
    runs_loaded,
    tab,
    wait_drawn,
)
from tbserver import get_json, running_tensorboard

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LAYERS, STEPS, SPIKE, SPIKED = 12, 300, 120, 5
NAMES = [f"block{i}/pool" for i in range(LAYERS)]


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    root = tmp_path_factory.mktemp("heatmap")
    synthetic.write_large_run(
        root / "logs" / "run", layers=LAYERS, steps=STEPS, layer_spike=(SPIKE, SPIKED, 1e6)
    )
    with running_tensorboard(
        root / "logs", root / "tensorboard.log", runs_loaded({"run": STEPS})
    ) as url:
        yield url


def _x_of(canvas_box, columns, first, step):
    """The page x of the middle of `step`'s column, in a drawing of one column per step."""
    return canvas_box["x"] + (step - first + 0.5) / columns * canvas_box["width"]


def _drag(page, canvas, columns, first, start, end):
    """Drags across the drawing from `start`'s column to `end`'s, in its middle row."""
    box = canvas.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(_x_of(box, columns, first, start), y)
    page.mouse.down()
    page.mouse.move(_x_of(box, columns, first, end), y, steps=6)
    page.mouse.up()


def _step_ticks(frame):
    """The step axis' labels, as numbers, and their page x."""
    ticks = frame.locator("svg.timeline-axis text.step-tick")
    return [
        (int(tick.text_content()), tick.bounding_box()) for tick in ticks.all() if tick.is_visible()
    ]


def test_the_view_names_rows_steps_colour_flag_and_onset_and_zooms(browser, tensorboard, tmp_path):  # noqa: F811
    onsets = get_json(f"{tensorboard}/data/plugin/gradviz/onset?run=run")["onsets"]
    exploding = [o for o in onsets if o["flag"] == "exploding"]
    assert [(o["step"], o["layer"]) for o in exploding] == [(SPIKE, NAMES[SPIKED])]
    with gradviz_page(browser, tensorboard, 1400, 1000, "gradviz&run=run&view=timeline") as page:
        frame = tab(page)
        wait_drawn(frame, TIMELINE, run="run", colour="rms/output_gradient", range=None)
        # Once /onset is in (the marker then counts the onsets marked), with the onset table
        # above the view, which moves it down.
        view = wait_drawn(frame, TIMELINE, run="run", range=None, onsets=1)
        wait_drawn(frame, ONSET, run="run")
        canvas = view.locator("canvas.timeline-canvas")
        canvas.scroll_into_view_if_needed()
        assert canvas.get_attribute("data-columns") == str(STEPS)

        # Every row named, in model order, each at least 8 px tall and beside its row.
        names = frame.get_by_role("list", name="Layers, in model order").get_by_role("listitem")
        assert names.all_inner_texts() == NAMES
        box = canvas.bounding_box()
        rows = [item.bounding_box() for item in names.all()]
        assert all(row["height"] >= 8 for row in rows)
        assert rows[0]["y"] == pytest.approx(box["y"], abs=1)
        assert rows[-1]["y"] + rows[-1]["height"] == pytest.approx(box["y"] + box["height"], abs=1)

        # Round steps on the axis, each under its step's column.
        ticks = _step_ticks(frame)
        assert [step for step, _ in ticks] == [50, 100, 150, 200, 250, 300]
        for step, tick in ticks:
            middle = tick["x"] + tick["width"] / 2
            assert middle == pytest.approx(_x_of(box, STEPS, 1, step), abs=2), step

        # The colour bar says what the colour is, on which scale, with its ticks.
        bar = view.locator(".timeline-colourbar")
        expect(bar.locator("figcaption")).to_have_text("RMS of the output gradient, log scale")
        assert any(re.fullmatch("10[⁻⁰-⁹]+", t) for t in bar.locator("text").all_text_contents())

        # The flag: a mark in the legend's colour at the top of layer 5's row, at step 120.
        colour = view.locator(".timeline-key .timeline-swatch.flag-exploding").evaluate(
            "(swatch) => getComputedStyle(swatch).backgroundColor"
        )
        drawn = canvas.evaluate(
            """(canvas, [x, y]) => {
                const [r, g, b] = canvas.getContext('2d').getImageData(x, y, 1, 1).data;
                return `rgb(${r}, ${g}, ${b})`;
            }""",
            [
                int((SPIKE - 0.5) / STEPS * int(canvas.get_attribute("width"))),
                int(rows[SPIKED]["y"] - box["y"]) + 1,
            ],
        )
        assert drawn == colour

        # The onset: where /onset says it began, at its layer's row and its step.
        mark = view.locator(".timeline-onset.flag-exploding")
        assert (mark.get_attribute("data-layer"), mark.get_attribute("data-step")) == (
            NAMES[SPIKED],
            str(SPIKE),
        )
        at = mark.bounding_box()
        assert at["x"] + at["width"] / 2 == pytest.approx(_x_of(box, STEPS, 1, SPIKE), abs=2)
        row = rows[SPIKED]
        assert at["y"] + at["height"] / 2 == pytest.approx(row["y"] + row["height"] / 2, abs=2)

        # The crosshair names the layer, the step and the value, and lights the row's name.
        canvas.hover(
            position={"x": _x_of(box, STEPS, 1, SPIKE) - box["x"], "y": row["y"] - box["y"] + 5}
        )
        tip = view.locator(".timeline-tip")
        expect(tip).to_contain_text(f"{NAMES[SPIKED]}, step {SPIKE}: rms ")
        expect(tip).to_contain_text("flags: exploding")
        expect(view.locator(".timeline-name.current")).to_have_text(NAMES[SPIKED])
        keep_screenshot(view, tmp_path / "timeline.png")

        # A drag from step 100 to step 150 shows those steps, one column each.
        _drag(page, canvas, STEPS, 1, 100, 150)
        wait_drawn(frame, TIMELINE, run="run", range=[100, 150])
        assert canvas.get_attribute("data-columns") == "51"
        steps = [step for step, _ in _step_ticks(frame)]
        assert steps and all(100 <= step <= 150 for step in steps), steps
        expect(view.locator(".timeline-status")).to_contain_text(
            "12 layers, 51 logged steps from step 100 to 150."
        )
        box = canvas.bounding_box()
        wait_drawn(frame, TIMELINE, run="run", range=[100, 150], onsets=1)
        at = view.locator(".timeline-onset.flag-exploding").bounding_box()
        assert at["x"] + at["width"] / 2 == pytest.approx(_x_of(box, 51, 100, SPIKE), abs=2)

        # 'Whole run' goes back; so does Escape after another drag.
        frame.get_by_role("button", name="Whole run").click()
        wait_drawn(frame, TIMELINE, run="run", range=None)
        assert canvas.get_attribute("data-columns") == str(STEPS)
        expect(frame.get_by_role("button", name="Whole run")).to_be_disabled()
        _drag(page, canvas, STEPS, 1, 200, 260)
        wait_drawn(frame, TIMELINE, run="run", range=[200, 260])
        page.keyboard.press("Escape")
        wait_drawn(frame, TIMELINE, run="run", range=None)
        assert canvas.get_attribute("data-columns") == str(STEPS)
