"""The weights of `weights=True` in the GradViz tab, in a real TensorBoard and Chromium.

Two runs of the same small CNN (Conv2D with ReLU, BatchNormalization,
MaxPooling2D, Flatten, Dense), one logged with `weights=True` and one
without. The layer view's weights row is checked against the event files
(TensorBoard's own event reader, `eventdata`): each weight's statistics and
its update records. The gradient flow's weight-gradient and update-ratio
panels are checked against /step. The run without weights must look as the
tab looked before weights existed. A screenshot of the weights row goes to
the test's tmp folder (and to TB_GRADVIZ_ARTIFACTS when set).
"""

import math

import eventdata
import pytest
import small_runs
from browser import (  # noqa: F401 (fixture)
    COMPARE,
    GRID,
    PANELS,
    WEIGHTS_ROW,
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
from test_flow_browser import UPDATE_PANEL, _check_points, _read_chart, _step

from tb_gradviz.format import records

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WEIGHTS_RUN, PLAIN_RUN = "cnn_weights", "cnn_plain"
PROBE_BATCH = 8
BATCH = 16
EPOCHS = 3
STEPS_PER_EPOCH = 2
STEPS = [STEPS_PER_EPOCH * (epoch + 1) for epoch in range(EPOCHS)]
LAYERS = ["conv", "bn", "pool", "flatten", "head"]
WEIGHTS = {"conv": ["kernel", "bias"], "bn": ["gamma", "beta"], "head": ["kernel", "bias"]}
SIZES = {
    ("conv", "kernel"): 3 * 3 * 3 * 4,
    ("conv", "bias"): 4,
    ("bn", "gamma"): 4,
    ("bn", "beta"): 4,
    ("head", "kernel"): 4 * 4 * 4 * 3,
    ("head", "bias"): 3,
}


def _train(log_dir, weights):
    small_runs.fit_weights_cnn(
        log_dir, 0, BATCH, PROBE_BATCH, STEPS_PER_EPOCH, EPOCHS, weights=weights
    )


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    root = tmp_path_factory.mktemp("weights")
    logdir = root / "logs"
    _train(logdir / WEIGHTS_RUN, weights=True)
    _train(logdir / PLAIN_RUN, weights=False)
    ready = runs_loaded({WEIGHTS_RUN: STEPS[-1], PLAIN_RUN: STEPS[-1]})
    with running_tensorboard(logdir, root / "tensorboard.log", ready) as url:
        yield url, root, eventdata.load(logdir / WEIGHTS_RUN)


def _open(frame, run, layer):
    """Opens `run`'s `layer` in the layer view, at the last step, once its panels are drawn."""
    frame.get_by_label("Run", exact=True).select_option(run)
    wait_drawn(frame, PANELS, run=run)
    frame.get_by_label("Layer", exact=True).select_option(layer)
    wait_drawn(frame, PANELS, run=run, layer=layer, step=STEPS[-1])


def _update_record(log, layer, weight, step):
    """`{field: value}` of a weight's update record at `step`, from the event file."""
    value = dict(eventdata.values(log, records.update_tag(layer, weight)))[step]
    return {name: column[0].item() for name, column in records.update_columns(value[None]).items()}


def _percent_text(zeros, count):
    return f"{100 * zeros / count:.1f} %"


# Everything the weights row shows that stands for a number, read in one evaluation.
_READ_WEIGHTS = """section => [...section.querySelectorAll('.weight-row')].map((row) => {
  const update = row.querySelector('.update-panel');
  const number = (value) => (value === undefined ? null : Number(value));
  return {
    weight: row.dataset.weight,
    panels: [...row.querySelectorAll('.panel[data-tensor]')].map((panel) => ({
      tensor: panel.dataset.tensor, step: number(panel.dataset.step), title: panel.querySelector('h3').textContent,
      side: panel.querySelector('.side').textContent, shape: panel.querySelector('.shape-value').textContent.trim(),
      zeros: panel.querySelector('.zero-fraction').textContent,
      count: panel.querySelector('.stats dd').textContent, bars: panel.querySelectorAll('rect.bar').length})),
    update: {
      step: number(update.dataset.step), ratio: number(update.dataset.updateRatio),
      weightNorm: number(update.dataset.weightNorm), updateNorm: number(update.dataset.updateNorm),
      interval: number(update.dataset.interval),
      ratioText: update.querySelector('.update-ratio')?.textContent ?? null,
      detail: update.querySelector('.update-detail')?.textContent ?? null,
      empty: update.querySelector('.empty')?.textContent ?? null,
      dots: [...update.querySelectorAll('.update-dot')].map((dot) => [Number(dot.dataset.step), Number(dot.dataset.value)]),
      guides: update.querySelectorAll('.guide').length,
      guideLabel: update.querySelector('.guide-label')?.textContent ?? null,
      current: update.querySelector('.current-step') !== null},
  };
})"""


def _read_weights(frame, run, layer, step):
    """The weights row, once it says it shows `run`'s `layer` at `step`."""
    return read_drawn(frame, WEIGHTS_ROW, _READ_WEIGHTS, run=run, layer=layer, step=step)


def _shown_number(text):
    """A number as model.formatNumber prints it ("0.0116", "3.7e-4", "−2")."""
    return float(text.replace("−", "-"))


def test_weights_row_shows_the_recorded_weights_and_updates(browser, tensorboard):
    url, root, log = tensorboard
    # Tall enough that the tab's frame holds the weights row whole, for its screenshot.
    with gradviz_page(browser, url, 1600, 2200) as page:
        frame = tab(page)
        for layer, weights in WEIGHTS.items():
            _open(frame, WEIGHTS_RUN, layer)
            rows = _read_weights(frame, WEIGHTS_RUN, layer, STEPS[-1])
            assert [row["weight"] for row in rows] == weights
            for row in rows:
                weight = row["weight"]
                # Its values and its gradient, as the layer's tensors are shown, at the last step.
                assert [p["tensor"] for p in row["panels"]] == [
                    f"weight/{weight}",
                    f"weight_gradient/{weight}",
                ]
                assert [p["title"] for p in row["panels"]] == [
                    f"{weight} (values)",
                    f"Gradient w.r.t. {weight}",
                ]
                for panel in row["panels"]:
                    stats = records.decode_stats(
                        dict(eventdata.values(log, records.stats_tag(layer, panel["tensor"])))[
                            STEPS[-1]
                        ]
                    )
                    assert panel["step"] == STEPS[-1] and panel["side"] == "weight"
                    assert stats["count"] == SIZES[(layer, weight)]
                    assert panel["count"] == f"{SIZES[(layer, weight)]:,}"
                    assert panel["zeros"] == _percent_text(stats["zeros"], stats["count"])
                    assert panel["bars"] > 0
                # The update at the last step: the event file's record, to the last bit.
                recorded = _update_record(log, layer, weight, STEPS[-1])
                update = row["update"]
                assert update["step"] == STEPS[-1]
                assert update["ratio"] == recorded["update_ratio"]
                assert update["weightNorm"] == recorded["weight_norm"]
                assert update["updateNorm"] == recorded["update_norm"]
                assert update["interval"] == recorded["interval"] == STEPS_PER_EPOCH
                assert math.isclose(
                    _shown_number(update["ratioText"]), recorded["update_ratio"], rel_tol=5e-3
                )
                assert update["detail"].startswith(f"Update at step {STEPS[-1]}: |Δw| ")
                assert update["detail"].endswith(f", over {STEPS_PER_EPOCH} steps")
                # The ratio over steps: a dot per update record (none at the first log event), and the 1e-3 guide.
                assert update["dots"] == [
                    [step, _update_record(log, layer, weight, step)["update_ratio"]]
                    for step in STEPS[1:]
                ]
                assert update["guides"] == 1 and update["guideLabel"] == "10⁻³: usual size"
                assert update["current"]
        hint = frame.locator(".weights-section .hint").text_content()
        assert (
            "About 10⁻³ per step is the usual healthy size" in hint
            and "10⁻⁵ or less means the weight barely moves" in hint
        )
        keep_screenshot(frame.locator(".weights-section"), root / "weights.png")

        # At the first log event a weight has values and a gradient, but no update yet.
        slider = frame.get_by_label("Step", exact=True)
        slider.focus()
        slider.press("Home")
        rows = _read_weights(frame, WEIGHTS_RUN, layer, STEPS[0])
        assert all(
            row["update"]["step"] is None
            and "No update at or before this step" in row["update"]["empty"]
            for row in rows
        )
        assert all(not row["update"]["current"] for row in rows)
        slider.press("End")

        # A layer without weights: no weights row at all.
        _open(frame, WEIGHTS_RUN, "pool")
        wait_drawn(frame, WEIGHTS_ROW, run=WEIGHTS_RUN, layer="pool", step=STEPS[-1])
        assert frame.locator(".weights-section").is_hidden()
        assert frame.locator(".weight-row").count() == 0

        # The comparison keeps to the layer's own tensors; the weights' are offered apart.
        _open(frame, WEIGHTS_RUN, "conv")
        show_section(frame, "compare")
        assert frame.get_by_label("Tensor", exact=True).input_value() == "input_gradient"
        picker = frame.get_by_label("Tensor", exact=True)
        assert picker.locator(":scope > option").all_text_contents() == [
            "activation",
            "input_gradient",
            "output_gradient",
        ]
        assert picker.locator('optgroup[label="Weights"] option').all_text_contents() == [
            "weight/kernel",
            "weight/bias",
            "weight_gradient/kernel",
            "weight_gradient/bias",
        ]
        # A weight's gradient compared with a run logged without weights: that run is not offered.
        picker.select_option("weight_gradient/kernel")
        assert frame.get_by_label("Against run", exact=True).locator(
            "option"
        ).all_text_contents() == ["(none)"]
        charts = wait_drawn(
            frame, COMPARE, run=WEIGHTS_RUN, layer="conv", tensor="weight_gradient/kernel"
        )
        assert charts.locator(".run-legend li").all_text_contents() == [WEIGHTS_RUN]
        picker.select_option("input_gradient")
        wait_drawn(frame, COMPARE, layer="conv", tensor="input_gradient", against=PLAIN_RUN)
        assert charts.locator(".run-legend li").all_text_contents() == [WEIGHTS_RUN, PLAIN_RUN]

        # The grid's columns stay the three roles, with each layer's update ratio beside them.
        show_section(frame, "layers")
        grid = wait_drawn(frame, GRID, run=WEIGHTS_RUN, step=STEPS[-1]).locator("table.layer-grid")
        headers = grid.locator("thead th").all_text_contents()
        assert headers[-1] == "Update ratio" and len(headers) == 9
        snapshot = _step(url, WEIGHTS_RUN)
        cells = grid.locator("tbody tr").evaluate_all(
            "rows => rows.map((row) => row.querySelector('.update-cell').dataset.value ?? null)"
        )
        assert cells == [
            None if layer["update_ratio"] is None else str(layer["update_ratio"])
            for layer in snapshot["layers"]
        ]
        assert grid.locator(".grid-tensor").count() == 3 * len(LAYERS)


def test_gradient_flow_shows_weight_gradients_and_update_ratios(browser, tensorboard):
    url, root, _ = tensorboard
    with gradviz_page(browser, url, 1600, 1400, fragment="gradviz&view=layers") as page:
        frame = tab(page)
        frame.get_by_label("Run", exact=True).select_option(WEIGHTS_RUN)
        snapshot = _step(url, WEIGHTS_RUN)
        chart = _read_chart(frame, run=WEIGHTS_RUN, step=STEPS[-1])
        assert [panel["role"] for panel in chart["panels"]] == [
            "output_gradient",
            "input_gradient",
            "activation",
            "weight_gradient",
            UPDATE_PANEL,
        ]
        points = _check_points(chart, snapshot, WEIGHTS_RUN)
        ratios = {p["layer"]: p["value"] for p in points if p["role"] == UPDATE_PANEL}
        assert ratios == {
            layer["layer"]: layer["update_ratio"]
            for layer in snapshot["layers"]
            if layer["update_ratio"] is not None
        }
        assert sorted(ratios) == sorted(WEIGHTS)
        rms = {
            p["layer"]: p["value"]
            for p in points
            if p["role"] == "weight_gradient" and p["stat"] == "rms"
        }
        assert rms == {
            layer["layer"]: layer["flow"]["weight_gradient"]["rms"]
            for layer in snapshot["layers"]
            if "weight_gradient" in layer["flow"]
        }
        assert sorted(rms) == sorted(WEIGHTS)
        # Layers without weights are stepped over: one line across conv, bn and head.
        assert frame.locator("path.flow-line.series-0.pin-0.stat-update_ratio").count() == 1
        assert frame.locator(".update-panel .guide-label").text_content() == "10⁻³: usual size"
        assert (
            "About 10⁻³ per step is the usual healthy size"
            in frame.locator(".flow-update-note").text_content()
        )
        keep_screenshot(frame.locator(".flow-section"), root / "gradient_flow_weights.png")

        # At the first log event there is no update yet: the panel stays, empty.
        slider = frame.get_by_label("Step", exact=True)
        slider.focus()
        slider.press("Home")
        chart = _read_chart(frame, run=WEIGHTS_RUN, step=STEPS[0])
        assert [panel["role"] for panel in chart["panels"]][-1] == UPDATE_PANEL
        _check_points(chart, _step(url, WEIGHTS_RUN, STEPS[0]), WEIGHTS_RUN)
        assert not [p for p in chart["points"] if p["role"] == UPDATE_PANEL]
        assert (
            "no update at or before this step"
            in frame.locator(".update-panel .empty-text").text_content()
        )


def test_a_run_without_weights_looks_as_before(browser, tensorboard):
    url, _, _ = tensorboard
    runs = {run["run"]: run for run in get_json(f"{url}/data/plugin/gradviz/runs")["runs"]}
    assert all(
        layer["weights"] == [] and layer["updates"] == [] for layer in runs[PLAIN_RUN]["layers"]
    )
    with gradviz_page(browser, url) as page:
        frame = tab(page)
        _open(frame, PLAIN_RUN, "conv")
        assert frame.locator(".panels .panel").count() == 3
        assert frame.locator(".weights-section").is_hidden()
        assert frame.locator(".weight-row, .update-panel, .update-chart").count() == 0
        assert frame.locator(".heatmap-figure").count() == 3

        show_section(frame, "layers")
        chart = _read_chart(frame, run=PLAIN_RUN, step=STEPS[-1])
        assert [panel["role"] for panel in chart["panels"]] == [
            "output_gradient",
            "input_gradient",
            "activation",
        ]
        _check_points(chart, _step(url, PLAIN_RUN), PLAIN_RUN)
        assert frame.locator(".flow-update-note").count() == 0
        grid = wait_drawn(frame, GRID, run=PLAIN_RUN, step=STEPS[-1])
        assert "Update ratio" not in grid.locator("table.layer-grid thead").text_content()

        show_section(frame, "compare")
        picker = frame.get_by_label("Tensor", exact=True)
        assert picker.locator("option").all_text_contents() == [
            "activation",
            "input_gradient",
            "output_gradient",
        ]
        assert picker.locator("optgroup").count() == 0
