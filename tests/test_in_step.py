"""The in-step digest (`digest="step"`, capture/in_step*.py) on Keras' TensorFlow backend.

Real fits of a tiny CNN (convolutions, BatchNorm, a residual Add, pooling):
the digest the train step computes equals the one the probe's records make
on the same batch and weights, and training is the same bit for bit with the
callback on.
"""

import eventdata
import in_step_runs
import numpy as np
import pytest
from in_step_runs import data

from tb_gradviz.capture import in_step

keras = pytest.importorskip("keras")
if keras.backend.backend() != "tensorflow":
    pytest.skip("the in-step digest runs on TensorFlow so far", allow_module_level=True)


def test_the_in_step_digest_equals_the_probes_on_the_same_batch_and_weights():
    rows, chosen = in_step_runs.assert_step_digest_equals_probes()
    assert {row[1] for row in rows} == set(chosen)


def test_a_transformers_in_step_digest_equals_the_probes_on_the_same_batch_and_weights():
    rows, chosen = in_step_runs.assert_step_digest_equals_probes(in_step_runs.transformer())
    assert {row[1] for row in rows} == set(chosen) and "attn0/query" in chosen


def test_an_input_gradient_that_is_another_layers_output_gradient_is_read_once(monkeypatch):
    reads = in_step_runs.kernel_reads_of_a_logged_step(monkeypatch)
    # TensorFlow's gradient of `add` is one tensor, handed to both its inputs: its output
    # gradient, and so `conv2`'s, and its input gradient from `relu` are read once together.
    assert len(reads) == in_step_runs.CNN_READS - 2


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


@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_training_is_the_same_bit_for_bit_with_the_in_step_digest(tmp_path, steps_per_execution):
    histories, states = in_step_runs.fitted_twice(tmp_path / "run", steps_per_execution)
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
    in_step_runs.assert_every_event_updates_every_weight(tmp_path / "run")


def test_the_update_rows_give_every_weights_move_over_the_step_chosen_layer_or_not():
    in_step_runs.assert_step_updates_are_the_weights_moves()


def test_training_under_mixed_float16_with_its_loss_scale_is_the_same_bit_for_bit(tmp_path):
    in_step_runs.assert_mixed_float16_training_is_the_same(tmp_path / "run")


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
    told, steps, in_step_events = in_step_runs.fallback_fit(
        tmp_path,
        model_class=OwnStep if case == "own_train_step" else None,
        jit_compile=case == "jit_compile",
        epochs=(2, 1),
    )
    assert len(told) == 1 and message in told[0]  # said once, not per fit
    assert steps == [1, 2, 3, 4, 5, 6] and not in_step_events  # the probe's digest


@pytest.mark.parametrize("value, error", [("fast", ValueError), (None, TypeError), (1, TypeError)])
def test_a_bad_digest_is_refused_naming_what_is_allowed(value, error):
    with pytest.raises(error, match=r"digest must be 'probe' or 'step'\. Received: digest="):
        in_step.check_digest(value)


@pytest.mark.parametrize(
    "arguments, match",
    [
        ({}, "needs every_n_batches"),
        ({"every_n_batches": 1, "weights": True}, "does not record weights"),
    ],
)
def test_digest_step_refuses_what_it_does_not_do_yet(tmp_path, arguments, match):
    from tb_gradviz import GradVizCallback

    x, y = data(4)
    with pytest.raises(ValueError, match=match):
        GradVizCallback(str(tmp_path), probe_data=(x, y), digest="step", **arguments)
