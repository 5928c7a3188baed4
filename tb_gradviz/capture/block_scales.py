"""The scales of the block record's blocks on the host, from the bits of their values (numba).

`block_counts` rounds every value of a chunk in its block; this module gives it what the
rounding needs: NVFP4's tensor scale (`nvfp4_tensor_scale`), per block of 16 the bits of its
largest and smallest non-zero magnitudes (`half_stats`, in integer operations: a float32
magnitude's bits order as its value, and bits at or above +Inf's mean NaN or Inf), from them
each block's NVFP4 scales (`nvfp4_scales`) and MX scales (`mx_scales`), and the blocks wider
than a format's span (`count_above`). The scales are exact, as the definition (`format.blocks`)
sets them.
"""

import numba
import numpy as np

from tb_gradviz.format import blocks

MX = tuple(name for name, spec in blocks.FORMATS.items() if spec.scaling == "mx")
NVFP4 = tuple(name for name, spec in blocks.FORMATS.items() if spec.scaling == "nvfp4")
assert {blocks.FORMATS[name].block_size for name in MX} == {32}, "MX blocks of 32"
assert [blocks.FORMATS[name].block_size for name in NVFP4] == [16], "one NVFP4, blocks of 16"
MX_ELEMENTS = [blocks.ELEMENTS[blocks.FORMATS[name].element] for name in MX]
FP4 = blocks.ELEMENTS[blocks.FORMATS[NVFP4[0]].element]
_FP4_SPAN = FP4.span
_E4M3 = blocks.ELEMENTS["fp8_e4m3"]
E8M0_LOW, E8M0_HIGH = blocks.E8M0_EXPONENTS
# The blocks rounded in chunks: no element's scale clamped, 2**K and 2**-K normal float32s.
_K_LOW = E8M0_LOW + max(e.max_exponent for e in MX_ELEMENTS)
_K_HIGH = 125
ABS = np.int32(0x7FFFFFFF)  # float32 magnitude bits; also "no non-zero value"
INF = np.int32(0x7F800000)  # +Inf's bits: a magnitude at or above holds NaN or Inf
_EXPONENT64 = np.int64(0x7FF0000000000000)
_F0 = np.float32(0.0)


@numba.njit(nogil=True, cache=True)
def two_to(exponent):
    """`2.0**exponent` (float64) for an integer exponent of float64's normal range."""
    return np.int64((exponent + 1023) << 52).view(np.float64)


@numba.njit(nogil=True, cache=True)
def float32_of(bits):
    return np.int32(bits).view(np.float32)


@numba.njit(nogil=True, cache=True)
def binade(bits):
    """`floor(log2(m))` of a positive float32 magnitude given by its bits (subnormals too)."""
    m = np.float64(float32_of(bits))
    return ((np.float64(m).view(np.int64) >> 52) & 0x7FF) - 1023


@numba.njit(nogil=True, cache=True)
def round64(x, unit, floor):
    """`x >= 0` (float64) rounded to a multiple of its quantum, ties to even, as `block_counts`
    rounds (`(x + B) - B`)."""
    big = max(np.int64(np.float64(x).view(np.int64) & _EXPONENT64).view(np.float64) * unit, floor)
    return (x + big) - big


@numba.njit(nogil=True, cache=True)
def e4m3(x):
    """`blocks.quantize(x, E4M3)` of one float64 `x >= 0`: NVFP4's block scale."""
    floor = two_to(_E4M3.min_exponent + 52 - _E4M3.mantissa)
    return min(round64(x, two_to(52 - _E4M3.mantissa), floor), _E4M3.largest)


@numba.njit(nogil=True, cache=True)
def nvfp4_tensor_scale(bits, rows, width):
    """NVFP4's float32 tensor scale `448 * 6 / amax`, clamped to float32's largest value, as
    `blocks` computes it; `amax` is the largest magnitude of the blocks of 16 with no NaN or
    Inf (1 where it is 0)."""
    top = np.int32(0)
    for i in range(bits.size):
        top = max(top, bits[np.uint64(i)] & ABS)
    if top >= INF:
        top = np.int32(0)
        for r in range(rows):
            for start in range(r * width, (r + 1) * width, 16):
                high = np.int32(0)
                for i in range(start, min(start + 16, (r + 1) * width)):
                    high = max(high, bits[np.uint64(i)] & ABS)
                top = max(top, high if high < INF else np.int32(0))
    return tensor_scale_of(top)


@numba.njit(nogil=True, cache=True)
def tensor_scale_of(top):
    """NVFP4's float32 tensor scale from the bits of the tensor's largest finite magnitude."""
    if top == 0:
        return np.float32(1.0)
    scale = np.float32(_E4M3.largest * FP4.largest) / float32_of(top)
    return min(scale, np.float32(np.finfo(np.float32).max))


@numba.njit(nogil=True, cache=True)
def half_stats(bits, start, halves, half, amax, amin):
    """Per block of `half` (16) values of `bits[start:start + half * halves]`: the bits of its
    largest magnitude and of its smallest non-zero one (`ABS` for none)."""
    for h in range(halves):
        high, low = np.int32(0), ABS
        for i in range(start + half * h, start + half * h + half):
            b = bits[np.uint64(i)] & ABS
            high = max(high, b)
            low = min(low, b if b != 0 else ABS)
        amax[h], amin[h] = high, low


@numba.njit(nogil=True, cache=True)
def nvfp4_scales(amax, amin, halves, tensor_scale, scale, decode):
    """Each block of 16's E4M3 scale `s` in float32 (+Inf where `s` is 0 or the block holds NaN
    or Inf: its values then round to 0) and `s / S` in float64 (0 there); returns NVFP4's
    `(wide_blocks, nonfinite_blocks)` among them."""
    nonfinite = wide = 0
    for h in range(halves):
        finite = amax[h] < INF
        wanted = (float32_of(amax[h]) / np.float32(FP4.largest)) * tensor_scale
        s = e4m3(np.float64(wanted))
        scale[h] = np.float32(s) if finite and s > 0 else np.float32(np.inf)
        decode[h] = s / np.float64(tensor_scale) if finite else 0.0
        nonfinite += not finite
        wide += finite and amax[h] > 0 and binade(amax[h]) - binade(amin[h]) > _FP4_SPAN
    return wide, nonfinite


@numba.njit(nogil=True, cache=True)
def mx_scales(amax, amin, count, inverse, spread):
    """Each MX block's `2**-K` in float32, 0 for a block left out of the chunk (NaN or Inf, or
    rounded by `_mx_block`), and its spread in binades (-1 for none: no non-zero value or NaN
    or Inf). Returns the smallest non-zero magnitude over `2**K` of the blocks taken, the
    blocks holding NaN or Inf and the blocks left out.

    Without a branch (selects only), so that LLVM vectorizes the loop over the blocks."""
    low, nonfinite, left = np.inf, 0, 0
    for b in range(count):
        top, bottom = max(amax[2 * b], amax[2 * b + 1]), min(amin[2 * b], amin[2 * b + 1])
        finite = top < INF
        some = finite & (top > 0)
        k = binade(top) if some else 0
        taken = finite & (k >= _K_LOW) & (k <= _K_HIGH)
        # 2**-k as float32 bits: a normal float32 wherever the block is taken.
        inverse[b] = np.int32((127 - k) << 23).view(np.float32) if taken else _F0
        smallest = np.float64(float32_of(bottom)) * two_to(-k if taken else 0)
        low = min(low, smallest if taken & (bottom < ABS) else np.inf)
        nonfinite += not finite
        left += not taken
        spread[b] = k - binade(bottom) if some else -1
    return low, nonfinite, left


@numba.njit(nogil=True, cache=True)
def count_above(spread, count, span):
    """How many of the first `count` spreads exceed `span`: the wide blocks."""
    wide = np.int32(0)
    for b in range(count):
        wide += np.int32(spread[b] > span)
    return wide
