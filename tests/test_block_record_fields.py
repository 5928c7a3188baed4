"""The block part of the precision record (layout 12): its fields, built from the block records of
every format, decoded, and told apart from a record written before it."""

import numpy as np
import pytest

from tb_gradviz.format import blocks, records, summaries

MX = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4_e2m1")


def test_the_block_part_is_appended_to_the_precision_record():
    expected = (
        *(
            f"block/{name}/{field}"
            for name in (*MX, "nvfp4")
            for field in ("to_zero", "subnormal", "saturated", "wide_blocks", "relative_error")
        ),
        "block/blocks/32",
        "block/blocks/16",
        "block/nonfinite_blocks/32",
        "block/nonfinite_blocks/16",
    )
    assert expected == blocks.RECORD_FIELDS
    assert len(blocks.RECORD_FIELDS) == 34
    assert records.PRECISION_LENGTH == 29 + 34 == len(records.PRECISION_FIELDS)
    assert records.PRECISION_CAST_LENGTH == 29
    assert records.PRECISION_FIELDS[29:] == blocks.RECORD_FIELDS


def values_with_every_case():
    """Three rows of 40 values (blocks of 32: 2 per row, the second partial; of 16: 3, the last
    partial): a wide range, a row with a NaN and an Inf, values that flush in every format."""
    rng = np.random.default_rng(3)
    values = (np.sign(rng.normal(size=(3, 40))) * 2.0 ** rng.uniform(-30, 8, (3, 40))).astype(
        np.float32
    )
    values[1, 3] = np.nan  # the first block of row 1 in both sizes
    values[1, 35] = np.inf  # the second block of 32, the third of 16
    values[2, :16] = 0.0  # a block of zeros (of 16), half a block of 32
    return values


def test_record_fields_are_each_formats_block_record():
    values = values_with_every_case()
    by_format = {name: blocks.block_record(values, name) for name in blocks.FORMATS}
    fields = dict(zip(blocks.RECORD_FIELDS, blocks.record_fields(by_format)))
    for name, record in by_format.items():
        for count in ("to_zero", "subnormal", "saturated", "wide_blocks"):
            assert fields[f"block/{name}/{count}"] == record[count]
        assert fields[f"block/{name}/relative_error"] == (
            record["squared_error"] / record["squared_sum"]
        )
    assert (fields["block/blocks/32"], fields["block/blocks/16"]) == (6, 9)
    assert (fields["block/nonfinite_blocks/32"], fields["block/nonfinite_blocks/16"]) == (2, 2)
    # Some values flush in every format but the widest, FP8 E5M2.
    assert all(fields[f"block/{name}/to_zero"] > 0 for name in blocks.FORMATS if name != MX[1])
    np.testing.assert_array_equal(blocks.numpy_fields(values), blocks.record_fields(by_format))


def test_relative_error_of_a_tensor_without_finite_energy_is_zero():
    for values in (np.zeros((2, 5), np.float32), np.full(4, np.nan, np.float32)):
        fields = dict(zip(blocks.RECORD_FIELDS, blocks.numpy_fields(values)))
        assert all(fields[f"block/{name}/relative_error"] == 0.0 for name in blocks.FORMATS)
    fields = dict(zip(blocks.RECORD_FIELDS, blocks.numpy_fields(np.full(4, np.nan, np.float32))))
    assert fields["block/blocks/32"] == fields["block/nonfinite_blocks/32"] == 1


def test_record_fields_needs_every_format():
    with pytest.raises(ValueError, match=r"every format of .*received \['nvfp4'\]"):
        blocks.record_fields({"nvfp4": blocks.block_record(np.ones(3), "nvfp4")})


def full_record(values):
    return np.concatenate([summaries.precision_vector(values), blocks.numpy_fields(values)])


def test_decode_precision_gives_the_block_part_per_format():
    values = values_with_every_case()
    decoded = records.decode_precision(full_record(values))
    assert decoded["finite_nonzero"] == 120 - 2 - 16
    assert list(decoded["block_formats"]) == list(blocks.FORMATS)
    for name, spec in blocks.FORMATS.items():
        record = blocks.block_record(values, name)
        assert decoded["block_formats"][name] == {
            "to_zero": record["to_zero"],
            "subnormal": record["subnormal"],
            "saturated": record["saturated"],
            "wide_blocks": record["wide_blocks"],
            "relative_error": blocks.relative_squared_error(record),
            "blocks": 6 if spec.block_size == 32 else 9,
            "nonfinite_blocks": 2,
        }
        assert isinstance(decoded["block_formats"][name]["to_zero"], int)


def test_a_record_without_the_block_part_decodes_with_none():
    values = values_with_every_case()
    cast_part = summaries.precision_vector(values)
    assert cast_part.size == records.PRECISION_CAST_LENGTH
    older = records.decode_precision(cast_part)  # layouts 8 to 11
    turned_off = records.decode_precision(
        np.concatenate([cast_part, np.full(len(blocks.RECORD_FIELDS), np.nan)])
    )
    assert older["block_formats"] is turned_off["block_formats"] is None
    whole = records.decode_precision(full_record(values))
    assert older == dict(whole, block_formats=None) == turned_off


def test_precision_layout_reads_older_records_and_refuses_bad_block_counts():
    values = values_with_every_case()
    current = full_record(values)
    older = records.PRECISION.upgrade(current[:29])
    assert np.isnan(older[29:]).all()
    negative = current.copy()
    negative[records.PRECISION_FIELDS.index("block/nvfp4/to_zero")] = -1
    partial = current.copy()
    partial[records.PRECISION_FIELDS.index("block/blocks/16")] = np.nan
    # relative_error is no count: a NaN there alone leaves the row whole.
    error_only = current.copy()
    error_only[records.PRECISION_FIELDS.index("block/nvfp4/relative_error")] = np.nan
    rows = np.stack([current, older, negative, partial, error_only])
    assert records.PRECISION.valid_rows(rows).tolist() == [True, True, False, False, True]
    assert records.PRECISION.upgrade(current[:30]) is None
