"""The block record on the host: `format.blocks.block_record` of every format at once.

numba reads the tensor once for NVFP4's tensor amax, then a chunk at a time (`CHUNK` values of
whole blocks, which stay in the L2 cache): per block of 16 (NVFP4's; an MX block is two) the
bits of its largest and smallest non-zero magnitudes, in integer operations (a float32
magnitude's bits order as its value; bits at or above +Inf's mean NaN or Inf), from them every
block's scales (`block_scales`), spread over its values; then each format in two loops over
the chunk that LLVM vectorizes, with no branch and no sum per block: the rounding and the counts
in float32, then the squared sums in float64 (in one loop, the float64 lanes set the width of
every operation: half as many float32 lanes).

Rounding without a division or a logarithm: a float `x >= 0` rounds to a multiple of a power of
two `q`, ties to even, as `(x + B) - B` with `B = q * 2**23` in float32 (`x < B`): the sum's last
bit is worth `q`. An element's quantum of `x` is `2**(max(floor(log2(x)), e_min) - mantissa)`,
and `2**floor(log2(x))` is `x`'s bits with the significand masked off.

MX: a block's E8M0 scale is `2**(K - emax)`, `K = floor(log2(amax))`, the same `2**K` for the
five elements, so each value is taken to `u = |v| / 2**K` and each element's constants are
divided by `2**emax`. `u` is exact unless it is below float32's normal range, where every
element rounds it to zero; the error `q * 2**K - |v|` is exact in float32 (a power of two times
`q`, then Sterbenz's lemma) and squared in float64. A block whose E8M0 scale clamps (`amax`
below ~4e-34) or whose `2**-K` is not a normal float32 is rounded in float64 (`_mx_block`). A
chunk whose non-zero values are all normal elements of a format skips its subnormal arm.
NVFP4: `(v * S) / s` in float32 as the definition computes it (IEEE gradual underflow), rounded
the same way.

A block holding NaN or Inf is left out by zeroing its values in a copy of the chunk; the zeros
are counted in the chunk and taken off the values that round to zero. Counts are exact; the
squared sums are added in another order than numpy's, so they agree with the definition to
rounding (tests/test_block_counts.py). The kernels release the GIL and run on the calling
thread: capture runs tensors on threads of its own.
"""

import numba
import numpy as np

# numba's on-disk cache of this file's kernels keys on this file's stamp only, so after editing
# block_scales in a checkout, delete tb_gradviz/capture/__pycache__/block_counts.*.nb[ic] (an
# install writes new files, and recompiles).
from tb_gradviz.capture.block_scales import (
    E8M0_HIGH,
    E8M0_LOW,
    FP4,
    INF,
    MX,
    MX_ELEMENTS,
    NVFP4,
    binade,
    count_above,
    half_stats,
    mx_scales,
    nvfp4_scales,
    nvfp4_tensor_scale,
    round64,
    two_to,
)
from tb_gradviz.format import blocks

# Values per chunk: a multiple of 32 and of `kernels._BLOCK`. A chunk's calls cost 0.3-0.7 us
# whatever its length, so chunks are long (8,192 values: 0.7x the block part's time at 1,024);
# its arrays stay in the L2 cache (bench/RESULTS.md section 20).
CHUNK = 8192
HALF = 16  # NVFP4's block length, passed to the kernels at run time (`_records`)
# Per MX element, in units of 2**K: `B = max(2**floor(log2(u)) * unit, floor)`, the largest
# value, the smallest normal; then the element's own fields, as `_mx_block` reads them.
MX_CONSTANTS = np.array(
    [
        (2.0 ** (23 - e.mantissa), 2.0 ** (e.min_exponent - e.max_exponent + 23 - e.mantissa))
        + (e.largest / 2.0**e.max_exponent, 2.0 ** (e.min_exponent - e.max_exponent), *e)
        for e in MX_ELEMENTS
    ]
)
MX_SPANS = np.array([e.span for e in MX_ELEMENTS], np.int64)
_EXPONENT32 = np.int32(0x7F800000)
_RECIPROCAL = np.int32(254 << 23)  # 2**K's bits are this minus 2**-K's
_F0, _F1 = np.float32(0.0), np.float32(1.0)
_COUNTED = ("to_zero", "subnormal", "saturated", "wide_blocks", "nonfinite_blocks")


@numba.njit(nogil=True, cache=True, fastmath={"reassoc"})
def _plus(total, x):
    """`total + x`, reassociable: only the sums are, so LLVM may split them into vector lanes
    while every rounding step stays as written."""
    return total + x


@numba.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def _plus_square(total, x):
    return total + x * x


@numba.njit(nogil=True, cache=True)
def _mx_chunk(src, off, n, inverse, element, below_normal, errors):
    """One MX element (its row of `MX_CONSTANTS`) over `src[off:off + n]`, `inverse` holding
    each value's `2**-K`: `(zero, below, saturated, squared_error)`, zero and below counting the
    values that round to 0 and below the smallest normal (zeros included), or both 0 where
    `below_normal` is False: every non-zero value is then a normal element. `errors` is
    scratch: each value's error, squared in float64 by a loop of its own (`_squares`)."""
    zero = below = saturated = _F0
    unit, floor = np.float32(element[0]), np.float32(element[1])
    top, smallest_normal = np.float32(element[2]), np.float32(element[3])
    for i in range(n):
        m = abs(src[np.uint64(off + i)])
        g = inverse[np.uint64(i)]
        u = m * g
        power = np.int32(np.float32(u).view(np.int32) & _EXPONENT32).view(np.float32)
        big = max(power * unit, floor) if below_normal else power * unit
        q = (u + big) - big
        saturated = _plus(saturated, _F1 if u > top else _F0)
        q = min(q, top)
        if below_normal:
            zero = _plus(zero, _F1 if q == 0 else _F0)
            below = _plus(below, _F1 if q < smallest_normal else _F0)
        scale = np.int32(_RECIPROCAL - np.float32(g).view(np.int32)).view(np.float32)
        errors[np.uint64(i)] = q * scale - m
    return zero, below, saturated, _squares(errors, 0, n)[0]


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _fp4_chunk(src, off, n, tensor_scale, block_scale, decode, elements):
    """NVFP4 over `src[off:off + n]`, `block_scale` and `decode` holding each value's `s` and
    `s / S` (`nvfp4_scales`): as `_mx_chunk`, each element `(v * S) / s` in float32 (kept in
    the scratch `elements`), then the float64 sums: its squared error, and the values' sum of
    squares and zeros, as `_squares`."""
    zero = below = saturated = zeros = _F0
    unit, largest = np.float32(2.0 ** (23 - FP4.mantissa)), np.float32(FP4.largest)
    smallest_normal = np.float32(2.0**FP4.min_exponent)
    for i in range(n):
        v = src[np.uint64(off + i)]
        y = abs((v * tensor_scale) / block_scale[np.uint64(i)])
        power = np.int32(np.float32(y).view(np.int32) & _EXPONENT32).view(np.float32)
        big = max(power, smallest_normal) * unit
        q = (y + big) - big
        saturated = _plus(saturated, _F1 if y > largest else _F0)
        q = min(q, largest)
        zero = _plus(zero, _F1 if q == 0 else _F0)
        below = _plus(below, _F1 if q < smallest_normal else _F0)
        zeros = _plus(zeros, _F1 if v == 0 else _F0)
        elements[np.uint64(i)] = q
    error = squares = 0.0
    for i in range(n):
        m = abs(np.float64(src[np.uint64(off + i)]))
        error = _plus_square(error, np.float64(elements[np.uint64(i)]) * decode[np.uint64(i)] - m)
        squares = _plus_square(squares, m)
    return zero, below, saturated, error, squares, np.int64(zeros)


@numba.njit(nogil=True, cache=True)
def _squares(src, off, n):
    """`(sum of squares in float64, zeros)` of `src[off:off + n]`."""
    total, zeros = 0.0, _F0
    for i in range(n):
        v = src[np.uint64(off + i)]
        total = _plus_square(total, np.float64(v))
        zeros = _plus(zeros, _F1 if v == 0 else _F0)
    return total, np.int64(zeros)


@numba.njit(nogil=True, cache=True)
def _mx_block(values, start, n, top_binade, mx, counts, sums):
    """Adds one finite MX block's counts for every element, value by value in float64, its
    scale clamped to E8M0's range: for the blocks `_mx_chunk` does not take."""
    squares = _squares(values, start, n)[0]
    for f in range(mx.shape[0]):
        mantissa, min_exponent = int(mx[f, 4]), int(mx[f, 5])
        k = min(max(top_binade - int(mx[f, 7]), E8M0_LOW), E8M0_HIGH)
        unit, floor = two_to(52 - mantissa), two_to(k + min_exponent + 52 - mantissa)
        top, smallest_normal = mx[f, 6] * two_to(k), two_to(k + min_exponent)
        for i in range(start, start + n):
            m = abs(np.float64(values[np.uint64(i)]))
            q = min(round64(m, unit, floor), top)
            counts[f, 0] += m > 0 and q == 0
            counts[f, 1] += q > 0 and q < smallest_normal
            counts[f, 2] += m > top
            sums[f, 0] += (q - m) ** 2
        sums[f, 1] += squares


@numba.njit(nogil=True, cache=True)
def _chunk(src, start, n, half, stats, work, mx, spans, tensor_scale, out):
    """Adds the counts of the chunk `src[start:start + n]` (whole MX blocks of `2 * half`
    values) to `out`: `(counts, sums)` of each format's `_COUNTED` and `(squared_error,
    squared_sum)`."""
    counts, sums = out
    amax, amin, inverse_b, spread, scale_h, decode_h = stats
    inverse, scale, decode, copy, floats = work
    formats, count = mx.shape[0], n // (2 * half)
    half_stats(src.view(np.int32), start, 2 * count, half, amax, amin)
    wide, nonfinite = nvfp4_scales(amax, amin, 2 * count, tensor_scale, scale_h, decode_h)
    counts[formats, 3] += wide
    counts[formats, 4] += nonfinite
    low, mx_nonfinite, left = mx_scales(amax, amin, count, inverse_b, spread)
    for f in range(formats):
        counts[f, 3] += count_above(spread, count, spans[f])
        counts[f, 4] += mx_nonfinite
    for h in range(2 * count):  # each block's scales spread over its values
        s, d = scale_h[h], decode_h[h]
        for i in range(half * h, half * h + half):
            scale[np.uint64(i)], decode[np.uint64(i)] = s, d
    for b in range(count):
        g = inverse_b[b]
        for i in range(2 * half * b, 2 * half * b + 2 * half):
            inverse[np.uint64(i)] = g

    nv_src, nv_at = src, start
    if nonfinite:  # a copy with those blocks' values zeroed
        nv_src, nv_at = copy[1], 0
        nv_src[:n] = src[start : start + n]
        for h in range(2 * count):
            if amax[h] >= INF:
                nv_src[half * h : half * (h + 1)] = 0
    zero, below, saturated, error, squares, zeros = _fp4_chunk(
        nv_src, nv_at, n, tensor_scale, scale, decode, floats
    )
    counts[formats, 0] += np.int64(zero) - zeros
    counts[formats, 1] += np.int64(below) - np.int64(zero)
    counts[formats, 2] += np.int64(saturated)
    sums[formats, 0] += error
    sums[formats, 1] += squares

    mx_src, mx_at = src, start
    if left:
        mx_src, mx_at = copy[0], 0
        mx_src[:n] = src[start : start + n]
        for b in range(count):
            if inverse_b[b] == 0:
                mx_src[2 * half * b : 2 * half * (b + 1)] = 0
                top = max(amax[2 * b], amax[2 * b + 1])
                if top < INF:
                    _mx_block(src, start + 2 * half * b, 2 * half, binade(top), mx, counts, sums)
    if left or nonfinite:
        squares, zeros = _squares(mx_src, mx_at, n)
    for f in range(formats):
        below_normal = low < mx[f, 3]
        zero, below, saturated, error = _mx_chunk(
            mx_src, mx_at, n, inverse, mx[f], below_normal, floats
        )
        if below_normal:
            counts[f, 0] += np.int64(zero) - zeros
            counts[f, 1] += np.int64(below) - np.int64(zero)
        counts[f, 2] += np.int64(saturated)
        sums[f, 0] += error
        sums[f, 1] += squares


@numba.njit(nogil=True, cache=True)
def _records(values, rows, width, half, mx, spans, tensor_scale, out):
    """Adds every format's counts over `values` (float32, `rows` x `width`, flat) to `out`
    (`_chunk`), a chunk at a time.

    `half` is NVFP4's block length, 16, passed at run time: LLVM then vectorizes the loops
    over one block's values instead of unrolling them into gathers over blocks. Rows whose
    width is not a multiple of `2 * half` are copied with each MX block padded with zeros,
    which changes no count (a zero sets no scale, rounds to zero and is counted among the
    zeros): to `2 * half` values, or for rows of at most `half` values, which are one block
    in every format, to twice the row, with `half` the row's width."""
    stats, work = scratch()
    if width % (2 * half) == 0:
        aligned_chunks(values, 0, values.size, half, (stats, work), mx, spans, tensor_scale, out)
        return
    half = min(half, width)
    padded, n, block = np.empty(CHUNK, np.float32), 0, 2 * half
    for r in range(rows):
        for j in range(0, width, block):
            if n + block > CHUNK:
                _chunk(padded, 0, n, half, stats, work, mx, spans, tensor_scale, out)
                n = 0
            size = min(block, width - j)
            padded[n : n + size] = values[r * width + j : r * width + j + size]
            padded[n + size : n + block] = 0
            n += block
    if n:
        _chunk(padded, 0, n, half, stats, work, mx, spans, tensor_scale, out)


@numba.njit(nogil=True, cache=True)
def aligned_chunks(values, begin, end, half, scratch, mx, spans, tensor_scale, out):
    """Adds the counts of `values[begin:end]` to `out`, a chunk at a time (`_chunk`): `begin`
    starts an MX block, and every block of 32 lies whole inside (rows whose width is a
    multiple of 32). `kernels` calls it on each stretch of values its own pass has in cache."""
    stats, work = scratch
    for start in range(begin, end, CHUNK):
        n = min(CHUNK, end - start)
        _chunk(values, start, n, half, stats, work, mx, spans, tensor_scale, out)


@numba.njit(nogil=True, cache=True)
def scratch():
    """The per-chunk arrays `_chunk` fills: `(stats, work)`."""
    stats = (
        np.empty(CHUNK, np.int32),  # per block of `half`: its largest magnitude's bits
        np.empty(CHUNK, np.int32),  # its smallest non-zero magnitude's
        np.empty(CHUNK, np.float32),  # per MX block: 2**-K
        np.empty(CHUNK, np.int32),  # its spread in binades
        np.empty(CHUNK, np.float32),  # per block of `half`: NVFP4's s
        np.empty(CHUNK),  # NVFP4's s / S
    )
    work = (
        np.empty(CHUNK, np.float32),  # per value: 2**-K of its MX block
        np.empty(CHUNK, np.float32),  # NVFP4's s
        np.empty(CHUNK),  # NVFP4's s / S
        np.empty((2, CHUNK), np.float32),  # the chunk with blocks left out zeroed: MX, NVFP4
        np.empty(CHUNK, np.float32),  # per value: its error (MX) or element (NVFP4)
    )
    return stats, work


def block_records(values):
    """`{format: blocks.block_record(values, format)}` for every format of `blocks.FORMATS`.

    Args:
      values: an array of any shape, read as float32 (as the definition does).

    Returns:
      A dict per format, in `blocks.FORMATS` order, of `blocks.COUNTS`: ints,
      and floats for the two squared sums.
    """
    values = np.ascontiguousarray(blocks.as_float32(values))
    width = 1 if values.ndim == 0 else values.shape[-1]
    rows = values.size // width if width else 0
    flat = values.reshape(-1)
    out = new_sums()
    # float32 in the kernel
    scale = np.float32(nvfp4_tensor_scale(flat.view(np.int32), rows, width))
    _records(flat, rows, width, HALF, MX_CONSTANTS, MX_SPANS, scale, out)
    return as_records(out, rows, width)


def new_sums():
    """`(counts, sums)` of zeros, as `_chunk` adds to them."""
    return np.zeros((len(MX) + 1, len(_COUNTED)), np.int64), np.zeros((len(MX) + 1, 2))


def as_records(out, rows, width):
    """`{format: blocks.block_record(...)}` from the `(counts, sums)` over a tensor of `rows`
    rows of `width` values."""
    counts, sums = out
    records = {}
    for i, name in enumerate(MX + NVFP4):
        records[name] = dict(zip(_COUNTED, map(int, counts[i])))
        records[name]["blocks"] = rows * -(-width // blocks.FORMATS[name].block_size)
        records[name]["squared_error"], records[name]["squared_sum"] = map(float, sums[i])
    return {name: {k: records[name][k] for k in blocks.COUNTS} for name in blocks.FORMATS}


def block_record(values, name):
    """`blocks.block_record(values, name)`, from `block_records`.

    Raises:
      ValueError: for a format name not in `blocks.FORMATS`.
    """
    if name not in blocks.FORMATS:
        raise ValueError(
            f"Unknown block format {name!r}; expected one of {sorted(blocks.FORMATS)}."
        )
    return block_records(values)[name]
