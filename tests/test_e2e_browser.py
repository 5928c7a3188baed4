"""End to end: train with the real callback, serve the logs with a real
TensorBoard, and read the GradViz tab in Chromium.

Expected numbers come from the event files (through TensorBoard's own event
reader, `eventdata`), not from the plugin under test.
"""

import re
import time

import eventdata
import numpy as np
import pytest
import synthetic
from browser import (  # noqa: F401 (fixture)
    ASIDE,
    COMPARE,
    GRID,
    PANELS,
    WAIT_MS,
    artifacts_dir,
    browser,
    expect,
    gradviz_page,
    runs_loaded,
    show_section,
    tab,
    wait_drawn,
)
from tbserver import running_tensorboard

from tb_gradviz.format import events, records, summaries

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PROBE_BATCH = 8
EPOCHS = 3
STEPS_PER_EPOCH = 4


# ---------------------------------------------------------------- logs


def _train_cnn(log_dir, seed):
    """A small CNN whose first pool sees continuous, ReLU-free values: no ties, so
    the 2x2/2 max pool's input gradient is exactly 75 % zeros."""
    import keras

    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((PROBE_BATCH * 8, 16, 16, 3)).astype("float32")
    y = rng.integers(0, 3, size=len(x))
    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(8, 3, padding="same", name="conv"),
            keras.layers.MaxPooling2D(2, name="pool"),
            keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv2"),
            keras.layers.AveragePooling2D(2, name="avg"),
            keras.layers.Flatten(),
            keras.layers.Dense(3, name="head"),
        ]
    )
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    import tb_gradviz

    callback = tb_gradviz.GradVizCallback(log_dir, probe_data=(x[:PROBE_BATCH], y[:PROBE_BATCH]))
    model.fit(
        x, y, batch_size=len(x) // STEPS_PER_EPOCH, epochs=EPOCHS, callbacks=[callback], verbose=0
    )
    return model


@pytest.fixture(scope="module")
def trained_logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    logdir = root / "logs"
    shapes = {}
    for run, seed in (("cnn_a", 0), ("cnn_b", 1)):
        model = _train_cnn(logdir / run, seed)
        for name in ("pool", "avg"):
            layer = model.get_layer(name)
            shapes[name] = {
                "input": (PROBE_BATCH, *layer.input.shape[1:]),
                "output": (PROBE_BATCH, *layer.output.shape[1:]),
            }
    return root, logdir, shapes


def _shape_text(shape):
    return "×".join(str(n) for n in shape)


def _percent_text(zeros, count):
    return f"{100 * zeros / count:.1f} %"


def _expected_zeros(log, layer, tensor, step):
    """The zero fraction at `step` as the tab prints it, from the event file."""
    stats = dict(eventdata.values(log, records.stats_tag(layer, tensor)))[step]
    decoded = records.decode_stats(stats)
    return _percent_text(decoded["zeros"], decoded["count"])


def test_layer_view_of_a_trained_cnn(browser, trained_logs):
    root, logdir, shapes = trained_logs
    steps = [STEPS_PER_EPOCH * (epoch + 1) for epoch in range(EPOCHS)]
    log = eventdata.load(logdir / "cnn_a")
    assert [
        s for s, _ in eventdata.values(log, records.stats_tag("pool", "input_gradient"))
    ] == steps

    ready = runs_loaded({"cnn_a": steps[-1], "cnn_b": steps[-1]})
    with (
        running_tensorboard(logdir, root / "tensorboard.log", ready) as url,
        gradviz_page(browser, url) as page,
    ):
        frame = tab(page)
        activation = frame.locator('.panel[data-tensor="activation"]')
        input_gradient = frame.locator('.panel[data-tensor="input_gradient"]')
        output_gradient = frame.locator('.panel[data-tensor="output_gradient"]')
        wait_drawn(frame, PANELS, run="cnn_a", layer="pool", step=steps[-1])

        # The max pool is chosen first, at the last step: forward output and MaxPoolGrad side by side.
        assert frame.get_by_label("Layer", exact=True).input_value() == "pool"
        assert frame.locator(".layer-name").text_content() == "pool"
        assert activation.locator(".side").text_content() == "output"
        assert activation.locator(".shape-value").text_content().strip() == _shape_text(
            shapes["pool"]["output"]
        )
        assert input_gradient.locator(".side").text_content() == "input"
        assert input_gradient.locator(".shape-value").text_content().strip() == _shape_text(
            shapes["pool"]["input"]
        )
        assert output_gradient.locator(".shape-value").text_content().strip() == _shape_text(
            shapes["pool"]["output"]
        )
        assert "MaxPoolGrad" in input_gradient.locator(".produced-by").text_content()
        for panel in (activation, input_gradient, output_gradient):
            assert panel.get_attribute("data-step") == str(steps[-1])
            assert panel.locator("svg.histogram rect.bar").count() > 0
        # Exact for a 2x2/2 pool without ties, and what the event file says.
        assert input_gradient.locator(".zero-fraction").text_content() == "75.0 %"
        assert _expected_zeros(log, "pool", "input_gradient", steps[-1]) == "75.0 %"
        assert activation.locator(".zero-fraction").text_content() == _expected_zeros(
            log, "pool", "activation", steps[-1]
        )
        # The card is fetched for the step shown (/routing?step=), after the panels.
        wait_drawn(frame, ASIDE, run="cnn_a", layer="pool", step=steps[-1])
        routing = frame.locator(".card.routing")
        assert "25.0 % of input positions" in routing.text_content()
        assert "mass conserved" in routing.text_content()
        assert "MaxPoolGrad" in frame.locator(".explanation").text_content()
        # The tie rule, with the backend and device that wrote the run.
        assert (
            "this run's backend (tensorflow on cpu) sends the gradient to the first of them in raster order"
            in (frame.locator(".explanation").text_content())
        )

        # The tab opens on "The layer": the other sections are hidden and not yet fetched.
        expect(frame.get_by_role("tab", name="The layer")).to_have_attribute(
            "aria-selected", "true"
        )
        expect(frame.locator("table.layer-grid")).to_have_count(0)
        page.screenshot(path=str(artifacts_dir() / "gradviz_layer_view.png"))

        histogram = input_gradient.locator("svg.histogram")
        assert "linear count axis" in histogram.get_attribute("aria-label")
        frame.get_by_label("Log count axis", exact=True).check()
        wait_drawn(frame, PANELS, layer="pool", step=steps[-1], logarithmic=True)
        assert "log count axis" in histogram.get_attribute("aria-label")
        frame.get_by_label("Log count axis", exact=True).uncheck()
        wait_drawn(frame, PANELS, layer="pool", step=steps[-1], logarithmic=False)

        # The slider, from the keyboard: Home goes to the first logged step.
        slider = frame.get_by_label("Step", exact=True)
        last_stats = activation.locator(".stats").text_content()
        slider.focus()
        slider.press("Home")
        wait_drawn(frame, PANELS, layer="pool", step=steps[0])
        expect(frame.locator(".step-value")).to_have_text(re.compile(f"^{steps[0]} "))
        for panel in (activation, input_gradient, output_gradient):
            assert panel.get_attribute("data-step") == str(steps[0])
        assert activation.locator(".stats").text_content() != last_stats
        assert activation.locator(".zero-fraction").text_content() == _expected_zeros(
            log, "pool", "activation", steps[0]
        )
        slider.press("ArrowRight")
        wait_drawn(frame, PANELS, layer="pool", step=steps[1])
        assert activation.get_attribute("data-step") == str(steps[1])

        # Another layer: the average pool, whose gradient is spread, not routed.
        frame.get_by_label("Layer", exact=True).select_option("avg")
        wait_drawn(frame, PANELS, run="cnn_a", layer="avg", step=steps[1])
        assert activation.locator(".shape-value").text_content().strip() == _shape_text(
            shapes["avg"]["output"]
        )
        assert input_gradient.locator(".shape-value").text_content().strip() == _shape_text(
            shapes["avg"]["input"]
        )
        assert input_gradient.locator(".zero-fraction").text_content() == _expected_zeros(
            log, "avg", "input_gradient", steps[1]
        )
        # Issue 11, defect 1: the average pool's captions name its ops (the writer says "average").
        assert (
            input_gradient.locator(".produced-by").text_content()
            == "AvgPoolGrad output (backward pass)"
        )
        assert activation.locator(".produced-by").text_content() == "AvgPool output (forward pass)"
        wait_drawn(frame, ASIDE, run="cnn_a", layer="avg", step=steps[1])
        assert "AvgPoolGrad" in frame.locator(".explanation").text_content()

        # The grid of all layers at this step ("Across layers"), and its way back to the max pool
        # in "The layer".
        show_section(frame, "layers")
        grid = wait_drawn(frame, GRID, run="cnn_a", step=steps[1], layer="avg")
        assert grid.locator("table.layer-grid tbody tr").count() == 2
        grid.get_by_role("button", name="pool", exact=True).click()
        wait_drawn(frame, PANELS, run="cnn_a", layer="pool", step=steps[1])
        assert frame.get_by_label("Layer", exact=True).input_value() == "pool"

        # The overlay of the two runs ("Compare runs").
        show_section(frame, "compare")
        charts = wait_drawn(frame, COMPARE, run="cnn_a", layer="pool", against="cnn_b")
        assert frame.get_by_label("Against run", exact=True).input_value() == "cnn_b"
        assert charts.locator(".run-legend li").all_text_contents() == ["cnn_a", "cnn_b"]
        assert charts.locator("path.line").count() == 2

        show_section(frame, "layer")
        slider.press("End")
        wait_drawn(frame, PANELS, layer="pool", step=steps[-1])
        assert activation.get_attribute("data-step") == str(steps[-1])

        # TensorBoard's own dark-mode switch reaches into the tab's iframe.
        page.get_by_role("button", name="Menu for changing light or dark theme").click()
        page.get_by_role("menuitem", name="Dark").click()
        frame.locator("html.dark-mode").wait_for(state="attached")
        page.get_by_role("menu").wait_for(state="detached")
        background = frame.locator("body").evaluate(
            "body => getComputedStyle(body).backgroundColor"
        )
        assert background == "rgb(48, 48, 48)"
        page.screenshot(path=str(artifacts_dir() / "gradviz_layer_view_dark.png"))


# ---------------------------------------------------------------- hostile names

PAYLOAD_LAYER = "<img src=x onerror=alert(1)>"
PAYLOAD_RUN = '"><svg onload=alert(2)>'


def _write_run_with_layer_name(run_dir, layer, steps=3):
    """A synthetic 2x2/2 max pool named `layer`, written through the format functions."""
    rng = np.random.default_rng(0)
    pooling = {
        "type": "max",
        "global": False,
        "pool_size": [2, 2],
        "strides": [2, 2],
        "padding": "valid",
        "data_format": "channels_last",
    }
    common = {
        "layer_index": 0,
        "layer_class": "MaxPooling2D",
        "layer_dtype": "float32",
        "pooling": pooling,
    }
    log = events.EventLog(run_dir)
    try:
        for step in range(1, steps + 1):
            activation = rng.standard_normal((2, 4, 4, 3))
            output_gradient = rng.standard_normal((2, 4, 4, 3)) * 1e-3
            input_gradient = np.zeros((2, 8, 8, 3))
            input_gradient[:, ::2, ::2, :] = output_gradient
            written = []
            for role, array in zip(
                records.TENSOR_ROLES, (activation, input_gradient, output_gradient)
            ):
                content = dict(common, role=role, index=0, shape=list(array.shape), dtype="float32")
                written += events.tensor_records(
                    layer,
                    role,
                    summaries.linear_histogram(array),
                    summaries.stats_vector(array),
                    content,
                )
            routing = np.array(
                [
                    input_gradient.size,
                    activation.size,
                    activation.size,
                    0,
                    input_gradient.sum(),
                    output_gradient.sum(),
                ]
            )
            written += events.routing_records(layer, routing, common)
            log.write(step, written)
    finally:
        log.close()


def test_hostile_names_render_as_text(browser, tmp_path):
    logdir = tmp_path / "logs"
    _write_run_with_layer_name(logdir / PAYLOAD_RUN, PAYLOAD_LAYER)
    with (
        running_tensorboard(
            logdir, tmp_path / "tensorboard.log", runs_loaded({PAYLOAD_RUN: 3})
        ) as url,
        gradviz_page(browser, url, 1400, 900) as page,
    ):
        frame = tab(page)
        wait_drawn(frame, PANELS, run=PAYLOAD_RUN, layer=PAYLOAD_LAYER, step=3)
        show_section(frame, "layers")
        wait_drawn(frame, GRID, run=PAYLOAD_RUN, step=3)
        assert frame.locator(".layer-name").text_content() == PAYLOAD_LAYER
        assert frame.get_by_label("Layer", exact=True).input_value() == PAYLOAD_LAYER
        assert frame.get_by_label("Run", exact=True).input_value() == PAYLOAD_RUN
        assert frame.get_by_role("button", name=PAYLOAD_LAYER, exact=True).count() == 1
        assert (
            frame.locator("h2", has_text="All layers of").text_content()
            == f"All layers of {PAYLOAD_RUN} at step 3"
        )
        # Had the name been parsed as HTML there would be an <img> (and a request for "x") or an <svg onload>.
        assert frame.locator("img").count() == 0
        assert frame.locator("svg[onload]").count() == 0
        assert (
            frame.locator(".panel[data-tensor='input_gradient'] .zero-fraction").text_content()
            == "75.0 %"
        )

        # A run that appears later shows up after TensorBoard's reload button, once TensorBoard
        # has read it: each click waits a while for the run list to show it.
        synthetic.write_run(logdir / "later", layers=1, steps=2)
        run_options = frame.get_by_label("Run", exact=True).locator("option")
        deadline = time.monotonic() + WAIT_MS / 1000
        while True:
            page.locator('button[title^="Last Updated"]').click()
            try:
                expect(run_options).to_have_text([PAYLOAD_RUN, "later"], timeout=5_000)
                break
            except AssertionError:
                assert time.monotonic() < deadline, run_options.all_text_contents()
        wait_drawn(frame, PANELS, run=PAYLOAD_RUN, layer=PAYLOAD_LAYER)
        assert frame.locator(".layer-name").text_content() == PAYLOAD_LAYER

        # Outside TensorBoard (no host page to ask for runs) the tab shows every run. A page of
        # its own: navigating this one would cancel what the host's reload still has in flight.
        with gradviz_page(browser, url, 1400, 900, standalone=True) as plugin:
            wait_drawn(plugin, PANELS, run=PAYLOAD_RUN, layer=PAYLOAD_LAYER)
            assert plugin.locator(".layer-name").text_content() == PAYLOAD_LAYER
            assert plugin.get_by_label("Run", exact=True).locator("option").all_text_contents() == [
                PAYLOAD_RUN,
                "later",
            ]
            assert plugin.locator("img").count() == 0
