"""Where a fault began (`/onset`, `tb-gradviz check`): real fits with a fault put into one middle
layer at a known step are named at the first tensor the step computed that raised the flag, the
forward pass in model order and then the backward pass from the last layer to the first."""

import numpy as np
import pytest
import test_onset
from test_onset import onsets_of, run_check, strict_json

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

FAULT_STEP = 5
SAMPLES, BATCH = 28, 4  # seven steps


class SetKernelNaNAt(keras.callbacks.Callback):
    """Puts a NaN into one value of `layer.kernel` at the end of optimizer step `step`, before the
    callbacks after it in the list log that step."""

    def __init__(self, layer, step):
        super().__init__()
        self.layer, self.step = layer, step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.step:
            kernel = keras.ops.convert_to_numpy(self.layer.kernel).copy()
            kernel.flat[0] = np.nan
            self.layer.kernel.assign(kernel)


@tf.custom_gradient
def _backward_times(x, factor):
    """`x` in the forward pass; the gradient times `factor` in the backward pass."""

    def grad(upstream):
        return upstream * factor, tf.zeros_like(factor)

    return tf.identity(x), grad


class BackwardFault(keras.layers.Layer):
    """A dense layer (no bias) whose backward pass multiplies the gradients of its input and of
    its kernel by a non-trainable `factor`; the forward pass never reads it, so a NaN factor makes
    a NaN that only the backward pass holds."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.kernel = self.add_weight(
            shape=(input_shape[-1], self.units), initializer="glorot_uniform", name="kernel"
        )
        self.factor = self.add_weight(shape=(), initializer="ones", trainable=False, name="factor")

    def call(self, x):
        factor = tf.convert_to_tensor(self.factor)
        return tf.matmul(_backward_times(x, factor), _backward_times(self.kernel, factor))


def fit(logdir, model, fault, weights=False):
    """Fits `model` seven steps on seeded noise, every step logged for layers a, b, p and d;
    `fault` is the callback that changes the model at FAULT_STEP."""
    from tb_gradviz import GradVizCallback

    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, *model.input_shape[1:])).astype("float32")
    y = rng.normal(size=(SAMPLES, 3)).astype("float32")
    model.compile(keras.optimizers.SGD(0.01), "mse")
    logged = GradVizCallback(
        logdir, (x[:8], y[:8]), layers=["a", "b", "p", "d"], every_n_batches=1, weights=weights
    )
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[fault, logged])


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("origin")
    keras.utils.set_random_seed(0)
    # A NaN put into the kernel of the middle convolution b.
    conv_b = keras.layers.Conv2D(4, 3, padding="same", name="b")
    convs = keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="a"),
            conv_b,
            keras.layers.MaxPooling2D(2, name="p"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(3, name="d"),
        ]
    )
    fit(root / "kernel", convs, SetKernelNaNAt(conv_b, FAULT_STEP))
    # A NaN that only b's backward pass makes, in its kernel's and its input's gradients.
    keras.utils.set_random_seed(0)
    fault_b = BackwardFault(8, name="b")
    backward = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="tanh", name="a"),
            fault_b,
            keras.layers.Dense(8, activation="tanh", name="p"),
            keras.layers.Dense(3, name="d"),
        ]
    )
    fit(root / "backward", backward, test_onset.SetFactorAt(fault_b, FAULT_STEP, np.nan), True)
    # Gradients that fall by 1e-6 on their way back through `scale`, between b and p: both a's
    # and b's output gradients vanish.
    keras.utils.set_random_seed(0)
    scale = test_onset.Scale(name="scale")
    vanish = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="tanh", name="a"),
            keras.layers.Dense(8, activation="tanh", name="b"),
            scale,
            keras.layers.Dense(8, activation="tanh", name="p"),
            keras.layers.Dense(3, name="d"),
        ]
    )
    fit(root / "vanish", vanish, test_onset.SetFactorAt(scale, FAULT_STEP, 1e-6))
    return root


def test_a_nan_put_into_a_middle_layers_kernel_is_named_at_that_layers_activation(logdir):
    _, onsets, _ = onsets_of(logdir, "kernel")
    nonfinite = onsets["nonfinite"]
    # Not `a`'s input gradient: the backward pass brings the NaN to `a` after the forward
    # pass met it in b's activation.
    assert (nonfinite["step"], nonfinite["layer"], nonfinite["tensor"]) == (
        FAULT_STEP,
        "b",
        "activation",
    )
    assert nonfinite["detail"].startswith("activation: ")
    from test_plugin import PREFIX, make_app

    client, _ = make_app(logdir)

    def get(route, **query):
        response = client.get(PREFIX + route, query_string=dict(query, run="kernel"))
        return strict_json(response.get_data(as_text=True))

    # `a` holds it too at that step, in its gradients only: named first in model order before.
    at_fault = {
        layer["layer"]: [(f["flag"], f["tensor"]) for f in layer["flags"]]
        for layer in get("/step", step=FAULT_STEP)["layers"]
    }
    assert at_fault["a"] == [("nonfinite", "output_gradient")]
    assert at_fault["b"] == [("nonfinite", "activation")]
    # The text table and /onset say the same.
    _, out, _ = run_check(logdir, "--run", "kernel")
    row = next(
        line.split() for line in out.split("onset  (")[1].splitlines() if line[:9] == "nonfinite"
    )
    assert row[1:6] == ["flag", "yes", str(FAULT_STEP), "b", "activation"]
    served = next(o for o in get("/onset")["onsets"] if o["flag"] == "nonfinite")
    assert served == {key: value for key, value in nonfinite.items() if key != "fails"}


def test_a_nan_only_the_backward_pass_makes_is_named_at_the_first_gradient_that_holds_it(logdir):
    _, onsets, result = onsets_of(logdir, "backward")
    nonfinite = onsets["nonfinite"]
    # In the backward pass d and p come first, finite; b's output gradient is finite, and its
    # kernel's gradient is the first that holds the NaN (its input gradient, and a's, next).
    assert (nonfinite["step"], nonfinite["layer"], nonfinite["tensor"]) == (
        FAULT_STEP,
        "b",
        "weight_gradient/kernel",
    )
    assert nonfinite["detail"].split("; ")[0].startswith("weight_gradient/kernel: ")
    assert "input_gradient: " in nonfinite["detail"]
    # The forward pass held no NaN at that step: the next step trains on the NaN gradients.
    flagged = {f["layer"] for f in result["flags"] if f["flag"] == "nonfinite"}
    assert flagged == {"a", "b", "p", "d"}


def test_gradients_that_vanish_behind_a_layer_are_named_at_the_first_layer_the_backward_pass_meets(
    logdir,
):
    _, onsets, result = onsets_of(logdir, "vanish")
    assert set(onsets) == {"vanishing"}
    vanishing = onsets["vanishing"]
    # Both a and b vanish from FAULT_STEP on; the gradient fell between p and b, where the
    # backward pass meets b first (a only receives what b passes on).
    assert (vanishing["step"], vanishing["layer"], vanishing["tensor"]) == (
        FAULT_STEP,
        "b",
        "output_gradient",
    )
    assert {f["layer"] for f in result["flags"] if f["flag"] == "vanishing"} == {"a", "b"}
    assert "at d" in vanishing["detail"]


def test_each_flag_is_named_in_the_pass_its_rule_reads_on_a_written_run(tmp_path):
    # Two float16 layers a and b raise every flag at step 2 at once: dead channels (forward
    # pass: a first), a NaN in a's output gradient and in b's activation (forward pass first:
    # b), and gradients that underflow in both (backward pass: b first).
    from test_flags_from_digest import tensor

    from tb_gradviz.format import events, records

    rng = np.random.default_rng(0)
    log = events.EventLog(tmp_path)
    for step in (1, 2):
        written = []
        for index, layer in enumerate(("a", "b")):
            activation = rng.normal(size=40)
            gradient = rng.normal(size=40) * (1e-7 if step == 2 else 1.0)
            if step == 2 and layer == "b":
                activation[0] = np.nan
            if step == 2 and layer == "a":
                gradient[0] = np.nan
            written += tensor(layer, index, records.ACTIVATION, activation, "float16")
            written += tensor(layer, index, records.OUTPUT_GRADIENT, gradient, "float16")
            written += events.units_records(
                layer,
                records.units_vector([False, step == 2, False, False]),
                {"layer_index": index, "tensor": records.ACTIVATION, "channel_axis": -1},
            )
        log.write(step, written)
    log.close()
    _, onsets, _ = onsets_of(tmp_path, ".")
    where = {flag: (o["step"], o["layer"], o["tensor"]) for flag, o in onsets.items()}
    assert where == {
        "nonfinite": (2, "b", "activation"),
        "dead": (2, "a", "activation"),
        "underflow": (2, "b", "output_gradient"),
    }


def test_the_step_order_is_the_forward_pass_then_the_backward_pass_nested_models_at_their_ends():
    from tb_gradviz.format import origin

    def layer(name, *roles):
        return {"layer": name, "tensors": {f"{role}": {"role": role} for role in roles}}

    layers = [
        layer("a", "activation", "output_gradient", "input_gradient"),
        layer("block", "activation", "input_gradient", "output_gradient"),
        layer("block/inner", "activation", "input_gradient", "output_gradient"),
        layer("d", "activation", "input_gradient", "output_gradient"),
    ]
    layers[3]["tensors"].update(
        {"weight/kernel": {"role": "weight"}, "weight_gradient/kernel": {"role": "weight_gradient"}}
    )
    named = [(layers[i]["layer"], t) for i, t in origin.step_order(layers)]
    assert named == [
        ("a", "activation"),
        ("block/inner", "activation"),
        ("block", "activation"),
        ("d", "weight/kernel"),
        ("d", "activation"),
        ("d", "output_gradient"),
        ("d", "weight_gradient/kernel"),
        ("d", "input_gradient"),
        ("block", "output_gradient"),
        ("block/inner", "output_gradient"),
        ("block/inner", "input_gradient"),
        ("block", "input_gradient"),
        ("a", "output_gradient"),
        ("a", "input_gradient"),
    ]
    backward = [(layers[i]["layer"], t) for i, t in origin.step_order(layers, (origin.BACKWARD,))]
    assert backward == named[5:]
