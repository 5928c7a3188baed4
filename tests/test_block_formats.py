"""The block record against ml_dtypes' casts: every count, each format's rounding edges and scale
boundaries, zero and non-finite blocks, partial blocks."""

import math

import ml_dtypes
import numpy as np
import pytest

from tb_gradviz.format import blocks

ELEMENT_DTYPES = {
    "fp8_e4m3": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
    "fp6_e2m3": ml_dtypes.float6_e2m3fn,
    "fp6_e3m2": ml_dtypes.float6_e3m2fn,
    "fp4_e2m1": ml_dtypes.float4_e2m1fn,
}
F32 = np.float32


def cast(values32, dtype):
    """float32 values rounded to `dtype` by ml_dtypes (one rounding: the source is float32),
    saturated at its largest finite value first, as the block formats saturate."""
    top = F32(ml_dtypes.finfo(dtype).max)
    return np.clip(values32, -top, top).astype(dtype).astype(np.float64)


def split(values, size):
    """`(blocks, real)` of consecutive values along the last axis, written independently of
    blocks._blocks: a list of 1-D float32 arrays per block."""
    values = np.asarray(values, F32)
    rows = (
        values.reshape(1, 1)
        if values.ndim == 0
        else values.reshape(math.prod(values.shape[:-1]), values.shape[-1])
    )
    return [row[start : start + size] for row in rows for start in range(0, len(row), size)]


def reference(values, name):
    """The block record of `values` computed with ml_dtypes' casts and a scale per block set by
    the specification's formula (log2 of the block's amax for MX)."""
    spec = blocks.FORMATS[name]
    dtype = ELEMENT_DTYPES[spec.element]
    info = ml_dtypes.finfo(dtype)
    largest, tiny = float(info.max), float(info.smallest_subnormal)
    smallest_normal = float(info.smallest_normal)
    emax = int(math.floor(math.log2(largest)))
    parts = split(values, spec.block_size)
    finite_parts = [p for p in parts if np.isfinite(p).all()]
    tensor_amax = max((float(np.abs(p).max(initial=0.0)) for p in finite_parts), default=0.0)
    counts = dict.fromkeys(blocks.COUNTS, 0)
    counts["squared_error"] = counts["squared_sum"] = 0.0
    for part in parts:
        counts["blocks"] += 1
        if not np.isfinite(part).all():
            counts["nonfinite_blocks"] += 1
            continue
        magnitude = np.abs(part.astype(np.float64))
        amax = float(magnitude.max(initial=0.0))
        nonzero = magnitude[magnitude > 0]
        span = math.floor(math.log2(largest)) - math.floor(math.log2(tiny))
        if (
            nonzero.size
            and math.floor(math.log2(amax)) - math.floor(math.log2(nonzero.min())) > span
        ):
            counts["wide_blocks"] += 1
        if spec.scaling == "mx":
            exponent = math.floor(math.log2(amax)) - emax if amax > 0 else -127
            scale = 2.0 ** min(max(exponent, -127), 127)
            scaled = (part.astype(np.float64) / scale).astype(F32)  # exact: a power of two
            decoded_scale = scale
        else:
            with np.errstate(over="ignore"):
                tensor_scale = F32(F32(448.0 * 6.0) / F32(tensor_amax)) if tensor_amax else F32(1)
            tensor_scale = min(tensor_scale, np.finfo(F32).max)  # Transformer Engine's clamp
            wanted = F32(F32(amax) / F32(6.0)) * tensor_scale
            block_scale = cast(np.array([wanted], F32), ml_dtypes.float8_e4m3fn)[0]
            if block_scale == 0:
                scaled = np.zeros_like(part)
            else:
                scaled = (part * tensor_scale).astype(F32) / F32(block_scale)
            decoded_scale = block_scale / float(tensor_scale)
        element = cast(scaled, dtype)
        quantized = element * decoded_scale
        counts["to_zero"] += int(np.count_nonzero((element == 0) & (part != 0)))
        counts["subnormal"] += int(
            np.count_nonzero((element != 0) & (np.abs(element) < smallest_normal))
        )
        counts["saturated"] += int(np.count_nonzero(np.abs(scaled.astype(np.float64)) > largest))
        counts["squared_error"] += float(((quantized - part.astype(np.float64)) ** 2).sum())
        counts["squared_sum"] += float((part.astype(np.float64) ** 2).sum())
    return counts


def assert_record(values, name):
    got = blocks.block_record(values, name)
    want = reference(values, name)
    exact = {k: v for k, v in got.items() if not k.startswith("squared")}
    assert exact == {k: v for k, v in want.items() if not k.startswith("squared")}, name
    for key in ("squared_error", "squared_sum"):
        assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-300), (name, key)
    return got


def edges(name):
    """One block per edge case with the MX scale pinned to 1 (the block's amax has the element's
    top exponent): each representable value, every midpoint between neighbours (ties), their
    float32 neighbours, half the smallest subnormal and the values around the largest."""
    element = blocks.ELEMENTS[blocks.FORMATS[name].element]
    dtype = ELEMENT_DTYPES[blocks.FORMATS[name].element]
    grid = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64)))
    grid = grid[np.isfinite(grid)][: 1 << 8]
    mids = (grid[:-1] + grid[1:]) / 2
    points = np.concatenate([grid, mids, [element.largest * 1.01, element.largest * 1.2]])
    points32 = points.astype(F32)
    around = np.concatenate(
        [points32, np.nextafter(points32, F32(np.inf)), np.nextafter(points32, F32(0))]
    )
    around = np.concatenate([around, -around])
    size = blocks.FORMATS[name].block_size
    anchor = F32(2.0**element.max_exponent)
    rows = []
    for start in range(0, len(around), size - 1):
        row = np.zeros(size, F32)
        row[0] = anchor
        chunk = around[start : start + size - 1]
        row[1 : 1 + len(chunk)] = np.clip(chunk, -F32(2.0**element.max_exponent * 1.99), None)
        rows.append(row)
    return np.stack(rows)


@pytest.mark.parametrize("name", sorted(blocks.FORMATS))
def test_rounding_edges_match_ml_dtypes(name):
    record = assert_record(edges(name), name)
    assert record["to_zero"] > 0 and record["subnormal"] > 0


@pytest.mark.parametrize("name", sorted(n for n in blocks.FORMATS if n.startswith("mx")))
def test_the_mx_scale_steps_at_each_power_of_two(name):
    element = blocks.ELEMENTS[blocks.FORMATS[name].element]
    values = []
    for k in (-140, -127, -100, -3, 0, 1, 7, 100, 127 - element.max_exponent):
        top = np.ldexp(1.0, k)
        below = np.nextafter(F32(top), F32(0))
        for amax in (F32(top), below, F32(top * element.largest / 2**element.max_exponent)):
            block = np.full(32, F32(amax) * F32(2.0**-6), F32)
            block[0] = amax
            block[1] = -F32(amax) * F32(2.0**-9)
            values.append(block)
    record = assert_record(np.stack(values), name)
    assert record["blocks"] == len(values)


def test_a_large_block_value_flushes_the_small_ones_per_block_not_per_tensor():
    # In one MXFP4 block, 1e-3 next to 1e4 is below the scaled element's smallest subnormal.
    block = np.full(32, 1e-3, F32)
    block[0] = 1e4
    record = assert_record(block, "mxfp4_e2m1")
    assert record["to_zero"] == 31 and record["wide_blocks"] == 1
    apart = np.concatenate([block[:1], np.zeros(31, F32), block[1:]])
    assert assert_record(apart, "mxfp4_e2m1")["to_zero"] == 0  # each block has its own scale


@pytest.mark.parametrize("name", sorted(blocks.FORMATS))
def test_zero_and_nonfinite_blocks(name):
    size = blocks.FORMATS[name].block_size
    zeros = np.zeros(size, F32)
    nan = np.linspace(-1, 1, size, dtype=F32)
    nan[3] = np.nan
    inf = np.linspace(-1, 1, size, dtype=F32)
    inf[5] = -np.inf
    healthy = np.linspace(-3, 2, size, dtype=F32)
    record = assert_record(np.concatenate([zeros, nan, inf, healthy]), name)
    assert record["blocks"] == 4 and record["nonfinite_blocks"] == 2
    assert record["squared_sum"] == pytest.approx(float((healthy.astype(np.float64) ** 2).sum()))


@pytest.mark.parametrize("name", sorted(blocks.FORMATS))
@pytest.mark.parametrize("shape", [(), (7,), (3, 45), (2, 5, 33), (4, 16), (2, 0)])
def test_partial_blocks_along_the_last_axis(name, shape):
    rng = np.random.default_rng(sum(shape) + len(name))
    values = (rng.standard_normal(shape) * np.exp(rng.uniform(-12, 12, shape))).astype(F32)
    record = assert_record(values, name)
    size = blocks.FORMATS[name].block_size
    rows = 1 if not shape else int(np.prod(shape[:-1]))
    assert record["blocks"] == (1 if not shape else rows * -(-shape[-1] // size))


@pytest.mark.parametrize("name", sorted(blocks.FORMATS))
def test_gradient_like_tensors(name):
    rng = np.random.default_rng(7)
    values = (rng.standard_normal((64, 96)) * 1e-6).astype(F32)
    values[rng.random(values.shape) < 0.7] = 0  # mostly zeros, as a max pool's input gradient
    values[3, 10] = 5e-2  # one large value in a block
    values[10] = rng.standard_normal(96).astype(F32) * F32(3e-39)  # float32 subnormals
    assert_record(values, name)


def test_an_unknown_format_names_the_known_ones():
    with pytest.raises(ValueError, match=r"Unknown block format 'mxfp5'.*mxfp4_e2m1"):
        blocks.block_record(np.ones(4), "mxfp5")


@pytest.mark.parametrize("name", sorted(blocks.FORMATS))
def test_a_block_is_wide_once_its_binades_exceed_the_elements_span(name):
    element = blocks.ELEMENTS[blocks.FORMATS[name].element]
    size = blocks.FORMATS[name].block_size
    rows = []
    for extra in (0, 1):  # spanning exactly the element's binades, then one more
        row = np.zeros(size, F32)
        row[0] = F32(1.75)
        row[1] = F32(np.ldexp(1.99, -(element.span + extra)))
        rows.append(row)
    record = assert_record(np.stack(rows), name)
    assert record["wide_blocks"] == 1


def test_a_tiny_tensor_gets_a_finite_nvfp4_tensor_scale():
    """Below ~7.9e-36 the tensor scale 2688 / amax passes float32's largest value: clamped, every
    block still gets a scale and the error is finite, float32 subnormals included."""
    values = np.array([[1e-36, -3e-37, 2e-40, 0.0] * 8, [0.0] * 32], F32)
    record = assert_record(values, "nvfp4")
    assert math.isfinite(record["squared_error"]) and record["nonfinite_blocks"] == 0
    assert record["to_zero"] == 8  # the float32 subnormals 2e-40, far below the block's amax
