"""Where each flag began (`/onset`, `tb-gradviz check`): real runs with a fault at a known step."""

import io
import json
import sys

import numpy as np
import pytest

from tb_gradviz import cli

keras = pytest.importorskip("keras")

FAULT_STEP = 5
STEPS = 8


class Scale(keras.layers.Layer):
    """Multiplies its input by a non-trainable factor that a callback changes during fit."""

    def build(self, input_shape):
        self.factor = self.add_weight(shape=(), initializer="ones", trainable=False, name="factor")

    def call(self, x):
        return x * self.factor


class SetFactorAt(keras.callbacks.Callback):
    """Sets `layer.factor` to `value` at the end of optimizer step `step` (1-based), before the
    callbacks after it in the list log that step."""

    def __init__(self, layer, step, value):
        super().__init__()
        self.layer, self.step, self.value = layer, step, value

    def on_train_batch_end(self, batch, logs=None):
        if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) == self.step:
            self.layer.factor.assign(self.value)


def middle_layer_network(middle, examples=32, names=("d1", "d2")):
    """`(model, x, y)`: a small dense network d1 -> `middle` -> d2 -> logits (SGD, MSE), seeded,
    and `examples` seeded examples: the runs with a fault put into `middle` at a known step.
    `names` renames the dense layers around `middle`."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="tanh", name=names[0]),
            middle,
            keras.layers.Dense(8, activation="tanh", name=names[1]),
            keras.layers.Dense(3, name="logits"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.01), "mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples, 6)).astype("float32")
    y = rng.normal(size=(examples, 3)).astype("float32")
    return model, x, y


def faulty_run(logdir, value, layers):
    """A small dense network trained STEPS steps and logged at each; the `scale` layer's factor
    becomes `value` at step FAULT_STEP."""
    from tb_gradviz import GradVizCallback

    scale = Scale(name="scale")
    model, x, y = middle_layer_network(scale)
    callbacks = [
        SetFactorAt(scale, FAULT_STEP, value),
        GradVizCallback(logdir, (x[:8], y[:8]), layers=layers, every_n_batches=1),
    ]
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=callbacks)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("onset")
    # A NaN enters the forward pass at the scale layer from FAULT_STEP on.
    faulty_run(root / "nan", float("nan"), ["scale", "d2", "logits"])
    # The scale layer shrinks everything by 1e-6 from FAULT_STEP on: the gradient reaching
    # d1's output is 1e-6 of what it was, far below the reference layer's (logits).
    faulty_run(root / "vanish", 1e-6, ["d1", "scale", "d2", "logits"])
    return root


def run_check(*args):
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        status = cli.main(["check", *map(str, args)])
    finally:
        sys.stdout, sys.stderr = old
    return status, out.getvalue(), err.getvalue()


def strict_json(text):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def onsets_of(logdir, run):
    status, out, err = run_check(logdir, "--run", run, "--format", "json")
    (result,) = strict_json(out)["runs"]
    return status, {onset["flag"]: onset for onset in result["onsets"]}, result


def test_a_nan_injected_at_a_known_step_has_its_onset_at_that_step_layer_and_tensor(logdir):
    status, onsets, result = onsets_of(logdir, "nan")
    assert status == cli.EXIT_FLAGGED
    nonfinite = onsets["nonfinite"]
    assert (nonfinite["step"], nonfinite["layer"], nonfinite["tensor"]) == (
        FAULT_STEP,
        "scale",
        "activation",
    )
    # Training on NaN gradients keeps every later step non-finite.
    assert nonfinite["persists"] is True
    assert nonfinite["raised_steps"] == STEPS - FAULT_STEP + 1
    assert nonfinite["last_raised_step"] == STEPS and nonfinite["fails"] is True
    assert result["step"] == STEPS
    assert ("scale", "nonfinite", "activation") in {
        (f["layer"], f["flag"], f["tensor"]) for f in result["flags"]
    }


def test_gradients_that_start_vanishing_at_a_known_step_have_their_onset_there(logdir):
    status, onsets, result = onsets_of(logdir, "vanish")
    assert status == cli.EXIT_FLAGGED
    assert set(onsets) == {"vanishing"}
    vanishing = onsets["vanishing"]
    assert (vanishing["step"], vanishing["layer"], vanishing["tensor"]) == (
        FAULT_STEP,
        "d1",
        "output_gradient",
    )
    assert vanishing["persists"] is True and vanishing["raised_steps"] == STEPS - FAULT_STEP + 1
    assert "at logits" in vanishing["detail"]


def test_check_text_prints_the_onset_table(logdir):
    status, out, err = run_check(logdir, "--run", "vanish", "--fail-on", "vanishing")
    assert status == cli.EXIT_FLAGGED and "1 flag(s) among --fail-on vanishing raised" in err
    onset = out.split("onset  (")[1].splitlines()
    header = ["flag", "class", "fails", "first", "step", "layer", "tensor", "persists", "raised"]
    header += ["at"]
    assert onset[1].split() == header
    row = onset[3].split()
    assert row[:7] == ["vanishing", "flag", "yes", str(FAULT_STEP), "d1", "output_gradient", "yes"]


def test_check_json_for_ci_says_which_flags_fail_and_the_status(logdir):
    status, out, _ = run_check(logdir, "--fail-on", "dead", "--format", "json")
    data = strict_json(out)
    assert status == data["status"] == cli.EXIT_OK
    assert data["format_version"] == 1 and data["fail_on"] == ["dead"]
    assert [r["run"] for r in data["runs"]] == ["nan", "vanish"]
    assert all(not f["fails"] for r in data["runs"] for f in r["flags"] + r["onsets"])


def test_onset_route_serves_the_same_onset(logdir):
    from test_plugin import PREFIX, make_app

    client, _ = make_app(logdir)
    response = client.get(PREFIX + "/onset", query_string={"run": "vanish"})
    assert response.status_code == 200
    body = strict_json(response.get_data(as_text=True))
    _, onsets, _ = onsets_of(logdir, "vanish")
    assert body["onsets"] == [
        {key: value for key, value in onset.items() if key != "fails"} for onset in onsets.values()
    ]
    assert (body["first_step"], body["last_step"], body["steps"]) == (1, STEPS, STEPS)
    assert client.get(PREFIX + "/onset", query_string={"run": "nope"}).status_code == 404
    assert client.get(PREFIX + "/onset").status_code == 400
