"""The precision record on the host: counts of magnitudes below each boundary, exactly.

`summaries.precision_vector` defines the record; it needs, per boundary of
`precision.boundary_table`, the number of finite values whose magnitude is
below it. For float32 values that is the number of magnitude bit patterns
below a key (`float32_keys`), which the float32 kernel counts in the
histogram it already fills (kernels.py: the keys are edges of its refined
magnitude bins) or, for a key it could not place, by an exact pass
(`count_below`). Float32 values with a divisor (which the record ignores), or
holding NaN or Inf, take the same refined bins in a pass of their own
(`float32_record`); float64 values are compared with the boundaries
directly (`precision_direct`).
"""

import math

import numba
import numpy as np

from tb_gradviz.capture import refined_bins
from tb_gradviz.format import precision, summaries

# The boundaries as flat arrays (format, then `BOUNDARY_NAMES`), and each format's largest value.
_BASE = np.array(
    [precision.BOUNDARIES[f][b][0] for f in precision.FORMATS for b in precision.BOUNDARY_NAMES]
)
_INCLUSIVE = np.array(
    [precision.BOUNDARIES[f][b][1] for f in precision.FORMATS for b in precision.BOUNDARY_NAMES]
)
_TOPS = np.array([precision.largest(f) for f in precision.FORMATS])
# The record from the counts below each boundary: summaries' one assembly, compiled.
from_below = numba.njit(nogil=True, cache=True)(summaries.precision_from_below)


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
def count_below(bits, key):
    """The number of float32 values (`bits`, int32) whose magnitude's bits are below `key`."""
    count = 0
    for i in range(bits.size):
        count += (bits[i] & 0x7FFFFFFF) < key
    return count


@numba.njit(nogil=True, cache=True)
def float32_keys(amax):
    """Per boundary of `precision.boundary_table(amax)`, its float32 key (`_float32_key`), and
    each format's scale exponent."""
    bounds, sides, exponents = _table(amax, _BASE, _INCLUSIVE, _TOPS)
    keys = np.empty(bounds.size, np.int64)
    for i in range(bounds.size):
        keys[i] = _float32_key(bounds[i], sides[i])
    return keys, exponents


_NO_KEYS = np.zeros(0, np.int64)


@numba.njit(nogil=True, cache=True)
def _float32_record(values, cells):
    bits = values.view(np.int32)
    top = finite = zeros = 0  # top: the bits of the largest finite magnitude
    for i in range(bits.size):
        a = bits[i] & 0x7FFFFFFF
        is_finite = a < 0x7F800000
        top = max(top, a if is_finite else 0)
        finite += is_finite
        zeros += a == 0
    keys, exponents = float32_keys(np.float64(np.int32(top).view(np.float32)))
    above_all = top + 1
    edges, placed = refined_bins.refined_edges(keys, above_all, _NO_KEYS)
    # NaN and Inf lie above every edge: their cells are filled when there are any.
    last = top >> refined_bins.CELL_SHIFT if finite == bits.size else refined_bins.CELLS - 1
    refined_bins.fill_cells(edges, last, cells)
    counts = np.zeros((2, edges.size + 1), np.int64)
    for i in range(bits.size):
        a = bits[i] & 0x7FFFFFFF
        entry = cells[a >> refined_bins.CELL_SHIFT]
        counts[i & 1, (entry >> 32) + (a >= (entry & 0xFFFFFFFF))] += 1
    refined = counts[0] + counts[1]
    below = np.empty(keys.size, np.int64)
    for i in range(keys.size):
        if keys[i] >= above_all:
            below[i] = finite
        elif keys[i] <= 1:
            below[i] = zeros
        elif placed[i]:
            below[i] = refined[: np.searchsorted(edges, keys[i]) + 1].sum()
        else:
            below[i] = count_below(bits, keys[i])
    return from_below(finite, zeros, below, exponents)


def float32_record(values, cells):
    """The precision record of `values` (a flat float32 array, any values) by its refined bins.

    Args:
      values: the values as captured.
      cells: scratch of `refined_bins.CELLS` int64 values.
    """
    return _float32_record(values, cells)


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
    return from_below(finite, zeros, below, exponents)


def precision_direct(values):
    """The precision record of `values` (a flat float32 or float64 array), any values."""
    return _direct(values, _BASE, _INCLUSIVE, _TOPS)
