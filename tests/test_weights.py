"""`weights=True` on the Keras backend in use: weight gradients, values and update sizes.

tests/run.sh runs this file under KERAS_BACKEND=tensorflow, jax and torch.
References are the backend's own autodiff through `model.stateless_call`
(tests/autodiff.py) and weight copies taken by a plain Keras callback.
"""

import copy

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import eventdata  # noqa: E402
from autodiff import gradients, numpy  # noqa: E402

from tb_gradviz import GradVizCallback  # noqa: E402
from tb_gradviz.capture import probe, selection, weights  # noqa: E402
from tb_gradviz.format import (  # noqa: E402
    records,
    summaries,
)

layers = keras.layers
CHOSEN = ["conv", "bn", "pool", "dense"]


def conv_bn_model(seed, learning_rate=0.0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        # BatchNorm after the ReLU: right after the conv, it would cancel the bias's gradient to
        # roundoff.
        [
            keras.Input((8, 8, 3)),
            layers.Conv2D(4, 3, padding="same", name="conv"),
            layers.ReLU(name="relu"),
            layers.BatchNormalization(name="bn"),
            layers.MaxPooling2D(name="pool"),
            layers.Flatten(name="flat"),
            layers.Dense(2, name="dense"),
        ],
        name="cnn",
    )
    model.compile(
        keras.optimizers.Adam(learning_rate) if learning_rate else keras.optimizers.SGD(0.0), "mse"
    )
    return model


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 8, 8, 3)).astype("float32"), rng.normal(size=(n, 2)).astype(
        "float32"
    )


def weight_gradient(model, variable, x, y, scale=1.0):
    """d loss / d variable by the backend's autodiff, of the loss as `train_step` computes it.

    The loss is multiplied by `scale` first.
    """
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    position = [id(v) for v in model.trainable_variables].index(id(variable))
    mse = keras.losses.MeanSquaredError()

    def loss(value):
        values = list(trainable)
        values[position] = value
        y_pred, _ = model.stateless_call(values, non_trainable, x, training=True)
        return mse(y, y_pred) * keras.ops.cast(scale, "float32")

    return gradients(loss, numpy(variable))[1]


def test_weight_gradients_and_values_equal_the_frameworks_own(tmp_path):
    model = conv_bn_model(seed=1)
    x, y = data(8, seed=1)
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=1,
        verbose=0,
        callbacks=[GradVizCallback(tmp_path, (x, y), layers=CHOSEN, weights=True)],
    )

    log = eventdata.load(tmp_path)
    for layer, names in (
        ("conv", ("kernel", "bias")),
        ("bn", ("gamma", "beta")),
        ("dense", ("kernel", "bias")),
    ):
        for name in names:
            variable = getattr(model.get_layer(layer), name)
            eventdata.assert_record_matches(
                log, layer, f"weight/{name}", numpy(variable), rel=1e-12
            )
            expected = weight_gradient(model, variable, x, y)
            # A sum that cancels (BatchNorm's beta) is compared to the sum of magnitudes.
            eventdata.assert_record_matches(
                log,
                layer,
                f"weight_gradient/{name}",
                expected,
                rel=1e-5,
                abs=1e-6 * np.abs(expected).sum(),
            )
            content = eventdata.content(log, records.stats_tag(layer, f"weight_gradient/{name}"))
            assert (content["role"], content["weight"], content["shape"]) == (
                "weight_gradient",
                name,
                list(variable.shape),
            )
            assert content["loss_scaled"] is False
    # The pooling layer has no weights; moving statistics are not trainable.
    tags = eventdata.tensor_tags(log)
    assert not [t for t in tags if t.startswith("gradviz/pool/weight")]
    assert not [t for t in tags if "moving" in t]
    # One log event: nothing to compare with yet, so no update record.
    assert not [t for t in tags if "/update/" in t]


def test_without_weights_nothing_of_the_weights_is_written(tmp_path):
    model = conv_bn_model(seed=1)
    x, y = data(8)
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=2,
        verbose=0,
        callbacks=[GradVizCallback(tmp_path, (x, y), layers=CHOSEN)],
    )
    tags = eventdata.tensor_tags(eventdata.load(tmp_path))
    assert tags and not [t for t in tags if "/weight" in t or "/update/" in t]


class WeightCopies(keras.callbacks.Callback):
    """Copies the weights at each epoch's end, as the GradViz callback after it sees them."""

    def __init__(self):
        super().__init__()
        self.copies = []

    def on_epoch_end(self, epoch, logs=None):
        self.copies.append(
            {v.path: numpy(v).astype(np.float64) for v in self.model.trainable_variables}
        )


def test_update_ratio_equals_one_computed_from_weight_copies(tmp_path):
    model = conv_bn_model(seed=2, learning_rate=0.01)
    x, y = data(24, seed=2)
    copies = WeightCopies()
    callback = GradVizCallback(tmp_path, (x[:8], y[:8]), layers=CHOSEN, weights=True)
    model.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False, callbacks=[copies, callback])

    log = eventdata.load(tmp_path)
    checked = 0
    for layer in ("conv", "bn", "dense"):
        for variable in model.get_layer(layer).trainable_weights:
            logged = eventdata.values(log, records.update_tag(layer, variable.name))
            assert [step for step, _ in logged] == [
                6,
                9,
            ]  # from the second log event on; 3 steps an epoch
            for (_, vector), before, after in zip(logged, copies.copies, copies.copies[1:]):
                update = dict(zip(records.UPDATE_FIELDS, vector))
                w, previous = after[variable.path], before[variable.path]
                assert update["interval"] == 3
                assert update["weight_norm"] == pytest.approx(np.linalg.norm(w), rel=1e-12)
                assert update["update_norm"] == pytest.approx(
                    np.linalg.norm(w - previous), rel=1e-12
                )
                assert update["update_ratio"] == pytest.approx(
                    np.linalg.norm(w - previous) / np.linalg.norm(w), rel=1e-12
                )
                assert update["update_norm"] > 0
                checked += 1
            content = eventdata.content(log, records.update_tag(layer, variable.name))
            assert (content["kind"], content["weight"], content["tensor"]) == (
                "update",
                variable.name,
                f"weight/{variable.name}",
            )
    assert checked == 12


def test_training_is_bit_identical_with_weights_on(tmp_path):
    x, y = data(32)
    runs = []
    for with_callback in (False, True):
        model = conv_bn_model(seed=7, learning_rate=0.01)
        callbacks = (
            [
                GradVizCallback(
                    tmp_path, (x[:8], y[:8]), layers=CHOSEN, every_n_batches=1, weights=True
                )
            ]
            if with_callback
            else []
        )
        keras.utils.set_random_seed(11)
        history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=callbacks)
        state = [numpy(v) for v in model.variables + model.optimizer.variables]
        runs.append((state, np.random.rand(), history.history))
    (without, rng_without, history_without), (with_, rng_with, history_with) = runs
    for expected, actual in zip(without, with_, strict=True):
        np.testing.assert_array_equal(expected, actual)
    assert (rng_without, history_without) == (rng_with, history_with)
    log = eventdata.load(tmp_path)
    assert len(eventdata.values(log, records.update_tag("conv", "kernel"))) == 7  # 8 log events


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_weight_gradients_are_unscaled(tmp_path, policy):
    keras.mixed_precision.set_dtype_policy(policy)
    try:
        model = conv_bn_model(seed=3)
        if policy == "mixed_float16":
            # A scale this model's float16 gradients do not overflow at (Keras starts at 2**15).
            model.compile(
                keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.0), initial_scale=256.0),
                "mse",
            )
        x, y = data(8, seed=3)
        model.fit(
            x,
            y,
            batch_size=8,
            epochs=1,
            verbose=0,
            callbacks=[GradVizCallback(tmp_path, (x, y), layers=["conv"], weights=True)],
        )
        scaled = policy == "mixed_float16"
        scale = float(numpy(model.optimizer.scale_loss(keras.ops.ones(())))) if scaled else 1.0
        assert scale == (256.0 if scaled else 1.0)
        kernel = model.get_layer("conv").kernel
        expected = weight_gradient(model, kernel, x, y, scale).astype(np.float64) / scale
        log = eventdata.load(tmp_path)
        content = eventdata.content(log, records.stats_tag("conv", "weight_gradient/kernel"))
        assert (content["dtype"], content["loss_scaled"]) == (
            "float32",
            scaled,
        )  # float32 variables
        logged = eventdata.stats(log, "conv", "weight_gradient/kernel")
        assert (logged["count"], logged["nan"], logged["pos_inf"], logged["neg_inf"]) == (
            expected.size,
            0,
            0,
            0,
        )
        assert logged["std"] == pytest.approx(expected.std(), rel=0.02)
        assert logged["max"] == pytest.approx(
            expected.max(), rel=0.02, abs=0.02 * np.abs(expected).max()
        )
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


def test_each_weight_is_recorded_once_by_the_deepest_chosen_layer():
    keras.utils.set_random_seed(0)
    inner = keras.Sequential([keras.Input((4,)), layers.Dense(3, name="d1")], name="inner")
    frozen = layers.Dense(2, name="frozen")
    model = keras.Sequential(
        [keras.Input((4,)), inner, frozen, layers.Dense(1, name="head")], name="outer"
    )
    frozen.trainable = False
    chosen = selection.select_layers(model, ["inner", "inner/d1", "frozen", "head"])
    owned = {
        path: [(name, v.path) for name, v in pairs]
        for path, pairs in weights.chosen_weights(chosen).items()
    }
    assert owned == {
        "inner": [],
        "inner/d1": [("kernel", "inner/d1/kernel"), ("bias", "inner/d1/bias")],
        "frozen": [],
        "head": [("kernel", "outer/head/kernel"), ("bias", "outer/head/bias")],
    }
    # Without its sublayer chosen, the nested model records its weights, named below it.
    owned = weights.chosen_weights(selection.select_layers(model, ["inner"]))
    assert [name for name, _ in owned["inner"]] == ["d1/kernel", "d1/bias"]


def test_a_bad_weights_argument_says_what_was_received(tmp_path):
    x, y = data(2)
    with pytest.raises(TypeError, match="weights must be True or False. Received: weights='yes'"):
        GradVizCallback(tmp_path, (x, y), weights="yes")


@pytest.fixture(scope="module")
def host_and_device_passes():
    """One model's pass with host and with device statistics, at steps 1 and 2 (a training step
    between): per statistics, each step's records, update records and what the pass kept.

    Host statistics hand the weights' host arrays on; device statistics leave Updates to read
    the variables. Built once: compiling each pass is most of these tests' time.
    """
    model = conv_bn_model(seed=5, learning_rate=0.01)
    x, y = data(8, seed=5)
    chosen = selection.select_layers(model, CHOSEN)
    probes = {
        s: probe.new_capture(model, chosen, statistics=s, weights=True) for s in ("host", "device")
    }
    trackers = {s: weights.Updates() for s in probes}
    written = {s: {} for s in probes}
    for step in (1, 2):
        for statistics, pass_ in probes.items():
            records_, _ = pass_.run(x, y)
            host = pass_.take_host_weights()
            kept = (len(host), pass_.host_weights)
            updates = trackers[statistics].records(pass_.plans, step, host)
            # Copies: nothing of a later step may write into what an earlier one returned.
            written[statistics][step] = copy.deepcopy((records_, updates, kept))
        model.train_on_batch(x, y)
    return written


@pytest.mark.parametrize("step", [1, 2])
def test_host_and_device_statistics_give_the_same_weight_records(host_and_device_passes, step):
    host, device = (host_and_device_passes[s][step][0] for s in ("host", "device"))
    # Both write the precision record, the same (`eventdata.assert_same_precision`).
    assert any(tag.endswith("/weight/kernel/precision") for tag, _, _ in host)
    assert [tag for tag, _, _ in host] == [tag for tag, _, _ in device]
    weight_tags = [tag for tag, _, _ in host if "/weight" in tag]
    assert len(weight_tags) == 6 * 2 * 3  # six weights, two roles, histogram, stats, precision
    summed = records.SUMMED_STATS
    for (tag, a, _), (_, b, _) in zip(host, device):
        if tag in weight_tags and tag.endswith("/stats"):
            exact = np.setdiff1d(
                np.arange(records.STATS_LENGTH), np.arange(records.STATS_LENGTH)[summed]
            )
            np.testing.assert_array_equal(a[exact], b[exact], err_msg=tag)
            np.testing.assert_allclose(a[summed], b[summed], rtol=1e-9, atol=1e-15, err_msg=tag)
        elif tag in weight_tags and tag.endswith("/precision"):
            eventdata.assert_same_precision(a, b, tag)
        elif tag in weight_tags:
            np.testing.assert_array_equal(a, b, err_msg=tag)


def test_update_records_are_the_same_from_the_passs_host_arrays_and_from_the_variables(
    host_and_device_passes,
):
    for statistics, steps in host_and_device_passes.items():
        for step, (_, _, (handed_on, left)) in steps.items():
            # Host statistics hand the six weights on; after the take, the pass keeps none.
            assert (handed_on == 6) == (statistics == "host") and left == {}, (statistics, step)
    host, device = (host_and_device_passes[s][2][1] for s in ("host", "device"))
    assert [tag for tag, _, _ in host] == [tag for tag, _, _ in device]
    assert len(host) == 6
    for (tag, a, _), (_, b, _) in zip(host, device):
        np.testing.assert_array_equal(a, b, err_msg=tag)


def test_tensorboards_own_histograms_dashboard_serves_the_weight_histograms(tmp_path):
    from tensorboard.plugins.histogram import histograms_plugin
    from test_plugin import make_app

    model = conv_bn_model(seed=6)
    x, y = data(8, seed=6)
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=1,
        verbose=0,
        callbacks=[GradVizCallback(tmp_path / "run", (x, y), layers=CHOSEN, weights=True)],
    )

    client, _ = make_app(tmp_path, other_plugins=[histograms_plugin.HistogramsPlugin])

    tags = client.get("/data/plugin/histograms/tags").json["run"]
    log = eventdata.load(tmp_path / "run")
    for layer, names in (
        ("conv", ("kernel", "bias")),
        ("bn", ("gamma", "beta")),
        ("dense", ("kernel", "bias")),
    ):
        for role in ("weight", "weight_gradient"):
            for name in names:
                tag = records.histogram_tag(layer, f"{role}/{name}")
                assert (
                    tags[tag]["description"] == f"<p>tb_gradviz: {role}/{name} of {layer}</p>"
                )  # rendered Markdown
                response = client.get(
                    "/data/plugin/histograms/histograms", query_string={"run": "run", "tag": tag}
                )
                assert response.status_code == 200
                ((_, step, buckets),) = response.json
                assert step == 1
                np.testing.assert_array_equal(
                    np.array(buckets), eventdata.histogram(log, layer, f"{role}/{name}")
                )
                if (
                    role == "weight"
                ):  # the weights as the step left them (SGD(0) leaves them as built)
                    expected = numpy(getattr(model.get_layer(layer), name)).astype(np.float64)
                    np.testing.assert_array_equal(
                        np.array(buckets), summaries.linear_histogram(expected)
                    )


def test_an_embeddings_weight_gradient_given_as_indexed_slices_is_recorded(tmp_path):
    # TensorFlow's tape gives an Embedding's kernel gradient as tf.IndexedSlices (the rows
    # looked up): it is recorded as the dense gradient, equal to the framework's own.
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((4,), dtype="int32"),
            keras.layers.Embedding(6, 3, name="embed"),
            keras.layers.Flatten(),
            keras.layers.Dense(2, name="dense"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.1), "mse")
    x = np.array([[0, 1, 1, 5], [2, 2, 3, 0]], dtype="int32")
    y = np.ones((2, 2), dtype="float32")
    callback = GradVizCallback(tmp_path, (x, y), layers=["embed"], weights=True)
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[callback])
    variable = model.get_layer("embed").embeddings
    expected = weight_gradient(model, variable, x, y)
    assert np.count_nonzero(np.abs(expected).sum(axis=1)) == 5  # row 4 is not looked up
    log = eventdata.load(tmp_path)
    eventdata.assert_record_matches(
        log, "embed", "weight_gradient/embeddings", expected, rel=1e-5, abs=1e-7
    )
