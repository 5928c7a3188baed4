"""Training-health flags on models with a known problem, against GradientTape's gradients."""

import math
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import eventdata  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tb_gradviz import GradVizCallback, cli  # noqa: E402
from tb_gradviz.format import health, records  # noqa: E402

layers = keras.layers


def logged_flags(model, logdir, x, y, chosen, ratio=health.DEFAULT_RATIO):
    """Logs one event of `model` as it is (no training); returns `check`'s `{layer: [flags]}`."""
    callback = GradVizCallback(logdir, (x, y), layers=chosen)
    callback.set_model(model)
    callback.log_now(step=1)
    callback.on_train_end()
    gradviz, ctx, experiment = cli._open_logdir(str(logdir))
    snapshot = gradviz.step_impl(ctx, experiment, ".", None, ratio)
    return {
        layer["layer"]: [f["flag"] for f in layer["flags"]] for layer in snapshot["layers"]
    }, snapshot


def output_gradient_rms(model, names, x, y):
    """RMS of d loss / d output of each named layer, by GradientTape on a functional copy."""
    probe = keras.Model(
        model.inputs, [model.get_layer(n).output for n in names] + list(model.outputs)
    )
    with tf.GradientTape() as tape:
        outputs = probe(x, training=True)
        tape.watch(outputs)
        loss = model.compute_loss(x, y, outputs[-1])
    gradients = tape.gradient(loss, outputs[:-1])
    return {
        n: float(np.sqrt(np.mean(np.square(g.numpy().astype(np.float64)))))
        for n, g in zip(names, gradients)
    }


def dense_chain(depth, activation, initializer="glorot_uniform", width=16):
    keras.utils.set_random_seed(0)
    stack = [keras.Input((width,))]
    stack += [
        layers.Dense(width, activation=activation, kernel_initializer=initializer, name=f"d{i}")
        for i in range(depth)
    ]
    stack += [layers.Dense(3, name="logits")]
    model = keras.Sequential(stack)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def expected_gradient_flags(rms, names, ratio=health.DEFAULT_RATIO):
    reference = rms[names[-1]]
    return {
        n: ["vanishing"]
        if rms[n] * ratio < reference
        else ["exploding"]
        if rms[n] > reference * ratio
        else []
        for n in names
    }


@pytest.fixture
def batch():
    rng = np.random.default_rng(0)
    return rng.normal(size=(16, 16)).astype("float32"), (np.arange(16) % 3).astype("int32")


def test_gradients_vanishing_through_sigmoids_flag_exactly_the_layers_far_below_the_output(
    tmp_path, batch
):
    x, y = batch
    model = dense_chain(12, "sigmoid")
    names = [f"d{i}" for i in range(12)] + ["logits"]
    flags, snapshot = logged_flags(model, tmp_path, x, y, names)
    want = expected_gradient_flags(output_gradient_rms(model, names, x, y), names)
    assert flags == want
    assert snapshot["health"]["reference_layer"] == "logits"
    assert (
        2 <= sum(f == ["vanishing"] for f in flags.values()) <= 11
    )  # the test would show a change of rule


def test_gradients_exploding_through_large_initial_weights_are_flagged(tmp_path, batch):
    x, y = batch
    model = dense_chain(6, None, initializer=keras.initializers.RandomNormal(stddev=1.5))
    names = [f"d{i}" for i in range(6)] + ["logits"]
    flags, _ = logged_flags(model, tmp_path, x, y, names)
    assert flags == expected_gradient_flags(output_gradient_rms(model, names, x, y), names)
    assert flags["d0"] == ["exploding"] and flags["logits"] == []


def conv_model(bias):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            layers.Conv2D(
                4,
                3,
                padding="same",
                activation="relu",
                name="conv",
                bias_initializer=keras.initializers.Constant(bias),
            ),
            layers.MaxPooling2D(name="pool"),
            layers.Flatten(name="flat"),
            layers.Dense(2, name="head"),
        ]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_dead_relu_channels_from_a_large_negative_bias_are_flagged_where_they_are_dead(tmp_path):
    x = np.random.default_rng(1).normal(size=(8, 8, 8, 1)).astype("float32")
    y = np.arange(8) % 2
    flags, snapshot = logged_flags(
        conv_model([0.0, -50.0, 0.1, -50.0]), tmp_path, x, y, ["conv", "pool", "head"]
    )
    assert flags == {"conv": ["dead"], "pool": ["dead"], "head": []}
    units = {layer["layer"]: layer["units"] for layer in snapshot["layers"]}
    assert (units["conv"]["channels"], units["conv"]["dead_channels"], units["conv"]["listed"]) == (
        4,
        2,
        [1, 3],
    )
    assert records.decode_units(
        eventdata.last(eventdata.load(tmp_path), records.units_tag("conv"))
    )["listed"] == [1, 3]


def test_a_nan_in_the_probe_flags_every_layer_it_reaches_and_stops_fit_when_asked(tmp_path, capsys):
    x = np.random.default_rng(1).normal(size=(8, 8, 8, 1)).astype("float32")
    y = np.arange(8) % 2
    poisoned = x.copy()
    poisoned[0, 3, 3, 0] = np.nan
    model = conv_model(0.0)
    flags, snapshot = logged_flags(model, tmp_path / "flags", poisoned, y, ["conv", "pool", "head"])
    # TensorFlow's CPU MaxPool skips a NaN in its window (docs/probe.md): the NaN stops at the
    # conv's activation, and the loss and every gradient stay finite.
    assert {name: "nonfinite" in found for name, found in flags.items()} == {
        "conv": True,
        "pool": False,
        "head": False,
    }
    detail = next(f["detail"] for f in snapshot["layers"][0]["flags"] if f["flag"] == "nonfinite")
    assert "activation: " in detail and " NaN" in detail

    callback = GradVizCallback(
        tmp_path / "fit",
        (poisoned, y),
        layers=["conv", "pool"],
        every_n_batches=1,
        stop_on_nonfinite=True,
    )
    history = model.fit(x, y, batch_size=2, epochs=3, verbose=0, callbacks=[callback])
    assert (
        len(history.history["loss"]) == 1
    )  # Keras stops at the end of the epoch of the first step
    assert (
        "GradVizCallback: step 1: NaN or Inf recorded in gradviz/conv/activation/stats; stopping "
        "training" in capsys.readouterr().out
    )


def test_stop_on_nonfinite_must_be_a_bool(tmp_path):
    with pytest.raises(
        TypeError,
        match="stop_on_nonfinite must be True or False. Received: stop_on_nonfinite='yes'",
    ):
        GradVizCallback(tmp_path, (np.zeros((1, 2)), np.zeros(1)), stop_on_nonfinite="yes")


def test_a_healthy_model_raises_no_flag(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            layers.Conv2D(8, 3, padding="same", name="conv1"),
            layers.BatchNormalization(name="bn1"),
            layers.ReLU(name="relu1"),
            layers.MaxPooling2D(name="pool1"),
            layers.Conv2D(16, 3, padding="same", name="conv2"),
            layers.BatchNormalization(name="bn2"),
            layers.ReLU(name="relu2"),
            layers.GlobalAveragePooling2D(name="gap"),
            layers.Dense(4, name="logits"),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(64, 16, 16, 3)).astype("float32"), np.arange(64) % 4
    callback = GradVizCallback(
        tmp_path / "run", (x[:16], y[:16]), layers=lambda layer: True, every_n_batches=2
    )
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[callback])
    assert cli.main(["check", str(tmp_path)]) == 0


def test_check_exit_statuses(tmp_path, capsys):
    x = np.random.default_rng(1).normal(size=(8, 8, 8, 1)).astype("float32")
    logged_flags(
        conv_model([0.0, -50.0, 0.1, -50.0]),
        tmp_path / "dead",
        x,
        np.arange(8) % 2,
        ["conv", "head"],
    )
    capsys.readouterr()
    assert cli.main(["check", str(tmp_path)]) == cli.EXIT_FLAGGED == 1
    out, err = capsys.readouterr()
    assert "conv   dead  activation  yes    2 of 4 channels never non-zero: 1, 3" in out
    assert (
        "1 flag(s) among --fail-on nonfinite,vanishing,exploding,dead,underflow,overflow,stalled,"
        "skipped_steps raised" in err
    )
    assert cli.main(["check", str(tmp_path), "--fail-on", "vanishing,exploding"]) == 0
    assert "conv   dead  activation  no" in capsys.readouterr().out
    assert cli.main(["check", str(tmp_path), "--fail-on", "dead,sleepy"]) == cli.EXIT_USAGE
    assert (
        "flags must be a comma-separated list of nonfinite, vanishing, exploding, dead, underflow, "
        "overflow, block_underflow, stalled, skipped_steps; received 'dead,sleepy'"
        in capsys.readouterr().err
    )
    assert cli.main(["check", str(tmp_path), "--ratio", "1"]) == cli.EXIT_USAGE
    assert cli.main(["check", str(tmp_path / "nothing")]) == cli.EXIT_USAGE  # no such folder
    (tmp_path / "empty").mkdir()
    assert cli.main(["check", str(tmp_path / "empty")]) == cli.EXIT_NO_DATA


def test_check_reads_a_logdir_written_before_the_dead_unit_record(capsys):
    layout = os.path.join(os.path.dirname(__file__), "data", "layouts", "layout4-a4aadd0")
    assert cli.main(["check", layout]) == 0
    out = capsys.readouterr().out
    assert out.count("no flag raised") == 2 and "dead units not recorded" in out


def test_a_softmax_whose_loss_reads_its_logits_and_a_nested_model_are_not_called_vanishing(
    tmp_path, batch
):
    # Keras' cross-entropy reads the logits behind a softmax: the softmax layer's (and the
    # nested model's) output gradient is exactly zero, though the gradient flows well.
    x, y = batch
    keras.utils.set_random_seed(0)
    inner = keras.Sequential(
        [
            keras.Input((16,)),
            layers.Dense(16, activation="relu", name="hidden"),
            layers.Dense(3, activation="softmax", name="predictions"),
        ],
        name="net",
    )
    model = keras.Sequential([keras.Input((16,)), inner])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy())
    flags, snapshot = logged_flags(model, tmp_path, x, y, lambda layer: True)
    flow = {layer["layer"]: layer["flow"]["output_gradient"]["rms"] for layer in snapshot["layers"]}
    assert flow["net/predictions"] == 0.0 and flow["net"] == 0.0 and flow["net/hidden"] > 0
    assert snapshot["health"]["reference_layer"] == "net/hidden"
    assert flags == {"net": [], "net/hidden": [], "net/predictions": []}


@pytest.mark.parametrize(
    "ratio, interval, size",
    [
        (1e-3, 1, "usual"),
        (4e-3, 4, "usual"),
        (9.9e-3, 1, "usual"),
        (1e-4, 1, "usual"),
        (1e-2, 1, "above"),
        (9.9e-2, 1, "above"),
        (1e-1, 1, "big"),
        (0.4, 4, "big"),
        (9.9e-5, 1, "below"),
        (1.1e-5, 1, "below"),
        (1e-5, 1, "small"),
        (4e-5, 4, "small"),
        (0.0, 3, "small"),
        (math.nan, 1, None),
        (math.inf, 1, None),
        (1e-3, 0, None),
        (1e-3, math.nan, None),
        (None, 1, None),
    ],
)
def test_update_size_judges_the_ratio_per_step_against_the_usual_1e_3(ratio, interval, size):
    assert health.update_size(ratio, interval) == size


def test_a_nested_model_is_a_layer_another_layers_path_lies_under():
    names = ["a", "a/b", "ab", "a/b/c", "c", "c.d", "c/d/e", "b/", "b//x"]
    quadratic = [any(o.startswith(n + "/") for o in names) for n in names]
    found = health._containers(names)
    assert list(found) == quadratic == [True, True, False, False, True, False, False, True, False]
