"""The in-step digest (`digest="step"`) on Keras' PyTorch and JAX backends.

On PyTorch the train step's own backward pass hands the chosen layers'
gradients to hooks (capture/backends/torch_in_step.py); on JAX a mirror of
Keras' jitted `train_step` differentiates w.r.t. a zero subtracted from each
chosen layer's inputs and outputs too (capture/backends/jax_in_step.py). On
both the digest equals the probe's on the same batch and weights, and
training is the same bit for bit. tests/test_in_step.py covers TensorFlow.
"""

import eventdata
import in_step_runs
import numpy as np
import pytest

from tb_gradviz.capture import in_step

keras = pytest.importorskip("keras")
BACKEND = keras.backend.backend()
if BACKEND == "tensorflow":
    pytest.skip("tests/test_in_step.py covers TensorFlow", allow_module_level=True)
jax_only = pytest.mark.skipif(BACKEND != "jax", reason="the in-step digest's JAX step")


def test_the_in_step_digest_equals_the_probes_on_the_same_batch_and_weights():
    in_step_runs.assert_step_digest_equals_probes()


def test_a_transformers_in_step_digest_equals_the_probes_on_the_same_batch_and_weights():
    rows, chosen = in_step_runs.assert_step_digest_equals_probes(in_step_runs.transformer())
    assert {row[1] for row in rows} == set(chosen) and "attn0/query" in chosen


def test_an_input_gradient_that_is_another_layers_output_gradient_is_read_once(monkeypatch):
    assert len(in_step_runs.kernel_reads_of_a_logged_step(monkeypatch)) == in_step_runs.CNN_READS


STEPS_PER_EXECUTION = [1, 2] if BACKEND == "jax" else [1]


@pytest.mark.parametrize("steps_per_execution", STEPS_PER_EXECUTION)
def test_training_is_the_same_bit_for_bit_with_the_in_step_digest(tmp_path, steps_per_execution):
    histories, states = in_step_runs.fitted_twice(tmp_path / "run", steps_per_execution)
    assert histories[0] == histories[1]
    for a, b in zip(*states):
        np.testing.assert_array_equal(a, b)
    accumulator = eventdata.load(str(tmp_path / "run"))
    (tag,) = eventdata.digest_tags(accumulator)
    steps = [e.step for e in accumulator.Tensors(tag)]
    assert steps == list(range(steps_per_execution, 13, steps_per_execution))
    sources = {e.step for e in accumulator.Tensors(in_step.SOURCE_TAG)}
    assert sources == {s for i, s in enumerate(steps) if i not in (0, 2, 5, 9)}
    in_step_runs.assert_every_event_updates_every_weight(tmp_path / "run")


def test_the_update_rows_give_every_weights_move_over_the_step_chosen_layer_or_not():
    in_step_runs.assert_step_updates_are_the_weights_moves()


@jax_only
def test_on_jax_training_under_mixed_float16_with_its_loss_scale_is_the_same_bit_for_bit(
    tmp_path,
):
    accumulator = in_step_runs.assert_mixed_float16_training_is_the_same(tmp_path / "run")
    assert {e.step for e in accumulator.Tensors(in_step.SOURCE_TAG)} == {2, 4}


@jax_only
def test_on_jax_the_device_programs_rows_equal_the_host_kernels():
    import jax.numpy as jnp

    from tb_gradviz.capture import in_step_kernel
    from tb_gradviz.capture.backends import jax_in_step_device

    rng = np.random.RandomState(0)
    values = rng.normal(size=(4, 3, 5)).astype("float32")
    values[..., 1] = 0.0
    values[0, 0, 0], values[1, 0, 0], values[2, 0, 0] = np.nan, np.inf, -np.inf
    values[3, 0, 2], values[3, 1, 2] = 1e-6, -0.0  # below float16's normal range; a signed zero
    values[3, 2, 3] = 70000.0  # overflows float16
    with np.errstate(over="ignore"):
        tensors = [values, values.astype("float16"), np.abs(values[..., 2:])]
    axes = [2, None, 2]
    found = jax_in_step_device.rows([jnp.asarray(t) for t in tensors], axes)
    for row, t, axis in zip(found, tensors, axes):
        expected = in_step_kernel.row_along(t, axis)
        counts = len(in_step.COUNT_FIELDS)
        np.testing.assert_array_equal(row[:counts], expected[:counts])
        np.testing.assert_allclose(row[counts:], expected[counts:], rtol=1e-12)
    assert found[0][-1] == 1  # the channel zero everywhere
    after = [rng.normal(size=(3, 4)).astype("float32"), np.ones(5, "float16")]
    before = [after[0] + np.float32(0.01), np.zeros(5, "float16")]
    norms = jax_in_step_device.update_norms(
        [jnp.asarray(a) for a in after], [jnp.asarray(b) for b in before]
    )
    np.testing.assert_allclose(norms, in_step_kernel.update_norms(after, before), rtol=1e-12)


class OwnStep(keras.Model):
    def train_step(self, *args):
        return super().train_step(*args)


@pytest.mark.parametrize("case", ["own_train_step", "distribution"])
def test_where_the_step_is_not_mirrored_the_probes_digest_is_kept_and_said_once(tmp_path, case):
    if case == "distribution":
        if BACKEND != "jax":
            pytest.skip("keras.distribution runs on JAX")
        told, steps, in_step_events = in_step_runs.fallback_fit(
            tmp_path, distribution=keras.distribution.DataParallel()
        )
        message = "without a keras.distribution so far; the model trains under DataParallel"
    else:
        told, steps, in_step_events = in_step_runs.fallback_fit(tmp_path, model_class=OwnStep)
        message = "OwnStep defines its own train_step"
    assert len(told) == 1 and message in told[0]
    assert steps == [1, 2, 3, 4] and not in_step_events  # the probe's digest at every event
