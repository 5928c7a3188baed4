"""The callback's records against hand-written GradientTape references."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import eventdata  # noqa: E402
from values import assert_same_stats  # noqa: E402

from tb_gradviz import GradVizCallback  # noqa: E402
from tb_gradviz.format import (  # noqa: E402
    records,
    summaries,
)

layers = keras.layers


def fit_once(model, x, y, log_dir, **kwargs):
    """Fits one epoch of one batch (so the logged weights are the final ones)."""
    callback = GradVizCallback(log_dir, probe_data=(x, y), **kwargs)
    model.fit(x, y, batch_size=len(x), epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    return callback


def reference_tensors(pre, pool, post, x, y, loss):
    """The pool's (activation, input_gradient, output_gradient), by hand."""
    with tf.GradientTape(persistent=True) as tape:
        pool_input = pre(x) if pre is not None else tf.convert_to_tensor(x)
        tape.watch(pool_input)
        activation = pool(pool_input)
        tape.watch(activation)
        total = loss(y, post(activation))
    input_gradient, output_gradient = tape.gradient(total, [pool_input, activation])
    return activation.numpy(), input_gradient.numpy(), output_gradient.numpy()


def assert_matches_reference(log, layer, tensor, array):
    """Counts are exact; float statistics agree to float64 rounding of the sums."""
    logged = eventdata.stats(log, layer, tensor)
    expected = records.decode_stats(summaries.stats_vector(array))
    for field in ("count", "zeros", "nan", "pos_inf", "neg_inf", "min", "max"):
        assert logged[field] == expected[field], (tensor, field)
    for field in ("mean", "std", "sum"):
        assert logged[field] == pytest.approx(expected[field], rel=1e-9, abs=1e-15), (tensor, field)
    assert logged["log_counts"] == expected["log_counts"], tensor
    np.testing.assert_array_equal(
        eventdata.histogram(log, layer, tensor), summaries.linear_histogram(array)
    )


def conv_pool_model(seed, pool_layer):
    keras.utils.set_random_seed(seed)
    conv = layers.Conv2D(6, 3, use_bias=False, name="conv")
    dense = layers.Dense(3, name="dense")
    inputs = keras.Input((12, 12, 2))
    outputs = dense(layers.Flatten()(pool_layer(conv(inputs))))
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.SGD(0.01), "mse")
    return model, conv, dense


def test_conv_maxpool_records_equal_hand_written_tape(tmp_path):
    pool = layers.MaxPooling2D(2, name="pool")
    model, conv, dense = conv_pool_model(1, pool)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 12, 12, 2)).astype("float32")
    y = rng.normal(size=(4, 3)).astype("float32")
    fit_once(model, x, y, tmp_path)

    activation, input_gradient, output_gradient = reference_tensors(
        conv, pool, lambda a: dense(layers.Flatten()(a)), x, y, keras.losses.MeanSquaredError()
    )
    log = eventdata.load(tmp_path)
    assert eventdata.layers(log) == ["pool"]
    assert_matches_reference(log, "pool", "activation", activation)
    assert_matches_reference(log, "pool", "input_gradient", input_gradient)
    assert_matches_reference(log, "pool", "output_gradient", output_gradient)

    routing = eventdata.routing(log, "pool")
    assert routing["input_positions"] == input_gradient.size == 4 * 10 * 10 * 6
    assert routing["windows"] == activation.size == 4 * 5 * 5 * 6
    # Random normal inputs have no ties: one routed position per window.
    assert routing["tied_windows"] == 0
    assert routing["routed_positions"] == activation.size
    assert routing["input_gradient_sum"] == pytest.approx(
        float(input_gradient.sum(dtype=np.float64)), rel=1e-9
    )
    assert routing["output_gradient_sum"] == pytest.approx(
        float(output_gradient.sum(dtype=np.float64)), rel=1e-9
    )
    assert routing["input_gradient_sum"] == pytest.approx(routing["output_gradient_sum"], rel=1e-6)
    assert routing["output_gradient_abs_sum"] == pytest.approx(
        float(np.abs(output_gradient).sum(dtype=np.float64)), rel=1e-9
    )

    content = eventdata.content(log, records.stats_tag("pool", "input_gradient"))
    assert content["shape"] == [4, 10, 10, 6]
    assert content["layer_class"] == "MaxPooling2D"
    assert content["dtype"] == "float32"
    assert content["pooling"] == {
        "type": "max",
        "global": False,
        "pool_size": [2, 2],
        "strides": [2, 2],
        "padding": "valid",
        "data_format": "channels_last",
    }


def pool_only_model(pool, shape, units=3, seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input(shape)
    model = keras.Model(inputs, layers.Dense(units, name="dense")(layers.Flatten()(pool(inputs))))
    model.compile(keras.optimizers.SGD(0.0), "mse")
    return model


def test_strictly_ordered_input_gives_exactly_75_percent_zeros(tmp_path):
    model = pool_only_model(layers.MaxPooling2D(2, name="pool"), (8, 8, 3))
    x = np.arange(2 * 8 * 8 * 3, dtype="float32").reshape(2, 8, 8, 3)
    y = np.ones((2, 3), "float32")
    fit_once(model, x, y, tmp_path)

    log = eventdata.load(tmp_path)
    gradient = eventdata.stats(log, "pool", "input_gradient")
    assert gradient["count"] == 384
    assert gradient["zeros"] == 288  # exactly 75 %
    routing = eventdata.routing(log, "pool")
    assert (routing["routed_positions"], routing["windows"], routing["tied_windows"]) == (96, 96, 0)


def test_all_zero_input_routes_each_window_to_its_first_maximum(tmp_path):
    model = pool_only_model(layers.MaxPooling2D(2, name="pool"), (4, 4, 1), units=1)
    x = np.zeros((1, 4, 4, 1), "float32")
    y = np.ones((1, 1), "float32")
    fit_once(model, x, y, tmp_path)

    log = eventdata.load(tmp_path)
    routing = eventdata.routing(log, "pool")
    # Every window is tied, and each still routes to one position only.
    assert routing["tied_windows"] == 4
    assert routing["routed_positions"] == 4
    assert eventdata.stats(log, "pool", "input_gradient")["zeros"] == 12

    # Which position: the first maximum in raster order, as the hand-written tape shows.
    pool = model.get_layer("pool")
    dense = model.get_layer("dense")
    _, input_gradient, _ = reference_tensors(
        None, pool, lambda a: dense(layers.Flatten()(a)), x, y, keras.losses.MeanSquaredError()
    )
    routed = (input_gradient[0, :, :, 0] != 0).astype(int)
    np.testing.assert_array_equal(routed, [[1, 0, 1, 0], [0, 0, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]])
    assert_matches_reference(log, "pool", "input_gradient", input_gradient)


def test_average_pooling_spreads_the_gradient_over_every_position(tmp_path):
    model = pool_only_model(layers.AveragePooling2D(2, name="pool"), (6, 6, 2))
    x = np.random.default_rng(3).normal(size=(2, 6, 6, 2)).astype("float32")
    fit_once(model, x, np.ones((2, 3), "float32"), tmp_path)

    log = eventdata.load(tmp_path)
    assert eventdata.stats(log, "pool", "input_gradient")["zeros"] == 0
    routing = eventdata.routing(log, "pool")
    assert routing["routed_positions"] == routing["input_positions"] == 144
    assert np.isnan(routing["tied_windows"])
    assert routing["input_gradient_sum"] == pytest.approx(routing["output_gradient_sum"], rel=1e-6)


def test_nan_in_probe_is_counted_and_the_histogram_keeps_the_rest(tmp_path):
    model = pool_only_model(layers.MaxPooling2D(2, name="pool"), (4, 4, 1), units=1)
    x = np.arange(16, dtype="float32").reshape(1, 4, 4, 1)
    x[0, 3, 3, 0] = np.nan  # in the window whose max would be 15
    fit_once(model, x, np.ones((1, 1), "float32"), tmp_path)

    log = eventdata.load(tmp_path)
    pool = model.get_layer("pool")
    expected = pool(x).numpy()
    activation = eventdata.stats(log, "pool", "activation")
    assert activation["nan"] == np.isnan(expected).sum()
    assert activation["count"] == 4
    finite = expected[np.isfinite(expected)]
    histogram = eventdata.histogram(log, "pool", "activation")
    assert histogram[:, 2].sum() == finite.size
    assert (histogram[0, 0], histogram[-1, 1]) == (finite.min(), finite.max())
    # The loss is NaN, so every gradient value is NaN: counted, never dropped.
    gradient = eventdata.stats(log, "pool", "input_gradient")
    assert (
        gradient["nan"]
        + gradient["zeros"]
        + sum(gradient["log_counts"]["positive"])
        + sum(gradient["log_counts"]["negative"])
        == 16
    )


def test_resnet50_nested_in_sequential_logs_its_two_pooling_layers(tmp_path):
    keras.utils.set_random_seed(0)
    resnet = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=5)
    model = keras.Sequential([keras.Input((32, 32, 3)), resnet])
    model.compile(keras.optimizers.SGD(0.01), "categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(4, 32, 32, 3)).astype("float32")
    y = np.eye(5, dtype="float32")[[0, 1, 2, 3]]
    callback = fit_once(model, x, y, tmp_path)

    assert callback.chosen_layers == ["resnet50/pool1_pool", "resnet50/avg_pool"]
    log = eventdata.load(tmp_path)
    assert eventdata.layers(log) == ["resnet50/pool1_pool", "resnet50/avg_pool"]
    pool1 = eventdata.content(log, records.stats_tag("resnet50/pool1_pool", "input_gradient"))
    assert pool1["shape"] == [4, 18, 18, 64]  # after ZeroPadding2D around a 16x16 map
    assert eventdata.content(log, records.stats_tag("resnet50/pool1_pool", "activation"))[
        "shape"
    ] == [4, 8, 8, 64]
    zeros = eventdata.stats(log, "resnet50/pool1_pool", "input_gradient")
    routing = eventdata.routing(log, "resnet50/pool1_pool")
    # Overlapping 3x3/2 windows share winners: fewer routed positions than windows.
    assert routing["routed_positions"] <= routing["windows"] == 4 * 8 * 8 * 64
    assert zeros["zeros"] >= zeros["count"] - routing["windows"]
    assert (
        abs(routing["input_gradient_sum"] - routing["output_gradient_sum"])
        <= 1e-6 * routing["output_gradient_abs_sum"]
    )
    avg = eventdata.routing(log, "resnet50/avg_pool")
    assert (
        avg["windows"] == 4 * 2048
        and avg["routed_positions"] == avg["input_positions"] == 4 * 1 * 1 * 2048
    )


def test_float32_subnormals_are_counted_on_device_as_on_the_host():
    # XLA on the CPU flushes float32 subnormals to zero; the device statistics count them as
    # the host does, as non-zero values in magnitude bin 0 of their sign (docs/FORMAT.md).
    from tb_gradviz.capture import assemble, device_statistics
    from tb_gradviz.capture.backends import tf_statistics

    array = np.array([1e-45, -1e-40, 0.0, 1.0], np.float32)
    with tf.device("/CPU:0"):
        compiled = tf_statistics.compiled([[0]], [False], "stepped")
        results = compiled([tf.constant(array)], tf.constant(1.0, tf.float64))
    (row,) = device_statistics.tensor_rows([[0]], results, [4])
    stats = assemble.summary_of_row(row)[1]
    record = records.decode_stats(stats)
    assert record["zeros"] == 1
    negative, positive = record["log_counts"]["negative"], record["log_counts"]["positive"]
    assert {j: c for j, c in enumerate(negative) if c} == {0: 1}  # -1e-40
    assert {j: c for j, c in enumerate(positive) if c} == {0: 1, 25: 1}  # 1e-45; 1.0
    host = summaries.stats_vector(array)  # what the host kernel computes
    exact = np.ones(records.STATS_LENGTH, bool)
    exact[records.SUMMED_STATS] = False
    np.testing.assert_array_equal(stats[exact], host[exact])


def chain_model_and_batch(seed):
    """conv -> bn -> relu -> pool -> flat -> dense, compiled, and a batch for it."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            layers.Conv2D(4, 3, padding="same", name="conv"),
            layers.BatchNormalization(name="bn"),
            layers.ReLU(name="relu"),
            layers.MaxPooling2D(name="pool"),
            layers.Flatten(name="flat"),
            layers.Dense(2, name="dense"),
        ]
    )
    model.compile("sgd", "mse")
    rng = np.random.default_rng(seed)
    return (
        model,
        tf.constant(rng.random((4, 8, 8, 3), "float32")),
        tf.constant(rng.random((4, 2), "float32")),
    )


def test_a_chain_summarises_each_shared_gradient_once_with_the_same_records(monkeypatch):
    # conv -> bn -> relu -> pool -> flat -> dense: each layer's input gradient is
    # the previous layer's output gradient, bit for bit.
    from tb_gradviz.capture import selection
    from tb_gradviz.capture.backends import tensorflow as capture

    model, x, y = chain_model_and_batch(0)
    chosen = selection.select_layers(model, ["*"])

    found = []
    sole_inputs = capture._sole_inputs_of_outputs
    monkeypatch.setattr(
        capture,
        "_sole_inputs_of_outputs",
        lambda recs: found.append(sole_inputs(recs)) or found[-1],
    )
    shared, _ = capture.LayerCapture(model, chosen).run(x, y)
    monkeypatch.setattr(capture, "_sole_inputs_of_outputs", lambda recs: {})
    separate, _ = capture.LayerCapture(model, chosen).run(x, y)

    assert len(found[0]) == 5  # every link of the chain
    assert [tag for tag, _, _ in shared] == [tag for tag, _, _ in separate]
    for (tag, a, _), (_, b, _) in zip(shared, separate):
        np.testing.assert_array_equal(a, b, err_msg=tag)


def test_an_unknown_statistics_path_is_refused():
    from tb_gradviz.capture import selection
    from tb_gradviz.capture.backends import tensorflow as capture

    model = keras.Sequential([keras.Input((4,)), layers.Dense(2, name="dense")])
    with pytest.raises(
        ValueError, match=r"statistics must be one of \('host', 'device'\) or None; received 'gpu'"
    ):
        capture.LayerCapture(model, selection.select_layers(model, ["dense"]), statistics="gpu")


def test_a_gradient_tensor_shared_by_two_inputs_is_summarised_once():
    # Backprop hands Add's output gradient, the same tensor, to both inputs.
    from tb_gradviz.capture import selection
    from tb_gradviz.capture.backends import tensorflow as capture

    keras.utils.set_random_seed(4)
    inputs = keras.Input((6,))
    left, right = layers.Dense(5, name="left")(inputs), layers.Dense(5, name="right")(inputs)
    outputs = layers.Dense(2, name="head")(layers.Add(name="add")([left, right]))
    model = keras.Model(inputs, outputs)
    model.compile("sgd", "mse")
    rng = np.random.default_rng(4)
    x, y = rng.random((8, 6), "float32"), rng.random((8, 2), "float32")

    probe = capture.LayerCapture(model, selection.select_layers(model, ["add"]))
    written, _ = probe.run(tf.constant(x), tf.constant(y))
    assert probe._items == [
        0,
        1,
        1,
        1,
    ]  # activation; input_gradient_0, _1 and output_gradient: one item
    with tf.GradientTape() as tape:
        added = model.get_layer("add")([model.get_layer("left")(x), model.get_layer("right")(x)])
        tape.watch(added)
        loss = keras.losses.MeanSquaredError()(y, model.get_layer("head")(added))
    expected = tape.gradient(loss, added).numpy()
    by_tag = {tag: array for tag, array, _ in written}
    for tensor in ("input_gradient_0", "input_gradient_1", "output_gradient"):
        np.testing.assert_array_equal(
            by_tag[records.histogram_tag("add", tensor)], summaries.linear_histogram(expected)
        )
        stats = by_tag[records.stats_tag("add", tensor)]
        assert_same_stats(stats, summaries.stats_vector(expected), rtol=1e-9, atol=1e-15)
