"""The in-step digest (`digest="step"`, capture/in_step*.py) on Keras' TensorFlow backend.

Real fits of a tiny CNN (convolutions, BatchNorm, a residual Add, pooling):
the digest the train step computes equals the one the probe's records make
on the same batch and weights, and training is the same bit for bit with the
callback on.
"""

import warnings

import eventdata
import numpy as np
import pytest

from tb_gradviz.capture import in_step, in_step_fit, probe, selection
from tb_gradviz.format import digest

keras = pytest.importorskip("keras")
if keras.backend.backend() != "tensorflow":
    pytest.skip("the in-step digest runs on TensorFlow so far", allow_module_level=True)

BATCH = 16


def cnn(jit_compile=False, learning_rate=0.0, steps_per_execution=1, dtype=None):
    """A tiny CNN with BatchNorm, a residual Add, max pooling and a dense head, compiled."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(4, 3, padding="same", name="conv", dtype=dtype)(inputs)
    h = keras.layers.BatchNormalization(name="bn", dtype=dtype)(h)
    h = keras.layers.ReLU(name="relu", dtype=dtype)(h)
    branch = keras.layers.Conv2D(4, 1, name="conv2", dtype=dtype)(h)
    h = keras.layers.Add(name="add", dtype=dtype)([h, branch])
    h = keras.layers.MaxPooling2D(name="pool", dtype=dtype)(h)
    h = keras.layers.GlobalAveragePooling2D(name="gap", dtype=dtype)(h)
    outputs = keras.layers.Dense(3, name="dense", dtype="float32")(h)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model


def data(n=BATCH):
    rng = np.random.RandomState(0)
    return rng.normal(size=(n, 8, 8, 3)).astype("float32"), np.arange(n) % 3


def test_the_in_step_digest_equals_the_probes_on_the_same_batch_and_weights():
    model = cnn()
    x, y = data()
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)  # makes the train function
    chosen = selection.select_layers(model, lambda layer: True)
    step = in_step_fit.install(model, chosen, lambda: True)
    # Learning rate 0: the weights the probe sees are those of the step; BatchNorm takes the
    # batch's statistics in both.
    records, _ = probe.new_capture(model, chosen).run(x, y)
    ((tag, expected, _),) = digest.digest_records(records)
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)
    step_count = int(model.optimizer.iterations.numpy())
    taken = step.take(step_count)
    assert taken is not None
    found_tag, found, _ = in_step_fit.event_records(taken, step.layout)[0]
    assert found_tag == tag  # the same rows: one series with the probe's digests
    offsets, _ = digest.row_offsets(step.layout.rows)
    compared = 0
    for (kind, layer, name), offset in zip(step.layout.rows, offsets):
        fields = digest.FIELDS[kind]
        got = found[offset : offset + len(fields)]
        want = expected[offset : offset + len(fields)]
        for field, g, w in zip(fields, got, want):
            if field == digest.BLOCK_FIELD:
                assert np.isnan(g)  # the block part is the probe's alone
            elif field in ("rms", "max_abs"):
                assert g == pytest.approx(w, rel=2e-6), (kind, layer, name, field)
            else:
                assert g == w, (kind, layer, name, field)
            compared += 1
    assert compared == len(expected)
    assert {row[1] for row in step.layout.rows} == {c.path for c in chosen}


def test_a_tensors_statistics_on_either_path_count_nonfinite_values_and_dead_channels():
    import tensorflow as tf

    from tb_gradviz.capture.backends import tf_in_step

    values = np.array([[0.0, -2.0, np.nan], [np.inf, -np.inf, 3.0]], np.float32)
    for on_host in (True, False):
        row = tf_in_step.tensor_statistics(tf.constant(values), 1, on_host).numpy()
        counts = dict(zip(in_step.COUNT_FIELDS, row))
        assert counts["count"] == 6 and counts["zero"] == 1
        assert (counts["nan"], counts["pos_inf"], counts["neg_inf"]) == (1, 1, 1)
        assert counts["float16_overflow"] == 3  # 0, -2 and 3 stay finite in float16
        sum_of_squares, max_abs, dead = row[len(in_step.COUNT_FIELDS) :]
        assert (sum_of_squares, max_abs, dead) == (13.0, 3.0, 0.0)
        # Every value finite: one pass; the first channel is zero everywhere, -0.0 included.
        finite = np.array([[0.0, 1.0], [-0.0, -2.0]], np.float32)
        row = tf_in_step.tensor_statistics(tf.constant(finite), 1, on_host).numpy()
        assert list(row) == [4, 2, 2, 2, 4, 4, 0, 0, 0, 5.0, 2.0, 1]


def weights_and_state(model):
    return [v.numpy() for v in model.variables + model.optimizer.variables]


@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_training_is_the_same_bit_for_bit_with_the_in_step_digest(tmp_path, steps_per_execution):
    from tb_gradviz import GradVizCallback

    x, y = data(6 * BATCH)
    histories, states = [], []
    for with_callback in (False, True):
        model = cnn(False, 0.1, steps_per_execution)
        callbacks = []
        if with_callback:
            callbacks = [
                GradVizCallback(
                    str(tmp_path / "run"),
                    probe_data=(x[:BATCH], y[:BATCH]),
                    layers=lambda layer: True,
                    every_n_batches=1,
                    full_records=0,
                    digest="step",
                )
            ]
        history = model.fit(
            x, y, batch_size=BATCH, epochs=2, verbose=0, shuffle=False, callbacks=callbacks
        )
        histories.append(history.history)
        states.append(weights_and_state(model))
    assert histories[0] == histories[1]
    assert len(states[0]) == len(states[1])
    for a, b in zip(*states):
        np.testing.assert_array_equal(a, b)
    # Every batch end logged: 12 steps, so 12 / steps_per_execution events, the in-step ones
    # saying so; the probe ran at the full records' schedule (events 0, 2, 5, 9).
    accumulator = eventdata.load(str(tmp_path / "run"))
    events = 12 // steps_per_execution
    (tag,) = eventdata.digest_tags(accumulator)
    steps = [e.step for e in accumulator.Tensors(tag)]
    assert steps == [steps_per_execution * (i + 1) for i in range(events)]
    sources = {e.step for e in accumulator.Tensors(in_step.SOURCE_TAG)}
    probe_events = [0, 2, 5, 9]
    assert sources == {s for i, s in enumerate(steps) if i not in probe_events}


def test_training_under_mixed_float16_with_its_loss_scale_is_the_same_bit_for_bit(tmp_path):
    from tb_gradviz import GradVizCallback

    x, y = data(4 * BATCH)
    states = []
    for with_callback in (False, True):
        keras.mixed_precision.set_dtype_policy("mixed_float16")
        try:
            model = cnn(learning_rate=0.1)
            assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
            callbacks = []
            if with_callback:
                callback = GradVizCallback(
                    str(tmp_path / "run"),
                    probe_data=(x[:BATCH], y[:BATCH]),
                    layers=lambda layer: True,
                    every_n_batches=1,
                    full_records=0,
                    digest="step",
                )
                callbacks = [callback]
            model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False, callbacks=callbacks)
            states.append(weights_and_state(model))
        finally:
            keras.mixed_precision.set_dtype_policy("float32")
    for a, b in zip(*states):
        np.testing.assert_array_equal(a, b)
    # The gradients' RMS is unscaled (divided by the loss scale), as the probe's.
    accumulator = eventdata.load(str(tmp_path / "run"))
    (tag,) = eventdata.digest_tags(accumulator)
    rows = eventdata.content(accumulator, tag)["rows"]
    vectors = [vector for _, vector in eventdata.values(accumulator, tag)]
    decoded = digest.decode_digest(rows, np.stack(vectors))
    rms = decoded[(digest.TENSOR, "dense", "output_gradient")]["rms"]
    assert np.all(np.isfinite(rms)) and np.all(rms < 1.0)


class OwnStep(keras.Model):
    def train_step(self, data):
        return super().train_step(data)


@pytest.mark.parametrize(
    "case, message",
    [
        ("own_train_step", "OwnStep defines its own train_step"),
        ("jit_compile", "under jit_compile the compiler compiles the step"),
    ],
)
def test_where_the_step_is_not_mirrored_the_probes_digest_is_kept_and_said(tmp_path, case, message):
    from tb_gradviz import GradVizCallback

    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(2, name="dense")(inputs)
    model_class = OwnStep if case == "own_train_step" else keras.Model
    model = model_class(inputs, outputs)
    model.compile(optimizer="sgd", loss="mse", jit_compile=case == "jit_compile")
    x, y = np.ones((8, 4), "float32"), np.zeros((8, 2), "float32")
    callback = GradVizCallback(
        str(tmp_path), probe_data=(x, y), layers="dense", every_n_batches=1, digest="step"
    )
    in_step_fit._told.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[callback])
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[callback])
    falls_back = [str(w.message) for w in caught if "falls back" in str(w.message)]
    assert len(falls_back) == 1 and message in falls_back[0]  # said once, not per fit
    accumulator = eventdata.load(str(tmp_path))
    (tag,) = eventdata.digest_tags(accumulator)
    assert [e.step for e in accumulator.Tensors(tag)] == [1, 2, 3, 4, 5, 6]  # the probe's
    assert in_step.SOURCE_TAG not in eventdata.tensor_tags(accumulator)


@pytest.mark.parametrize("value, error", [("fast", ValueError), (None, TypeError), (1, TypeError)])
def test_a_bad_digest_is_refused_naming_what_is_allowed(value, error):
    with pytest.raises(error, match=r"digest must be 'probe' or 'step'\. Received: digest="):
        in_step.check_digest(value)


@pytest.mark.parametrize(
    "arguments, match",
    [
        ({}, "needs every_n_batches"),
        ({"every_n_batches": 1, "stop_on": "nonfinite"}, "does not judge stop_on"),
        ({"every_n_batches": 1, "weights": True}, "does not record weights"),
    ],
)
def test_digest_step_refuses_what_it_does_not_do_yet(tmp_path, arguments, match):
    from tb_gradviz import GradVizCallback

    x, y = data(4)
    with pytest.raises(ValueError, match=match):
        GradVizCallback(str(tmp_path), probe_data=(x, y), digest="step", **arguments)


def test_stop_on_nonfinite_stops_at_the_in_step_event_whose_batch_held_a_nan(tmp_path, capsys):
    from tb_gradviz import GradVizCallback

    model = cnn(learning_rate=0.1)
    x, y = data(8 * BATCH)
    x[3 * BATCH] = np.nan  # the fourth batch: an in-step event (the probe's are events 0 and 2)
    callback = GradVizCallback(
        str(tmp_path),
        probe_data=(x[:BATCH], y[:BATCH]),
        layers=["conv", "dense"],
        every_n_batches=1,
        full_records=0,
        stop_on_nonfinite=True,
        digest="step",
    )
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False, callbacks=[callback])
    assert int(model.optimizer.iterations.numpy()) == 4
    printed = capsys.readouterr().out
    assert "step 4: NaN or Inf in conv/activation, conv/input_gradient" in printed
