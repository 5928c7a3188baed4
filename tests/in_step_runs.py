"""The tiny CNN, data and checks that the in-step digest's tests share on every backend
(tests/test_in_step.py on TensorFlow, tests/test_in_step_backends.py on PyTorch and JAX)."""

import numpy as np
import pytest

BATCH = 16


def cnn(learning_rate=0.0, jit_compile=False, steps_per_execution=1, dtype=None):
    """A tiny CNN with BatchNorm, a residual Add, max pooling and a dense head, compiled."""
    import keras

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


def weights_and_state(model):
    import keras

    return [keras.ops.convert_to_numpy(v) for v in model.variables + model.optimizer.variables]


def assert_step_digest_equals_probes():
    """Fits `cnn()` (learning rate 0: the weights the probe sees are those of the step) once
    with the in-step digest installed and asserts its digest equals the probe's on the same
    batch: the same tag, exact counts, RMS and max |x| to float32 rounding, the block part the
    probe's alone. Returns the in-step layout's rows and the chosen layers' paths."""
    import keras

    from tb_gradviz.capture import in_step_fit, probe, selection
    from tb_gradviz.format import digest

    model = cnn()
    x, y = data()
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)  # makes the train function
    chosen = selection.select_layers(model, lambda layer: True)
    step = in_step_fit.install(model, chosen, lambda: True)
    records, _ = probe.new_capture(model, chosen).run(x, y)
    ((tag, expected, _),) = digest.digest_records(records)
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)
    taken = step.take(int(keras.ops.convert_to_numpy(model.optimizer.iterations)))
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
    return step.layout.rows, [c.path for c in chosen]


def fitted_twice(log_dir, steps_per_execution=1):
    """`(histories, states)` of `cnn(0.1)` fitted 2 epochs of 6 batches without the callback,
    then with `digest="step"` at every batch end (no full records but the probe's schedule)."""
    from tb_gradviz import GradVizCallback

    x, y = data(6 * BATCH)
    histories, states = [], []
    for with_callback in (False, True):
        model = cnn(0.1, steps_per_execution=steps_per_execution)
        callbacks = []
        if with_callback:
            callbacks = [
                GradVizCallback(
                    str(log_dir),
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
    return histories, states
