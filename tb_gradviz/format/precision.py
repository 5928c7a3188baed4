"""The narrow float formats of the precision record, and where a cast to each one rounds.

A cast with IEEE round-to-nearest-even turns a finite value into zero, a
subnormal, a normal number or an overflow (Inf, or NaN in a format without
Inf) depending on its magnitude alone, so counting what a cast does to a
tensor is comparing `|x|` with three boundaries per format (`BOUNDARIES`):

* `zero`: `|x| <= min_subnormal / 2` rounds to zero (at exactly half the
  smallest subnormal the tie goes to the even neighbour, zero);
* `normal`: `|x| >= min_normal - min_subnormal / 2` rounds to a normal
  number (the tie goes to `min_normal`, whose significand is even); between
  the two, a non-zero value becomes subnormal;
* `overflow`: `|x| >= max + ulp(max) / 2` overflows when `max`'s significand
  is odd (all ones: float16, bfloat16, float8 e5m2, where the tie rounds up
  to Inf), `|x| > max + ulp(max) / 2` when it is even (float8 e4m3fn: 464
  rounds to 448, anything above to NaN).

Each boundary is a float64 number (exact: a few significand bits) and a
side: `count_below` is the number of values `|x| < b` or `|x| <= b`, and
every count of the record is a difference of such counts. The scaled
setting multiplies a tensor by `2**k`, the largest power of two that keeps
its largest finite magnitude (amax) at or below the format's `max`, as
power-of-two float8 scaling does: the product is exact, and
`|x| * 2**k < b` is `|x| < b * 2**-k`. tests/test_precision_record.py
checks every boundary and its neighbours against ml_dtypes' casts.

Imports only numpy.
"""

import numpy as np

# name: (explicit significand bits, exponent of the smallest normal, largest finite value,
#        whether the largest finite value's significand is odd)
_FORMATS = {
    "float16": (10, -14, 65504.0, True),
    "bfloat16": (7, -126, float(np.ldexp(2.0 - 2.0**-7, 127)), True),
    "float8_e4m3fn": (3, -6, 448.0, False),
    "float8_e5m2": (2, -14, 57344.0, True),
}
FORMATS = tuple(_FORMATS)
SETTINGS = ("as_is", "scaled")  # the values as they are; scaled to the format by 2**k (amax)
COUNTS = ("to_zero", "subnormal", "overflow")


def largest(name):
    """The largest finite value of a format."""
    return _FORMATS[name][2]


def boundaries(name):
    """Returns `{"zero", "normal", "overflow"}`: each `(b, inclusive)` where `|x| < b` (or `<= b`
    when inclusive) counts the values below that boundary. See the module docstring."""
    mantissa, min_exponent, top, odd = _FORMATS[name]
    half_subnormal = float(np.ldexp(1.0, min_exponent - mantissa - 1))
    top_exponent = int(np.frexp(top)[1]) - 1
    half_ulp = float(np.ldexp(1.0, top_exponent - mantissa - 1))
    return {
        "zero": (half_subnormal, True),
        "normal": (float(np.ldexp(1.0, min_exponent)) - half_subnormal, False),
        "overflow": (top + half_ulp, not odd),
    }


BOUNDARIES = {name: boundaries(name) for name in FORMATS}
# The order of the boundaries in the flat lists the kernels take.
BOUNDARY_NAMES = ("zero", "normal", "overflow")


def scale_exponent(amax, name):
    """The largest `k` with `amax * 2**k <= largest(name)`: 0 when `amax` is 0 or not finite."""
    amax = float(amax)
    if not (np.isfinite(amax) and amax > 0):
        return 0
    mantissa_a, exponent_a = np.frexp(amax)
    mantissa_f, exponent_f = np.frexp(largest(name))
    return int(exponent_f - exponent_a - (mantissa_a > mantissa_f))


def boundary_table(amax):
    """`(values, inclusive)`: the float64 boundaries `|x|` is compared with, and their sides.

    The `2 * len(FORMATS) * 3` boundaries in the order setting, format,
    `BOUNDARY_NAMES`; the scaled setting's divided by `2**k` of `amax`.
    """
    values, inclusive = [], []
    for setting in SETTINGS:
        for name in FORMATS:
            k = 0 if setting == "as_is" else scale_exponent(amax, name)
            for boundary in BOUNDARY_NAMES:
                b, side = BOUNDARIES[name][boundary]
                values.append(float(np.ldexp(b, -k)))
                inclusive.append(side)
    return np.array(values, np.float64), np.array(inclusive, bool)
