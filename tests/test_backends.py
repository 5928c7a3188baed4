"""The callback on the Keras backend in use, against that framework's own autodiff.

tests/run.sh runs this file under KERAS_BACKEND=tensorflow (with the rest of
the suite), jax and torch. References are written by hand in each framework
(`tf.GradientTape`, `jax.grad`, `torch.autograd.grad`), never with tb_gradviz.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import eventdata  # noqa: E402
from autodiff import BACKEND, gradients, numpy, tracing_count  # noqa: E402

from tb_gradviz import GradVizCallback  # noqa: E402
from tb_gradviz.format import digest, records, routing_map  # noqa: E402

layers = keras.layers


def conv_pool_model(pool, seed=1):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((12, 12, 2))
    conv = layers.Conv2D(6, 3, use_bias=False, name="conv")
    head = layers.Dense(3, name="dense")
    model = keras.Model(inputs, head(layers.Flatten()(pool(conv(inputs)))))
    model.compile(keras.optimizers.SGD(0.0), "mse")
    return model, conv, head


def fit_once(model, x, y, log_dir, **kwargs):
    callback = GradVizCallback(log_dir, probe_data=(x, y), **kwargs)
    model.fit(x, y, batch_size=len(x), epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    return callback


def test_maxpool_records_equal_the_frameworks_own_gradients(tmp_path):
    pool = layers.MaxPooling2D(2, name="pool")
    model, conv, head = conv_pool_model(pool)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 12, 12, 2)).astype("float32")
    y = rng.normal(size=(4, 3)).astype("float32")
    fit_once(model, x, y, tmp_path)

    mse = keras.losses.MeanSquaredError()
    pool_input = numpy(conv(x))
    activation = numpy(pool(pool_input))
    _, input_gradient = gradients(lambda p: mse(y, head(layers.Flatten()(pool(p)))), pool_input)
    _, output_gradient = gradients(lambda a: mse(y, head(layers.Flatten()(a))), activation)

    log = eventdata.load(tmp_path)
    eventdata.assert_record_matches(log, "pool", "activation", activation)
    eventdata.assert_record_matches(log, "pool", "input_gradient", input_gradient)
    eventdata.assert_record_matches(log, "pool", "output_gradient", output_gradient)
    routing = eventdata.routing(log, "pool")
    assert routing["input_positions"] == input_gradient.size == 4 * 10 * 10 * 6
    assert routing["windows"] == activation.size == 4 * 5 * 5 * 6
    assert routing["tied_windows"] == 0  # random normal values do not tie
    assert routing["routed_positions"] == activation.size
    assert routing["input_gradient_sum"] == pytest.approx(
        float(input_gradient.sum(dtype=np.float64)), rel=1e-6
    )
    assert routing["output_gradient_abs_sum"] == pytest.approx(
        float(np.abs(output_gradient).sum(dtype=np.float64)), rel=1e-6
    )
    content = eventdata.content(log, records.stats_tag("pool", "input_gradient"))
    assert (content["backend"], content["device"], content["shape"]) == (
        BACKEND,
        "cpu",
        [4, 10, 10, 6],
    )


def test_the_tie_rule_on_this_backend_is_the_first_maximum(tmp_path):
    # An all-zero 4x4 input: every 2x2 window ties, and the gradient of the
    # sum goes to each window's first position in raster order.
    pool = layers.MaxPooling2D(2)
    _, routes = gradients(lambda t: keras.ops.sum(pool(t)), np.zeros((1, 4, 4, 1), "float32"))
    expected = np.zeros((4, 4), "float32")
    expected[::2, ::2] = 1
    np.testing.assert_array_equal(routes[0, :, :, 0], expected)

    # ReLU zeros in the probe: the record counts the tied windows, one routed position each.
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((4, 4, 1)),
            layers.ReLU(name="relu"),
            layers.MaxPooling2D(2, name="pool"),
            layers.Flatten(),
            layers.Dense(1, name="dense"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.0), "mse")
    x = -np.ones((2, 4, 4, 1), "float32")
    fit_once(model, x, np.ones((2, 1), "float32"), tmp_path)
    routing = eventdata.routing(eventdata.load(tmp_path), "pool")
    assert (routing["windows"], routing["tied_windows"], routing["routed_positions"]) == (8, 8, 8)


def model_state(model):
    return [(v.path, numpy(v)) for v in model.variables + model.optimizer.variables]


def bn_dropout_cnn(seed):
    keras.utils.set_random_seed(seed)
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
        ],
        name="cnn",
    )
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
    return model


def data(n=16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 8, 8, 3)).astype("float32"), rng.normal(size=(n, 2)).astype(
        "float32"
    )


def test_training_is_bit_identical_with_and_without_the_callback(tmp_path):
    x, y = data(32)
    runs = []
    for with_callback in (False, True):
        model = bn_dropout_cnn(seed=7)
        callbacks = (
            [
                GradVizCallback(
                    tmp_path, (x[:8], y[:8]), layers=["conv", "drop", "pool"], every_n_batches=1
                )
            ]
            if with_callback
            else []
        )
        keras.utils.set_random_seed(11)
        history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=callbacks)
        follow_up = (np.random.rand(), float(numpy(keras.random.uniform(()))))
        runs.append((model_state(model), follow_up, history.history))
    (without, rng_without, history_without), (with_, rng_with, history_with) = runs
    assert len(without) == len(with_)  # paths differ: seed generators get instance counters
    assert any("moving_mean" in p for p, _ in without) and any(
        "seed_generator" in p for p, _ in without
    )
    for (path, expected), (_, actual) in zip(without, with_):
        np.testing.assert_array_equal(expected, actual, err_msg=path)
    assert rng_without == rng_with
    assert history_without == history_with
    assert (
        len(eventdata.values(eventdata.load(tmp_path), records.stats_tag("pool", "activation")))
        == 8
    )


def test_steps_frequency_and_layer_choice(tmp_path):
    x, y = data(16)
    model = bn_dropout_cnn(0)
    callback = GradVizCallback(
        tmp_path / "b", (x[:4], y[:4]), every_n_batches=3, layers=["re*", layers.Conv2D, "pool"]
    )
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[callback])
    log = eventdata.load(tmp_path / "b")
    assert [s for s, _ in eventdata.values(log, records.stats_tag("pool", "input_gradient"))] == [
        3,
        6,
    ]
    assert eventdata.layers(log) == callback.chosen_layers == ["conv", "relu", "pool"]
    with pytest.raises(ValueError, match=r"'pol'.*Nearest: 'pool'"):
        model.fit(
            x, y, epochs=1, verbose=0, callbacks=[GradVizCallback(tmp_path, (x, y), layers="pol")]
        )


def test_nested_model_layers_are_reached_by_path(tmp_path):
    keras.utils.set_random_seed(2)
    inner_in = keras.Input((8, 8, 3))
    inner = keras.Model(
        inner_in,
        layers.MaxPooling2D(name="pool")(
            layers.Conv2D(4, 3, padding="same", name="conv")(inner_in)
        ),
        name="block",
    )
    model = keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            inner,
            layers.GlobalAveragePooling2D(name="gap"),
            layers.Dense(2, name="dense"),
        ]
    )
    model.compile("sgd", "mse")
    x, y = data(4)
    callback = fit_once(model, x, y, tmp_path)
    assert callback.chosen_layers == ["block/pool", "gap"]
    log = eventdata.load(tmp_path)
    pool_input = numpy(inner.get_layer("conv")(x))
    pool, gap, dense = inner.get_layer("pool"), model.get_layer("gap"), model.get_layer("dense")
    mse = keras.losses.MeanSquaredError()
    _, expected = gradients(lambda p: mse(y, dense(gap(pool(p)))), pool_input)
    eventdata.assert_record_matches(log, "block/pool", "input_gradient", expected)
    routing = eventdata.routing(log, "gap")
    assert routing["routed_positions"] == routing["input_positions"] == 4 * 4 * 4 * 4


def test_multi_input_add_and_subclassed_models(tmp_path):
    keras.utils.set_random_seed(0)
    a, b = keras.Input((6,), name="a"), keras.Input((6,), name="b")
    summed = layers.Add(name="add")([layers.Dense(4, name="da")(a), layers.Dense(4, name="db")(b)])
    model = keras.Model({"a": a, "b": b}, layers.Dense(1, name="out")(summed))
    model.compile("sgd", "mse")
    rng = np.random.default_rng(0)
    x = {
        "a": rng.normal(size=(5, 6)).astype("float32"),
        "b": rng.normal(size=(5, 6)).astype("float32"),
    }
    y = rng.normal(size=(5, 1)).astype("float32")
    model.fit(x, y, verbose=0, callbacks=[GradVizCallback(tmp_path / "add", (x, y), layers="add")])
    log = eventdata.load(tmp_path / "add")
    grads = [
        eventdata.stats(log, "add", t)
        for t in ("input_gradient_0", "input_gradient_1", "output_gradient")
    ]
    # Add passes its output gradient unchanged to each input.
    assert grads[0]["sum"] == grads[1]["sum"] == pytest.approx(grads[2]["sum"], rel=1e-12)
    assert eventdata.content(log, records.stats_tag("add", "input_gradient_1"))["index"] == 1

    class Block(layers.Layer):  # a plain layer that holds layers
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.conv = layers.Conv2D(3, 3, padding="same", name="conv")
            self.pool = layers.AveragePooling2D(2, name="pool")

        def call(self, inputs):
            return self.pool(self.conv(inputs))

    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="net")
            self.block = Block(name="block")
            self.head = layers.Dense(2, name="head")

        def call(self, inputs):
            return self.head(keras.ops.mean(self.block(inputs), axis=(1, 2)))

    keras.utils.set_random_seed(0)
    net = Net()
    net.compile("sgd", "mse")
    x, y = data(4)
    callback = GradVizCallback(tmp_path / "net", (x, y))
    net.fit(x, y, verbose=0, callbacks=[callback])
    assert callback.chosen_layers == ["block/pool"]
    routing = eventdata.routing(eventdata.load(tmp_path / "net"), "block/pool")
    assert routing["routed_positions"] == routing["input_positions"] == 4 * 8 * 8 * 3
    assert np.isnan(routing["tied_windows"])


def test_a_layers_input_gradient_is_the_gradient_through_that_layer_alone(tmp_path):
    # h feeds the Dense "a" and, around it, the Add: d loss / d h sums both
    # paths, but a's input gradient is the part that flows back through a.
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    pre, a, add, head = (
        layers.Dense(6, name="pre"),
        layers.Dense(6, name="a"),
        layers.Add(name="add"),
        layers.Dense(1, name="head"),
    )
    h = pre(inputs)
    model = keras.Model(inputs, head(add([h, a(h)])))
    model.compile(keras.optimizers.SGD(0.0), "mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(5, 6)).astype("float32"), rng.normal(size=(5, 1)).astype("float32")
    fit_once(model, x, y, tmp_path, layers=["pre", "a", "add"])

    mse = keras.losses.MeanSquaredError()
    h = numpy(pre(x))
    through_a = gradients(lambda v: mse(y, head(add([keras.ops.convert_to_tensor(h), a(v)]))), h)[1]
    total = gradients(lambda v: mse(y, head(add([v, a(v)]))), h)[1]
    at_sum = gradients(lambda s: mse(y, head(s)), numpy(add([h, a(h)])))[1]
    log = eventdata.load(tmp_path)
    eventdata.assert_record_matches(log, "a", "input_gradient", through_a, rel=1e-5)
    eventdata.assert_record_matches(log, "a", "output_gradient", at_sum, rel=1e-5)
    eventdata.assert_record_matches(log, "add", "input_gradient_0", at_sum, rel=1e-5)
    eventdata.assert_record_matches(log, "pre", "output_gradient", total, rel=1e-5)
    # The two paths differ, so the test tells them apart.
    np.testing.assert_allclose(total, through_a + at_sum, rtol=1e-5, atol=1e-7)
    assert float(np.abs(total - through_a).sum()) > 0.1 * float(np.abs(total).sum())


def test_nan_and_inf_are_counted_and_kept_out_of_the_histogram(tmp_path):
    # Average pooling carries NaN and Inf through on every backend (TensorFlow's
    # CPU max pool drops a NaN from its window; JAX and PyTorch propagate it).
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((4, 4, 1)),
            layers.AveragePooling2D(2, name="pool"),
            layers.Flatten(),
            layers.Dense(1, name="dense"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.0), "mse")
    x = np.arange(32, dtype="float32").reshape(2, 4, 4, 1)
    x[0, 1, 1, 0], x[1, 3, 3, 0] = np.nan, np.inf
    callback = GradVizCallback(tmp_path, (x, np.ones((2, 1), "float32")))
    callback.set_model(model)
    callback.log_now(step=5)
    log = eventdata.load(tmp_path)
    activation = eventdata.stats(log, "pool", "activation")
    assert (activation["count"], activation["nan"], activation["pos_inf"]) == (8, 1, 1)
    assert eventdata.histogram(log, "pool", "activation")[:, 2].sum() == 6
    assert [s for s, _ in eventdata.values(log, records.stats_tag("pool", "activation"))] == [5]


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_records_the_unscaled_gradients_in_their_dtype(tmp_path, policy):
    keras.mixed_precision.set_dtype_policy(policy)
    try:
        model, conv, head = conv_pool_model(layers.MaxPooling2D(2, name="pool"), seed=3)
        model.compile(
            keras.optimizers.SGD(0.0), "mse"
        )  # mixed_float16 wraps it in a LossScaleOptimizer
        rng = np.random.default_rng(3)
        x = rng.normal(size=(4, 12, 12, 2)).astype("float32")
        y = rng.normal(size=(4, 3)).astype("float32")
        fit_once(model, x, y, tmp_path)
        scaled = policy == "mixed_float16"
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer) == scaled
        mse = keras.losses.MeanSquaredError()
        scale = float(numpy(model.optimizer.scale_loss(keras.ops.ones(())))) if scaled else 1.0
        activation = numpy(model.get_layer("pool")(conv(x)))
        _, output_gradient = gradients(
            lambda a: mse(y, head(layers.Flatten()(a))) * keras.ops.cast(scale, "float32"),
            activation,
        )
        log = eventdata.load(tmp_path)
        dtype = policy.removeprefix("mixed_")
        content = eventdata.content(log, records.stats_tag("pool", "output_gradient"))
        assert (content["dtype"], content["loss_scaled"]) == (dtype, scaled)
        logged = eventdata.stats(log, "pool", "output_gradient")
        expected = output_gradient.astype(np.float64) / scale
        assert logged["count"] == expected.size
        assert logged["sum"] == pytest.approx(
            expected.sum(), rel=0.05, abs=1e-3 * np.abs(expected).sum()
        )
        assert logged["max"] == pytest.approx(expected.max(), rel=0.02)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


class Batches(keras.utils.PyDataset):
    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return self.x[i * 3 : (i + 1) * 3], self.y[i * 3 : (i + 1) * 3]


def probe_sources(x, y):
    """Every kind of probe data this backend can be given, each with its batch size."""
    sources = {
        "numpy": ((x[:5], y[:5]), 5),
        "backend tensors": (
            (keras.ops.convert_to_tensor(x[:4]), keras.ops.convert_to_tensor(y[:4])),
            4,
        ),
        "PyDataset": (Batches(x, y), 3),
        "iterable": (Reiterable(x, y), 2),
    }
    try:
        import tensorflow as tf

        sources["tf.data"] = (tf.data.Dataset.from_tensor_slices((x, y)).batch(6), 6)
    except ImportError:
        pass
    if BACKEND == "torch":
        import torch

        sources["DataLoader"] = (
            torch.utils.data.DataLoader(
                torch.utils.data.TensorDataset(torch.tensor(x), torch.tensor(y)), batch_size=7
            ),
            7,
        )
    return sources


def test_every_kind_of_probe_data(tmp_path):
    x, y = data(16)
    model = bn_dropout_cnn(0)
    for name, (source, size) in probe_sources(x, y).items():
        callback = GradVizCallback(tmp_path / name.replace(" ", "_"), source)
        callback.set_model(model)
        callback.log_now(step=0)
        content = eventdata.content(
            eventdata.load(tmp_path / name.replace(" ", "_")),
            records.stats_tag("pool", "activation"),
        )
        assert content["shape"] == [size, 4, 4, 4], name
    with pytest.raises(
        ValueError, match=r"at least one \(x, y\) batch\. Received: an empty Reiterable"
    ):
        GradVizCallback(tmp_path, Reiterable(x[:0], y[:0]))
    with pytest.raises(
        TypeError,
        match=r"first batch of probe_data \(a Reiterable\) must be \(x, y\).*"
        r"Received: a \w+ of shape \(2, 8, 8, 3\)",
    ):
        GradVizCallback(tmp_path, Reiterable(x, None))
    with pytest.raises(TypeError, match=r"one-shot iterator \(a generator\)"):
        GradVizCallback(tmp_path, (batch for batch in Reiterable(x, y)))


class Reiterable:
    """An iterable of (x, y) batches of 2 that can be read again; y None: batches of x alone."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        for i in range(0, len(self.x), 2):
            yield self.x[i : i + 2] if self.y is None else (self.x[i : i + 2], self.y[i : i + 2])


def test_a_custom_training_loop_logs_with_log_now(tmp_path):
    # Outside fit: set the model once, then log at the loop's own steps.
    model = bn_dropout_cnn(0)
    x, y = data(8)
    callback = GradVizCallback(tmp_path, (x[:4], y[:4]))
    callback.set_model(model)
    for step in (10, 20):
        model.train_on_batch(x, y)
        callback.log_now(step=step)
    callback.on_train_end()
    log = eventdata.load(tmp_path)
    assert [s for s, _ in eventdata.values(log, records.stats_tag("pool", "activation"))] == [
        10,
        20,
    ]
    with pytest.raises(ValueError, match="step must be a non-negative integer. Received: step=-1"):
        callback.log_now(step=-1)


@pytest.mark.skipif(BACKEND == "torch", reason="PyTorch runs the pass eagerly: nothing is traced")
def test_log_events_across_fits_reuse_one_compiled_pass(tmp_path):
    # A retrace per event would cost seconds each; steps and fits change no shape.
    model = bn_dropout_cnn(0)
    x, y = data(8)
    callback = GradVizCallback(tmp_path, (x[:4], y[:4]), every_n_batches=1)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[callback])
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[callback])
    callback.log_now()
    assert tracing_count(callback._capture) == 1


def test_bad_arguments_say_what_was_received(tmp_path):
    x, y = data(2)
    with pytest.raises(
        ValueError, match="every_n_batches must be a positive integer. Received: every_n_batches=0"
    ):
        GradVizCallback(tmp_path, (x, y), every_n_batches=0)
    with pytest.raises(ValueError, match=r"same batch size\. Received: batch sizes \[1, 2\]"):
        GradVizCallback(tmp_path, (x, y[:1]))


def test_tb_gradviz_imports_no_framework_beyond_what_keras_does(tmp_path):
    # Keras' PyTorch backend imports JAX itself when it is installed; the
    # callback adds none: not TensorFlow on JAX, say.
    script = (
        "import sys, numpy as np, keras\n"
        "frameworks = lambda: sorted(n for n in ('tensorflow', 'jax', 'torch') if n in "
        "sys.modules)\n"
        "print(frameworks())\n"
        "import tb_gradviz\n"
        "m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.MaxPooling2D(), "
        "keras.layers.Flatten(), keras.layers.Dense(1)])\n"
        "m.compile('sgd', 'mse')\n"
        "x, y = np.ones((2, 4, 4, 1), 'float32'), np.ones((2, 1), 'float32')\n"
        f"m.fit(x, y, verbose=0, callbacks=[tb_gradviz.GradVizCallback({str(tmp_path)!r}, (x, "
        "y))])\n"
        "print(frameworks())\n"
    )
    env = dict(os.environ, KERAS_BACKEND=BACKEND)
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    keras_alone, with_callback = result.stdout.split("\n")[-3:-1]
    assert BACKEND in keras_alone
    assert with_callback == keras_alone


def test_without_numba_the_callback_warns_once_and_writes_the_same_records(tmp_path):
    # `pip install tb_gradviz` without an extra leaves numba out: the import is blocked here.
    script = (
        "import sys, warnings, numpy as np\n"
        "if sys.argv[1] == 'blocked': sys.modules['numba'] = None\n"
        "import keras, tb_gradviz\n"
        "assert 'GradVizCallback' in dir(tb_gradviz)\n"
        "keras.utils.set_random_seed(0)\n"
        "m = keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(3, 3, name='conv'), "
        "keras.layers.MaxPooling2D(name='pool'),"
        " keras.layers.Flatten(), keras.layers.Dense(1)])\n"
        "m.compile('sgd', 'mse')\n"
        "x, y = np.random.default_rng(0).normal(size=(4, 6, 6, 2)).astype('float32'), np.ones((4, "
        "1), 'float32')\n"
        "cb = tb_gradviz.GradVizCallback(sys.argv[2], (x, y), layers=['conv', 'pool'], "
        "weights=True)\n"
        "cb.set_model(m)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    cb.log_now(step=1); m.train_on_batch(x, y); cb.log_now(step=2)\n"
        "print([str(w.message) for w in caught if 'numba' in str(w.message)])\n"
    )
    env = dict(os.environ, KERAS_BACKEND=BACKEND)
    outputs = {}
    for mode in ("blocked", "installed"):
        result = subprocess.run(
            [sys.executable, "-c", script, mode, str(tmp_path / mode)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        outputs[mode] = result.stdout.strip().split("\n")[-1]
    assert outputs["installed"] == "[]"
    assert outputs["blocked"].count("numba is not installed") == 1
    assert 'pip install "numba>=0.60"' in outputs["blocked"]
    blocked, installed = (
        eventdata.load(tmp_path / "blocked"),
        eventdata.load(tmp_path / "installed"),
    )
    assert eventdata.tensor_tags(blocked) == eventdata.tensor_tags(installed)
    assert records.update_tag("conv", "kernel") in eventdata.tensor_tags(
        installed
    )  # weights=True: the update sums too
    for tag in eventdata.tensor_tags(installed):
        for (step_a, a), (step_b, b) in zip(
            eventdata.values(blocked, tag), eventdata.values(installed, tag)
        ):
            assert step_a == step_b
            # The digest is float32: its RMS may round the stats' last bits either way.
            rtol = 1e-6 if tag.startswith(digest.TAG_PREFIX) else 1e-9
            np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-12, err_msg=tag)


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution runs on JAX")
def test_under_keras_distribution_the_probe_runs_on_one_device_with_the_same_records(tmp_path):
    # Two CPU devices stand in for two accelerators; DataParallel replicates the model on both.
    script = (
        "import sys, numpy as np, keras, jax\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "import eventdata\n"
        "from tb_gradviz import GradVizCallback\n"
        "def run(logdir, distributed):\n"
        "    if distributed:\n"
        "        keras.distribution.set_distribution("
        "keras.distribution.DataParallel(devices=jax.devices()))\n"
        "    keras.utils.set_random_seed(0)\n"
        "    L = keras.layers\n"
        "    m = keras.Sequential([keras.Input((8, 8, 3)), L.Conv2D(4, 3, padding='same', "
        "name='conv'),"
        " L.BatchNormalization(name='bn'), L.MaxPooling2D(name='pool'), L.Flatten(), L.Dense(2)])\n"
        "    m.compile(keras.optimizers.SGD(0.0), 'mse')  # the same weights at the log event\n"
        "    rng = np.random.default_rng(0)\n"
        "    x, y = rng.normal(size=(16, 8, 8, 3)).astype('float32'), rng.normal(size=(16, "
        "2)).astype('float32')\n"
        "    cb = GradVizCallback(logdir, (x[:6], y[:6]), layers=['conv', 'pool'], weights=True)\n"
        "    m.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[cb])\n"
        "    print(len(jax.devices()), len(m.trainable_variables[0].value.devices()), "
        "cb._capture.devices)\n"
        "    return eventdata.load(logdir)\n"
        "plain, distributed = run(sys.argv[1] + '/plain', False), run(sys.argv[1] + "
        "'/distributed', True)\n"
        "assert eventdata.tensor_tags(plain) == eventdata.tensor_tags(distributed)\n"
        "for tag in eventdata.tensor_tags(plain):\n"
        "    np.testing.assert_array_equal(eventdata.last(plain, tag), eventdata.last(distributed, "
        "tag), err_msg=tag)\n"
    )
    env = dict(
        os.environ, KERAS_BACKEND="jax", XLA_FLAGS="--xla_force_host_platform_device_count=2"
    )
    tests = os.path.dirname(os.path.abspath(__file__))
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), tests],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    plain, distributed = result.stdout.strip().split("\n")[-2:]
    assert plain == "2 1 ['cpu:0']"
    assert distributed == "2 2 ['cpu:0']"  # the model lives on both devices, the probe ran on one


def test_host_and_device_statistics_give_the_same_records():
    # On a CPU the tensors go to the host kernel; on an accelerator the
    # backend's own ops summarise them. Both paths run here, on the CPU.
    from tb_gradviz.capture import probe, selection

    keras.utils.set_random_seed(3)
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
    rng = np.random.default_rng(3)
    x, y = rng.random((4, 8, 8, 3), "float32"), rng.random((4, 2), "float32")
    chosen = selection.select_layers(model, ["*"])
    host, _ = probe.new_capture(model, chosen, statistics="host").run(x, y)
    device, _ = probe.new_capture(model, chosen, statistics="device").run(x, y)
    # Both write the precision record, the same (`eventdata.assert_same_precision`).
    assert any(tag.endswith("/precision") for tag, _, _ in host)
    assert [tag for tag, _, _ in host] == [tag for tag, _, _ in device]
    summed = [records.STATS_FIELDS.index(f) for f in ("mean", "std", "sum")]
    for (tag, a, _), (_, b, _) in zip(host, device):
        if tag.endswith("/stats"):
            exact = np.setdiff1d(np.arange(records.STATS_LENGTH), summed)
            np.testing.assert_array_equal(a[exact], b[exact], err_msg=tag)
            np.testing.assert_allclose(a[summed], b[summed], rtol=1e-9, atol=1e-15, err_msg=tag)
        elif tag.endswith("/routing"):
            np.testing.assert_allclose(a, b, rtol=1e-9, err_msg=tag)
        elif tag.endswith("/precision"):
            eventdata.assert_same_precision(a, b, tag)
        else:
            np.testing.assert_array_equal(a, b, err_msg=tag)


def test_a_nan_in_a_max_pool_window_is_what_the_backend_computes(tmp_path):
    # TensorFlow's CPU MaxPool skips a NaN in its window; JAX and PyTorch give NaN.
    # The records show what each backend computed (docs/probe.md, "NaN and Inf").
    x = np.arange(16, dtype="float32").reshape(1, 4, 4, 1)
    x[0, 0, 0, 0] = np.nan
    pooled = numpy(layers.MaxPooling2D(2)(x))[0, :, :, 0]
    expected_first = 5.0 if BACKEND == "tensorflow" else np.nan
    np.testing.assert_array_equal(pooled, [[expected_first, 7.0], [13.0, 15.0]])


def test_dead_channels_are_recorded_alike_on_every_backend(tmp_path):
    # Issue 13: the units record, computed in keras.ops inside each backend's pass.
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 6, 1))
    conv = layers.Conv2D(
        5,
        3,
        padding="same",
        activation="relu",
        name="conv",
        bias_initializer=keras.initializers.Constant([0.0, -40.0, 0.2, 0.0, -40.0]),
    )
    model = keras.Model(
        inputs,
        layers.Dense(2, name="head")(
            layers.Flatten()(layers.MaxPooling2D(name="pool")(conv(inputs)))
        ),
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(5).normal(size=(4, 6, 6, 1)).astype("float32")
    callback = GradVizCallback(tmp_path, (x, np.arange(4) % 2), layers=["conv", "pool", "head"])
    callback.set_model(model)
    callback.log_now(step=3)
    callback.on_train_end()
    log = eventdata.load(tmp_path)
    activation = numpy(conv(x))
    reference = np.flatnonzero(np.all(activation == 0, axis=(0, 1, 2))).tolist()
    assert reference == [1, 4]
    for layer, channels in (("conv", 5), ("pool", 5)):
        units = records.decode_units(eventdata.last(log, records.units_tag(layer)))
        assert units == {"channels": channels, "dead_channels": 2, "listed": reference}
    assert records.decode_units(eventdata.last(log, records.units_tag("head"))) == {
        "channels": 2,
        "dead_channels": 0,
        "listed": [],
    }


def test_routing_map_is_the_backends_own_gradient_and_the_first_maximum(tmp_path):
    # Issue 12 on every backend: the input gradient is the backend's, the winner the first maximum.
    pool = layers.MaxPooling2D(3, strides=2, name="pool")
    model, conv, head = conv_pool_model(pool, seed=4)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3, 12, 12, 2)).astype("float32")
    y = rng.normal(size=(3, 3)).astype("float32")
    callback = GradVizCallback(
        tmp_path, (x, y), layers=["pool"], routing_map_example=1, routing_map_channels=[0, 5]
    )
    callback.set_model(model)
    callback.log_now(step=1)
    callback.on_train_end()
    log = eventdata.load(tmp_path)
    content = eventdata.content(log, records.routing_map_tag("pool"))
    rows = [
        routing_map.decode(row, content)
        for row in eventdata.last(log, records.routing_map_tag("pool"))
    ]
    mse = keras.losses.MeanSquaredError()
    _, input_gradient = gradients(lambda p: mse(y, head(layers.Flatten()(pool(p)))), numpy(conv(x)))
    assert [row["channel"] for row in rows] == [0, 5]
    for row in rows:
        c = row["channel"]
        np.testing.assert_allclose(
            row["input_gradient"], input_gradient[1, :, :, c].ravel(), rtol=1e-6, atol=1e-9
        )
        plane = numpy(conv(x))[1, :, :, c]
        expected = []
        for i in range(4):  # 10x10 map, 3x3 windows, stride 2
            for j in range(4):
                window = plane[2 * i : 2 * i + 3, 2 * j : 2 * j + 3]
                flat = int(np.argmax(window))
                expected.append((2 * i + flat // 3) * 10 + 2 * j + flat % 3)
        assert row["winner"] == expected


def test_the_digest_equals_the_full_records_on_every_backend(tmp_path):
    # Dead channels, several weights and update rows: the digest of each event holds
    # what that event's stats, units and update records say, whichever pass computed them.
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 6, 1))
    conv = layers.Conv2D(
        4,
        3,
        padding="same",
        activation="relu",
        name="conv",
        bias_initializer=keras.initializers.Constant([0.0, -40.0, 0.2, 0.0]),
    )
    model = keras.Model(
        inputs,
        layers.Dense(2, name="head")(
            layers.Flatten()(layers.MaxPooling2D(name="pool")(conv(inputs)))
        ),
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(5).normal(size=(4, 6, 6, 1)).astype("float32")
    callback = GradVizCallback(
        tmp_path, (x, np.arange(4) % 2), layers=["conv", "pool", "head"], weights=True
    )
    callback.set_model(model)
    for step in (1, 2, 3):
        model.train_on_batch(x, np.arange(4) % 2)
        callback.log_now(step=step)
    callback.on_train_end()
    log = eventdata.load(tmp_path)
    assert eventdata.assert_digest_equals_records(log) == 3
    (tag,) = eventdata.digest_tags(log)
    rows = eventdata.content(log, tag)["rows"]
    kinds = [kind for kind, _, _ in rows]
    assert kinds.count("units") == 3 and kinds.count("update") == 4  # 2 kernels, 2 biases
    # A precision row per precision record, checked against it above.
    assert kinds.count("precision") == kinds.count("tensor")
    decoded = digest.decode_digest(rows, np.stack([v for _, v in eventdata.values(log, tag)]))
    ratio = decoded[("update", "conv", "kernel")]["update_ratio"]
    assert np.isnan(ratio[0]) and np.all(ratio[1:] > 0)
    assert decoded[("units", "conv", "activation")]["dead_channels"].tolist() == [1, 1, 1]


@pytest.mark.parametrize(
    "steps_per_execution, expected",
    [(1, [3, 6, 9, 12]), (2, [4, 6, 10, 12]), (4, [4, 8, 12])],
)
def test_every_n_batches_logs_at_the_first_batch_end_after_each_multiple_with_steps_per_execution(
    tmp_path, steps_per_execution, expected
):
    # Keras calls the batch hook once per execution of steps_per_execution steps.
    if BACKEND == "torch" and steps_per_execution > 1:
        pytest.skip("Keras' PyTorch backend requires steps_per_execution=1")
    x, y = data(24)
    model = bn_dropout_cnn(0)
    model.compile(keras.optimizers.SGD(0.01), "mse", steps_per_execution=steps_per_execution)
    callback = GradVizCallback(tmp_path, (x[:4], y[:4]), every_n_batches=3)
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    log = eventdata.load(tmp_path)
    steps = [s for s, _ in eventdata.values(log, records.stats_tag("pool", "activation"))]
    assert steps == expected


def test_a_probe_y_the_loss_cannot_take_fails_when_fit_starts_and_no_step_runs(tmp_path):
    # y of shape (2, 5) against a (2, 2) output used to fail inside fit, at the first log event.
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4, 4, 1)), keras.layers.MaxPooling2D(name="pool"), keras.layers.Flatten()]
        + [keras.layers.Dense(2)]
    )
    model.compile("sgd", "mse")
    x = np.ones((2, 4, 4, 1), "float32")
    before = [numpy(w) for w in model.weights]
    callback = GradVizCallback(tmp_path, (x, np.ones((2, 5), "float32")))
    with pytest.raises(
        ValueError, match=r"probe_data's y does not fit .* of shape \(2, 2\)"
    ) as raised:
        model.fit(x, np.ones((2, 2), "float32"), epochs=1, verbose=0, callbacks=[callback])
    assert str(raised.value).endswith("Received: probe_data y of shape (2, 5)")
    assert all(np.array_equal(a, numpy(b)) for a, b in zip(before, model.weights))
    assert not list(tmp_path.iterdir())  # nothing written
    # The same y with a loss that takes it, and a y that fits: both train.
    labels = GradVizCallback(
        tmp_path / "sparse", (x, np.array([0, 1])), loss="sparse_categorical_crossentropy"
    )
    fits = GradVizCallback(tmp_path / "fits", (x, np.ones((2, 2), "float32")))
    model.fit(x, np.ones((2, 2), "float32"), epochs=1, verbose=0, callbacks=[labels, fits])
