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


def transformer():
    """The demo's small transformer (`divergence_cases.transformer_case`: embeddings,
    multi-head attention, layer norms, GELU feed-forward blocks), at learning rate 0, with one
    batch of its data, and the layers it calls."""
    from tb_gradviz import demos, divergence_cases

    model, x, y, batch = divergence_cases.transformer_case(1, 0, 0.0, activation="gelu")
    return model, (x[:batch], y[:batch]), demos._called


def assert_step_digest_equals_probes(case=None):
    """Fits a model (learning rate 0: the weights the probe sees are those of the step) once
    with the in-step digest installed and asserts its digest equals the probe's on the same
    batch: the same tag, exact counts, RMS and max |x| to float32 rounding, the block part the
    probe's alone. Returns the in-step layout's rows and the chosen layers' paths.

    Args:
      case: `(model, (x, y), layers)`, a compiled model at learning rate 0, the one batch it
        is fitted on and the layers to choose; None for `cnn()` and every layer.
    """
    import keras

    from tb_gradviz.capture import in_step, in_step_fit, probe, selection
    from tb_gradviz.format import digest

    model, (x, y), layers = case or (cnn(), data(), lambda layer: True)
    batch = len(x)
    model.fit(x, y, batch_size=batch, verbose=0, shuffle=False)  # makes the train function
    chosen = selection.select_layers(model, layers)
    step = in_step_fit.install(model, chosen, lambda: True)
    records, _ = probe.new_capture(model, chosen).run(x, y)
    ((tag, expected, _),) = digest.digest_records(records)
    model.fit(x, y, batch_size=batch, verbose=0, shuffle=False)
    taken = step.take(int(keras.ops.convert_to_numpy(model.optimizer.iterations)))
    assert taken is not None
    found_tag, found, _ = in_step_fit.event_records(taken, step.layout)[0]
    # The update rows of every trainable weight follow the probe's rows (on a step that gives
    # them): a probe event's digest gets them too, so both are one series.
    updates = in_step.update_rows(getattr(step, "weights", ()))
    rows = step.layout.rows[: len(step.layout.rows) - len(updates)]
    assert step.layout.rows[len(rows) :] == updates
    assert digest.digest_tag([list(row) for row in rows]) == tag  # the probe's rows
    at = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    probe_event = in_step_fit.probe_event_records(records, step, at)
    assert digest.digest_records(probe_event[:-1])[0][0] == tag
    assert (probe_event[-1][0] if updates else tag) == found_tag
    # Learning rate 0: each update is 0, over the one optimizer step applied (0 / 0 for the
    # weights that are all zero, the biases).
    ratio, interval = found[len(expected) :].reshape(-1, 2).T
    assert np.all(interval == 1) and np.all(np.nan_to_num(ratio) == 0)
    offsets, _ = digest.row_offsets(rows)
    compared = 0
    for (kind, layer, name), offset in zip(rows, offsets):
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
    return rows, [c.path for c in chosen]


def kernel_reads_of_a_logged_step(monkeypatch):
    """The shapes of the tensors the host kernel reads in `cnn()`'s logged step, every layer
    chosen (the digest is checked against the probe's on the way)."""
    from tb_gradviz.capture import in_step_kernel

    reads = []
    row_along = in_step_kernel.row_along

    def counted(values, units_axis):
        reads.append(tuple(values.shape))
        return row_along(values, units_axis)

    monkeypatch.setattr(in_step_kernel, "row_along", counted)
    assert_step_digest_equals_probes()
    return reads


# `cnn()`'s 8 layers each read once for their activation and once for their output gradient;
# of their 9 input gradients, those of `conv` (the model's input), `conv2` and `add` (which
# both read `relu`'s output: the sum of their two gradients is `relu`'s) are read, and the
# other 6 are the output gradient of the one layer whose output they read, and are not.
CNN_READS = 8 + 8 + 3


# Every trainable weight of `cnn()`, in model order: the in-step digest's update rows.
CNN_WEIGHTS = [
    ("conv", "kernel"),
    ("conv", "bias"),
    ("bn", "gamma"),
    ("bn", "beta"),
    ("conv2", "kernel"),
    ("conv2", "bias"),
    ("dense", "kernel"),
    ("dense", "bias"),
]


def assert_step_updates_are_the_weights_moves():
    """Fits `cnn(0.1)` one step with the in-step digest of its pooling layer only, and asserts
    its update rows are those of every trainable weight, chosen layer or not: each ratio
    `|w_after - w_before| / |w_after|` of host copies taken around the step (to float32
    rounding), over one optimizer step, and the metadata gives each weight's layer and size."""
    import keras

    from tb_gradviz.capture import in_step_fit, selection
    from tb_gradviz.format import digest, metadata

    model = cnn(0.1)
    x, y = data(2 * BATCH)
    model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, verbose=0, shuffle=False)
    chosen = selection.select_layers(model, ["pool"])
    step = in_step_fit.install(model, chosen, lambda: True)
    by_name = {f"{layer}/{name}": (layer, name) for layer, name in CNN_WEIGHTS}
    variables = {by_name[v.path]: v for v in model.trainable_weights}
    before = {k: keras.ops.convert_to_numpy(v).astype(np.float64) for k, v in variables.items()}
    model.fit(x[BATCH:], y[BATCH:], batch_size=BATCH, verbose=0, shuffle=False)
    taken = step.take(int(keras.ops.convert_to_numpy(model.optimizer.iterations)))
    _, vector, summary_metadata = in_step_fit.event_records(taken, step.layout)[0]
    content = metadata.parse_plugin_metadata(summary_metadata.plugin_data.content)
    decoded = digest.decode_digest(content["rows"], vector)
    updates = [(layer, name) for kind, layer, name in content["rows"] if kind == digest.UPDATE]
    assert updates == CNN_WEIGHTS
    for layer, name in updates:
        after = keras.ops.convert_to_numpy(variables[(layer, name)]).astype(np.float64)
        moved = np.linalg.norm(after - before[(layer, name)]) / np.linalg.norm(after)
        row = decoded[(digest.UPDATE, layer, name)]
        assert row["update_ratio"][0] == pytest.approx(moved, rel=1e-6), (layer, name)
        assert row["interval"][0] == 1
    described = digest.update_weights(content)
    assert described[("conv", "kernel")] == {
        "layer_index": 0,
        "layer_class": "Conv2D",
        "count": 3 * 3 * 3 * 4,
    }
    assert described[("dense", "bias")]["count"] == 3


def every_step_callback(log_dir, x, y):
    """The callback of the bit-identity fits: every layer, the digest from the train step at
    every batch end, no full records but the probe's schedule, the first batch as the probe's."""
    from tb_gradviz import GradVizCallback

    return GradVizCallback(
        str(log_dir),
        probe_data=(x[:BATCH], y[:BATCH]),
        layers=lambda layer: True,
        every_n_batches=1,
        full_records=0,
        digest="step",
    )


def fitted_twice(log_dir, steps_per_execution=1):
    """`(histories, states)` of `cnn(0.1)` fitted 2 epochs of 6 batches without the callback,
    then with `digest="step"` at every batch end (no full records but the probe's schedule)."""

    x, y = data(6 * BATCH)
    histories, states = [], []
    for with_callback in (False, True):
        model = cnn(0.1, steps_per_execution=steps_per_execution)
        callbacks = [every_step_callback(log_dir, x, y)] if with_callback else []
        history = model.fit(
            x, y, batch_size=BATCH, epochs=2, verbose=0, shuffle=False, callbacks=callbacks
        )
        histories.append(history.history)
        states.append(weights_and_state(model))
    return histories, states


def assert_every_event_updates_every_weight(log_dir):
    """Asserts that each event `fitted_twice` wrote, the probe's and the step's alike, is in one
    digest series whose update rows give every weight of `cnn()` its update over the one
    optimizer step before the event (a learning rate of 0.1: each kernel moved)."""
    import eventdata

    from tb_gradviz.format import digest

    accumulator = eventdata.load(str(log_dir))
    (tag,) = eventdata.digest_tags(accumulator)
    rows = eventdata.content(accumulator, tag)["rows"]
    vectors = np.stack([vector for _, vector in eventdata.values(accumulator, tag)])
    decoded = digest.decode_digest(rows, vectors)
    assert [(layer, name) for kind, layer, name in rows if kind == digest.UPDATE] == CNN_WEIGHTS
    for layer, name in CNN_WEIGHTS:
        update = decoded[(digest.UPDATE, layer, name)]
        assert np.all(update["interval"] == 1), (layer, name)
        if name == "kernel":
            assert np.all(update["update_ratio"] > 0), (layer, name)


def assert_mixed_float16_training_is_the_same(log_dir):
    """Fits `cnn(0.1)` under mixed_float16 (its `LossScaleOptimizer`) 4 batches without and
    with `digest="step"` at every batch end, asserts every weight, optimizer variable and the
    loss scale bit-identical, and the digest's gradients unscaled (divided by the loss scale,
    32768 at first: their RMS far below one, as the probe's). Returns the run's accumulator."""
    import eventdata
    import keras

    from tb_gradviz.format import digest

    x, y = data(4 * BATCH)
    states = []
    for with_callback in (False, True):
        keras.mixed_precision.set_dtype_policy("mixed_float16")
        try:
            model = cnn(learning_rate=0.1)
            assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
            callbacks = [every_step_callback(log_dir, x, y)] if with_callback else []
            model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False, callbacks=callbacks)
            states.append(weights_and_state(model))
        finally:
            keras.mixed_precision.set_dtype_policy("float32")
    for a, b in zip(*states):
        np.testing.assert_array_equal(a, b)
    accumulator = eventdata.load(str(log_dir))
    (tag,) = eventdata.digest_tags(accumulator)
    rows = eventdata.content(accumulator, tag)["rows"]
    vectors = [vector for _, vector in eventdata.values(accumulator, tag)]
    decoded = digest.decode_digest(rows, np.stack(vectors))
    rms = decoded[(digest.TENSOR, "dense", "output_gradient")]["rms"]
    assert np.all(np.isfinite(rms)) and np.all(rms < 1.0)
    return accumulator


def fallback_fit(log_dir, model_class=None, distribution=None, jit_compile=False, epochs=(2,)):
    """`(messages, steps, in_step_events)` of fits (one per `epochs` entry) of a dense model with
    `digest="step"` where the step is not mirrored: the fall-back warnings said, the digest's
    steps, and whether any event was the step's."""
    import warnings

    import eventdata
    import keras

    from tb_gradviz import GradVizCallback
    from tb_gradviz.capture import in_step, in_step_fit

    keras.distribution.set_distribution(distribution)
    try:
        inputs = keras.Input((4,))
        model = (model_class or keras.Model)(inputs, keras.layers.Dense(2, name="dense")(inputs))
        model.compile(optimizer="sgd", loss="mse", jit_compile=jit_compile)
        x, y = np.ones((8, 4), "float32"), np.zeros((8, 2), "float32")
        callback = GradVizCallback(
            str(log_dir), probe_data=(x, y), layers="dense", every_n_batches=1, digest="step"
        )
        in_step_fit._told.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for n in epochs:
                model.fit(x, y, batch_size=4, epochs=n, verbose=0, callbacks=[callback])
    finally:
        keras.distribution.set_distribution(None)
    accumulator = eventdata.load(str(log_dir))
    (tag,) = eventdata.digest_tags(accumulator)
    steps = [e.step for e in accumulator.Tensors(tag)]
    in_step_events = in_step.SOURCE_TAG in eventdata.tensor_tags(accumulator)
    return [str(w.message) for w in caught if "falls back" in str(w.message)], steps, in_step_events
