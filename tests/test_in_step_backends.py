"""The in-step digest (`digest="step"`) on Keras' PyTorch and JAX backends.

On PyTorch the train step's own backward pass hands the chosen layers'
gradients to hooks (capture/backends/torch_in_step.py): the digest equals
the probe's on the same batch and weights, and training is the same bit for
bit. On JAX the callback keeps the probe's digest and says so once.
tests/test_in_step.py covers TensorFlow.
"""

import warnings

import eventdata
import numpy as np
import pytest

from tb_gradviz.capture import in_step, in_step_fit, probe, selection
from tb_gradviz.format import digest

keras = pytest.importorskip("keras")
BACKEND = keras.backend.backend()
if BACKEND == "tensorflow":
    pytest.skip("tests/test_in_step.py covers TensorFlow", allow_module_level=True)
torch_only = pytest.mark.skipif(BACKEND != "torch", reason="the in-step digest's PyTorch step")

BATCH = 16


def cnn(learning_rate=0.0):
    """A tiny CNN with BatchNorm, a residual Add, max pooling and a dense head, compiled."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(4, 3, padding="same", name="conv")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.ReLU(name="relu")(h)
    branch = keras.layers.Conv2D(4, 1, name="conv2")(h)
    h = keras.layers.Add(name="add")([h, branch])
    h = keras.layers.MaxPooling2D(name="pool")(h)
    h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
    outputs = keras.layers.Dense(3, name="dense")(h)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def data(n=BATCH):
    rng = np.random.RandomState(0)
    return rng.normal(size=(n, 8, 8, 3)).astype("float32"), np.arange(n) % 3


@torch_only
def test_the_in_step_digest_equals_the_probes_on_the_same_batch_and_weights():
    model = cnn()
    x, y = data()
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)  # makes the train function
    chosen = selection.select_layers(model, lambda layer: True)
    step = in_step_fit.install(model, chosen, lambda: True)
    records, _ = probe.new_capture(model, chosen).run(x, y)
    ((tag, expected, _),) = digest.digest_records(records)
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)
    taken = step.take(int(keras.ops.convert_to_numpy(model.optimizer.iterations)))
    found_tag, found, _ = in_step_fit.event_records(taken, step.layout)[0]
    assert found_tag == tag
    offsets, _ = digest.row_offsets(step.layout.rows)
    for (kind, layer, name), offset in zip(step.layout.rows, offsets):
        fields = digest.FIELDS[kind]
        got = found[offset : offset + len(fields)]
        want = expected[offset : offset + len(fields)]
        for field, g, w in zip(fields, got, want):
            if field == digest.BLOCK_FIELD:
                assert np.isnan(g)
            elif field in ("rms", "max_abs"):
                assert g == pytest.approx(w, rel=2e-6), (kind, layer, name, field)
            else:
                assert g == w, (kind, layer, name, field)


def weights_and_state(model):
    return [keras.ops.convert_to_numpy(v) for v in model.variables + model.optimizer.variables]


@torch_only
def test_training_is_the_same_bit_for_bit_with_the_in_step_digest(tmp_path):
    from tb_gradviz import GradVizCallback

    x, y = data(6 * BATCH)
    histories, states = [], []
    for with_callback in (False, True):
        model = cnn(0.1)
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
