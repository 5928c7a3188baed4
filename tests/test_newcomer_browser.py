"""What a newcomer reads at a glance in the tab, in a real TensorBoard and Chromium.

Three synthetic runs in the real format (`synthetic`), one TensorBoard and one browser for the
file:

* `deep`: 63 max pools logged at steps 4, 8 and 12 alone: more rows than the time view shows at
  once, and a step axis with room for steps that were never logged;
* `warned`: 4 layers over 80 steps whose layer 1 alone has its gradients 30 times larger at
  step 70: the warnings (leading indicators) fire there, no flag does;
* `nan_end`: 3 layers whose gradients are NaN at the last of their 5 steps, as a run that
  diverges ends.

Every view is read once its marker names the state asked for (`browser.wait_drawn`), never
after a sleep.
"""

import math

import numpy as np
import pytest
import synthetic
from browser import (  # noqa: F401 (fixture)
    FLOW,
    HEATMAPS,
    ONSET,
    TIMELINE,
    browser,
    expect,
    gradviz_page,
    keep_screenshot,
    runs_loaded,
    tab,
    wait_drawn,
    wait_time_view,
)
from tbserver import get_json, running_tensorboard

from tb_gradviz.format import events

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DEEP_LAYERS, DEEP_STEPS = 63, (4, 8, 12)
DEEP_NAMES = [f"block{i:02d}/pool" for i in range(DEEP_LAYERS)]
WARNED_STEPS, SPIKE_STEP, SPIKED = 80, 70, 1
NAN_LAYERS, NAN_STEPS = 3, 5

FLAG_TITLES = [
    "NaN / Inf",
    "vanishing",
    "exploding",
    "dead units",
    "underflow",
    "overflow",
    "MXFP8 underflow",
    "stalled",
    "skipped steps",
]


def _write(run_dir, names, steps, gradient_scale=lambda step: 1.0):
    """A run of synthetic 2x2/2 max pools named `names`, one event at each of `steps`."""
    rng = np.random.default_rng(0)
    log = events.EventLog(run_dir)
    try:
        for step in steps:
            records = []
            for index, name in enumerate(names):
                records += synthetic.pool_records(
                    rng, name, index, size=4, channels=2, gradient_scale=gradient_scale(step)
                )
            log.write(step, records)
    finally:
        log.close()


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    root = tmp_path_factory.mktemp("newcomer")
    logs = root / "logs"
    _write(logs / "deep", DEEP_NAMES, DEEP_STEPS)
    synthetic.write_large_run(
        logs / "warned", layers=4, steps=WARNED_STEPS, layer_spike=(SPIKE_STEP, SPIKED, 30.0)
    )
    nan_names = [f"block{i}/pool" for i in range(NAN_LAYERS)]
    _write(
        logs / "nan_end",
        nan_names,
        range(1, NAN_STEPS + 1),
        lambda step: math.nan if step == NAN_STEPS else 1.0,
    )
    expected = {"deep": DEEP_STEPS[-1], "warned": WARNED_STEPS, "nan_end": NAN_STEPS}
    with running_tensorboard(logs, root / "tensorboard.log", runs_loaded(expected)) as url:
        yield url


def _open(browser, url, fragment):  # noqa: F811
    return gradviz_page(browser, url, 1400, 1000, fragment=fragment)


# The boxes of the elements matched, in the tab's frame, read in one evaluation (Playwright's
# `bounding_box` is in the page's: the frame sits under TensorBoard's bar).
BOX = """(element) => {
  const box = element.getBoundingClientRect();
  return {text: element.textContent, left: box.left, right: box.right, top: box.top, bottom: box.bottom,
    width: box.width, height: box.height};
}"""
BOXES = f"(elements) => elements.map({BOX})"


def test_no_label_of_the_flag_rows_is_clipped(browser, tensorboard):  # noqa: F811
    with _open(browser, tensorboard, "gradviz&run=warned&view=layers") as page:
        frame = tab(page)
        flow = wait_drawn(frame, FLOW, run="warned")
        chart = flow.locator("svg.flow-chart").evaluate(
            "(chart) => { const b = chart.getBoundingClientRect(); return [b.left, b.right]; }"
        )
        scroller = flow.locator(".flow-scroll").evaluate(
            "(box) => { const b = box.getBoundingClientRect(); return [b.left, b.right]; }"
        )
        labels = flow.locator("text.flag-row-label").evaluate_all(BOXES)
        assert [label["text"] for label in labels] == FLAG_TITLES
        for label in labels:
            # Inside the chart, and inside the part of it its scroll box shows.
            assert label["left"] >= max(chart[0], scroller[0]), label
            assert label["right"] <= min(chart[1], scroller[1]), label
            # Clear of the run's marker at the chart's left edge (x 2 to 5).
            assert label["left"] >= chart[0] + 6, label


def test_every_one_of_63_rows_scrolls_into_view_and_is_named(browser, tensorboard, tmp_path):  # noqa: F811
    with _open(browser, tensorboard, "gradviz&run=deep&view=timeline") as page:
        frame = tab(page)
        view = wait_time_view(frame, "deep", range=None)
        canvas = view.locator("canvas.timeline-canvas")
        assert canvas.get_attribute("data-rows") == str(DEEP_LAYERS)
        names = frame.get_by_role("list", name="Layers, in model order").get_by_role("listitem")
        assert names.all_inner_texts() == DEEP_NAMES
        # The rows scroll, and the note under them says so, with the way to the others.
        note = view.locator(".timeline-scroll-note")
        expect(note).to_be_visible()
        expect(note.locator(".timeline-rows-shown")).to_have_text(
            f"Rows 1–40 of {DEEP_LAYERS} shown: scroll them, or"
        )
        expect(note.get_by_role("button", name="Rows above")).to_be_disabled()
        keep_screenshot(view, tmp_path / "timeline_63_rows.png")
        # Each row, scrolled into view, is shown whole in the rows' box and is the element seen
        # there (nothing over it), with its name in a colour that is not the background's.
        seen = view.locator(".timeline-rows").evaluate(
            """(scroller) => [...scroller.querySelectorAll('.timeline-name')].map((name) => {
                name.scrollIntoView({block: 'nearest'});
                const box = name.getBoundingClientRect();
                const shown = scroller.getBoundingClientRect();
                const at = document.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2);
                return {
                  text: name.textContent,
                  inside: box.top >= shown.top - 0.5 && box.bottom <= shown.bottom + 0.5 && box.height >= 11,
                  topmost: at === name,
                  colour: getComputedStyle(name).color,
                };
            })"""
        )
        assert [row["text"] for row in seen] == DEEP_NAMES
        for row in seen:
            assert row["inside"] and row["topmost"], row
            assert row["colour"] not in ("rgba(0, 0, 0, 0)", "transparent"), row
        # Scrolled to the end: the note names the last rows, and the button back up works.
        expect(note.locator(".timeline-rows-shown")).to_have_text(
            f"Rows 24–63 of {DEEP_LAYERS} shown: scroll them, or"
        )
        expect(note.get_by_role("button", name="Rows below")).to_be_disabled()
        note.get_by_role("button", name="Rows above").click()
        expect(note.get_by_role("button", name="Rows below")).to_be_enabled()


def test_the_axis_of_a_3_step_run_names_only_logged_steps(browser, tensorboard):  # noqa: F811
    logged = [str(step) for step in DEEP_STEPS]
    with _open(browser, tensorboard, "gradviz&run=deep&view=timeline") as page:
        frame = tab(page)
        view = wait_time_view(frame, "deep", range=None)
        ticks = view.locator("svg.timeline-axis text.step-tick").all_text_contents()
        assert ticks == logged
        # Each under its own column, the middle of a third of the drawing.
        box = view.locator("canvas.timeline-canvas").evaluate(BOX)
        placed = view.locator("svg.timeline-axis text.step-tick").evaluate_all(BOXES)
        for k, tick in enumerate(placed):
            middle = (tick["left"] + tick["right"]) / 2
            assert middle == pytest.approx(box["left"] + (k + 0.5) / 3 * box["width"], abs=2)
    # The layer view's charts over steps too: the heatmap and the spread under it.
    fragment = f"gradviz&run=deep&layer={DEEP_NAMES[0]}&view=layer"
    with _open(browser, tensorboard, fragment) as page:
        frame = tab(page)
        heatmaps = wait_drawn(frame, HEATMAPS, run="deep", layer=DEEP_NAMES[0])
        for chart in ("svg.heatmap", "svg.spread"):
            for figure in heatmaps.locator(".heatmap-figure").all():
                texts = figure.locator(f"{chart} text.step-tick").all_text_contents()
                assert texts and set(texts) <= set(logged), (chart, texts)


def test_each_warning_onset_has_a_mark_on_the_heatmap(browser, tensorboard, tmp_path):  # noqa: F811
    onsets = get_json(f"{tensorboard}/data/plugin/gradviz/onset?run=warned")["onsets"]
    warnings = [onset for onset in onsets if onset["class"] == "warning"]
    assert warnings, onsets
    flags = [onset for onset in onsets if onset["class"] != "warning"]
    with _open(browser, tensorboard, "gradviz&run=warned&view=timeline") as page:
        frame = tab(page)
        view = wait_time_view(
            frame, "warned", range=None, onsets=len(flags), warnings=len(warnings)
        )
        canvas = view.locator("canvas.timeline-canvas").evaluate(BOX)
        rows = frame.get_by_role("list", name="Layers, in model order").get_by_role("listitem")
        names = rows.all_inner_texts()
        boxes = rows.evaluate_all(BOXES)
        for onset in warnings:
            mark = view.locator(
                f'.timeline-warning[data-flag="{onset["flag"]}"][data-layer="{onset["layer"]}"]'
                f'[data-step="{onset["step"]}"]'
            )
            expect(mark).to_have_count(1)
            assert mark.get_attribute("aria-label").startswith("Warning ")
            at = mark.evaluate(BOX)
            row = boxes[names.index(onset["layer"])]
            assert row["top"] <= (at["top"] + at["bottom"]) / 2 <= row["bottom"], (onset, at, row)
            # At its step's column (one per step), give or take the spacing of signs at one spot.
            x = canvas["left"] + (onset["step"] - 0.5) / WARNED_STEPS * canvas["width"]
            assert (at["left"] + at["right"]) / 2 == pytest.approx(x, abs=20), onset
        keep_screenshot(view, tmp_path / "timeline_warnings.png")
        # In the onset table, a warning's row reads apart from a flag's: its own sign and colour.
        wait_drawn(frame, ONSET, run="warned")
        row = frame.locator('table.onset-table tr[data-class="warning"] th').first
        sign = row.evaluate("(th) => getComputedStyle(th, '::before').content")
        assert sign == '"▲"'
        # Each warning's row says what to try, as /onset's remedy says it.
        for onset in warnings:
            cell = frame.locator(
                f'table.onset-table tr[data-class="warning"][data-flag="{onset["flag"]}"] '
                "td.onset-remedy"
            )
            expect(cell).to_have_text(onset["remedy"])
        # The legend's marks: no two flags alike in colour and stripes, and none in the colour
        # bar's hues alone: each has an outline.
        swatches = view.locator(".timeline-key .timeline-swatch[class*='flag-']").evaluate_all(
            """(swatches) => swatches.map((swatch) => {
                const style = getComputedStyle(swatch);
                return [style.backgroundColor, style.backgroundImage, style.borderTopStyle];
            })"""
        )
        assert len(swatches) == len(FLAG_TITLES)
        assert len({(colour, image) for colour, image, _ in swatches}) == len(FLAG_TITLES)
        assert {border for _, _, border in swatches} == {"solid"}


def test_the_distribution_view_has_a_colour_bar(browser, tensorboard):  # noqa: F811
    fragment = f"gradviz&run=warned&layer=block{SPIKED}/pool&view=layer"
    with _open(browser, tensorboard, fragment) as page:
        frame = tab(page)
        heatmaps = wait_drawn(frame, HEATMAPS, run="warned", layer=f"block{SPIKED}/pool")
        figures = heatmaps.locator(".heatmap-figure")
        assert figures.count() == 3
        for figure in figures.all():
            bar = figure.locator("svg.heatmap-scale")
            expect(bar).to_be_visible()
            assert bar.locator("text.scale-tick").all_text_contents() == [
                "0.001 %",
                "0.01 %",
                "0.1 %",
                "1 %",
                "10 %",
                "100 %",
            ]
            # A strip per sign, each darker to the right, as the heatmap's cells are shaded.
            for sign in ("positive", "zeros", "negative"):
                shades = bar.locator(f"rect.cell.{sign}").evaluate_all(
                    "(cells) => cells.map((cell) => Number(cell.getAttribute('fill-opacity')))"
                )
                assert len(shades) > 10 and shades == sorted(shades) and shades[-1] == 1, sign


def test_a_last_step_of_nan_gradients_is_drawn_as_not_finite_not_as_no_value(browser, tensorboard):  # noqa: F811
    onsets = get_json(f"{tensorboard}/data/plugin/gradviz/onset?run=nan_end")["onsets"]
    assert [(onset["flag"], onset["step"]) for onset in onsets] == [("nonfinite", NAN_STEPS)]
    with _open(browser, tensorboard, "gradviz&run=nan_end&view=timeline") as page:
        frame = tab(page)
        view = wait_time_view(frame, "nan_end", range=None, onsets=1)
        canvas = view.locator("canvas.timeline-canvas")
        width = int(canvas.get_attribute("width"))
        rows = int(canvas.get_attribute("data-rows"))
        height = int(canvas.get_attribute("height"))
        row_height = height // rows
        # The bottom half of each row's last column (below the first flag's mark): the stripes
        # of a value that is not finite, dark and light grey.
        pixels = canvas.evaluate(
            """(canvas, [x0, x1, rowHeight, rows]) => {
                const context = canvas.getContext('2d');
                const out = [];
                for (let r = 0; r < rows; r++) {
                  const data = context.getImageData(x0, r * rowHeight + rowHeight / 2, x1 - x0, rowHeight / 2).data;
                  const colours = new Set();
                  for (let i = 0; i < data.length; i += 4) colours.add(`${data[i]},${data[i + 1]},${data[i + 2]}`);
                  out.push([...colours].sort());
                }
                return out;
            }""",
            [width * (NAN_STEPS - 1) // NAN_STEPS + 6, width - 6, row_height, rows],
        )
        # (Before, a NaN was drawn as no value: that grey alone, besides the flags' marks.)
        assert all("60,60,60" in colours and "200,200,200" in colours for colours in pixels), pixels
        # The flag's mark: its colour inside an outline of the marks' colour, whatever the cell.
        swatch = view.locator(".timeline-key .timeline-swatch.flag-nonfinite").evaluate(
            "(swatch) => [getComputedStyle(swatch).backgroundColor, getComputedStyle(swatch).borderTopColor]"
        )
        x = int((NAN_STEPS - 0.5) / NAN_STEPS * width)
        mark = canvas.evaluate(
            """(canvas, x) => [0, 1].map((y) => {
                const [r, g, b] = canvas.getContext('2d').getImageData(x, y, 1, 1).data;
                return `rgb(${r}, ${g}, ${b})`;
            })""",
            x,
        )
        assert mark == [swatch[1], swatch[0]]
        # The reading says what the cell holds.
        box = canvas.bounding_box()
        canvas.hover(position={"x": x, "y": box["height"] - 3})
        expect(view.locator(".timeline-tip")).to_contain_text("not finite (NaN / Inf)")
        expect(view.locator(".timeline-key")).to_contain_text("NaN / Inf value")
