"""The routing map (issue 12): each window's winner against a hand-written reference, the gradient
maps against GradientTape's, the byte bound, and the `/routing_map` route."""

import json
import os
import warnings

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import eventdata  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tb_gradviz import GradVizCallback, cli  # noqa: E402
from tb_gradviz.format import records, routing_map  # noqa: E402

layers = keras.layers


def reference_windows(x, pool_size, strides, padding):
    """Per window of a [H, W] map, row-major: its input positions in raster order, no padding."""
    height, width = x.shape
    windows = []
    if padding == "global":
        return [[(r, c) for r in range(height) for c in range(width)]]
    (kh, kw), (sh, sw) = pool_size, strides
    if padding == "same":
        rows, cols = -(-height // sh), -(-width // sw)
        top = max((rows - 1) * sh + kh - height, 0) // 2
        left = max((cols - 1) * sw + kw - width, 0) // 2
    else:
        rows, cols, top, left = (height - kh) // sh + 1, (width - kw) // sw + 1, 0, 0
    for i in range(rows):
        for j in range(cols):
            windows.append(
                [
                    (r, c)
                    for r in range(i * sh - top, i * sh - top + kh)
                    for c in range(j * sw - left, j * sw - left + kw)
                    if 0 <= r < height and 0 <= c < width
                ]
            )
    return windows


def reference_winners(x, windows):
    """The first maximum of each window, in raster order, and whether the maximum is tied."""
    winners, tied = [], []
    for positions in windows:
        values = [x[p] for p in positions]
        best = max(values)
        winners.append(positions[values.index(best)])
        tied.append(values.count(best) > 1)
    return winners, tied


def logged_map(model, pool_name, x, y, tmp_path, **map_args):
    callback = GradVizCallback(tmp_path, (x, y), layers=[pool_name], **map_args)
    callback.set_model(model)
    callback.log_now(step=1)
    callback.on_train_end()
    log = eventdata.load(tmp_path)
    content = eventdata.content(log, records.routing_map_tag(pool_name))
    array = eventdata.last(log, records.routing_map_tag(pool_name))
    return content, [routing_map.decode(row, content) for row in array], array


def tape_gradients(model, pool_name, x, y):
    """d loss / d (pool input) through the pool only and d loss / d (pool output) (GradientTape)."""
    pool = model.get_layer(pool_name)
    upstream = keras.Model(model.inputs, pool.input)
    x = [x]  # the structure of model.inputs
    downstream_layers = model.layers[model.layers.index(pool) + 1 :]
    with tf.GradientTape(persistent=True) as tape:
        pool_input = upstream(x, training=True)
        tape.watch(pool_input)
        pooled = pool(pool_input)
        out = pooled
        for layer in downstream_layers:
            out = layer(out, training=True)
        loss = model.compute_loss(x[0], y, out)
    return (
        pool_input.numpy(),
        tape.gradient(loss, pool_input).numpy(),
        tape.gradient(loss, pooled).numpy(),
    )


CASES = {
    "2x2/2": (lambda: layers.MaxPooling2D(2, name="pool"), None, ((2, 2), (2, 2), "valid")),
    "3x3/2 after zero padding (ResNet50's pool1)": (
        lambda: layers.MaxPooling2D(3, strides=2, name="pool"),
        layers.ZeroPadding2D(1, name="pad"),
        ((3, 3), (2, 2), "valid"),
    ),
    "3x3/2 same padding": (
        lambda: layers.MaxPooling2D(3, strides=2, padding="same", name="pool"),
        None,
        ((3, 3), (2, 2), "same"),
    ),
    "global max": (lambda: layers.GlobalMaxPooling2D(name="pool"), None, (None, None, "global")),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_winners_and_gradients_match_a_hand_written_reference_and_gradient_tape(case, tmp_path):
    make_pool, padding_layer, (pool_size, strides, padding) = CASES[case]
    keras.utils.set_random_seed(0)
    stack = [
        keras.Input((9, 9, 3)),
        layers.Conv2D(6, 3, padding="same", activation="relu", name="conv"),
    ]
    stack += [padding_layer] if padding_layer else []
    stack += [make_pool(), layers.Flatten(), layers.Dense(2, name="head")]
    model = keras.Sequential(stack)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(3).normal(size=(4, 9, 9, 3)).astype("float32")
    y = np.arange(4) % 2
    content, rows, array = logged_map(
        model, "pool", x, y, tmp_path, routing_map_example=2, routing_map_channels=3
    )
    pool_input, input_gradient, output_gradient = tape_gradients(model, "pool", x, y)
    height, width = pool_input.shape[1:3]
    assert content["map"] == {"height": height, "width": width} and content["example"] == 2
    assert content["crop"] == {"row": 0, "col": 0, "height": height, "width": width}  # fits whole
    # The channels that receive the most gradient mass, ascending.
    mass = np.abs(input_gradient[2]).sum(axis=(0, 1))
    assert [row["channel"] for row in rows] == sorted(np.argsort(-mass, kind="stable")[:3].tolist())
    for row in rows:
        c = row["channel"]
        plane = pool_input[2, :, :, c]
        windows = reference_windows(plane, pool_size, strides, padding)
        winners, tied = reference_winners(plane, windows)
        assert row["winner"] == [r * width + q for r, q in winners]
        assert row["tied"] == tied
        np.testing.assert_array_equal(row["input"], plane.ravel())
        # Where the gradient goes is exact; a position that wins overlapping windows sums their
        # gradients, and the order of that sum differs between TensorFlow's graph and eager
        # kernels on some CPUs (one float32 ulp seen on 3x3/2 pools: AMD EPYC, oneDNN on).
        expected = input_gradient[2, :, :, c].ravel()
        np.testing.assert_array_equal(
            np.flatnonzero(row["input_gradient"]), np.flatnonzero(expected)
        )
        np.testing.assert_allclose(row["input_gradient"], expected, rtol=5e-7, atol=0)  # a few ulps
        np.testing.assert_array_equal(
            row["output_gradient"], output_gradient[2].reshape(-1, output_gradient.shape[-1])[:, c]
        )
    assert case == "global max" or any(
        any(row["tied"]) for row in rows
    )  # ReLU zeros tie whole windows
    assert array.nbytes <= routing_map.MAX_VALUES * 4


def test_a_large_map_is_cropped_within_64_kib_around_the_origin_asked(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((112, 112, 8)),
            layers.MaxPooling2D(3, strides=2, name="pool"),
            layers.GlobalAveragePooling2D(),
            layers.Dense(2),
        ]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).normal(size=(2, 112, 112, 8)).astype("float32")
    content, rows, array = logged_map(
        model, "pool", x, np.arange(2) % 2, tmp_path / "a", routing_map_channels=8
    )
    assert array.nbytes <= 64 * 1024 and len(rows) == 8
    crop, windows = content["crop"], content["windows"]
    assert crop["height"] < 112 and crop["row"] == 2 * windows["row"]
    content, rows, _ = logged_map(
        model, "pool", x, np.arange(2) % 2, tmp_path / "b", routing_map_origin=(0, 40)
    )
    assert (content["crop"]["row"], content["crop"]["col"]) == (0, 40)
    plane = x[0, :, :, rows[0]["channel"]]
    windows = reference_windows(plane, (3, 3), (2, 2), "valid")
    per_row = (112 - 3) // 2 + 1
    first = content["windows"]["row"] * per_row + content["windows"]["col"]
    winner, _ = reference_winners(plane, [windows[first]])
    r, q = winner[0]
    assert rows[0]["winner"][0] == (r - content["crop"]["row"]) * content["crop"]["width"] + (
        q - content["crop"]["col"]
    )


def test_average_pools_map_gradients_without_winners(tmp_path):
    model = keras.Sequential(
        [
            keras.Input((4, 4, 2)),
            layers.AveragePooling2D(2, name="pool"),
            layers.Flatten(),
            layers.Dense(2),
        ]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).normal(size=(2, 4, 4, 2)).astype("float32")
    _, rows, _ = logged_map(model, "pool", x, np.arange(2) % 2, tmp_path)
    assert rows[0]["winner"] == [-1] * 4 and rows[0]["tied"] == [None] * 4


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            dict(routing_map_channels=9),
            ValueError,
            "routing_map_channels must be None, a count 1..8 or a list of at most 8 distinct "
            "channel indices >= 0. Received: routing_map_channels=9",
        ),
        (
            dict(routing_map_channels=[1, 1]),
            ValueError,
            "Received: routing_map_channels=[1, 1]",
        ),
        (dict(routing_map_channels=[]), ValueError, "Received: routing_map_channels=[]"),
        (dict(routing_map_channels=[-1]), ValueError, "Received: routing_map_channels=[-1]"),
        (dict(routing_map_channels="all"), TypeError, "Received: routing_map_channels='all'"),
        (dict(routing_map_channels=2.0), TypeError, "Received: routing_map_channels=2.0"),
        (
            dict(routing_map_example=-1),
            ValueError,
            "routing_map_example must be an int >= 0. Received: routing_map_example=-1",
        ),
        (dict(routing_map_example=0.0), TypeError, "Received: routing_map_example=0.0"),
        (
            dict(routing_map_origin=(1,)),
            ValueError,
            "routing_map_origin must be None or (row, col), two ints >= 0. "
            "Received: routing_map_origin=(1,)",
        ),
        (dict(routing_map_origin=(0, -1)), ValueError, "Received: routing_map_origin=(0, -1)"),
        (dict(routing_map_origin="ab"), TypeError, "Received: routing_map_origin='ab'"),
        (
            dict(routing_map="yes"),
            TypeError,
            "routing_map must be True or False. Received: routing_map='yes'",
        ),
    ],
)
def test_bad_routing_map_arguments_say_what_was_received(tmp_path, kwargs, error, message):
    with pytest.raises(error, match=__import__("re").escape(message)):
        GradVizCallback(tmp_path, (np.zeros((1, 4, 4, 1)), np.zeros(1)), **kwargs)


def test_an_example_beyond_the_probe_batch_is_refused_when_training_begins(tmp_path):
    model = keras.Sequential(
        [keras.Input((4, 4, 1)), layers.MaxPooling2D(), layers.Flatten(), layers.Dense(2)]
    )
    model.compile("sgd", "mse")
    callback = GradVizCallback(
        tmp_path, (np.zeros((2, 4, 4, 1)), np.zeros((2, 2))), routing_map_example=2
    )
    callback.set_model(model)
    with pytest.raises(
        ValueError,
        match="routing_map_example must be below the probe batch's size, 2. "
        "Received: routing_map_example=2",
    ):
        callback.on_train_begin()


def test_routing_map_route_and_export(tmp_path, capsys):
    model = keras.Sequential(
        [
            keras.Input((4, 4, 2)),
            layers.MaxPooling2D(name="pool"),
            layers.Flatten(),
            layers.Dense(2, name="head"),
        ]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).normal(size=(2, 4, 4, 2)).astype("float32")
    callback = GradVizCallback(tmp_path / "run", (x, np.arange(2) % 2), layers=["pool", "head"])
    callback.set_model(model)
    for step in (3, 7):
        callback.log_now(step=step)
    callback.on_train_end()
    gradviz, ctx, experiment = cli._open_logdir(str(tmp_path))
    body = gradviz.routing_map_impl(ctx, experiment, "run", "pool", 5)
    assert body["steps"] == [3, 7] and body["step"] == 3 and len(body["channels"]) == 2
    assert body["pooling"]["type"] == "max" and body["backend"] == "tensorflow"
    # The window geometry the tab draws is served, not computed again in the browser.
    halves = {"kernel": 2, "stride": 2, "before": 0, "count": 2}
    assert body["axes"] == {"rows": halves, "cols": halves}
    from tensorboard import errors

    for args in (("run", "head", None), ("run", "pool", 2), ("nope", "pool", None)):
        with pytest.raises(errors.NotFoundError):
            gradviz.routing_map_impl(ctx, experiment, *args)
    assert cli.main(["export", str(tmp_path), "--format", "json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    (mapped,) = exported["routing_maps"]
    assert (mapped["run"], mapped["layer"], mapped["steps"]) == ("run", "pool", [3, 7])
    assert (
        mapped["maps"][-1]["channels"]
        == gradviz.routing_map_impl(ctx, experiment, "run", "pool")["channels"]
    )


def test_window_axes_of_valid_same_global_and_1d_pools():
    """The window geometry `/routing_map` serves (`axes`) for each kind of pool."""
    # ResNet50's pool1_pool at 64 px: a 34x34 input (ZeroPadding2D(1) of 32x32), 3x3, stride 2.
    resnet = {"global": False, "pool_size": [3, 3], "strides": [2, 2], "padding": "valid"}
    flat = {"kernel": 1, "stride": 1, "before": 0, "count": 1}
    sixteen = {"kernel": 3, "stride": 2, "before": 0, "count": 16}
    assert routing_map.window_axes(resnet, 1, 34, 34) == [flat, sixteen, sixteen]
    # At 224 px: 114x114 (the 112x112 map, padded), 56 windows a side.
    assert routing_map.window_axes(resnet, 1, 114, 114)[1]["count"] == 56
    same = {**resnet, "padding": "same"}
    assert routing_map.window_axes(same, 1, 5, 5)[1] == {
        "kernel": 3,
        "stride": 2,
        "before": 1,
        "count": 3,
    }
    assert routing_map.window_axes({**same, "pool_size": [2, 2]}, 1, 5, 5)[1] == {
        "kernel": 2,
        "stride": 2,
        "before": 0,
        "count": 3,
    }
    whole = {"global": True, "pool_size": None, "strides": None, "padding": "valid"}
    assert routing_map.window_axes(whole, 1, 2, 7) == [
        flat,
        {"kernel": 2, "stride": 2, "before": 0, "count": 1},
        {"kernel": 7, "stride": 7, "before": 0, "count": 1},
    ]
    one_d = {**resnet, "pool_size": [2], "strides": [2]}
    assert routing_map.window_axes(one_d, 1, 1, 9) == [
        flat,
        flat,
        {"kernel": 2, "stride": 2, "before": 0, "count": 4},
    ]
    cube = {**resnet, "pool_size": [2, 2, 2], "strides": [2, 2, 2]}
    assert routing_map.window_axes(cube, 4, 6, 6)[0] == {
        "kernel": 2,
        "stride": 2,
        "before": 0,
        "count": 2,
    }


def test_a_global_pool_larger_than_the_budget_is_cropped_around_its_centre(tmp_path):
    model = keras.Sequential(
        [keras.Input((112, 112, 4)), layers.GlobalMaxPooling2D(name="pool"), layers.Dense(2)]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).normal(size=(2, 112, 112, 4)).astype("float32")
    x[0, 56, 57, :] = 10.0  # every channel's maximum, inside the centred crop
    content, rows, array = logged_map(model, "pool", x, np.arange(2) % 2, tmp_path)
    assert array.nbytes <= 64 * 1024
    crop = content["crop"]
    assert crop["height"] == crop["width"] < 112 and crop["row"] == (112 - crop["height"]) // 2
    for row in rows:
        assert row["winner"] == [(56 - crop["row"]) * crop["width"] + 57 - crop["col"]]


def test_a_3d_pool_maps_its_middle_depth_on_the_middle_plane_of_those_windows(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((4, 6, 6, 2)),
            layers.Conv3D(3, 3, padding="same", activation="relu"),
            layers.MaxPooling3D(2, name="pool"),
            layers.Flatten(),
            layers.Dense(2),
        ]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(2).normal(size=(2, 4, 6, 6, 2)).astype("float32")
    content, rows, _ = logged_map(
        model, "pool", x, np.arange(2) % 2, tmp_path, routing_map_channels=[0, 2]
    )
    pool_input, input_gradient, output_gradient = tape_gradients(model, "pool", x, np.arange(2) % 2)
    # Output depths 0 and 1: the middle is 1, whose windows span input depths 2 and 3; plane 3
    # is shown.
    assert content["depth"] == {"size": 4, "window": 1, "plane": 3}
    assert content["windows"] == {"row": 0, "col": 0, "rows": 3, "cols": 3}
    for row in rows:
        c = row["channel"]
        volume = pool_input[0, :, :, :, c]
        winners = []
        for i in range(3):
            for j in range(3):
                positions = [
                    (z, 2 * i + a, 2 * j + b) for z in (2, 3) for a in range(2) for b in range(2)
                ]
                values = [volume[p] for p in positions]
                z, r, q = positions[values.index(max(values))]
                winners.append(r * 6 + q if z == 3 else -1)
        assert row["winner"] == winners
        np.testing.assert_array_equal(row["input"], volume[3].ravel())
        np.testing.assert_array_equal(row["input_gradient"], input_gradient[0, 3, :, :, c].ravel())
        np.testing.assert_array_equal(
            row["output_gradient"], output_gradient[0, 1, :, :, c].ravel()
        )


def test_an_inf_in_the_input_gradient_ranks_channels_without_a_runtime_warning():
    # Several Infs and float32 maxima in a channel: summing them as finite
    # stand-ins (1.8e308 each) overflowed and numpy warned during fit.
    planes = np.zeros((4, 1, 3, 3), np.float32)
    planes[0] = 1.0
    planes[1, 0, 0, :2] = np.inf
    planes[2, 0, 1, 1] = np.finfo(np.float32).max
    planes[2, 0, 2, 2] = np.nan
    planes[3, 0, 0, 0] = -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chosen = routing_map.chosen_channels(planes, routing_map.Settings(channels=2))
        assert chosen == [1, 3]  # the most Infs first, then the larger finite mass
        chosen = routing_map.chosen_channels(planes, routing_map.Settings(channels=3))
        assert chosen == [1, 2, 3]


def test_export_json_reads_and_checks_each_routing_map_record_once(tmp_path, capsys, monkeypatch):
    model = keras.Sequential(
        [keras.Input((4, 4, 2)), layers.MaxPooling2D(name="pool"), layers.Flatten()]
    )
    x = np.random.default_rng(0).normal(size=(2, 4, 4, 2)).astype("float32")
    callback = GradVizCallback(tmp_path / "run", (x, x.reshape(2, -1)[:, :8]), layers=["pool"])
    model.compile("sgd", "mse")
    callback.set_model(model)
    steps = list(range(1, 9))
    for step in steps:
        callback.log_now(step=step)
    callback.on_train_end()
    checked, check = [], routing_map.valid_rows
    monkeypatch.setattr(routing_map, "valid_rows", lambda *a: checked.append(1) or check(*a))
    assert cli.main(["export", str(tmp_path), "--format", "json"]) == 0
    (mapped,) = json.loads(capsys.readouterr().out)["routing_maps"]
    assert mapped["steps"] == steps and [body["step"] for body in mapped["maps"]] == steps
    assert all(body["steps"] == steps for body in mapped["maps"])
    # One check of each of the 8 records: read once, not once per step (8 + 8 x 8 checks).
    assert len(checked) == len(steps)
