"""The block record on the host: `format.blocks.block_record` of every format at once.

numba reads the tensor once for NVFP4's tensor amax, then a chunk at a time (`CHUNK` values of
whole blocks, which stay in the L1 cache): per block of 16 (NVFP4's; an MX block is two) the
bits of its largest and smallest non-zero magnitudes, in integer operations (a float32
magnitude's bits order as its value; bits at or above +Inf's mean NaN or Inf), from them every
block's scales, spread over its values; then each format in one loop over the chunk that LLVM
vectorizes: no branch and no sum per block.

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

from tb_gradviz.format import blocks

CHUNK = 1024  # values per chunk, a multiple of 32: its arrays stay in the L1 cache
_MX = tuple(name for name, spec in blocks.FORMATS.items() if spec.scaling == "mx")
_NVFP4 = tuple(name for name, spec in blocks.FORMATS.items() if spec.scaling == "nvfp4")
assert {blocks.FORMATS[name].block_size for name in _MX} == {32}, "MX blocks of 32"
assert [blocks.FORMATS[name].block_size for name in _NVFP4] == [16], "one NVFP4, blocks of 16"
_MX_ELEMENTS = [blocks.ELEMENTS[blocks.FORMATS[name].element] for name in _MX]
_FP4 = blocks.ELEMENTS[blocks.FORMATS[_NVFP4[0]].element]
_FP4_SPAN = _FP4.span
_E4M3 = blocks.ELEMENTS["fp8_e4m3"]
_E8M0_LOW, _E8M0_HIGH = blocks.E8M0_EXPONENTS
# The blocks rounded in chunks: no element's scale clamped, 2**K and 2**-K normal float32s.
_K_LOW = _E8M0_LOW + max(e.max_exponent for e in _MX_ELEMENTS)
_K_HIGH = 125
# Per MX element, in units of 2**K: `B = max(2**floor(log2(u)) * unit, floor)`, the largest
# value, the smallest normal; then the element's own fields, as `_mx_block` reads them.
_MX_CONSTANTS = np.array(
    [
        (2.0 ** (23 - e.mantissa), 2.0 ** (e.min_exponent - e.max_exponent + 23 - e.mantissa))
        + (e.largest / 2.0**e.max_exponent, 2.0 ** (e.min_exponent - e.max_exponent), *e)
        for e in _MX_ELEMENTS
    ]
)
_MX_SPANS = np.array([e.span for e in _MX_ELEMENTS], np.int64)
_ABS = np.int32(0x7FFFFFFF)  # float32 magnitude bits; also "no non-zero value"
_INF = np.int32(0x7F800000)  # +Inf's bits: a magnitude at or above holds NaN or Inf
_EXPONENT32 = np.int32(0x7F800000)
_EXPONENT64 = np.int64(0x7FF0000000000000)
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
def _two_to(exponent):
    """`2.0**exponent` (float64) for an integer exponent of float64's normal range."""
    return np.int64((exponent + 1023) << 52).view(np.float64)


@numba.njit(nogil=True, cache=True)
def _float32_of(bits):
    return np.int32(bits).view(np.float32)


@numba.njit(nogil=True, cache=True)
def _binade(bits):
    """`floor(log2(m))` of a positive float32 magnitude given by its bits (subnormals too)."""
    m = np.float64(_float32_of(bits))
    return ((np.float64(m).view(np.int64) >> 52) & 0x7FF) - 1023


@numba.njit(nogil=True, cache=True)
def _round64(x, unit, floor):
    """`x >= 0` (float64) rounded to a multiple of its quantum, ties to even, as above."""
    big = max(np.int64(np.float64(x).view(np.int64) & _EXPONENT64).view(np.float64) * unit, floor)
    return (x + big) - big


@numba.njit(nogil=True, cache=True)
def _e4m3(x):
    """`blocks.quantize(x, E4M3)` of one float64 `x >= 0`: NVFP4's block scale."""
    floor = _two_to(_E4M3.min_exponent + 52 - _E4M3.mantissa)
    return min(_round64(x, _two_to(52 - _E4M3.mantissa), floor), _E4M3.largest)


@numba.njit(nogil=True, cache=True)
def _tensor_scale(bits, rows, width):
    """NVFP4's float32 tensor scale `448 * 6 / amax`, clamped to float32's largest value, as
    `blocks` computes it; `amax` is the largest magnitude of the blocks of 16 with no NaN or
    Inf (1 where it is 0)."""
    top = np.int32(0)
    for i in range(bits.size):
        top = max(top, bits[np.uint64(i)] & _ABS)
    if top >= _INF:
        top = np.int32(0)
        for r in range(rows):
            for start in range(r * width, (r + 1) * width, 16):
                high = np.int32(0)
                for i in range(start, min(start + 16, (r + 1) * width)):
                    high = max(high, bits[np.uint64(i)] & _ABS)
                top = max(top, high if high < _INF else np.int32(0))
    if top == 0:
        return np.float32(1.0)
    scale = np.float32(_E4M3.largest * _FP4.largest) / _float32_of(top)
    return min(scale, np.float32(np.finfo(np.float32).max))


@numba.njit(nogil=True, cache=True)
def _half_stats(bits, start, halves, half, amax, amin):
    """Per block of `half` (16) values of `bits[start:start + half * halves]`: the bits of its
    largest magnitude and of its smallest non-zero one (`_ABS` for none)."""
    for h in range(halves):
        high, low = np.int32(0), _ABS
        for i in range(start + half * h, start + half * h + half):
            b = bits[np.uint64(i)] & _ABS
            high = max(high, b)
            low = min(low, b if b != 0 else _ABS)
        amax[h], amin[h] = high, low


@numba.njit(nogil=True, cache=True)
def _nvfp4_scales(amax, amin, halves, tensor_scale, scale, decode):
    """Each block of 16's E4M3 scale `s` in float32 (+Inf where `s` is 0 or the block holds NaN
    or Inf: its values then round to 0) and `s / S` in float64 (0 there); returns NVFP4's
    `(wide_blocks, nonfinite_blocks)` among them."""
    nonfinite = wide = 0
    for h in range(halves):
        finite = amax[h] < _INF
        wanted = (_float32_of(amax[h]) / np.float32(_FP4.largest)) * tensor_scale
        s = _e4m3(np.float64(wanted))
        scale[h] = np.float32(s) if finite and s > 0 else np.float32(np.inf)
        decode[h] = s / np.float64(tensor_scale) if finite else 0.0
        nonfinite += not finite
        wide += finite and amax[h] > 0 and _binade(amax[h]) - _binade(amin[h]) > _FP4_SPAN
    return wide, nonfinite


@numba.njit(nogil=True, cache=True)
def _mx_scales(amax, amin, count, inverse, spread):
    """Each MX block's `2**-K` in float32, 0 for a block left out of the chunk (NaN or Inf, or
    rounded by `_mx_block`), and its spread in binades (-1 for none: no non-zero value or NaN
    or Inf). Returns the smallest non-zero magnitude over `2**K` of the blocks taken, the
    blocks holding NaN or Inf and the blocks left out."""
    low, nonfinite, left = np.inf, 0, 0
    for b in range(count):
        top, bottom = max(amax[2 * b], amax[2 * b + 1]), min(amin[2 * b], amin[2 * b + 1])
        finite = top < _INF
        k = _binade(top) if 0 < top < _INF else 0
        taken = finite and _K_LOW <= k <= _K_HIGH
        inverse[b] = np.float32(_two_to(-k)) if taken else _F0
        if taken and bottom < _ABS:
            low = min(low, np.float64(_float32_of(bottom)) * _two_to(-k))
        nonfinite += not finite
        left += not taken
        spread[b] = k - _binade(bottom) if finite and top > 0 else -1
    return low, nonfinite, left


@numba.njit(nogil=True, cache=True)
def _above(spread, count, span):
    """How many of the first `count` spreads exceed `span`: the wide blocks."""
    wide = 0
    for b in range(count):
        wide += spread[b] > span
    return wide


@numba.njit(nogil=True, cache=True)
def _mx_chunk(src, off, n, inverse, element, below_normal):
    """One MX element (its row of `_MX_CONSTANTS`) over `src[off:off + n]`, `inverse` holding
    each value's `2**-K`: `(zero, below, saturated, squared_error)`, zero and below counting the
    values that round to 0 and below the smallest normal (zeros included), or both 0 where
    `below_normal` is False: every non-zero value is then a normal element."""
    zero = below = saturated = _F0
    error = 0.0
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
        error = _plus_square(error, np.float64(q * scale - m))
    return zero, below, saturated, error


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _fp4_chunk(src, off, n, tensor_scale, block_scale, decode):
    """NVFP4 over `src[off:off + n]`, `block_scale` and `decode` holding each value's `s` and
    `s / S` (`_nvfp4_scales`): as `_mx_chunk`, each element `(v * S) / s` in float32, then the
    values' sum of squares and zeros, as `_squares`."""
    zero = below = saturated = zeros = _F0
    error = squares = 0.0
    unit, largest = np.float32(2.0 ** (23 - _FP4.mantissa)), np.float32(_FP4.largest)
    smallest_normal = np.float32(2.0**_FP4.min_exponent)
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
        m = abs(np.float64(v))
        error = _plus_square(error, np.float64(q) * decode[np.uint64(i)] - m)
        squares = _plus_square(squares, m)
        zeros = _plus(zeros, _F1 if v == 0 else _F0)
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
def _mx_block(values, start, n, binade, mx, counts, sums):
    """Adds one finite MX block's counts for every element, value by value in float64, its
    scale clamped to E8M0's range: for the blocks `_mx_chunk` does not take."""
    squares = _squares(values, start, n)[0]
    for f in range(mx.shape[0]):
        mantissa, min_exponent = int(mx[f, 4]), int(mx[f, 5])
        k = min(max(binade - int(mx[f, 7]), _E8M0_LOW), _E8M0_HIGH)
        unit, floor = _two_to(52 - mantissa), _two_to(k + min_exponent + 52 - mantissa)
        top, smallest_normal = mx[f, 6] * _two_to(k), _two_to(k + min_exponent)
        for i in range(start, start + n):
            m = abs(np.float64(values[np.uint64(i)]))
            q = min(_round64(m, unit, floor), top)
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
    inverse, scale, decode, copy = work
    formats, count = mx.shape[0], n // (2 * half)
    _half_stats(src.view(np.int32), start, 2 * count, half, amax, amin)
    wide, nonfinite = _nvfp4_scales(amax, amin, 2 * count, tensor_scale, scale_h, decode_h)
    counts[formats, 3] += wide
    counts[formats, 4] += nonfinite
    low, mx_nonfinite, left = _mx_scales(amax, amin, count, inverse_b, spread)
    for f in range(formats):
        counts[f, 3] += _above(spread, count, spans[f])
    counts[:formats, 4] += mx_nonfinite
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
            if amax[h] >= _INF:
                nv_src[half * h : half * (h + 1)] = 0
    zero, below, saturated, error, squares, zeros = _fp4_chunk(
        nv_src, nv_at, n, tensor_scale, scale, decode
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
                if top < _INF:
                    _mx_block(src, start + 2 * half * b, 2 * half, _binade(top), mx, counts, sums)
    if left or nonfinite:
        squares, zeros = _squares(mx_src, mx_at, n)
    for f in range(formats):
        below_normal = low < mx[f, 3]
        zero, below, saturated, error = _mx_chunk(mx_src, mx_at, n, inverse, mx[f], below_normal)
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
    stats = (
        np.empty(CHUNK, np.int32),  # per block of `half`: its largest magnitude's bits
        np.empty(CHUNK, np.int32),  # its smallest non-zero magnitude's
        np.empty(CHUNK, np.float32),  # per MX block: 2**-K
        np.empty(CHUNK, np.int64),  # its spread in binades
        np.empty(CHUNK, np.float32),  # per block of `half`: NVFP4's s
        np.empty(CHUNK),  # NVFP4's s / S
    )
    work = (
        np.empty(CHUNK, np.float32),  # per value: 2**-K of its MX block
        np.empty(CHUNK, np.float32),  # NVFP4's s
        np.empty(CHUNK),  # NVFP4's s / S
        np.empty((2, CHUNK), np.float32),  # the chunk with blocks left out zeroed: MX, NVFP4
    )
    if width % (2 * half) == 0:
        for start in range(0, values.size, CHUNK):
            n = min(CHUNK, values.size - start)
            _chunk(values, start, n, half, stats, work, mx, spans, tensor_scale, out)
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
    counts, sums = np.zeros((len(_MX) + 1, len(_COUNTED)), np.int64), np.zeros((len(_MX) + 1, 2))
    scale = np.float32(_tensor_scale(flat.view(np.int32), rows, width))  # float32 in the kernel
    _records(flat, rows, width, 16, _MX_CONSTANTS, _MX_SPANS, scale, (counts, sums))
    records = {}
    for i, name in enumerate(_MX + _NVFP4):
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
