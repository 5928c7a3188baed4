"""The host kernel of the block record against its numpy definition: every format of
`block_records` at once, counts exactly and squared sums to rounding."""

import warnings

import numpy as np
import pytest
from test_block_formats import edges

from tb_gradviz.capture import block_counts
from tb_gradviz.format import blocks

F32 = np.float32


def assert_same(values, name):
    """`block_record(values, name)` against the definition; returns the record."""
    want = blocks.block_record(values, name)
    got = block_counts.block_record(values, name)
    assert_equal(got, want, name)
    return got


def assert_equal(got, want, name):
    assert {k: got[k] for k in blocks.COUNTS[:6]} == {k: want[k] for k in blocks.COUNTS[:6]}, name
    for key in ("squared_error", "squared_sum"):
        assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-300), (name, key)


def assert_records(values):
    """`block_records(values)` against the definition of every format; returns the records."""
    got = block_counts.block_records(values)
    assert list(got) == list(blocks.FORMATS)
    for name in blocks.FORMATS:
        assert_equal(got[name], blocks.block_record(values, name), name)
    return got


def mixed_tensor(shape, seed):
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(shape) * np.exp(rng.uniform(-30, 30, shape))).astype(F32)
    flat = values.reshape(-1)
    flat[rng.random(flat.size) < 0.3] = 0
    flat[rng.random(flat.size) < 0.01] = F32(1e-41)  # float32 subnormals
    if flat.size > 40:
        flat[7], flat[40] = np.nan, -np.inf
    return values


@pytest.mark.parametrize("name", sorted(blocks.FORMATS))
def test_rounding_edges(name):
    assert assert_same(edges(name), name)["to_zero"] > 0


@pytest.mark.parametrize("edges_of", sorted(blocks.FORMATS))
def test_every_format_on_each_formats_rounding_edges(edges_of):
    """Each element's values, midpoints (ties to even) and their float32 neighbours, with the
    MX scale pinned to 1, read by all six formats at once."""
    records = assert_records(edges(edges_of))
    assert records[edges_of]["to_zero"] > 0 and records[edges_of]["subnormal"] > 0


@pytest.mark.parametrize("name", sorted(blocks.FORMATS))
@pytest.mark.parametrize("shape", [(), (5,), (3, 47), (4, 2, 64), (2, 0)])
def test_tensors_with_zeros_subnormals_and_nonfinite_values(name, shape):
    assert_same(mixed_tensor(shape, len(shape) + len(name)), name)


@pytest.mark.parametrize(
    "shape",
    [(1,), (3,), (7, 3), (5, 15), (4, 16), (3, 17), (6, 31), (2, 32), (3, 33), (2, 47)]
    + [(2, 48), (3, 100), (2, 1000), (9, 64), (3, 2, 96), (70, 32), (5, 1500), (1, 4096)]
    + [(3, 8288), (2, 20000)],
)
def test_partial_blocks_and_chunks_in_every_format(shape):
    """Rows of one value up to several chunks (`block_counts.CHUNK`), partial blocks of 16
    and 32, rows of at most 16 values (one block in every format), NaN and Inf in some."""
    assert_records(mixed_tensor(shape, sum(shape)))


@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 5), (3, 0, 4), (0, 0)])
def test_empty_tensors(shape):
    records = assert_records(np.zeros(shape, F32))
    assert all(record["blocks"] == 0 and record["squared_sum"] == 0 for record in records.values())


@pytest.mark.parametrize("value", [0.0, 1.0, -3.5, 1e-42, 1e-36, 3e38, np.nan, -np.inf])
def test_scalars(value):
    records = assert_records(np.array(value, F32))
    assert all(record["blocks"] == 1 for record in records.values())


def test_float32_subnormals_alone_and_beside_normal_values():
    """A tensor of float32 subnormals alone (NVFP4's tensor scale clamped to float32's
    largest), and subnormals in blocks whose largest value is large or small."""
    rng = np.random.default_rng(3)
    subnormals = (rng.integers(1, 1 << 23, (4, 64)) * np.ldexp(1.0, -149)).astype(F32)
    subnormals[rng.random(subnormals.shape) < 0.3] = 0
    assert_records(subnormals)
    beside = np.concatenate([subnormals, subnormals * F32(2.0**100), subnormals * F32(2.0**60)])
    beside[:, ::7] = rng.choice([1e-3, 1.0, 1e30], (beside.shape[0], 1)).astype(F32)
    assert_records(beside)


def test_nan_and_inf_leave_their_own_blocks_out():
    """NaN or Inf in one half of an MX block: MX leaves the block of 32 out, NVFP4 only that
    block of 16; in a partial block; in every block of a row."""
    values = np.tile(np.linspace(-2, 3, 96, dtype=F32), (4, 1))
    values[0, 3] = np.nan  # first half of the first MX block
    values[1, 20] = np.inf  # its second half
    values[2, 90] = -np.inf  # the row's last block
    values[3, ::16] = np.nan  # every block
    records = assert_records(values)
    assert records["nvfp4"]["nonfinite_blocks"] == 3 + 6
    assert records["mxfp8_e4m3"]["nonfinite_blocks"] == 3 + 3
    partial = np.linspace(1, 2, 50, dtype=F32).reshape(1, 50)
    partial[0, 49] = np.nan
    assert assert_records(partial)["nvfp4"]["nonfinite_blocks"] == 1


@pytest.mark.parametrize("exponent", [-149, -140, -127, -120, -114, -113, -112, -111, -100])
def test_small_blocks_whose_e8m0_scale_clamps(exponent):
    """A block's largest magnitude 2**exponent (times 1, just below 2 and 1.5) with smaller
    values: near and past the E8M0 clamp, where some elements' scale is 2**-127 and the
    kernel rounds the block in float64."""
    rng = np.random.default_rng(-exponent)
    rows = []
    for mantissa in (1.0, 1.99999, 1.5):
        top = np.ldexp(mantissa, exponent)
        row = (rng.uniform(-1, 1, 32) * top * np.exp2(-rng.uniform(0, 20, 32))).astype(F32)
        row[0] = F32(top)
        rows.append(row)
    assert_records(np.stack(rows))


@pytest.mark.parametrize("exponent", [120, 124, 125, 126, 127])
def test_large_blocks_near_float32s_largest(exponent):
    """Largest magnitudes up to float32's largest, where 2**-K leaves float32's normal range
    and the kernel rounds the block in float64; with blocks of ordinary values beside them."""
    rng = np.random.default_rng(exponent)
    top = np.ldexp(1.0, exponent) * rng.uniform(1, 1.99, (3, 1))
    values = (rng.uniform(-1, 1, (3, 64)) * top).astype(F32)
    values[:, 32:] = rng.standard_normal((3, 32)).astype(F32)
    values[0, 0] = np.finfo(F32).max
    assert_records(values)


def test_gradient_like_tensor_over_many_chunks():
    rng = np.random.default_rng(11)
    values = (rng.standard_normal((40, 1024)) * np.exp(rng.uniform(-12, 12, (40, 1024)))).astype(
        F32
    )
    values[rng.random(values.shape) < 0.5] = 0
    values[17, 5] = np.inf
    assert_records(values)


def test_float64_past_float32s_range_gives_no_overflow_warning():
    # Read as float32 as the definition reads them: 1e39 and 3e300 become Inf, quietly, and their
    # blocks count as holding Inf.
    values = np.ones((2, 40))
    values[0, 3], values[1, 35] = 1e39, -3e300
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = assert_records(values)
    assert got["nvfp4"]["nonfinite_blocks"] == 2 and got["mxfp8_e4m3"]["nonfinite_blocks"] == 2


def test_block_record_is_block_records_entry():
    values = mixed_tensor((3, 47), 0)
    records = block_counts.block_records(values)
    for name in blocks.FORMATS:
        assert block_counts.block_record(values, name) == records[name]


def test_an_unknown_format_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"Unknown block format 'fp8'.*nvfp4"):
        block_counts.block_record(np.ones(3, F32), "fp8")
