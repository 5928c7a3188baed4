"""The precision record on the host: counts of magnitudes below each boundary, exactly.

`summaries.precision_vector` defines the record; it needs, per boundary of
`precision.boundary_table`, the number of finite values whose magnitude is
below it. The float32 kernel gets them from one more histogram filled in
its second pass: per float32 exponent field, the values split by the
significand at `BIN_EDGES`, the significands of every boundary of every
format (as they are or scaled by a power of two, which keeps the
significand). A boundary whose float32 key sits on an edge, or in an empty bin, is counted
from the histogram's running sum; any other (a scaled boundary below
float32's normal range) by an exact pass over the values (`_count_below`).
Values of any other dtype, or with a divisor, or holding NaN or Inf, are
compared with the boundaries directly (`precision_direct`).
"""

import math

import numba
import numpy as np

from tb_gradviz.format import precision, summaries


def _float32_keys(bounds, inclusive):
    """Per boundary, the smallest float32 bit pattern `u` with `bits(|x|) < u` iff `|x|` is
    below it."""
    keys = np.empty(len(bounds), np.int64)
    with np.errstate(over="ignore"):
        for i, (b, side) in enumerate(zip(bounds, inclusive)):
            f = np.float32(b)
            if float(f) < b or (side and float(f) == b):
                f = np.nextafter(f, np.float32(np.inf))
            keys[i] = int(np.abs(f).view(np.int32))
    return keys


def _bin_edges():
    """The lower significand edge of each bin of an exponent field: 0, 1, then the cuts.

    The cuts are the significands of every boundary's float32 key but 1
    (which the edge at 1 gives) rounded down to `SIGNIFICAND_TABLE` steps: a
    key on no edge (e4m3fn's overflow, `|x| > 464`) is counted exactly when
    its bin holds values (`_float32_precision`).
    """
    bounds = [b for name in precision.FORMATS for b, _ in precision.BOUNDARIES[name].values()]
    inclusive = [s for name in precision.FORMATS for _, s in precision.BOUNDARIES[name].values()]
    keys = _float32_keys(np.array(bounds), np.array(inclusive))
    # Normal-range keys only; the bfloat16 ones below float32's normal range are not cuts.
    cuts = sorted({(int(k) & 0x7FFFFF) >> 11 << 11 for k in keys if k >= 1 << 23} - {0})
    assert len(cuts) == FINE_BINS - 2, cuts
    return np.array([0, 1, *cuts], np.int64)


FINE_BINS = 8  # per exponent field: significand 0, then up to each cut, then the rest
FINE_LENGTH = 256 * FINE_BINS
BIN_EDGES = _bin_edges()
# Per top 12 significand bits, the cuts at or below them: a value's bin in its field is
# `(significand != 0) + SIGNIFICAND_TABLE[significand >> 11]`, one load instead of compares.
SIGNIFICAND_TABLE = np.searchsorted(BIN_EDGES[2:], np.arange(4096) << 11, side="right").astype(
    np.int64
)
# The boundaries as flat arrays (format, then `BOUNDARY_NAMES`), and each format's largest value.
_BASE = np.array(
    [precision.BOUNDARIES[f][b][0] for f in precision.FORMATS for b in precision.BOUNDARY_NAMES]
)
_INCLUSIVE = np.array(
    [precision.BOUNDARIES[f][b][1] for f in precision.FORMATS for b in precision.BOUNDARY_NAMES]
)
_TOPS = np.array([precision.largest(f) for f in precision.FORMATS])
_assemble = numba.njit(nogil=True, cache=True)(summaries.precision_from_below)


@numba.njit(nogil=True, cache=True)
def _scale_exponent(amax, top):
    """`precision.scale_exponent`, compiled."""
    if not (amax - amax == 0.0 and amax > 0.0):
        return 0
    mantissa_a, exponent_a = math.frexp(amax)
    mantissa_f, exponent_f = math.frexp(top)
    return exponent_f - exponent_a - (1 if mantissa_a > mantissa_f else 0)


@numba.njit(nogil=True, cache=True)
def _table(amax, base, inclusive, tops):
    """`precision.boundary_table(amax)` and the scale exponents, compiled."""
    formats = tops.size
    bounds = np.empty(2 * base.size)
    sides = np.empty(2 * base.size, np.bool_)
    exponents = np.empty(formats, np.int64)
    for f in range(formats):
        exponents[f] = _scale_exponent(amax, tops[f])
        for j in range(3):
            i = 3 * f + j
            bounds[i] = base[i]
            bounds[base.size + i] = math.ldexp(base[i], -exponents[f])
            sides[i] = sides[base.size + i] = inclusive[i]
    return bounds, sides, exponents


@numba.njit(nogil=True, cache=True)
def _float32_key(b, inclusive):
    """The smallest float32 bit pattern `u` with `bits(|x|) < u` iff `|x|` is below `b`."""
    f = np.empty(1, np.float32)
    f[0] = b  # rounds to nearest; +inf above float32's range
    key = np.int64(f.view(np.int32)[0])
    if np.float64(f[0]) < b or (inclusive and np.float64(f[0]) == b):
        key += 1
    return key


@numba.njit(nogil=True, cache=True)
def _count_below(bits, key):
    count = 0
    for i in range(bits.size):
        count += (bits[i] & 0x7FFFFFFF) < key
    return count


@numba.njit(nogil=True, cache=True)
def _float32_precision(fine, bits, n, zeros, amax, base, inclusive, tops, edges):
    bounds, sides, exponents = _table(amax, base, inclusive, tops)
    running = np.zeros(fine.size + 1, np.int64)
    for i in range(fine.size):
        running[i + 1] = running[i] + fine[i]
    below = np.empty(bounds.size, np.int64)
    above_all = _float32_key(amax, True)
    for i in range(bounds.size):
        key = _float32_key(bounds[i], sides[i])
        if key >= above_all:  # above the largest magnitude: every value
            below[i] = n
            continue
        significand = key & 0x7FFFFF
        sub = 0
        while sub + 1 < edges.size and edges[sub + 1] <= significand:
            sub += 1
        index = (key >> 23) * FINE_BINS + sub
        if significand == edges[sub] or fine[index] == 0:
            below[i] = running[index]
        else:
            below[i] = _count_below(bits, key)
    return _assemble(n, zeros, below, exponents)


def float32_precision(fine, bits, n, zeros, amax):
    """The precision record of `n` finite float32 values from their fine histogram.

    Args:
      fine: the `FINE_LENGTH` counts the float32 kernel filled.
      bits: the values' bits (int32), for the rare boundary the histogram cannot place.
      n, zeros: values and exact zeros; amax: the largest magnitude.
    """
    return _float32_precision(
        fine, bits, n, zeros, float(amax), _BASE, _INCLUSIVE, _TOPS, BIN_EDGES
    )


@numba.njit(nogil=True, cache=True)
def _direct(values, base, inclusive, tops):
    amax = 0.0
    for i in range(values.size):
        a = abs(np.float64(values[i]))
        if a - a == 0.0 and a > amax:
            amax = a
    bounds, sides, exponents = _table(amax, base, inclusive, tops)
    below = np.zeros(bounds.size, np.int64)
    finite = zeros = 0
    for i in range(values.size):
        a = abs(np.float64(values[i]))
        if a - a != 0.0:
            continue
        finite += 1
        zeros += a == 0.0
        for j in range(bounds.size):
            below[j] += (a <= bounds[j]) if sides[j] else (a < bounds[j])
    return _assemble(finite, zeros, below, exponents)


def precision_direct(values):
    """The precision record of `values` (a flat float32 or float64 array), any values."""
    return _direct(values, _BASE, _INCLUSIVE, _TOPS)
