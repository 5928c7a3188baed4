"""The in-step digest's update rows (`digest="step"`) as the board and the rules read them.

The train step gives the update of every trainable weight of the model, also
of layers that are not logged: a learning rate that ramps past stability
raises the update warnings without `weights=True`, judged by `/onset` and by
`rule_columns.build` with `leading` over the written digest, while the depth
x time view, `/step` and `check` still show the logged layers only. Real fits
on Keras' TensorFlow backend (the PyTorch step makes the same rows:
tests/in_step_runs.py).
"""

import eventdata
import numpy as np
import pytest
import test_onset
from tensorboard import context

from tb_gradviz.format import digest, leading, rule_columns

keras = pytest.importorskip("keras")
if keras.backend.backend() != "tensorflow":
    pytest.skip("the in-step digest's TensorFlow step", allow_module_level=True)

STEPS = 220
RAMP_START = 80
BATCH = 8
LOGGED = "h1"
NOT_LOGGED = ("h2", "out")  # the digest holds their updates only


def ramped_fit(run_dir, steps=STEPS, steps_per_execution=1, nan_batch=None):
    """A tanh MLP trained by Adam whose learning rate is 1e-3 until RAMP_START, then grows 4 %
    a step; only its first layer is logged, at every batch end, from the train step. With
    `nan_batch`, that batch's first input holds a NaN."""
    from tb_gradviz import GradVizCallback
    from tb_gradviz.divergence_cases import RampedRate

    keras.utils.set_random_seed(0)
    inputs = keras.Input((32,))
    h = keras.layers.Dense(64, activation="tanh", name="h1")(inputs)
    h = keras.layers.Dense(64, activation="tanh", name="h2")(h)
    outputs = keras.layers.Dense(4, name="out", dtype="float32")(h)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(RampedRate(1e-3, RAMP_START, 1.04)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution,
    )
    rng = np.random.RandomState(0)
    x = rng.normal(size=(steps * BATCH, 32)).astype("float32")
    y = rng.randint(0, 4, size=steps * BATCH)
    probe_data = (x[:BATCH].copy(), y[:BATCH])
    if nan_batch is not None:
        x[nan_batch * BATCH, 0] = np.nan
    callback = GradVizCallback(
        str(run_dir),
        probe_data=probe_data,
        layers=[LOGGED],
        every_n_batches=1,
        full_records=0,
        digest="step",
    )
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False, callbacks=[callback])
    return model


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("in_step_updates")
    ramped_fit(root / "run")
    return root


def test_a_ramping_learning_rate_raises_the_update_warnings_on_layers_not_logged(logdir):
    accumulator = eventdata.load(str(logdir / "run"))
    (tag,) = eventdata.digest_tags(accumulator)
    content = eventdata.content(accumulator, tag)
    found = eventdata.values(accumulator, tag)
    series = rule_columns.DigestSeries(
        content["rows"],
        np.array([step for step, _ in found]),
        np.stack([vector for _, vector in found]),
        digest.update_weights(content),
    )
    logged = eventdata.content(accumulator, f"gradviz/{LOGGED}/activation/stats")
    layers = {LOGGED: rule_columns.LayerInfo(logged, [logged])}
    steps, columns = rule_columns.build(layers, [series])
    assert [layer["layer"] for layer in columns] == [LOGGED, *NOT_LOGGED]  # model order
    h2 = columns[1]
    assert h2["tensors"] == {} and list(h2["updates"]) == ["kernel", "bias"]
    assert h2["weight_counts"] == {"kernel": 64 * 64, "bias": 64}
    assert columns[0]["weight_counts"] == {"kernel": 32 * 64, "bias": 64}
    verdicts = leading.verdicts(steps, columns)
    raised = verdicts["update_growth"] | verdicts["update_spike"]
    by_not_logged = raised[1:].any(axis=0)
    assert by_not_logged.any()
    first = int(steps[np.argmax(by_not_logged)])
    assert RAMP_START < first < STEPS
    # Before the ramp, no warning of any kind on any layer.
    assert not any(verdicts[w][:, steps <= RAMP_START].any() for w in leading.WARNINGS)


def test_onset_names_the_update_warning_of_a_layer_not_logged_and_the_views_show_logged_ones(
    logdir,
):
    gradviz, _ = eventdata.plugin_over(logdir)
    ctx = context.RequestContext()
    onsets = gradviz.onset_impl(ctx, "", "run")["onsets"]
    updates = [o for o in onsets if o["flag"] in leading.UPDATE_WARNINGS]
    assert updates and all(o["class"] == "warning" for o in updates)
    # The output layer's updates grow past the rule first: a layer the run does not log.
    assert [o["layer"] for o in updates] == ["out"] * len(updates)
    assert min(o["step"] for o in updates) > RAMP_START
    # The depth x time view and /step show the logged layer only.
    timeline = gradviz.timeline_impl(ctx, "", "run", field="update_ratio")
    assert [row["layer"] for row in timeline["layers"]] == [LOGGED]
    step = gradviz.step_impl(ctx, "", "run")
    assert [layer["layer"] for layer in step["layers"]] == [LOGGED]
    status, by_flag, _ = test_onset.onsets_of(logdir, "run")
    assert status == 0  # warnings do not fail check unless asked
    assert by_flag["update_growth"]["layer"] == "out"


def test_a_step_the_loss_scale_optimizer_skipped_has_an_update_of_0_over_0_steps(tmp_path):
    # Two steps a call: batch 5, the second step of the third call, holds a NaN, so the
    # LossScaleOptimizer skips it after applying the one before; the event at the call's end
    # (the probe's, the third: its digest takes the step's updates) gives that last step's.
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        model = ramped_fit(tmp_path / "run", steps=12, steps_per_execution=2, nan_batch=5)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    accumulator = eventdata.load(str(tmp_path / "run"))
    (tag,) = eventdata.digest_tags(accumulator)
    rows = eventdata.content(accumulator, tag)["rows"]
    found = eventdata.values(accumulator, tag)
    assert [step for step, _ in found] == [2, 4, 5, 7, 9, 11]
    vectors = np.stack([vector for _, vector in found])
    for layer in (LOGGED, *NOT_LOGGED):
        kernel = digest.decode_digest(rows, vectors)[(digest.UPDATE, layer, "kernel")]
        assert list(kernel["interval"]) == [1, 1, 0, 1, 1, 1]
        assert kernel["update_ratio"][2] == 0 and np.all(np.delete(kernel["update_ratio"], 2) > 0)


def test_the_update_norms_on_either_path_are_those_of_the_weights_and_their_moves():
    import tensorflow as tf

    from tb_gradviz.capture.backends import tf_in_step

    rng = np.random.RandomState(0)
    before = [rng.normal(size=(3, 4)).astype("float32"), np.zeros(5, "float16")]
    after = [b + (0.01 * rng.normal(size=b.shape)).astype(b.dtype) for b in before]
    wide = [(a.astype(np.float64), b.astype(np.float64)) for a, b in zip(after, before)]
    want = [[np.linalg.norm(a), np.linalg.norm(a - b)] for a, b in wide]
    for on_host in (True, False):
        found = tf_in_step.update_norms(
            [tf.constant(a) for a in after], [tf.constant(b) for b in before], on_host
        ).numpy()
        np.testing.assert_allclose(found, want, rtol=1e-6)
