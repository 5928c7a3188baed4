"""The block part of the precision record on the host path: as captured (gradients at the loss
scale), from the host kernel (the numpy definition's counts), written by a real fit."""

import eventdata
import keras
import numpy as np
import pytest

from tb_gradviz import GradVizCallback
from tb_gradviz.capture import assemble
from tb_gradviz.format import blocks, records

COUNTS = [blocks.RECORD_FIELDS.index(f) for f in blocks.RECORD_COUNT_FIELDS]
ERRORS = [blocks.RECORD_FIELDS.index(f"block/{name}/relative_error") for name in blocks.FORMATS]


def assert_block_part(found, values):
    """`found` (a whole precision record) has the numpy definition's block part of `values`:
    counts exactly, relative errors to float64 rounding (sums taken in another order)."""
    assert found.size == records.PRECISION_LENGTH
    part, expected = found[records.PRECISION_CAST_LENGTH :], blocks.numpy_fields(values)
    np.testing.assert_array_equal(part[COUNTS], expected[COUNTS])
    np.testing.assert_allclose(part[ERRORS], expected[ERRORS], rtol=1e-12, atol=0)


def test_host_summaries_append_the_block_part_of_the_values_as_captured():
    rng = np.random.default_rng(5)
    wide = (np.sign(rng.normal(size=(6, 70))) * 2.0 ** rng.uniform(-40, 10, (6, 70))).astype(
        np.float32
    )
    wide[2, 5], wide[4, 66] = np.nan, -np.inf
    items = [
        (wide, None),
        # A loss-scaled gradient: its record is of the values as they are, not divided.
        (wide * np.float32(2.0**14), 2.0**14),
        (rng.normal(size=(3, 5, 33)).astype(np.float32), None),
        (np.float32(3.0).reshape(()), None),
        (np.zeros((0, 7), np.float32), None),
    ]
    found = assemble.host_summaries(items)
    without = assemble.host_summaries(items, block_formats=False)
    for (values, _), (histogram, stats, precision), (h, s, cast) in zip(items, found, without):
        assert_block_part(precision, values)
        np.testing.assert_array_equal(precision[: records.PRECISION_CAST_LENGTH], cast)
        assert cast.size == records.PRECISION_CAST_LENGTH
        np.testing.assert_array_equal(histogram, h)
        np.testing.assert_array_equal(stats, s)
    # Blocks along the last axis: 6 rows of 70 are 3 blocks of 32 and 5 of 16 each.
    fields = dict(zip(records.PRECISION_FIELDS, found[0][2]))
    assert (fields["block/blocks/32"], fields["block/blocks/16"]) == (18, 30)
    assert (fields["block/nonfinite_blocks/32"], fields["block/nonfinite_blocks/16"]) == (2, 2)
    # A power-of-two loss scale moves no value across a block format's edges.
    np.testing.assert_array_equal(
        found[0][2][records.PRECISION_CAST_LENGTH :], found[1][2][records.PRECISION_CAST_LENGTH :]
    )
    # The scalar is one block of one value; the empty tensor has none.
    assert dict(zip(records.PRECISION_FIELDS, found[3][2]))["block/blocks/16"] == 1
    assert dict(zip(records.PRECISION_FIELDS, found[4][2]))["block/blocks/32"] == 0


def test_the_block_part_of_threads_equals_one_at_a_time():
    rng = np.random.default_rng(6)
    arrays = [rng.normal(size=(n, 48)).astype(np.float32) for n in (1, 300, 7, 40)]
    threaded = assemble.block_fields(arrays)
    for values, fields in zip(arrays, threaded):
        np.testing.assert_array_equal(fields, assemble.block_fields([values])[0])


def test_a_fit_writes_the_block_part_of_a_known_gradient(tmp_path):
    """Dense(4, identity) -> Dense(1) with kernel 2**-30, 2**-20, 2**-10, 1 and a target
    2**-11 below the output: the hidden layer's output gradient is exactly 2**-10 times the
    kernel, [2**-40, 2**-30, 2**-20, 2**-10], one row of one block."""
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(
        4, kernel_initializer=keras.initializers.Identity(), use_bias=False, name="hidden"
    )(inputs)
    kernel = np.array([[2.0**-30], [2.0**-20], [2.0**-10], [1.0]], "float32")
    output = keras.layers.Dense(
        1, kernel_initializer=keras.initializers.Constant(kernel), use_bias=False, name="out"
    )(hidden)
    model = keras.Model(inputs, output)
    model.compile(keras.optimizers.SGD(0.0), "mse")
    x = np.eye(4, dtype="float32")[:1]  # out = 2**-30
    y = model.predict(x, verbose=0).astype("float32") - np.float32(2.0**-11)
    callback = GradVizCallback(tmp_path, (x, y), layers=["hidden"], block_formats=True)
    model.fit(x, y, verbose=0, callbacks=[callback])
    log = eventdata.load(tmp_path)
    found = eventdata.last(log, records.precision_tag("hidden", "output_gradient"))
    gradient = np.float32(2.0**-10) * kernel.reshape(1, 4)
    assert_block_part(found, gradient)
    record = records.decode_precision(found)["block_formats"]
    # MXFP8 E4M3: the scale 2**(-10 - 8) leaves 2**-40 and 2**-30 below half the smallest
    # subnormal (2**-10 after scaling), and the block spans 30 binades, more than E4M3's 17.
    assert record["mxfp8_e4m3"] == {
        "to_zero": 2,
        "subnormal": 0,
        "saturated": 0,
        "wide_blocks": 1,
        "relative_error": pytest.approx(
            (2.0**-80 + 2.0**-60) / (2.0**-80 + 2.0**-60 + 2.0**-40 + 2.0**-20), rel=1e-15
        ),
        "blocks": 1,
        "nonfinite_blocks": 0,
    }
    # E5M2's scale 2**-25 keeps 2**-30 normal and 2**-40 (2**-15 scaled) subnormal; 30 binades fit.
    assert record["mxfp8_e5m2"]["to_zero"] == record["mxfp8_e5m2"]["wide_blocks"] == 0
    assert record["mxfp8_e5m2"]["subnormal"] == 1


@pytest.mark.parametrize("statistics", ["host", "device"])
def test_block_formats_false_writes_the_casts_part_alone(tmp_path, statistics):
    """The switch holds on both paths: with it, every precision record has the block part; without,
    the 29 fields of the casts' part, which readers decode with `block_formats` None."""
    from tb_gradviz.capture import probe, selection

    model = keras.Sequential([keras.Input((40,)), keras.layers.Dense(33, name="dense")])
    model.compile("sgd", "mse")
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(2, 40)).astype("float32"), np.zeros((2, 33), "float32")
    chosen = selection.select_layers(model, ["dense"])
    for on in (True, False):
        capture = probe.new_capture(model, chosen, statistics=statistics, block_formats=on)
        written, _ = capture.run(x, y)
        precision = [r for tag, r, _ in written if tag.endswith("/precision")]
        assert len(precision) == 3
        for record in precision:
            length = records.PRECISION_LENGTH if on else records.PRECISION_CAST_LENGTH
            assert len(record) == length
            assert (records.decode_precision(record)["block_formats"] is None) == (not on)


@pytest.mark.parametrize(
    "policy, layers, asked, written",
    [
        ("float32", None, None, True),  # the pooling layers: the default selection
        ("float32", ["dense"], None, False),  # a float32 dense layer: 45 % of an event
        ("float32", ["dense"], True, True),
        ("mixed_float16", ["dense"], None, True),  # a layer computing in 16 bits
        ("mixed_bfloat16", ["dense", "pool"], None, True),
        ("mixed_float16", None, False, False),
    ],
)
def test_the_default_writes_the_block_part_for_pooling_and_16_bit_layers(
    tmp_path, policy, layers, asked, written
):
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = keras.Sequential(
            [
                keras.Input((8, 3)),
                keras.layers.Dense(4, name="dense"),
                keras.layers.MaxPooling1D(2, name="pool"),
            ]
        )
    finally:
        keras.mixed_precision.set_global_policy(previous)
    model.compile("sgd", "mse")
    x, y = np.ones((2, 8, 3), "float32"), np.zeros((2, 4, 4), "float32")
    callback = GradVizCallback(tmp_path, (x, y), layers=layers, block_formats=asked)
    model.fit(x, y, verbose=0, callbacks=[callback])
    log = eventdata.load(tmp_path)
    layer = (layers or ["pool"])[0]
    found = eventdata.last(log, records.precision_tag(layer, "activation"))
    assert (records.decode_precision(found)["block_formats"] is not None) == written


def test_block_formats_must_be_a_bool(tmp_path):
    with pytest.raises(TypeError, match="block_formats.*Received: block_formats='yes'"):
        GradVizCallback(tmp_path, (np.zeros((1, 4)), np.zeros((1, 1))), block_formats="yes")
