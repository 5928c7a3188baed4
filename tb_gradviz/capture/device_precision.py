"""The precision record on the device: counts by comparing each value's bits with integer keys.

`summaries.precision_vector` defines the record: per boundary of
`precision.boundary_table`, the number of finite values whose magnitude is
below it. On the device every such count is a comparison of each value's
magnitude bits (`|x|` as a float32 bit pattern, or float64 for float64
tensors) with a key: the smallest bit pattern that is not below the
boundary. Bit patterns of non-negative floats order as their values, so
`bits < key` is exactly `|x| < b` (or `<= b`) for every value, subnormals
included: unlike a float comparison, an integer one is not flushed to zero
by a device that runs with flush-to-zero (XLA on the CPU). NaN and Inf
have patterns above every key, so only finite values are counted.

- The first pass compares with `as_is_keys`: each format's boundaries as
  they are, after a key of 1 that counts the exact zeros.
- Between the passes, `scale_exponents` gives each row's `k` per format
  from its largest finite magnitude (from the bits too), and `scaled_keys`
  the keys of the boundaries times `2**-k`, per row.
- The second pass compares with them.

Every key is computed from the float64 bits of its boundary with integer
operations (`_keys`): scaling by `2**-k` subtracts `k` from the exponent
field, exactly, as long as the product is a normal float64, which holds for
every tensor of float32 or narrower (and float64 ones whose largest
finite magnitude is at least about `2**-760`).

The statistics read the same bits (`float_bits`): zero and sign, and
`widened`, each value as float64 exactly, float32 subnormals included.

Imports keras and numpy only.
"""

import keras
import numpy as np

from tb_gradviz.format import precision

ops = keras.ops

# Flat, in `precision.boundary_table`'s order for one setting (format, then
# `BOUNDARY_NAMES`): each boundary's float64 bits and side, each format's largest value's bits.
_BOUNDS = np.array(
    [precision.BOUNDARIES[f][b][0] for f in precision.FORMATS for b in precision.BOUNDARY_NAMES]
)
_BOUND_BITS = _BOUNDS.view(np.int64)
_INCLUSIVE = np.array(
    [precision.BOUNDARIES[f][b][1] for f in precision.FORMATS for b in precision.BOUNDARY_NAMES]
)
_TOP_BITS = np.array([precision.largest(f) for f in precision.FORMATS]).view(np.int64)
_FRACTION = (1 << 52) - 1  # float64's significand field
# The bit pattern of +Inf, per width of the compared bits: finite magnitudes are below it.
INF_BITS = {32: 0x7F800000, 64: 0x7FF0000000000000}
_BITS_DTYPE = {32: "int32", 64: "int64"}


def width(dtype):
    """The width of the bit patterns a tensor of `dtype` is compared in: 64 for float64, else 32."""
    return 64 if keras.backend.standardize_dtype(dtype) == "float64" else 32


def float_bits(values, bits_width):
    """The bit patterns of `values`, sign included: as float32 (float16 and bfloat16 widen
    exactly), or float64.

    Args:
      values: floating-point values, in their own dtype.
      bits_width: 32 or 64 (`width`).
    """
    wide = "float64" if bits_width == 64 else "float32"
    return ops.view(ops.cast(values, wide), _BITS_DTYPE[bits_width])


def magnitude_bits(bits, bits_width):
    """The bit patterns of `|x|` from those of `x` (`float_bits`)."""
    mask = np.iinfo(np.int64).max if bits_width == 64 else 0x7FFFFFFF
    return ops.bitwise_and(bits, _constant(mask, _BITS_DTYPE[bits_width]))


def widened(values, bits, bits_width):
    """`values` as float64, exactly, float32 subnormals included.

    A cast widens normal values, zeros, NaN and Inf exactly on every device,
    but one that runs with flush-to-zero (XLA on the CPU) turns a float32
    subnormal into 0 (or compares it as 0): those are rebuilt from their
    bits, `significand * 2**-149` with their sign, a normal float64 that no
    device flushes. float64 values are returned as they are.

    Args:
      values: the values, in their own dtype.
      bits: their `float_bits`.
      bits_width: the width of those bits.
    """
    if bits_width == 64:
        return ops.cast(values, "float64")
    significand = ops.cast(ops.bitwise_and(bits, _constant(0x7FFFFF, "int32")), "float64")
    step = ops.where(ops.less(bits, 0), _float64(-(2.0**-149)), _float64(2.0**-149))
    subnormal = ops.less(magnitude_bits(bits, 32), _constant(1 << 23, "int32"))
    return ops.where(subnormal, significand * step, ops.cast(values, "float64"))


def finite_amax_bits(bits, bits_width, axis):
    """The bits of the largest finite magnitude along `axis` (0 when none is finite)."""
    finite = ops.less(bits, _constant(INF_BITS[bits_width], _BITS_DTYPE[bits_width]))
    return ops.max(ops.where(finite, bits, ops.zeros_like(bits)), axis=axis)


def as_is_keys(bits_width):
    """`[1, 1 + 12]` keys: 1 (the values below it are the zeros), then every boundary's."""
    keys = _keys(ops.convert_to_tensor(_BOUND_BITS[None, :]), bits_width)
    one = ops.ones([1, 1], _BITS_DTYPE[bits_width])
    return ops.concatenate([one, keys], axis=1)


def scale_exponents(amax_bits, bits_width):
    """`precision.scale_exponent` of each row's largest finite magnitude, per format: `[R, 4]`.

    Args:
      amax_bits: `[R]` bits of each row's largest finite magnitude (`finite_amax_bits`).
      bits_width: the width of those bits.
    """
    amax = ops.cast(amax_bits, "int64")
    if bits_width == 32:
        # The float32 value `significand * 2**(exponent - 150)`, a normal float64: the
        # significand's exact float64 bits with the power of two added to their exponent field.
        field = ops.right_shift(amax, int64(23))
        significand = ops.bitwise_and(amax, int64(0x7FFFFF))
        significand = significand + ops.where(ops.greater(field, 0), int64(1 << 23), int64(0))
        power = ops.cast(ops.maximum(field, 1), "int64") - int64(150)
        float64_bits = ops.view(ops.cast(significand, "float64"), "int64")
        amax = float64_bits + ops.left_shift(power, int64(52))
    amax = amax[:, None]
    top = ops.convert_to_tensor(_TOP_BITS[None, :])
    # frexp's exponents differ from the biased exponent fields by the same constant.
    exponent = ops.right_shift(top, int64(52)) - ops.right_shift(amax, int64(52))
    larger_significand = ops.greater(
        ops.bitwise_and(amax, int64(_FRACTION)), ops.bitwise_and(top, int64(_FRACTION))
    )
    exponent = exponent - ops.cast(larger_significand, "int64")
    return ops.where(ops.greater(amax, int64(0)), exponent, ops.zeros_like(exponent))


def scaled_keys(exponents, bits_width):
    """`[R, 12]` keys of every boundary times `2**-k`, `k` each row's exponent of its format."""
    per_boundary = ops.repeat(exponents, len(precision.BOUNDARY_NAMES), axis=1)
    bits = ops.convert_to_tensor(_BOUND_BITS[None, :]) - ops.left_shift(per_boundary, int64(52))
    return _keys(bits, bits_width)


def _keys(bound_bits, bits_width):
    """Per boundary (`bound_bits`: the float64 bits of `b`, a normal float64; sides as
    `_INCLUSIVE`), the smallest `key` with `bits(|x|) < key` iff `|x|` is below `b`."""
    inclusive = ops.convert_to_tensor(_INCLUSIVE[None, :].astype(np.int64))
    if bits_width == 64:
        return bound_bits + inclusive
    exponent = ops.right_shift(bound_bits, int64(52)) - int64(1023)
    fraction = ops.bitwise_and(bound_bits, int64(_FRACTION))
    # A normal float32 holds b exactly (b has a short significand): its bits, plus the side.
    normal = (
        ops.left_shift(exponent + int64(127), int64(23))
        + ops.right_shift(fraction, int64(29))
        + inclusive
    )
    # Below float32's normal range, the patterns below b are the subnormals p * 2**-149 < b
    # (<= b), p = 0, 1, ...: floor(y) + 1 of y = b / 2**-149, or y when y is an integer
    # and the side is exclusive.
    significand = fraction + int64(1 << 52)
    shift = ops.cast(ops.clip(int64(-97) - exponent, 0, 62), "int64")
    floor = ops.right_shift(significand, shift)
    remainder = ops.bitwise_and(significand, ops.left_shift(ops.ones_like(shift), shift) - int64(1))
    exact = ops.logical_and(ops.equal(remainder, int64(0)), ops.equal(inclusive, int64(0)))
    subnormal = floor + ops.where(exact, int64(0), int64(1))
    keys = ops.where(
        ops.greater_equal(exponent, int64(128)),
        int64(INF_BITS[32]),
        ops.where(ops.greater_equal(exponent, int64(-126)), normal, subnormal),
    )
    return ops.cast(keys, "int32")


def divide(x, divisor, like=None):
    """`x / divisor`, correctly rounded, as numpy divides.

    XLA rewrites a division by a constant (or a broadcast) into a
    multiplication by its reciprocal, which can differ in the last bit and
    move a value across a bucket edge. `like * 0 + divisor`, with `like`
    finite where it matters, is not folded (`like` could be NaN), so the
    division stays one.
    """
    like = x if like is None else like
    zero = ops.where(ops.isfinite(like), like, 0.0) * 0.0
    return x / (zero + divisor)


def _constant(value, dtype):
    return ops.convert_to_tensor(np.array(value, dtype=dtype))


def _float64(value):
    return _constant(value, "float64")


def int64(value):
    """An int64 constant. Keras' backends differ in the dtype they give a Python int, and
    PyTorch's `maximum` and `clip` narrow int64 to int32: their results are cast back."""
    return _constant(value, "int64")
