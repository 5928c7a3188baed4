"""The host pass with the block part inside it (`kernels.summary(..., block_formats=True)`)
against the numpy definitions: the statistics and the casts' part as without it, the block part
as `format.blocks` defines it, counts exactly and relative errors to rounding."""

import ml_dtypes
import numpy as np
import pytest
from test_block_counts import mixed_tensor
from test_block_formats import edges

from tb_gradviz.capture import assemble, kernels
from tb_gradviz.format import blocks

F32 = np.float32
CASTS = slice(0, -len(blocks.RECORD_FIELDS))
BLOCK = slice(-len(blocks.RECORD_FIELDS), None)
RELATIVE = [i for i, f in enumerate(blocks.RECORD_FIELDS) if f.endswith("/relative_error")]
COUNTED = [i for i, f in enumerate(blocks.RECORD_FIELDS) if not f.endswith("/relative_error")]
RELATIVE_FIELDS = [blocks.RECORD_FIELDS[i] for i in RELATIVE]
COUNTED_FIELDS = [blocks.RECORD_FIELDS[i] for i in COUNTED]


def assert_fused(values, divisor=None):
    """One fused summary of `values` against the unfused one and the block definition; returns
    the block part's fields."""
    histogram, stats, precision = kernels.summary(
        values, divisor, precision=True, block_formats=True
    )
    want_histogram, want_stats, want_casts = kernels.summary(values, divisor, precision=True)
    np.testing.assert_array_equal(histogram, want_histogram)
    np.testing.assert_array_equal(stats, want_stats)
    np.testing.assert_array_equal(precision[CASTS], want_casts)
    got, want = precision[BLOCK], blocks.numpy_fields(values)
    np.testing.assert_array_equal(got[COUNTED], want[COUNTED])
    np.testing.assert_allclose(got[RELATIVE], want[RELATIVE], rtol=1e-11, atol=1e-300)
    return dict(zip(blocks.RECORD_FIELDS, got))


def rows_of_32(values):
    """`values`' blocks laid out in rows of 64 (zeros after the last), so that the fused pass,
    which takes rows of whole blocks of 32, reads them."""
    flat = values.reshape(-1)
    padded = np.zeros(-(-flat.size // 64) * 64, flat.dtype)
    padded[: flat.size] = flat
    return padded.reshape(-1, 64)


@pytest.mark.parametrize("name", sorted(blocks.FORMATS))
def test_each_formats_rounding_edges_in_one_pass(name):
    """Each element's values, its ties and their float32 neighbours, the MX scale pinned to 1:
    as the edge tests give them, and in rows of 64 (NVFP4's blocks of 16 unchanged)."""
    assert assert_fused(edges(name))[f"block/{name}/to_zero"] > 0
    fields = assert_fused(rows_of_32(edges(name)))
    assert fields[f"block/{name}/to_zero"] > 0 and fields[f"block/{name}/subnormal"] > 0


@pytest.mark.parametrize("exponent", [-149, -127, -114, -112, -100, 0, 100, 124, 126, 127])
def test_blocks_near_the_ends_of_float32s_range(exponent):
    """Blocks whose E8M0 scale clamps, or whose 2**-K leaves float32's normal range, beside
    ordinary blocks: the fused pass hands them to the float64 rounding as the kernel does."""
    rng = np.random.default_rng(exponent + 200)
    top = np.ldexp(1.0, exponent) * rng.uniform(1, 1.99, (4, 1))
    values = (rng.uniform(-1, 1, (4, 96)) * top * np.exp2(-rng.uniform(0, 20, (4, 96)))).astype(F32)
    values[:, 64:] = rng.standard_normal((4, 32)).astype(F32)
    values[0, 0] = F32(top[0, 0]) if exponent < 127 else np.finfo(F32).max
    assert_fused(values)


def random_tensor(shape, dtype, seed):
    """Finite values over many binades with zeros and float32 subnormals, as `dtype` holds
    them (narrow dtypes round, and flush or overflow some)."""
    values = np.nan_to_num(mixed_tensor(shape, seed), nan=1.0, posinf=2.0, neginf=-3.0)
    with np.errstate(over="ignore"):
        return np.clip(values, -1e30, 1e30).astype(dtype)


@pytest.mark.parametrize(
    "dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64], ids=lambda d: d.__name__
)
@pytest.mark.parametrize("shape", [(64,), (3, 32), (5, 4096), (2, 3, 160), (7, 33), (9, 5), ()])
def test_random_tensors_of_every_dtype(dtype, shape):
    """As a backend hands values to the host pass: float16 and bfloat16 widened to float32
    exactly, float32 as it is, float64 read as float32 by the block part; widths of whole
    blocks of 32 (one pass) and others (the block part apart)."""
    values = random_tensor(shape, dtype, seed=len(shape) * 31 + sum(shape))
    if values.dtype not in (np.float32, np.float64):
        values = values.astype(F32)
    assert_fused(values)


def test_nan_and_inf_and_a_divisor_take_the_block_part_apart():
    """NaN, Inf or a loss scale send the tensor to the one-value kernel; the block part is then
    computed on its own, of the values as they are."""
    values = mixed_tensor((6, 128), 5)
    assert np.isnan(values).any() and np.isinf(values).any()
    fields = assert_fused(values)
    assert fields["block/nonfinite_blocks/32"] == 2
    finite = np.nan_to_num(values, nan=0.0, posinf=1.0, neginf=-1.0)
    # Divided by a power of two, the same blocks: the same counts; the relative errors are
    # sums added in another order (each pass's own lanes), equal to rounding.
    divided, whole = assert_fused(finite, 1024.0), assert_fused(finite)
    assert [divided[f] for f in COUNTED_FIELDS] == [whole[f] for f in COUNTED_FIELDS]
    for field in RELATIVE_FIELDS:
        assert divided[field] == pytest.approx(whole[field], rel=1e-12), field


def test_an_empty_tensor_and_all_zeros():
    assert assert_fused(np.zeros((0, 64), F32))["block/blocks/32"] == 0
    zeros = assert_fused(np.zeros((3, 64), F32))
    assert zeros["block/blocks/32"] == 6 and zeros["block/mxfp4_e2m1/to_zero"] == 0


def test_host_summaries_reads_each_tensor_once_for_everything():
    """The capture's entry point gives the fused records, in item order, on threads."""
    items = [(random_tensor((4, 256), F32, seed), None) for seed in range(5)]
    items.append((mixed_tensor((3, 47), 1), None))
    got = assemble.host_summaries(items, block_formats=True)
    for (values, divisor), (histogram, stats, precision) in zip(items, got):
        want = kernels.summary(values, divisor, precision=True, block_formats=True)
        for got_part, want_part in zip((histogram, stats, precision), want):
            np.testing.assert_array_equal(got_part, want_part)
    casts_only = assemble.host_summaries(items, block_formats=False)
    assert all(len(c[2]) == len(g[2]) - len(blocks.RECORD_FIELDS) for c, g in zip(casts_only, got))


def test_block_formats_without_precision_is_refused():
    with pytest.raises(ValueError, match="block_formats=True needs precision=True"):
        kernels.summary(np.ones(32, F32), block_formats=True)
