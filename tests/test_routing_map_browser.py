"""The routing-map view (issue 12) in a real TensorBoard and Chromium.

The logs come from ResNet50's own stem: `keras.applications.ResNet50(weights=None)`
cut after `pool1_pool` (ZeroPadding2D(1) then a 3x3 max pool with stride 2,
over BatchNorm + ReLU: whole windows of zeros tie), with a small head that
adds a 2x2/2 max pool and a global average pool. At 64 px `pool1_pool` sees
34x34, as in the demo's ResNet50; a second run at 224 px has the 112x112 map
(114x114 padded), cropped to the 64 KiB a layer may write. Fitting the stem
takes seconds where the demo's whole ResNet50 takes minutes.

What the view says is checked against what /routing_map serves: the window
under the pointer, its winner, the gradient it sent, its values; a
screenshot of each pool is kept in the test's tmp folder (and in
TB_GRADVIZ_ARTIFACTS when set).
"""

import math
import re
import urllib.parse

import numpy as np
import pytest
from browser import (  # noqa: F401 (fixture)
    PANELS,
    ROUTING_MAP,
    browser,
    gradviz_page,
    keep_screenshot,
    runs_loaded,
    tab,
    wait_drawn,
)
from tbserver import get_json, running_tensorboard

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RUN, RUN_224 = "resnet50_stem", "resnet50_stem_224"
BATCH = 8
STEPS_PER_EPOCH, EPOCHS = 2, 2
STEPS = [2, 4]
# The tooltip prints 3 significant digits.
DIGITS = 5e-3
# A pointer move over the 112x112 map redraws the highlight and the tooltip; a
# channel switch shades every cell again. Bounds with room for a busy machine.
HOVER_BOUND_MS = 20
DRAW_BOUND_MS = 300


# ---------------------------------------------------------------- logs


def _fit_stem(log_dir, image_size, layers, batch=BATCH, **map_options):
    """ResNet50's layers up to pool1_pool, then a ReLU convolution, a 2x2/2 max pool, a global
    average pool and a classifier, fitted on the demo's patterns with GradVizCallback."""
    import keras

    import tb_gradviz
    from tb_gradviz import demos

    keras.utils.set_random_seed(0)
    resnet = keras.applications.ResNet50(
        weights=None, input_shape=(image_size, image_size, 3), classes=4
    )
    hidden = resnet.get_layer("pool1_pool").output
    hidden = keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv2")(hidden)
    hidden = keras.layers.MaxPooling2D(2, name="pool2")(hidden)
    hidden = keras.layers.GlobalAveragePooling2D(name="avg_pool")(hidden)
    model = keras.Model(resnet.inputs, keras.layers.Dense(4, name="predictions")(hidden))
    model.compile(
        keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    x, y = demos.pattern_images(batch * STEPS_PER_EPOCH, image_size)
    callback = tb_gradviz.GradVizCallback(
        log_dir, probe_data=(x[:batch], y[:batch]), layers=layers, **map_options
    )
    model.fit(x, y, batch_size=batch, epochs=EPOCHS, callbacks=[callback], verbose=0)


@pytest.fixture(scope="module")
def stem_logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("routing_map")
    logdir = root / "logs"
    _fit_stem(logdir / RUN, 64, ["pool1_pool", "pool2", "avg_pool"])
    # One channel: the largest crop the budget allows.
    _fit_stem(logdir / RUN_224, 224, ["pool1_pool"], batch=2, routing_map_channels=1)
    return root, logdir


# ---------------------------------------------------------------- reading the view


def _number(text):
    """A number as the tab prints it (U+2212 minus, `2.6e-3`)."""
    return float(text.replace("\u2212", "-"))


def _close(printed, value):
    return math.isclose(printed, value, rel_tol=DIGITS, abs_tol=1e-30)


def _tooltip(frame):
    tooltip = frame.locator(".routemap-tooltip")
    tooltip.wait_for()
    names = tooltip.locator("dt").all_text_contents()
    values = tooltip.locator("dd").all_text_contents()
    grid = [row.locator("td").all_text_contents() for row in tooltip.locator("tr").all()]
    return tooltip.locator("strong").text_content(), dict(zip(names, values)), grid


def _api(url, run, layer, step=None):
    query = {"run": run, "layer": layer, **({} if step is None else {"step": step})}
    return get_json(f"{url}/data/plugin/gradviz/routing_map?{urllib.parse.urlencode(query)}")


def _windows(answer):
    """Per served window (row-major): its input rectangle `(top, left, height, width)` on the
    map, computed here from the pool's geometry (docs/API.md)."""
    pooling, size = answer["pooling"], answer["map"]
    if pooling["global"]:
        return [(0, 0, size["height"], size["width"])]
    rects = []
    geometry = []
    for n, k, s in zip((size["height"], size["width"]), pooling["pool_size"], pooling["strides"]):
        before = (
            max((math.ceil(n / s) - 1) * s + k - n, 0) // 2 if pooling["padding"] == "same" else 0
        )
        geometry.append((k, s, before))
    (kh, sh, bh), (kw, sw, bw) = geometry
    windows = answer["windows"]
    for i in range(windows["row"], windows["row"] + windows["rows"]):
        for j in range(windows["col"], windows["col"] + windows["cols"]):
            rects.append((i * sh - bh, j * sw - bw, kh, kw))
    return rects


def _hover_window(frame, answer, k):
    """Moves the pointer to the centre of served window k on the input map.

    The position is the canvas's own (Playwright finds the canvas where it is when it moves
    the pointer): a view drawn meanwhile above the map moves it, and a position taken from an
    earlier box would miss it."""
    crop = answer["crop"]
    top, left, height, width = _windows(answer)[k]
    canvas = frame.locator(".routemap-figure.input canvas.base")
    cell = canvas.bounding_box()["width"] / crop["width"]
    position = {
        "x": (left - crop["col"] + width / 2) * cell,
        "y": (top - crop["row"] + height / 2) * cell,
    }
    canvas.hover(position=position)


def _position(answer, index):
    crop = answer["crop"]
    return crop["row"] + index // crop["width"], crop["col"] + index % crop["width"]


def _check_max_window(page, frame, answer, channel_index, k):
    """Hovers window k and checks the tooltip against the answer: the winner (with the
    number of tied maxima), the maximum, the gradient sent, the gradient at the winner, the values."""
    channel = answer["channels"][channel_index]
    crop = answer["crop"]
    _hover_window(frame, answer, k)
    title, rows, grid = _tooltip(frame)
    window = answer["windows"]
    row, col = window["row"] + k // window["cols"], window["col"] + k % window["cols"]
    assert title == f"Window ({row}, {col}) of channel {channel['channel']}"
    top, left, height, width = _windows(answer)[k]
    values = np.array(
        [
            [
                channel["input"][(r - crop["row"]) * crop["width"] + (c - crop["col"])]
                for c in range(left, left + width)
            ]
            for r in range(top, top + height)
        ]
    )
    winner = channel["winner"][k]
    r, c = _position(answer, winner)
    ties = int((values == values.max()).sum())
    assert (ties > 1) == channel["tied"][k]
    # The first maximum in raster order, as the server says and as the values say.
    first = np.argmax(values.ravel())
    assert (r, c) == (top + first // width, left + first % width)
    assert rows["winner"] == (
        f"({r}, {c}), the first of {ties} tied positions" if ties > 1 else f"({r}, {c})"
    )
    assert _close(_number(rows["maximum"]), channel["input"][winner])
    assert _close(_number(rows["sent"].split(",")[0]), channel["output_gradient"][k])
    assert rows["sent"].endswith(f", all of it to ({r}, {c})")
    at_winner = rows[f"input gradient at ({r}, {c})"].split(",")[0]
    assert _close(_number(at_winner), channel["input_gradient"][winner])
    assert np.allclose([[_number(v) for v in line] for line in grid], values, rtol=DIGITS, atol=0)
    return rows


def _timed_in_page(locator, script):
    """Milliseconds `script` takes in the page (its handlers draw synchronously)."""
    return locator.evaluate(f"""element => {{
      const start = performance.now();
      ({script})(element);
      return performance.now() - start;
    }}""")


# ---------------------------------------------------------------- the test


def test_routing_map_of_resnet50_stem(browser, stem_logs):
    root, logdir = stem_logs
    ready = runs_loaded({RUN: STEPS[-1], RUN_224: STEPS[-1]})
    with (
        running_tensorboard(logdir, root / "tensorboard.log", ready) as url,
        gradviz_page(browser, url) as page,
    ):
        frame = tab(page)
        frame.get_by_label("Run", exact=True).select_option(RUN)
        # The first max pool is the layer the tab opens with: pool1_pool, at the last step.
        answer = _api(url, RUN, "pool1_pool")
        view = wait_drawn(
            frame,
            ROUTING_MAP,
            run=RUN,
            layer="pool1_pool",
            step=STEPS[-1],
            channel=answer["channels"][0]["channel"],
        )
        assert answer["map"] == {"height": 34, "width": 34} and answer["windows"]["rows"] == 16
        assert view.locator(".routemap-title .layer-meta").text_content() == (
            "Example 0 · the whole 34×34 map · 256 windows 3×3, stride 2×2, valid"
        )
        rule = view.locator(".routemap-rule").text_content()
        assert rule == "Ties: first maximum in raster order (tensorflow on cpu)."
        # Every position: those no window reaches (the last row and column) get no gradient, as predicted.
        assert view.locator(".routemap-check").text_content() == (
            "✓ tensorflow's input gradient is what these winners predict at all 1,156 positions compared."
        )
        channels = [str(c["channel"]) for c in answer["channels"]]
        channel_select = frame.get_by_label("Channel", exact=True)
        assert channel_select.locator("option").all_text_contents() == channels
        assert channel_select.input_value() == channels[0]
        assert view.locator(".map-step-value").text_content() == f"{STEPS[-1]} (2 of 2)"

        # A tied window of ReLU zeros: the first position, its top-left, wins.
        first = answer["channels"][0]
        at_winner = [first["input"][w] for w in first["winner"]]
        zero_windows = [
            k
            for k, tied in enumerate(first["tied"])
            if tied and first["output_gradient"][k] != 0 and at_winner[k] == 0
        ]
        assert zero_windows, "no tied window of zeros in channel 0"
        rows = _check_max_window(page, frame, answer, 0, zero_windows[len(zero_windows) // 2])
        assert "tied positions" in rows["winner"]
        keep_screenshot(view, root / "routing_map_pool1_pool_tie.png")
        untied = [k for k, tied in enumerate(first["tied"]) if not tied and at_winner[k] > 0]
        _check_max_window(page, frame, answer, 0, untied[len(untied) // 3])
        keep_screenshot(view, root / "routing_map_pool1_pool.png")

        # From the keyboard: the input map walks the windows, from the first.
        page.mouse.move(0, 0)
        frame.locator(".routemap-tooltip").wait_for(state="hidden")
        frame.locator(".routemap-figure.input .routemap-stack").focus()
        page.keyboard.press("ArrowRight")
        assert _tooltip(frame)[0] == f"Window (0, 0) of channel {channels[0]}"
        page.keyboard.press("ArrowDown")
        assert _tooltip(frame)[0] == f"Window (1, 0) of channel {channels[0]}"
        page.keyboard.press("Escape")
        frame.locator(".routemap-tooltip").wait_for(state="hidden")

        # Another channel, then the first map step: the view follows, and stays right.
        channel_select.select_option(channels[-1])
        wait_drawn(frame, ROUTING_MAP, layer="pool1_pool", channel=int(channels[-1]))
        _check_max_window(page, frame, answer, len(channels) - 1, 17)
        step_slider = frame.get_by_label("Map step", exact=True)
        step_slider.focus()
        step_slider.press("Home")
        wait_drawn(frame, ROUTING_MAP, layer="pool1_pool", step=STEPS[0])
        assert view.locator(".map-step-value").text_content() == f"{STEPS[0]} (1 of 2)"
        earlier = _api(url, RUN, "pool1_pool", STEPS[0])
        index = [c["channel"] for c in earlier["channels"]].index(int(channel_select.input_value()))
        _check_max_window(page, frame, earlier, index, 40)
        assert view.locator(".routemap-summary").text_content().startswith(f"Step {STEPS[0]}: ")
        # The tab's own slider moves the map too.
        frame.get_by_label("Step", exact=True).focus()
        page.keyboard.press("Home")
        wait_drawn(frame, PANELS, layer="pool1_pool", step=STEPS[0])
        page.keyboard.press("End")
        wait_drawn(frame, ROUTING_MAP, layer="pool1_pool", step=STEPS[-1])
        assert view.locator(".map-step-value").text_content() == f"{STEPS[-1]} (2 of 2)"

        # A 2x2/2 pool: windows touch without overlapping; every position is compared.
        frame.get_by_label("Layer", exact=True).select_option("pool2")
        wait_drawn(frame, ROUTING_MAP, layer="pool2", step=STEPS[-1])
        assert "windows 2×2, stride 2×2" in view.locator(".layer-meta").text_content()
        pool2 = _api(url, RUN, "pool2")
        _check_max_window(page, frame, pool2, 0, 21)
        cells = pool2["crop"]["height"] * pool2["crop"]["width"]
        assert view.locator(".routemap-check").text_content() == (
            f"✓ tensorflow's input gradient is what these winners predict at all {cells:,} positions compared."
        )
        keep_screenshot(view, root / "routing_map_pool2.png")

        # The global average pool: even shares, no winner.
        frame.get_by_label("Layer", exact=True).select_option("avg_pool")
        wait_drawn(frame, ROUTING_MAP, layer="avg_pool", step=STEPS[-1])
        assert "one global window" in view.locator(".layer-meta").text_content()
        assert (
            view.locator(".routemap-rule")
            .text_content()
            .startswith("Average pool: each window's gradient is shared")
        )
        average = _api(url, RUN, "avg_pool")
        _hover_window(frame, average, 0)
        rows = _tooltip(frame)[1]
        n = average["map"]["height"] * average["map"]["width"]
        g = average["channels"][0]["output_gradient"][0]
        shares = re.fullmatch(rf"(\S+) / {n} = (\S+) to each of its {n} positions", rows["sent"])
        assert shares and _close(_number(shares[1]), g) and _close(_number(shares[2]), g / n)
        assert "winner" not in rows

        # Dark mode: the canvases are painted again in TensorBoard's dark colours.
        frame.get_by_label("Layer", exact=True).select_option("pool1_pool")
        wait_drawn(frame, ROUTING_MAP, layer="pool1_pool", step=STEPS[-1])
        assert "34×34" in view.locator(".layer-meta").text_content()
        light = view.locator(".routemap-figure.gradient canvas.base").evaluate("c => c.toDataURL()")
        page.get_by_role("button", name="Menu for changing light or dark theme").click()
        page.get_by_role("menuitem", name="Dark").click()
        frame.locator("html.dark-mode").wait_for(state="attached")
        page.get_by_role("menu").wait_for(state="detached")
        assert (
            view.locator(".routemap-figure.gradient canvas.base").evaluate("c => c.toDataURL()")
            != light
        )
        _check_max_window(page, frame, answer, 0, zero_windows[0])
        keep_screenshot(view, root / "routing_map_pool1_pool_dark.png")

        # The 112x112 map at 224 px, cropped: the view stays responsive.
        frame.get_by_label("Run", exact=True).select_option(RUN_224)
        wait_drawn(frame, ROUTING_MAP, run=RUN_224, layer="pool1_pool", step=STEPS[-1])
        assert "of the 114×114 map (cropped" in view.locator(".layer-meta").text_content()
        large = _api(url, RUN_224, "pool1_pool")
        assert large["crop"]["height"] * large["crop"]["width"] > 60 * 60
        _check_max_window(page, frame, large, 0, len(large["channels"][0]["winner"]) // 2)
        stack = frame.locator(".routemap-figure.input .routemap-stack")
        moves = 100
        hover_ms = (
            _timed_in_page(
                stack,
                f"""stack => {{
          const box = stack.getBoundingClientRect();
          for (let i = 0; i < {moves}; i++) {{
            stack.dispatchEvent(new PointerEvent('pointermove', {{bubbles: true,
              clientX: box.left + (i * 7.3) % box.width, clientY: box.top + (i * 3.1) % box.height}}));
          }}
        }}""",
            )
            / moves
        )
        draw_ms = _timed_in_page(
            frame.get_by_label("Channel", exact=True),
            "select => select.dispatchEvent(new Event('change'))",
        )
        print(
            f"\n112x112 map, crop {large['crop']}: {hover_ms:.2f} ms a pointer move, {draw_ms:.0f} ms a redraw"
        )
        assert hover_ms < HOVER_BOUND_MS and draw_ms < DRAW_BOUND_MS
        keep_screenshot(view, root / "routing_map_224.png")
