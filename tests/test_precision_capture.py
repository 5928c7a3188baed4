"""The precision record as the callback writes it: the values as captured, on every backend.

Runs on the Keras backend that KERAS_BACKEND selects (CI runs it on all three).
"""

import eventdata
import keras
import numpy as np

from tb_gradviz import GradVizCallback
from tb_gradviz.format import precision, records, summaries

layers = keras.layers


def decoded(log, layer, tensor):
    return records.decode_precision(eventdata.last(log, records.precision_tag(layer, tensor)))


def tiny_gradient_model(scale):
    """Dense(4) -> Dense(1) whose output-layer gradient is `scale` times a fixed vector."""
    inputs = keras.Input((4,))
    hidden = layers.Dense(
        4, kernel_initializer=keras.initializers.Identity(), use_bias=False, name="hidden"
    )(inputs)
    kernel = np.array([[1e-5], [1e-3], [1e-1], [1.0]], "float32") * scale
    output = layers.Dense(
        1, kernel_initializer=keras.initializers.Constant(kernel), use_bias=False, name="out"
    )(hidden)
    model = keras.Model(inputs, output)
    model.compile(keras.optimizers.SGD(0.0), "mse")
    return model


def test_every_recorded_tensor_has_a_precision_record(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6, 6, 2)),
            layers.Conv2D(3, 3, padding="same", activation="relu", name="conv"),
            layers.MaxPooling2D(2, name="pool"),
            layers.Flatten(),
            layers.Dense(2, name="dense"),
        ]
    )
    model.compile("sgd", "mse")
    x = np.random.default_rng(0).normal(size=(8, 6, 6, 2)).astype("float32")
    y = np.zeros((8, 2), "float32")
    callback = GradVizCallback(tmp_path, (x[:4], y[:4]), layers=["conv", "dense"], weights=True)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[callback])
    log = eventdata.load(tmp_path)
    stats_tags = [t for t in eventdata.tensor_tags(log) if t.endswith("/stats")]
    precision_tags = [t for t in eventdata.tensor_tags(log) if t.endswith("/precision")]
    assert sorted(t[: -len("/stats")] for t in stats_tags) == sorted(
        t[: -len("/precision")] for t in precision_tags
    )
    assert any("/weight_gradient/" in t for t in precision_tags)
    for tag in precision_tags:
        content = eventdata.content(log, tag)
        assert content["kind"] == "precision"
        assert content["tensor"] == tag[len("gradviz/") :].split("/", 1)[1][: -len("/precision")]
        # The stats of the same tensor count the same finite non-zero values.
        stats = records.decode_stats(eventdata.last(log, tag[: -len("precision")] + "stats"))
        finite = stats["count"] - stats["nan"] - stats["pos_inf"] - stats["neg_inf"]
        assert records.decode_precision(eventdata.last(log, tag))["finite_nonzero"] == (
            finite - stats["zeros"]
        )


def test_float16_underflow_of_a_float32_gradient_is_counted(tmp_path):
    """d loss / d out = 2 * 5e-4, so the hidden layer's output gradient is 1e-3 * the out kernel:
    1e-8 flushes to zero in float16, 1e-6 is subnormal, 1e-4 and 1e-3 are normal."""
    model = tiny_gradient_model(1.0)
    x = np.eye(4, dtype="float32")[:1]
    y = model.predict(x, verbose=0).astype("float32") - 5e-4
    callback = GradVizCallback(tmp_path, (x, y), layers=["hidden"])
    model.fit(x, y, verbose=0, callbacks=[callback])
    log = eventdata.load(tmp_path)
    gradient = 2 * 5e-4 * np.array([1e-5, 1e-3, 1e-1, 1.0], "float32")
    record = decoded(log, "hidden", "output_gradient")
    assert record["formats"]["float16"]["as_is"] == {"to_zero": 1, "subnormal": 1, "overflow": 0}
    # Scaled to its amax, float16 keeps all four; e4m3fn's 2**-9 * 448 / 1e-3 range does not.
    assert record["formats"]["float16"]["scaled"] == {"to_zero": 0, "subnormal": 0, "overflow": 0}
    logged = eventdata.last(log, records.precision_tag("hidden", "output_gradient"))
    expected = summaries.precision_vector(gradient.astype("float32").reshape(1, 4))
    counts = slice(1 + len(precision.FORMATS), records.PRECISION_CAST_LENGTH)
    np.testing.assert_array_equal(logged[counts], expected[counts])
    assert record["formats"]["float16"]["scale_exponent"] == precision.scale_exponent(
        float(np.float32(gradient[-1])), "float16"
    )
