"""The same checks under float32 and mixed_float16 (float16 activations and gradients)."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import eventdata  # noqa: E402

from tb_gradviz import GradVizCallback  # noqa: E402
from tb_gradviz.format import (  # noqa: E402
    records,
    summaries,
)

layers = keras.layers


@pytest.fixture(params=["float32", "mixed_float16"])
def policy(request):
    keras.mixed_precision.set_global_policy(request.param)
    try:
        yield request.param
    finally:
        keras.mixed_precision.set_global_policy("float32")


def assert_records_equal(log, layer, tensor, array):
    """The logged record is the numpy definition applied to `array`: counts,
    min, max and histogram exactly, the sums to float64 rounding (TensorFlow
    adds in another order than numpy)."""
    logged, expected = (
        eventdata.last(log, records.stats_tag(layer, tensor)),
        summaries.stats_vector(array),
    )
    summed = [records.STATS_FIELDS.index(f) for f in ("mean", "std", "sum")]
    exact = np.setdiff1d(np.arange(records.STATS_LENGTH), summed)
    np.testing.assert_array_equal(logged[exact], expected[exact])
    np.testing.assert_allclose(logged[summed], expected[summed], rtol=1e-12)
    np.testing.assert_array_equal(
        eventdata.histogram(log, layer, tensor), summaries.linear_histogram(array)
    )


def test_training_is_bit_identical_with_and_without_the_callback(tmp_path, policy):
    rng = np.random.default_rng(0)
    x, y = (
        rng.normal(size=(32, 8, 8, 3)).astype("float32"),
        rng.normal(size=(32, 2)).astype("float32"),
    )
    runs = []
    for with_callback in (False, True):
        keras.utils.set_random_seed(7)
        model = keras.Sequential(
            [
                keras.Input((8, 8, 3)),
                layers.Conv2D(4, 3, padding="same", name="conv"),
                layers.BatchNormalization(name="bn"),
                layers.ReLU(name="relu"),
                layers.Dropout(0.5, name="drop"),
                layers.MaxPooling2D(name="pool"),
                layers.Flatten(),
                layers.Dense(2, name="dense"),
            ]
        )
        model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
        callbacks = (
            [GradVizCallback(tmp_path, (x[:8], y[:8]), every_n_batches=1)] if with_callback else []
        )
        keras.utils.set_random_seed(11)
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=callbacks)
        state = [
            np.array(v)
            for v in model.variables + model.metrics_variables + model.optimizer.variables
        ]
        follow_up = (float(tf.random.uniform(())), float(keras.random.uniform(())))
        steps_taken = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
        runs.append((state, follow_up, type(model.optimizer).__name__))
    (without, rng_without, optimizer), (with_, rng_with, _) = runs
    # Under mixed_float16 compile wraps the optimizer; its dynamic loss scale must stay too.
    assert optimizer == ("LossScaleOptimizer" if policy == "mixed_float16" else "Adam")
    assert len(without) == len(with_)
    for expected, actual in zip(without, with_):
        np.testing.assert_array_equal(expected, actual)
    assert rng_without == rng_with
    log = eventdata.load(tmp_path)
    # One event per optimizer step: under mixed_float16 the dynamic loss scale
    # skips the steps whose gradients overflow, which advance no step to log.
    logged = [step for step, _ in eventdata.values(log, records.stats_tag("pool", "activation"))]
    assert logged == list(range(1, steps_taken + 1))
    assert steps_taken == 8 if policy != "mixed_float16" else 0 < steps_taken <= 8
    dtype = "float16" if policy == "mixed_float16" else "float32"
    assert eventdata.content(log, records.stats_tag("pool", "input_gradient"))["dtype"] == dtype


def pool_model(kernel, auto_scale_loss=True):
    """MaxPool(2) over a (4, 4, 1) input, then a Dense(1) with a fixed kernel."""
    inputs = keras.Input((4, 4, 1))
    pooled = layers.MaxPooling2D(2, name="pool")(inputs)
    dense = layers.Dense(1, kernel_initializer=keras.initializers.Constant(kernel), name="dense")
    model = keras.Model(inputs, dense(layers.Flatten()(pooled)))
    model.compile(keras.optimizers.SGD(0.0), "mse", auto_scale_loss=auto_scale_loss)
    return model


def reference_gradients(model, x, y, scale):
    """The pool's input and output gradients as train_step computes them, unscaled in float64."""
    pool, dense = model.get_layer("pool"), model.get_layer("dense")
    with tf.GradientTape(persistent=True) as tape:
        pool_input = tf.cast(x, pool.compute_dtype)
        tape.watch(pool_input)
        activation = pool(pool_input)
        tape.watch(activation)
        loss = keras.losses.MeanSquaredError()(y, dense(layers.Flatten()(activation)))
        scaled = loss * scale
    gradients = tape.gradient(scaled, [pool_input, activation])
    return [g.numpy().astype(np.float64) / scale for g in gradients]


# With d loss / d output = 1e-3, the pool's output gradients are 1e-3 * KERNEL:
# 1e-8 is below half of float16's smallest subnormal (6e-8) and rounds to
# zero, 1e-6 is subnormal, the others are normal numbers.
KERNEL = np.array([[1e-5], [1e-3], [1e-1], [1.0]], "float32")


@pytest.mark.parametrize("auto_scale_loss", [True, False], ids=["loss_scaled", "unscaled"])
def test_float16_gradient_underflow_is_counted_not_hidden(tmp_path, policy, auto_scale_loss):
    model = pool_model(KERNEL, auto_scale_loss)
    x = np.arange(16, dtype="float32").reshape(1, 4, 4, 1)  # window maxima 5, 7, 13, 15
    y = model.predict(x, verbose=0).astype("float32") - 5e-4  # d loss / d output = 2 * 5e-4
    model.fit(x, y, verbose=0, callbacks=[GradVizCallback(tmp_path, (x, y))])

    mixed = policy == "mixed_float16"
    scaled = mixed and auto_scale_loss
    scale = float(model.optimizer.dynamic_scale.numpy()) if scaled else 1.0
    input_gradient, output_gradient = reference_gradients(model, x, y, scale)
    log = eventdata.load(tmp_path)
    assert_records_equal(log, "pool", "input_gradient", input_gradient)
    assert_records_equal(log, "pool", "output_gradient", output_gradient)
    content = eventdata.content(log, records.stats_tag("pool", "output_gradient"))
    assert (content["dtype"], content["loss_scaled"]) == ("float16" if mixed else "float32", scaled)

    # 4 windows over 16 positions: 12 zeros by routing alone.
    output_stats = eventdata.stats(log, "pool", "output_gradient")
    input_stats = eventdata.stats(log, "pool", "input_gradient")
    smallest_normal_float16 = 2.0**-14
    if mixed and not auto_scale_loss:
        # What train_step would see without loss scaling: one gradient is
        # an exact zero, one is subnormal; both are in the record.
        assert (output_stats["zeros"], input_stats["zeros"]) == (1, 13)
        below_normal = np.searchsorted(
            records.LOG_EDGES, smallest_normal_float16
        )  # bins wholly below 2**-14
        assert sum(output_stats["log_counts"]["positive"][:below_normal]) == 1
    else:
        # float32, or float16 with the loss scaled as train_step scales it.
        assert (output_stats["zeros"], input_stats["zeros"]) == (0, 12)
        assert output_stats["min"] == pytest.approx(1e-8, rel=0.02 if mixed else 1e-3)
    assert sum(output_stats["log_counts"]["positive"]) == 4 - output_stats["zeros"]


def test_nan_and_inf_are_counted_and_training_goes_on(tmp_path, policy):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4, 4, 1))
    passed = layers.Activation("linear", name="identity")(inputs)
    pooled = layers.MaxPooling2D(2, name="pool")(passed)
    model = keras.Model(inputs, layers.Dense(1, name="dense")(layers.Flatten()(pooled)))
    model.compile(keras.optimizers.SGD(0.01), "mse")
    x = np.arange(1, 17, dtype="float32").reshape(1, 4, 4, 1) / 64
    probe_x = x.copy()
    probe_x[0, 0, 0, 0] = np.inf
    probe_x[0, 0:2, 2:4, 0] = -np.inf
    probe_x[0, 3, 3, 0] = np.nan
    y = np.ones((1, 1), "float32")
    model.fit(
        x,
        y,
        epochs=3,
        verbose=0,
        callbacks=[GradVizCallback(tmp_path, (probe_x, y), layers=["identity", "pool"])],
    )

    log = eventdata.load(tmp_path)
    steps = [s for s, _ in eventdata.values(log, records.stats_tag("identity", "activation"))]
    # One event per epoch. Under mixed_float16 the first loss-scaled step
    # overflows; LossScaleOptimizer skips it and the step count waits.
    assert steps == ([0, 1, 2] if policy == "mixed_float16" else [1, 2, 3])
    identity = eventdata.stats(log, "identity", "activation")
    assert [identity[f] for f in ("count", "zeros", "nan", "pos_inf", "neg_inf")] == [
        16,
        0,
        1,
        1,
        4,
    ]
    assert (identity["min"], identity["max"]) == (2 / 64, 15 / 64)  # over the 10 finite values
    assert eventdata.histogram(log, "identity", "activation")[:, 2].sum() == 10
    # Whatever MaxPool makes of them (on CPU it skips NaN, and a window of
    # -inf gives the lowest finite value), the record counts what it output.
    expected = model.get_layer("pool")(
        tf.cast(probe_x, model.get_layer("pool").compute_dtype)
    ).numpy()
    assert_records_equal(log, "pool", "activation", expected)
    # The loss is Inf or NaN, so the gradients are too: counted, never dropped.
    gradient = eventdata.stats(log, "identity", "input_gradient")
    assert (
        gradient["count"] == 16 and gradient["nan"] + gradient["pos_inf"] + gradient["neg_inf"] > 0
    )
    assert gradient["nan"] + gradient["pos_inf"] + gradient["neg_inf"] + gradient["zeros"] == 16
    assert all(np.isfinite(w).all() for w in model.get_weights())
