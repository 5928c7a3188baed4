"""The precision record on the host: counts of magnitudes below each boundary, exactly.

`summaries.precision_vector` defines the record; it needs, per boundary of
`precision.boundary_table`, the number of finite values whose magnitude is
below it. For float32 values that is the number of magnitude bit patterns
below a key (`float32_keys`), which the float32 kernel counts in the
histogram it already fills (kernels.py: the keys are edges of its refined
magnitude bins) or, for a key it could not place, by an exact pass
(`count_below`). Values of any other dtype, or with a divisor, or holding
NaN or Inf, are compared with the boundaries directly (`precision_direct`).
"""

import math

import numba
import numpy as np

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
