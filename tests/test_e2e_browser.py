"""End to end: train with the real callback, serve the logs with a real
TensorBoard, and read the GradViz tab in Chromium.

Expected numbers come from the event files (through TensorBoard's own event
reader, `eventdata`), not from the plugin under test.
"""

import contextlib
import os
import pathlib
import re
import shutil
import time

import eventdata
import numpy as np
import pytest
import synthetic
from tbserver import get_json, running_tensorboard

from tb_gradviz.format import events, records, summaries

try:
    from playwright.sync_api import expect
except ImportError:  # the `browser` fixture says so, and fails in CI
    expect = None

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
# Headless Debian Chromium as root, with nothing that reaches for the network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PLUGIN_FRAME = 'iframe[src*="plugin_entry.html?name=gradviz"]'

UI_TIMEOUT_MS = 20_000

PROBE_BATCH = 8
EPOCHS = 3
STEPS_PER_EPOCH = 4
REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


def _missing_browser(reason):
    # In CI a missing browser is a broken machine, not a reason to pass.
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}, and CI=true: browser tests must run in CI")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        _missing_browser(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing_browser("Python playwright is not installed")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield chromium
        finally:
            chromium.close()


class PageProblems:
    """Collects what must not happen on a page: errors, failed requests, dialogs."""

    # The browser asks for /favicon.ico of a page that names none (the plugin's
    # entry page opened on its own); TensorBoard has none to give.
    IGNORED_URL_ENDINGS = ("/favicon.ico",)

    def __init__(self, page):
        self.errors = []
        self.dialogs = []
        page.on("pageerror", lambda error: self.errors.append(f"pageerror: {error}"))
        page.on("console", self._on_console)
        page.on(
            "requestfailed",
            lambda request: self._add(request.url, f"request failed: {request.url}"),
        )
        page.on(
            "response",
            lambda response: (
                response.status >= 400
                and self._add(response.url, f"HTTP {response.status}: {response.url}")
            ),
        )

        def on_dialog(dialog):
            self.dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", on_dialog)

    def _add(self, url, problem):
        if not url.endswith(self.IGNORED_URL_ENDINGS):
            self.errors.append(problem)

    def _on_console(self, message):
        if message.type == "error":
            self._add(
                message.location.get("url", ""),
                f"console error: {message.text} at {message.location}",
            )


def _artifacts_dir():
    path = pathlib.Path(os.environ.get("TB_GRADVIZ_ARTIFACTS") or REPO_ROOT / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def gradviz_page(browser, url, width=1600, height=1000, fragment="gradviz"):
    """A new page on the GradViz tab of the TensorBoard at `url`, closed on leaving.

    `fragment` is the URL's (`gradviz&view=layers` opens "Across layers").
    Leaving the block normally asserts that no error, failed request or
    dialog happened on the page (`PageProblems`).
    """
    page = browser.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(UI_TIMEOUT_MS)
    problems = PageProblems(page)
    try:
        page.goto(f"{url}/#{fragment}")
        yield page
        assert problems.errors == []
        assert problems.dialogs == []
    finally:
        page.close()


def keep_screenshot(locator, path):
    """Saves a screenshot of `locator` at `path` (a test's tmp folder), and a copy in TB_GRADVIZ_ARTIFACTS when set."""
    locator.screenshot(path=str(path))
    if os.environ.get("TB_GRADVIZ_ARTIFACTS"):
        folder = pathlib.Path(os.environ["TB_GRADVIZ_ARTIFACTS"])
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, folder / path.name)
    print(f"\nscreenshot: {path}")


def read_when_ready(page, selector, reader, has=None):
    """`reader(element)` of the tab's first `selector` element, once laid out (and holding `has`).

    The tab redraws a chart by replacing its element (a new step, a new
    width from the resize observer), so a locator resolved before a redraw
    can point at a detached element that measures 0. Here the element is
    looked up, checked and read in one evaluation in the page, which no
    redraw can interleave with; Playwright polls it until it returns.

    Args:
      page: the page holding the tab's frame.
      selector: a CSS selector inside the tab.
      reader: a JavaScript function of the element returning a JSON-able, truthy value.
      has: a CSS selector that must match inside the element, or None.
    """
    handle = page.wait_for_function(
        f"""([frameSelector, selector, has]) => {{
      const tab = document.querySelector(frameSelector)?.contentDocument;
      const element = tab?.querySelector(selector);
      if (!element?.isConnected || element.getBoundingClientRect().width === 0) return null;
      if (has !== null && element.querySelector(has) === null) return null;
      return ({reader})(element);
    }}""",
        arg=[PLUGIN_FRAME, selector, has],
    )
    return handle.json_value()


def _runs_loaded(expected_max_step):
    """A readiness check: every run lists every layer, up to its last step."""

    def ready(url):
        runs = get_json(f"{url}/data/plugin/gradviz/runs")["runs"]
        return len(runs) == len(expected_max_step) and all(
            layer["max_step"] == expected_max_step[run["run"]]
            for run in runs
            for layer in run["layers"]
        )

    return ready


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

    ready = _runs_loaded({"cnn_a": steps[-1], "cnn_b": steps[-1]})
    with (
        running_tensorboard(logdir, root / "tensorboard.log", ready) as url,
        gradviz_page(browser, url) as page,
    ):
        frame = page.frame_locator(PLUGIN_FRAME)
        activation = frame.locator('.panel[data-tensor="activation"]')
        input_gradient = frame.locator('.panel[data-tensor="input_gradient"]')
        output_gradient = frame.locator('.panel[data-tensor="output_gradient"]')
        input_gradient.wait_for()

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
        routing = frame.locator(".card.routing")
        expect(routing).to_contain_text("25.0 % of input positions")
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
        page.screenshot(path=str(_artifacts_dir() / "gradviz_layer_view.png"))

        histogram = input_gradient.locator("svg.histogram")
        expect(histogram).to_have_attribute("aria-label", re.compile("linear count axis"))
        frame.get_by_label("Log count axis", exact=True).check()
        expect(histogram).to_have_attribute("aria-label", re.compile("log count axis"))
        frame.get_by_label("Log count axis", exact=True).uncheck()

        # The slider, from the keyboard: Home goes to the first logged step.
        slider = frame.get_by_label("Step", exact=True)
        last_stats = activation.locator(".stats").text_content()
        slider.focus()
        slider.press("Home")
        expect(frame.locator(".step-value")).to_have_text(re.compile(f"^{steps[0]} "))
        for panel in (activation, input_gradient, output_gradient):
            expect(panel).to_have_attribute("data-step", str(steps[0]))
        assert activation.locator(".stats").text_content() != last_stats
        assert activation.locator(".zero-fraction").text_content() == _expected_zeros(
            log, "pool", "activation", steps[0]
        )
        slider.press("ArrowRight")
        expect(activation).to_have_attribute("data-step", str(steps[1]))

        # Another layer: the average pool, whose gradient is spread, not routed.
        frame.get_by_label("Layer", exact=True).select_option("avg")
        frame.locator(".layer-name", has_text="avg").wait_for()
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
        expect(frame.locator(".explanation")).to_contain_text("AvgPoolGrad")

        # The grid of all layers at this step ("Across layers"), and its way back to the max pool
        # in "The layer".
        frame.get_by_role("tab", name="Across layers").click()
        grid = frame.locator("table.layer-grid")
        expect(grid.locator("tbody tr")).to_have_count(2, timeout=UI_TIMEOUT_MS)
        grid.get_by_role("button", name="pool", exact=True).click()
        frame.locator(".layer-name", has_text="pool").wait_for()
        assert frame.get_by_label("Layer", exact=True).input_value() == "pool"

        # The overlay of the two runs ("Compare runs").
        frame.get_by_role("tab", name="Compare runs").click()
        assert frame.get_by_label("Against run", exact=True).input_value() == "cnn_b"
        expect(frame.locator(".run-legend li")).to_have_text(
            ["cnn_a", "cnn_b"], timeout=UI_TIMEOUT_MS
        )
        expect(frame.locator(".compare-charts path.line")).to_have_count(2)

        frame.get_by_role("tab", name="The layer").click()
        slider.press("End")
        expect(activation).to_have_attribute("data-step", str(steps[-1]))

        # TensorBoard's own dark-mode switch reaches into the tab's iframe.
        page.get_by_role("button", name="Menu for changing light or dark theme").click()
        page.get_by_role("menuitem", name="Dark").click()
        frame.locator("html.dark-mode").wait_for(state="attached")
        page.get_by_role("menu").wait_for(state="detached")
        background = frame.locator("body").evaluate(
            "body => getComputedStyle(body).backgroundColor"
        )
        assert background == "rgb(48, 48, 48)"
        page.screenshot(path=str(_artifacts_dir() / "gradviz_layer_view_dark.png"))


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
            logdir, tmp_path / "tensorboard.log", _runs_loaded({PAYLOAD_RUN: 3})
        ) as url,
        gradviz_page(browser, url, 1400, 900) as page,
    ):
        frame = page.frame_locator(PLUGIN_FRAME)
        frame.locator('.panel[data-tensor="input_gradient"]').wait_for()
        frame.get_by_role("tab", name="Across layers").click()
        frame.locator("table.layer-grid").wait_for()
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
        page.wait_for_timeout(500)  # let a stray onerror fire, were there one

        # A run that appears later shows up after TensorBoard's reload button.
        synthetic.write_run(logdir / "later", layers=1, steps=2)
        run_options = frame.get_by_label("Run", exact=True).locator("option")
        deadline = time.monotonic() + 30
        while run_options.all_text_contents() != [PAYLOAD_RUN, "later"]:
            assert time.monotonic() < deadline, (
                f"runs after reload: {run_options.all_text_contents()}"
            )
            page.locator('button[title^="Last Updated"]').click()
            page.wait_for_timeout(1000)
        assert frame.locator(".layer-name").text_content() == PAYLOAD_LAYER

        # Outside TensorBoard (no host page to ask for runs) the tab shows every run.
        page.goto(f"{url}/data/plugin_entry.html?name=gradviz")
        page.locator(".layer-name").wait_for()
        assert page.locator(".layer-name").text_content() == PAYLOAD_LAYER
        assert page.get_by_label("Run", exact=True).locator("option").all_text_contents() == [
            PAYLOAD_RUN,
            "later",
        ]
        assert page.locator("img").count() == 0
        page.wait_for_timeout(500)  # for any late error before the page is judged
