"""The block formats in Chromium: the precision panel's block table against the written records,
its note for a run written before the block part, and the depth x time view coloured by the
MXFP8 E4M3 share to zero.

Two runs: block_runs.fit_spread (the gradient between d1 and spread loses half of each row in
MXFP8) and layout 11's files (tests/data/layouts: precision records without the block part).
"""

import decimal
import pathlib
import re
import shutil
import urllib.parse

import block_runs
import eventdata
import pytest
from browser import (  # noqa: F401 (fixture)
    PRECISION,
    TIMELINE,
    browser,
    expect,
    gradviz_page,
    keep_screenshot,
    runs_loaded,
    show_section,
    tab,
    wait_drawn,
    wait_time_view,
)
from tbserver import get_json, running_tensorboard

from tb_gradviz.format import blocks, records

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SPREAD, OLDER = "spread", "layout11"
LAYOUT11 = pathlib.Path(__file__).parent / "data" / "layouts" / "layout11-a82ce12" / "max"
NAMES = {
    "mxfp8_e4m3": "MXFP8 E4M3",
    "mxfp8_e5m2": "MXFP8 E5M2",
    "mxfp6_e2m3": "MXFP6 E2M3",
    "mxfp6_e3m2": "MXFP6 E3M2",
    "mxfp4_e2m1": "MXFP4 E2M1",
    "nvfp4": "NVFP4",
}


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    pytest.importorskip("keras")
    root = tmp_path_factory.mktemp("blocks")
    logdir = root / "logs"
    block_runs.fit_spread(logdir / SPREAD)
    shutil.copytree(LAYOUT11, logdir / OLDER)
    steps = {run: eventdata.last_step(logdir / run) for run in (SPREAD, OLDER)}
    with running_tensorboard(logdir, root / "tensorboard.log", runs_loaded(steps)) as url:
        yield url, logdir, steps


def _half_up(value, quantum):
    """`value` rounded to `quantum` with ties away from zero, on its exact binary value: what
    JavaScript's toFixed and toExponential do."""
    return decimal.Decimal(value).quantize(decimal.Decimal(quantum), decimal.ROUND_HALF_UP)


def share_text(count, total):
    """blockformats.shareText of the share count / total."""
    if not total:
        return "–"
    if not count:
        return "0"
    percent = 100 * (count / total)
    return "<0.1%" if percent < 0.1 else f"{_half_up(percent, '0.1')}%"


def error_text(error):
    """blockformats.errorText: "0", or two significant digits as "2.5e-4"."""
    if error == 0:
        return "0"
    exact = decimal.Decimal(error)
    exponent = exact.adjusted()
    digits = _half_up(exact.scaleb(-exponent), "0.1")
    if digits >= 10:
        digits, exponent = digits / 10, exponent + 1
    return f"{digits}e{exponent}"


def expected_cells(record):
    """`{format: [verdict, lines...]}` of one tensor's written precision record."""
    n = record["finite_nonzero"]
    cells = {}
    for name, counts in record["block_formats"].items():
        verdict = "–" if not n else "survives" if counts["to_zero"] <= 0.01 * n else "fails"
        cells[name] = [
            verdict,
            f"0: {share_text(counts['to_zero'], n)}",
            f"sub: {share_text(counts['subnormal'], n)}",
            f"sat: {share_text(counts['saturated'], n)}",
            f"wide: {share_text(counts['wide_blocks'], counts['blocks'])}",
            f"err: {error_text(counts['relative_error'])}",
        ] + (
            [f"NaN/Inf blocks: {counts['nonfinite_blocks']}"] if counts["nonfinite_blocks"] else []
        )
    return cells


_READ_BLOCKS = """panel => ({
  note: panel.querySelector('.block-note')?.textContent ?? null,
  heads: [...panel.querySelectorAll('table.block-table thead th')].map((th) => th.textContent),
  rows: Object.fromEntries([...panel.querySelectorAll('table.block-table tbody tr')].map((row) => [
    row.dataset.tensor, Object.fromEntries([...row.querySelectorAll('td[data-format]')].map((cell) => [
      cell.dataset.format, {
        lines: [...cell.children].map((span) => span.textContent),
        verdict: cell.className,
        title: cell.getAttribute('title'),
      }]))])),
  casts: panel.querySelectorAll('table.precision-table tbody tr').length,
})"""


def test_the_block_table_shows_each_tensors_written_record(browser, tensorboard):  # noqa: F811
    url, logdir, steps = tensorboard
    step = steps[SPREAD]
    log = eventdata.load(logdir / SPREAD)
    (run,) = [r for r in get_json(f"{url}/data/plugin/gradviz/runs")["runs"] if r["run"] == SPREAD]
    layers = {layer["layer"]: [t["tensor"] for t in layer["tensors"]] for layer in run["layers"]}
    fragment = f"gradviz&run={SPREAD}&layer=spread&step={step}"
    with gradviz_page(browser, url, 1400, 1000, fragment) as page:
        frame = tab(page)
        verdicts = set()
        for layer in ["spread", *(name for name in layers if name != "spread")]:
            frame.get_by_label("Layer", exact=True).select_option(layer)
            panel = wait_drawn(frame, PRECISION, run=SPREAD, layer=layer, step=step)
            shown = panel.evaluate(_READ_BLOCKS)
            assert shown["note"] is None
            assert shown["heads"] == ["tensor"] + [
                f"{NAMES[name]} · {spec.block_size}" for name, spec in blocks.FORMATS.items()
            ]
            assert list(shown["rows"]) == layers[layer], layer
            for tensor, cells in shown["rows"].items():
                record = records.decode_precision(
                    dict(eventdata.values(log, records.precision_tag(layer, tensor)))[step]
                )
                assert {name: cell["lines"] for name, cell in cells.items()} == expected_cells(
                    record
                ), (layer, tensor)
                for name, cell in cells.items():
                    counts = record["block_formats"][name]
                    verdicts.add(cell["verdict"])
                    # The hover holds the record's counts and its exact relative error.
                    assert (
                        f"of {record['finite_nonzero']} finite non-zero values, "
                        f"{counts['to_zero']} become zero, {counts['subnormal']} subnormal, "
                        f"{counts['saturated']} saturate; {counts['wide_blocks']} of "
                        f"{counts['blocks']} blocks" in cell["title"]
                    ), cell["title"]
                    error = re.search(r"relative squared error (\S+)$", cell["title"])[1]
                    assert float(error) == counts["relative_error"]
            if layer == "spread":
                # Half of each row of the gradient it passes back becomes zero in MXFP8 E4M3.
                cell = shown["rows"]["input_gradient"]["mxfp8_e4m3"]
                assert cell["lines"][:2] == ["fails", "0: 50.0%"] and cell["verdict"] == "fails"
                keep_screenshot(panel, logdir.parent / "block_table.png")
            # The table fits the column at 1,400 px: the frame does not scroll sideways.
            assert panel.evaluate(
                "p => p.ownerDocument.documentElement.scrollWidth"
                " <= p.ownerDocument.documentElement.clientWidth"
            )
        assert verdicts == {"survives", "fails"}


def test_a_run_written_before_the_block_part_shows_a_note_not_a_table(browser, tensorboard):  # noqa: F811
    url, _, steps = tensorboard
    step = steps[OLDER]
    fragment = f"gradviz&run={OLDER}&layer=conv&step={step}"
    with gradviz_page(browser, url, 1400, 1000, fragment) as page:
        panel = wait_drawn(tab(page), PRECISION, run=OLDER, layer="conv", step=step)
        shown = panel.evaluate(_READ_BLOCKS)
        assert shown["casts"] > 0  # the casts' part of the records is shown
        assert shown["rows"] == {} and shown["heads"] == []
        assert shown["note"] == (
            "No block-format counts at this step: the precision records were written before "
            "tb_gradviz recorded them (or with block_formats=False)."
        )


def test_the_time_view_colours_by_the_mxfp8_share_to_zero(browser, tensorboard):  # noqa: F811
    url, _, steps = tensorboard
    query = {"run": SPREAD, "field": "block_zero_share", "role": "input_gradient"}
    body = get_json(f"{url}/data/plugin/gradviz/timeline?{urllib.parse.urlencode(query)}")
    snapshot = get_json(f"{url}/data/plugin/gradviz/step?run={SPREAD}")
    colour = "block_zero_share/input_gradient"
    with gradviz_page(browser, url, 1400, 1000, f"gradviz&run={SPREAD}") as page:
        frame = tab(page)
        show_section(frame, "timeline")
        frame.locator('select[name="timeline-field"]').select_option(colour)
        view = wait_time_view(frame, SPREAD, colour=colour)
        rows = len(body["layers"])
        canvas = view.locator("canvas.timeline-canvas")
        assert canvas.get_attribute("aria-label").startswith(
            f"share that becomes zero in MXFP8 E4M3 of {rows} layers"
        )
        # The colour bar says what the colour is, and its unit.
        expect(view.locator(".timeline-colourbar figcaption")).to_have_text(
            "MXFP8 E4M3 share to zero of the input gradient, 0 to 100 %"
        )
        expect(view.locator('select[name="timeline-field"] option:checked')).to_have_text(
            "MXFP8 E4M3: share of the input gradient that becomes zero (blocks of 32)"
        )
        box = canvas.bounding_box()
        tip = frame.locator(".timeline-tip")
        for r, layer in enumerate(body["layers"]):
            tensors = [
                entry
                for entry in next(
                    item for item in snapshot["layers"] if item["layer"] == layer["layer"]
                )["tensors"].values()
                if entry["role"] == "input_gradient"
            ]
            zeros = sum(t["precision"]["block_formats"]["mxfp8_e4m3"]["to_zero"] for t in tensors)
            total = sum(t["precision"]["finite_nonzero"] for t in tensors)
            share = layer["block_zero_share"]["max"][-1]
            assert layer["format"] == "mxfp8_e4m3" and share == zeros / total
            canvas.hover(position={"x": box["width"] - 2, "y": (r + 0.5) * box["height"] / rows})
            pattern = (
                rf"^{layer['layer']}, step {steps[SPREAD]}: block_zero_share in mxfp8_e4m3 "
                r"([0-9.e+-]+)(; flags: .*)?$"
            )
            expect(tip).to_have_text(re.compile(pattern))
            shown = float(re.match(pattern, tip.inner_text())[1])
            assert shown == pytest.approx(share, rel=5e-3), (layer["layer"], shown, share)
        assert {layer["layer"]: layer["block_zero_share"]["max"][-1] for layer in body["layers"]}[
            "spread"
        ] == 0.5
