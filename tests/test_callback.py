"""GradVizCallback in model.fit: frequency, steps, files, layer choice, arguments."""

import os
import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import eventdata  # noqa: E402
from autodiff import tracing_count  # noqa: E402

from tb_gradviz import GradVizCallback  # noqa: E402
from tb_gradviz.format import records  # noqa: E402

layers = keras.layers


def small_cnn(seed=0, dropout=0.0, batchnorm=False):
    keras.utils.set_random_seed(seed)
    body = [keras.Input((8, 8, 3)), layers.Conv2D(4, 3, padding="same", name="conv")]
    if batchnorm:
        body.append(layers.BatchNormalization(name="bn"))
    body.append(layers.ReLU(name="relu"))
    if dropout:
        body.append(layers.Dropout(dropout, name="drop"))
    body += [layers.MaxPooling2D(name="pool"), layers.Flatten(), layers.Dense(2, name="dense")]
    model = keras.Sequential(body, name="cnn")
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def data(n=16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 8, 8, 3)).astype("float32"), rng.normal(size=(n, 2)).astype(
        "float32"
    )


def model_state(model):
    """Every variable of the model and its optimizer, in order (names get instance counters)."""
    return [(v.path, np.array(v)) for v in model.variables + model.optimizer.variables]


def test_training_is_bit_identical_with_and_without_the_callback(tmp_path):
    x, y = data(32)
    runs = []
    for with_callback in (False, True):
        model = small_cnn(seed=7, dropout=0.5, batchnorm=True)
        callbacks = (
            [GradVizCallback(tmp_path, (x[:8], y[:8]), every_n_batches=1)] if with_callback else []
        )
        keras.utils.set_random_seed(11)
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=callbacks)
        # The global streams must be where they would have been, too.
        follow_up = (
            np.random.rand(),
            float(tf.random.uniform(())),
            float(keras.random.uniform(())),
        )
        runs.append((model_state(model), follow_up))
    (without, rng_without), (with_, rng_with) = runs
    assert len(without) == len(with_)
    assert any("moving_mean" in p for p, _ in without) and any(
        "seed_generator" in p for p, _ in without
    )
    for (path, expected), (_, actual) in zip(without, with_):
        np.testing.assert_array_equal(expected, actual, err_msg=path)
    assert rng_without == rng_with
    assert (
        len(eventdata.values(eventdata.load(tmp_path), records.stats_tag("pool", "activation")))
        == 8
    )


def test_steps_follow_optimizer_iterations_across_fits_without_retracing(tmp_path):
    model = small_cnn()
    x, y = data(16)
    callback = GradVizCallback(tmp_path, (x[:4], y[:4]))
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    steps = [
        s
        for s, _ in eventdata.values(
            eventdata.load(tmp_path), records.stats_tag("pool", "activation")
        )
    ]
    assert steps == [2, 4, 6]
    assert tracing_count(callback._capture) == 1
    # One event file per fit: the writer is closed at train end and reopened lazily.
    assert len([f for f in os.listdir(tmp_path) if ".tfevents." in f]) == 2


def test_every_n_epochs_and_every_n_batches(tmp_path):
    x, y = data(16)
    model = small_cnn()
    model.fit(
        x,
        y,
        batch_size=4,
        epochs=4,
        verbose=0,
        callbacks=[GradVizCallback(tmp_path / "e", (x, y), every_n_epochs=2)],
    )
    model = small_cnn()
    model.fit(
        x,
        y,
        batch_size=4,
        epochs=2,
        verbose=0,
        callbacks=[GradVizCallback(tmp_path / "b", (x, y), every_n_batches=3)],
    )
    tag = records.stats_tag("pool", "input_gradient")
    assert [s for s, _ in eventdata.values(eventdata.load(tmp_path / "e"), tag)] == [8, 16]
    assert [s for s, _ in eventdata.values(eventdata.load(tmp_path / "b"), tag)] == [3, 6]


def test_nothing_is_written_when_nothing_fires(tmp_path):
    x, y = data(8)
    log_dir = tmp_path / "never"
    small_cnn().fit(
        x, y, epochs=1, verbose=0, callbacks=[GradVizCallback(log_dir, (x, y), every_n_epochs=5)]
    )
    assert not log_dir.exists()


def test_epoch_frequency_leaves_batch_hooks_undefined():
    # Keras dispatches batches asynchronously only when no callback defines batch hooks.
    x, y = data(4)
    assert not hasattr(GradVizCallback("unused", (x, y)).on_train_batch_end, "__func__") or (
        GradVizCallback("unused", (x, y)).on_train_batch_end.__func__
        is keras.callbacks.Callback.on_train_batch_end
    )
    assert GradVizCallback("unused", (x, y), every_n_batches=2).on_train_batch_end.__func__ is not (
        keras.callbacks.Callback.on_train_batch_end
    )


def test_dataset_probe_uses_its_first_batch(tmp_path):
    x, y = data(16)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    small_cnn().fit(x, y, epochs=1, verbose=0, callbacks=[GradVizCallback(tmp_path, dataset)])
    log = eventdata.load(tmp_path)
    assert eventdata.content(log, records.stats_tag("pool", "activation"))["shape"] == [4, 4, 4, 4]


def test_layer_choice_by_name_path_glob_class_and_predicate(tmp_path):
    x, y = data(8)
    model = small_cnn()
    model.fit(x, y, epochs=1, verbose=0)  # builds it
    cases = {
        "conv": ["conv"],
        "cnn_glob": ["*o*"],
        "class": [layers.Dense],
        "predicate": [lambda layer: layer.name.startswith("re")],
        "mixed": ["pool", layers.Conv2D],
    }
    expected = {
        "conv": ["conv"],
        "cnn_glob": ["conv", "pool"],
        "class": ["dense"],
        "predicate": ["relu"],
        "mixed": ["conv", "pool"],
    }
    for name, spec in cases.items():
        callback = GradVizCallback(tmp_path / name, (x, y), layers=spec)
        model.fit(x, y, epochs=1, verbose=0, callbacks=[callback])
        assert callback.chosen_layers == expected[name], name
        assert eventdata.layers(eventdata.load(tmp_path / name)) == expected[name], name


def test_unknown_layer_name_lists_the_nearest(tmp_path):
    x, y = data(4)
    model = small_cnn()
    with pytest.raises(ValueError, match=r"'pol'.*Nearest: 'pool'"):
        model.fit(
            x, y, epochs=1, verbose=0, callbacks=[GradVizCallback(tmp_path, (x, y), layers="pol")]
        )
    with pytest.raises(ValueError, match=r"pattern 'zz\*'"):
        model.fit(
            x, y, epochs=1, verbose=0, callbacks=[GradVizCallback(tmp_path, (x, y), layers="zz*")]
        )


def test_model_without_pooling_says_how_to_choose_layers(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), layers.Dense(2)])
    model.compile("sgd", "mse")
    x, y = np.ones((2, 3), "float32"), np.ones((2, 2), "float32")
    with pytest.raises(ValueError, match="has no pooling layer.*layers=\\["):
        model.fit(x, y, verbose=0, callbacks=[GradVizCallback(tmp_path, (x, y))])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            {"every_n_epochs": 0},
            ValueError,
            "every_n_epochs must be a positive integer. Received: every_n_epochs=0",
        ),
        ({"every_n_epochs": -2}, ValueError, "Received: every_n_epochs=-2"),
        ({"every_n_epochs": 1.5}, TypeError, "Received: every_n_epochs=1.5"),
        (
            {"every_n_batches": 0},
            ValueError,
            "every_n_batches must be a positive integer. Received: every_n_batches=0",
        ),
        (
            {"every_n_batches": 2, "every_n_epochs": 3},
            ValueError,
            "either every_n_epochs or every_n_batches, not both. "
            "Received: every_n_epochs=3, every_n_batches=2",
        ),
        ({"layers": 3}, TypeError, "Received: layers=3, holding 3 of type int"),
        ({"layers": []}, ValueError, "at least one layer; pass None to log all pooling layers"),
        ({"layers": [""]}, ValueError, "must not hold an empty name. Received: layers=['']"),
        ({"layers": [int]}, TypeError, "int is not one. Received: layers=[<class 'int'>]"),
        (
            {"training": "yes"},
            TypeError,
            "training must be True or False. Received: training='yes'",
        ),
        ({"loss": "no_such_loss"}, ValueError, "Received: loss='no_such_loss'"),
        ({"loss": lambda: 0.0}, TypeError, "does not take (y_true, y_pred). Received: loss=<"),
    ],
)
def test_bad_arguments_say_what_was_received(tmp_path, kwargs, error, message):
    x, y = data(2)
    with pytest.raises(error, match=re.escape(message)):
        GradVizCallback(tmp_path, (x, y), **kwargs)


def test_bad_log_dir_and_probe_data(tmp_path):
    x, y = data(4)
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(ValueError, match="log_dir must be a directory; it is a file. Received: "):
        GradVizCallback(a_file, (x, y))
    # A trailing slash named the same file, passed the check and failed inside fit.
    with pytest.raises(ValueError, match="log_dir must be a directory; it is a file. Received: "):
        GradVizCallback(f"{a_file}{os.sep}", (x, y))
    with pytest.raises(
        TypeError,
        match=r"must be \(x, y\) or \(x, y, sample_weight\)\. "
        r"Received: probe_data=a ndarray of shape \(4, 8, 8, 3\)",
    ):
        GradVizCallback(tmp_path, x)
    with pytest.raises(ValueError, match="Received: probe_data=a tuple of length 4"):
        GradVizCallback(tmp_path, (x, y, y, y))
    with pytest.raises(ValueError, match=r"same batch size\. Received: batch sizes \[3, 4\]"):
        GradVizCallback(tmp_path, (x, y[:3]))
    with pytest.raises(ValueError, match="Received: an empty tf.data.Dataset"):
        GradVizCallback(tmp_path, tf.data.Dataset.from_tensor_slices((x, y)).take(0))


def test_a_generator_as_probe_data_is_refused_and_training_keeps_every_batch(tmp_path):
    x, y = data(8)
    batches = ((x[i : i + 2], y[i : i + 2]) for i in range(0, 8, 2))
    with pytest.raises(
        TypeError,
        match=r"one-shot iterator \(a generator\).*tf\.data\.Dataset.*PyDataset.*"
        r"Received: probe_data=<generator",
    ):
        GradVizCallback(tmp_path, batches)
    with pytest.raises(TypeError, match=r"one-shot iterator \(a list_iterator\)"):
        GradVizCallback(tmp_path, iter([(x, y)]))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(2)
    with pytest.raises(TypeError, match="one-shot iterator"):
        GradVizCallback(tmp_path, iter(dataset))
    # The generator was not read: fit still gets all four batches.
    model = small_cnn()
    model.fit(batches, epochs=1, verbose=0, steps_per_epoch=4, shuffle=False)
    assert int(model.optimizer.iterations.numpy()) == 4
    assert not os.listdir(tmp_path)


class _CountedBatches:
    """A re-iterable source of (x, y) batches that counts how often it is read."""

    def __init__(self, x, y):
        self.x, self.y, self.reads = x, y, 0

    def __iter__(self):
        self.reads += 1
        yield self.x, self.y


@pytest.mark.parametrize(
    "kwargs", [{"budget": 2.0}, {"weights": "yes"}, {"every_n_epochs": 0}, {"layers": [None]}]
)
def test_a_bad_argument_is_refused_before_probe_data_is_read(tmp_path, kwargs):
    x, y = data(4)
    source = _CountedBatches(x, y)
    with pytest.raises((TypeError, ValueError)):
        GradVizCallback(tmp_path, source, **kwargs)
    assert source.reads == 0
    GradVizCallback(tmp_path, source)
    assert source.reads == 1


def test_log_now_validates_step_before_the_probe_pass_runs(tmp_path):
    x, y = data(4)
    model = small_cnn()
    callback = GradVizCallback(tmp_path, (x, y))
    callback.set_model(model)
    for step, error in ((-1, ValueError), (1.5, TypeError), ("3", TypeError), (True, TypeError)):
        with pytest.raises(
            error, match=re.escape(f"step must be a non-negative integer. Received: step={step!r}")
        ):
            callback.log_now(step=step)
    assert callback._capture is None  # no pass was built, none ran
    assert not os.listdir(tmp_path)
    callback.log_now(step=np.int64(3))
    log = eventdata.load(tmp_path)
    assert [s for s, _ in eventdata.values(log, records.stats_tag("pool", "activation"))] == [3]


def test_layer_instances_are_chosen_at_any_depth(tmp_path):
    keras.utils.set_random_seed(0)
    inner = keras.Sequential(
        [keras.Input((8, 8, 4)), layers.MaxPooling2D(name="inner_pool"), layers.ReLU(name="act")],
        name="block",
    )
    inputs = keras.Input((8, 8, 3))
    conv = layers.Conv2D(4, 3, padding="same", name="conv")
    outputs = layers.Dense(2, name="dense")(layers.Flatten()(inner(conv(inputs))))
    model = keras.Model(inputs, outputs, name="outer")
    model.compile("sgd", "mse")
    x, y = data(4)
    callback = GradVizCallback(
        tmp_path, (x, y), layers=[model.get_layer("conv"), inner.get_layer("inner_pool")]
    )
    model.fit(x, y, epochs=1, verbose=0, callbacks=[callback])
    assert callback.chosen_layers == ["conv", "block/inner_pool"]
    assert eventdata.layers(eventdata.load(tmp_path)) == ["conv", "block/inner_pool"]

    stranger = layers.MaxPooling2D(name="stranger")
    with pytest.raises(
        ValueError, match=r"The layer 'stranger' is not a layer of model 'outer'.*Received: layers="
    ):
        model.fit(
            x, y, epochs=1, verbose=0, callbacks=[GradVizCallback(tmp_path, (x, y), stranger)]
        )


def test_a_callable_that_is_not_a_predicate_says_so(tmp_path):
    x, y = data(4)
    with pytest.raises(
        TypeError, match=r"takes one layer and returns True or False; .* takes \(a, b\)"
    ):
        GradVizCallback(tmp_path, (x, y), layers=[lambda a, b: True])
    model = small_cnn()
    weights_before = [np.array(v) for v in model.weights]
    with pytest.raises(
        TypeError, match=r"raised AttributeError: .*on layer 'conv'.*Received: layers=\["
    ):
        model.fit(
            x,
            y,
            epochs=1,
            verbose=0,
            callbacks=[GradVizCallback(tmp_path, (x, y), layers=[lambda layer: layer.units > 1])],
        )
    for before, after in zip(weights_before, model.weights):
        np.testing.assert_array_equal(before, np.array(after))


class _Scaled(layers.Layer):
    """A layer with a trainable weight named `stats`."""

    def build(self, input_shape):
        self.stats = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="stats")

    def call(self, x):
        return x * self.stats


def test_stop_on_nonfinite_ignores_a_healthy_weight_named_stats(tmp_path):
    # With weights=True the weight's histogram tag ends in "/weight/stats"; its
    # histogram is not a stats record and must not stop training.
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), _Scaled(name="scaled"), layers.Dense(2, name="dense")]
    )
    model.compile(keras.optimizers.SGD(0.01), "mse")
    x, y = np.ones((8, 4), "float32"), np.zeros((8, 2), "float32")
    callback = GradVizCallback(
        tmp_path, (x, y), layers=["scaled"], weights=True, every_n_batches=1, stop_on_nonfinite=True
    )
    history = model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[callback])
    assert len(history.history["loss"]) == 3
    log = eventdata.load(tmp_path)
    assert records.histogram_tag("scaled", "weight/stats") in eventdata.tensor_tags(log)
    steps = [s for s, _ in eventdata.values(log, records.stats_tag("scaled", "weight/stats"))]
    assert steps == [1, 2, 3, 4, 5, 6]
