"""The in-step digest (`digest="step"`) on Keras' PyTorch and JAX backends.

On PyTorch the train step's own backward pass hands the chosen layers'
gradients to hooks (capture/backends/torch_in_step.py): the digest equals
the probe's on the same batch and weights, and training is the same bit for
bit. On JAX the callback keeps the probe's digest and says so once.
tests/test_in_step.py covers TensorFlow.
"""

import warnings

import eventdata
import in_step_runs
import numpy as np
import pytest
from in_step_runs import BATCH, cnn, data

from tb_gradviz.capture import in_step, in_step_fit

keras = pytest.importorskip("keras")
BACKEND = keras.backend.backend()
if BACKEND == "tensorflow":
    pytest.skip("tests/test_in_step.py covers TensorFlow", allow_module_level=True)
torch_only = pytest.mark.skipif(BACKEND != "torch", reason="the in-step digest's PyTorch step")


@torch_only
def test_the_in_step_digest_equals_the_probes_on_the_same_batch_and_weights():
    in_step_runs.assert_step_digest_equals_probes()


@torch_only
def test_training_is_the_same_bit_for_bit_with_the_in_step_digest(tmp_path):
    histories, states = in_step_runs.fitted_twice(tmp_path / "run")
    assert histories[0] == histories[1]
    for a, b in zip(*states):
        np.testing.assert_array_equal(a, b)
    accumulator = eventdata.load(str(tmp_path / "run"))
    (tag,) = eventdata.digest_tags(accumulator)
    steps = [e.step for e in accumulator.Tensors(tag)]
    assert steps == list(range(1, 13))
    sources = {e.step for e in accumulator.Tensors(in_step.SOURCE_TAG)}
    assert sources == {s for i, s in enumerate(steps) if i not in (0, 2, 5, 9)}


@pytest.mark.skipif(BACKEND != "jax", reason="the fallback on a backend without the step")
def test_on_jax_the_probes_digest_is_kept_and_said_once(tmp_path):
    from tb_gradviz import GradVizCallback

    model = cnn(0.1)
    x, y = data(2 * BATCH)
    callback = GradVizCallback(
        str(tmp_path), probe_data=(x[:BATCH], y[:BATCH]), every_n_batches=1, digest="step"
    )
    in_step_fit._told.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[callback])
    told = [str(w.message) for w in caught if "falls back" in str(w.message)]
    assert len(told) == 1 and "Keras runs on 'jax'" in told[0]
    accumulator = eventdata.load(str(tmp_path))
    (tag,) = eventdata.digest_tags(accumulator)
    assert [e.step for e in accumulator.Tensors(tag)] == [1, 2, 3, 4]
    assert in_step.SOURCE_TAG not in eventdata.tensor_tags(accumulator)
