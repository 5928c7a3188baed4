"""The `overflow` flag on real fits: it judges the values held in or cast to float16 only.

A small CNN with BatchNorm under `mixed_float16`, with `LossScaleOptimizer`
starting at 2**30: every step of the first epoch overflows and is skipped
(the scale halves each time), so the log event after it probes at 2**26,
where the float16 gradients overflow to ±Inf; by the second epoch's event
the scale is low enough for the float16 gradients, but BatchNorm's gamma
gradient (float32, which Keras never casts to float16) holds finite values
far past float16's largest. The conv kernel is initialised large so that
the convolution's output is wide: BatchNorm then divides its gradient down,
and the float16 gradients stay small while gamma's (a sum over all
positions of the batch) is large.
"""

import numpy as np
import pytest
import test_plugin

from tb_gradviz.format import records

SCALE = 2.0**30


def fit(log_dir, policy):
    """Two epochs of four steps, logged at each epoch's end with weights; the optimizer scales
    the loss by `SCALE` (`LossScaleOptimizer` under mixed_float16, `loss_scale_factor` else)."""
    import keras

    import tb_gradviz

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 16, 16, 3)).astype("float32")
    y = rng.integers(0, 3, size=len(x))
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = keras.Sequential(
            [
                keras.Input((16, 16, 3)),
                keras.layers.Conv2D(
                    8,
                    3,
                    padding="same",
                    kernel_initializer=keras.initializers.RandomNormal(stddev=10.0, seed=1),
                    name="conv",
                ),
                keras.layers.BatchNormalization(name="bn"),
                keras.layers.ReLU(name="relu"),
                keras.layers.Flatten(name="flatten"),
                keras.layers.Dense(3, dtype="float32", name="head"),
            ]
        )
        if policy == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(
                keras.optimizers.SGD(1e-3), initial_scale=SCALE, dynamic_growth_steps=2**31 - 1
            )
        else:
            optimizer = keras.optimizers.SGD(1e-3, loss_scale_factor=SCALE)
        model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        callback = tb_gradviz.GradVizCallback(log_dir, (x[:32], y[:32]), layers=["*"], weights=True)
        model.fit(x, y, batch_size=16, epochs=2, callbacks=[callback], verbose=0)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    pytest.importorskip("keras")
    logdir = tmp_path_factory.mktemp("overflow")
    for policy in ("mixed_float16", "float32"):
        assert fit(logdir / policy, policy) == STEPS_APPLIED[policy]
    return logdir


# Of the 8 batches: under mixed_float16 the first 7 overflowed at 2**30 ... 2**24 and were
# skipped (the scale halved each time, to 2**23), and the last was applied.
STEPS_APPLIED = {"mixed_float16": 1, "float32": 8}


def step_body(logdir, run, step):
    return test_plugin.get_json(test_plugin.make_app(logdir)[0], "/step", run=run, step=step)


def overflow_flags(body):
    """`{layer: sorted [tensor flagged]}` of a `/step` body's overflow flags."""
    return {
        layer["layer"]: sorted(flag["tensors"])
        for layer in body["layers"]
        for flag in layer["flags"]
        if flag["flag"] == "overflow"
    }


def tensor(body, layer, name):
    return next(entry for entry in body["layers"] if entry["layer"] == layer)["tensors"][name]


@pytest.mark.slow
def test_overflow_flag_not_raised_on_batchnorm_float32_gamma_gradient(logdir):
    body = step_body(logdir, "mixed_float16", 1)
    assert body["step"] == 1  # the first epoch's steps were all skipped
    gamma = tensor(body, "bn", "weight_gradient/gamma")
    # The loss-scaled gamma gradient is finite and past float16's largest in places ...
    assert gamma["stats"]["nan"] + gamma["stats"]["pos_inf"] + gamma["stats"]["neg_inf"] == 0
    assert gamma["precision"]["formats"]["float16"]["as_is"]["overflow"] > 0
    # ... but nothing casts it to float16, and no float16 value overflowed at this step.
    assert overflow_flags(body) == {}


@pytest.mark.slow
def test_overflow_flag_raised_on_float16_gradients_that_overflowed(logdir):
    body = step_body(logdir, "mixed_float16", 0)
    flagged = overflow_flags(body)
    # Every float16 gradient behind the float32 head holds ±Inf at 2**26 (the NaN it makes
    # through BatchNorm is nonfinite's, not an overflow).
    assert flagged == {
        "bn": ["output_gradient"],
        "relu": ["input_gradient", "output_gradient"],
        "flatten": ["input_gradient", "output_gradient"],
    }
    for layer, names in flagged.items():
        for name in names:
            stats = tensor(body, layer, name)["stats"]
            assert stats["pos_inf"] + stats["neg_inf"] > 0
    log = test_plugin.get_json(test_plugin.make_app(logdir)[0], "/onset", run="mixed_float16")
    (onset,) = [o for o in log["onsets"] if o["flag"] == "overflow"]
    assert (onset["step"], onset["persists"], onset["raised_steps"]) == (0, False, 1)


@pytest.mark.slow
def test_overflow_flags_name_float16_tensors_and_weights_cast_to_float16(logdir):
    # What the metadata says each weight is computed in: the conv kernel is cast to float16
    # (autocast), BatchNorm's gamma and beta are not, and the float32 head's stay float32.
    import eventdata

    log = eventdata.load(logdir / "mixed_float16")
    expected = {
        ("conv", "kernel"): "float16",
        ("conv", "bias"): "float16",
        ("bn", "gamma"): "float32",
        ("bn", "beta"): "float32",
        ("head", "kernel"): "float32",
        ("head", "bias"): "float32",
    }
    for (layer, weight), dtype in expected.items():
        tag = records.stats_tag(layer, records.weight_tensor_name("weight_gradient", weight))
        content = eventdata.content(log, tag)
        assert (content["dtype"], content["compute_dtype"]) == ("float32", dtype)


@pytest.mark.slow
def test_overflow_flag_not_raised_on_a_float32_run(logdir):
    client = test_plugin.make_app(logdir)[0]
    for step in (4, 8):  # four steps an epoch, none skipped
        body = test_plugin.get_json(client, "/step", run="float32", step=step)
        assert body["step"] == step
        # Its loss-scaled gradients are past float16's largest: no float16 holds them.
        gamma = tensor(body, "bn", "weight_gradient/gamma")
        assert gamma["precision"]["formats"]["float16"]["as_is"]["overflow"] > 0
        assert overflow_flags(body) == {}
    onsets = test_plugin.get_json(client, "/onset", run="float32")["onsets"]
    assert "overflow" not in [o["flag"] for o in onsets]


@pytest.mark.slow
def test_check_and_summary_count_the_steps_the_loss_scale_skipped(logdir, capsys):
    import json

    from tb_gradviz import cli

    assert cli.main(["check", str(logdir), "--format", "json", "--fail-on", "overflow"]) == 0
    runs = {run["run"]: run for run in json.loads(capsys.readouterr().out)["runs"]}
    assert runs["mixed_float16"]["loss_scale"] == {
        "skipped": 8 - STEPS_APPLIED["mixed_float16"],
        "exact": True,
        "first_scale": 2.0**30,
        "last_scale": 2.0**23,
        "step": 1,
        "batches": 8,
    }
    assert runs["float32"]["loss_scale"] is None  # no LossScaleOptimizer
    line = (
        "loss scale 2**30 at the start, 2**23 at step 1: LossScaleOptimizer skipped 7 steps "
        "(gradients with an Inf or NaN: each halved the scale and left the step count where "
        "it was)"
    )
    run = str(logdir / "mixed_float16")
    for arguments in (["check", run, "--fail-on", "overflow"], ["summary", run]):
        assert cli.main(arguments) == 0
        assert line in capsys.readouterr().out.splitlines()
    assert cli.main(["summary", str(logdir / "float32")]) == 0
    assert "LossScaleOptimizer" not in capsys.readouterr().out


def test_skipped_steps_exact_while_the_scale_cannot_have_grown():
    from tb_gradviz.board import loss_scale
    from tb_gradviz.capture import loss_scale as capture_loss_scale

    # A record without the batches fit ran (they would give the skips exactly).
    fields = list(capture_loss_scale.FIELDS[:4])
    # Events at steps 10 and 30: from 2**16 the scale fell to 2**15 (one step skipped), then
    # to 2**13 (two more). With 2000 steps to grow, counters 10 and 5 never got there.
    values = np.array([[2.0**15, 10, 2000, 2.0**16], [2.0**13, 5, 2000, 2.0**16]])
    assert loss_scale.skipped_steps(fields, [10, 30], values) == {
        "skipped": 3,
        "exact": True,
        "first_scale": 2.0**16,
        "last_scale": 2.0**13,
        "step": 30,
        "batches": None,
    }
    # With 15 steps to grow, 10 + 20 steps applied could have doubled it between the events:
    # the three halvings seen are a lower bound.
    values[:, 2] = 15
    body = loss_scale.skipped_steps(fields, [10, 30], values)
    assert (body["skipped"], body["exact"]) == (3, False)
    assert "skipped at least 3 steps" in loss_scale.line(body)
    # A scale that rose counts no halving.
    values[1, 0] = 2.0**16
    assert loss_scale.skipped_steps(fields, [10, 30], values)["skipped"] == 1
    assert loss_scale.skipped_steps(fields, [], values[:0]) is None
