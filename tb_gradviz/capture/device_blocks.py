"""The block record on the device: `format.blocks`' counts for every format, in `keras.ops`.

`format.blocks` defines the record: each row of a tensor's last axis is cut
into blocks of 32 (MX) or 16 (NVFP4) values, each block scaled, and each value
rounded to the element format. Here the same steps run on the tensor's
device, for all six formats at once, on every backend, with no scatter, sort
or gather: blocks are a reshape, each block's largest and smallest magnitude a
reduction, and every count the sum of a comparison.

Every step is exact in float64, so that no device's float32 behaviour enters:

- The values are widened to float64 exactly, float32 subnormals rebuilt from
  their bits (`device_precision.widened`), which a device that flushes to zero
  (XLA on the CPU) would turn into 0. A float64 tensor is first rounded to
  float32 as the definition casts it (`_round`, with float32's gradual
  underflow and overflow to Inf).
- Exponents are read from the float64 bits (every value here is zero or a
  normal float64) and powers of two are built from bits, so scaling by an MX
  scale is a change of exponent.
- Rounding to an element is `round(|y| / q) * q` with `q` the value's quantum
  (a power of two): an exact division, a round half to even, an exact product.
- NVFP4's float32 arithmetic (the tensor scale, the block scale's product,
  each value's product and quotient) is computed in float64 and rounded to
  float32 by the same rounding (`_round` with float32's 23 bits and exponent
  range). A product of two float32 values is exact in float64; a quotient is
  correctly rounded to float64 and then to float32, which gives the correctly
  rounded float32 quotient (53 >= 2 * 24 + 2 bits). Subnormal float32 results
  come out as IEEE's gradual underflow defines them, on a device that flushes
  them too: the result does not depend on how the device treats float32
  subnormals.

The counts are therefore equal to the definition's, and the squared sums
differ only in the order of float64 additions (tests/test_device_blocks.py,
on every backend).

Imports keras and numpy only.
"""

import keras
import numpy as np

from tb_gradviz.capture import device_precision
from tb_gradviz.format import blocks

ops = keras.ops

# float32 as an element for `_round`: 23 explicit bits, smallest normal exponent -126.
_FLOAT32 = blocks.Element(23, -126, float(np.finfo(np.float32).max), 127)
_E4M3 = blocks.ELEMENTS["fp8_e4m3"]
_SIZES = sorted({spec.block_size for spec in blocks.FORMATS.values()})  # [16, 32]
_WIDE = max(_SIZES)
_NVFP4_SIZE = blocks.FORMATS["nvfp4"].block_size
# The counts each format returns, per row of the group (int32 counts, float64 sums).
COUNTS = ("to_zero", "subnormal", "saturated", "wide_blocks", "nonfinite_blocks")
SUMS = ("squared_error", "squared_sum")


def block_counts(lines, width):
    """`{size: blocks}`: the blocks of each size in `lines` rows of `width` values (the record's
    `blocks`, which the shape gives without reading a value)."""
    return {size: lines * -(-width // size) for size in _SIZES}


def group_blocks(rows, width):
    """The block record of each of `rows`, every format.

    Args:
      rows: R flat tensors of one length n and dtype (float16, bfloat16,
        float32 or float64), each a tensor whose last axis has `width` values
        (n a multiple of `width`; a scalar is one row of width 1).
      width: the length of the tensors' last axis.

    Returns:
      `{format: {count: [R] tensor}}` for every format of `blocks.FORMATS`:
      `COUNTS` (int32) and `SUMS` (float64). `blocks` is not computed: it is
      `block_counts` of the shape.
    """
    stacked = ops.stack(rows) if isinstance(rows, (list, tuple)) else rows
    n_rows, n = stacked.shape
    if n == 0:
        zeros = ops.zeros([n_rows], "int32")
        empty = dict.fromkeys(COUNTS, zeros) | dict.fromkeys(SUMS, ops.zeros([n_rows], "float64"))
        return {name: dict(empty) for name in blocks.FORMATS}
    values = block_values(stacked)
    lines = n // width if width else 0
    padded = -(-width // _WIDE) * _WIDE
    values = ops.reshape(values, [n_rows, lines, width])
    if padded != width:  # zeros: they never set a scale and quantize to zero
        values = ops.pad(values, [[0, 0], [0, 0], [0, padded - width]])
    values = ops.reshape(values, [n_rows, lines * padded])
    return row_counts(values, finite_amax(values))


def block_values(raw):
    """`raw` (`[R, m]`, float16, bfloat16, float32 or float64) as the record reads it: float64,
    exactly, float32 subnormals included; float64 first rounded to float32 as the definition
    casts it."""
    if device_precision.width(raw.dtype) == 64:
        return _round(ops.cast(raw, "float64"), _FLOAT32, saturate=False)
    return device_precision.widened(raw, device_precision.float_bits(raw, 32), 32)


def finite_amax(values):
    """`[R]`: the largest magnitude of each row's blocks of NVFP4's size that hold only finite
    values (`block_values`, `[R, m]` with m a multiple of that size): NVFP4's tensor amax. Rows
    of one tensor combine by their maximum."""
    b = _Blocks(*_magnitudes(values), _NVFP4_SIZE)
    return ops.max(ops.where(b.finite, b.amax, 0.0), axis=1)


def row_counts(values, tensor_amax):
    """The block record of each row of `values`, every format.

    Args:
      values: `[R, m]` float64 (`block_values`), each row whole blocks of
        every size (m a multiple of 32, lines padded with zeros to whole blocks):
        zeros never set a scale and quantize to zero, so padding counts nothing.
      tensor_amax: `[R]`, `finite_amax` of the tensor each row belongs to.

    Returns:
      `{format: {count: [R] tensor}}`, as `group_blocks`; rows of one tensor
      combine by their sum.
    """
    magnitude, finite = _magnitudes(values)
    per_block = {size: _Blocks(magnitude, finite, size) for size in _SIZES}
    result = {}
    for name, spec in blocks.FORMATS.items():
        element = blocks.ELEMENTS[spec.element]
        b = per_block[spec.block_size]
        if spec.scaling == "mx":
            scale = _mx_scale(b.amax, element)
            scaled, decode = b.magnitude / scale, scale
        else:
            scaled, decode = _nvfp4_scaled(b, tensor_amax[:, None], element)
        result[name] = b.counts(scaled, decode, element)
    return result


def _magnitudes(values):
    magnitude = ops.abs(values)
    finite = ops.less(magnitude, np.inf)
    return ops.where(finite, magnitude, 0.0), finite


class _Blocks:
    """A group's magnitudes as `[R, blocks, size]`, with each block's extrema and finiteness."""

    def __init__(self, magnitude, finite, size):
        rows = magnitude.shape[0]
        self.magnitude = ops.reshape(magnitude, [rows, -1, size])
        finite = ops.reshape(finite, [rows, -1, size])
        self.finite = ops.all(finite, axis=2)  # [R, B]
        self.amax = ops.max(self.magnitude, axis=2)
        positive = ops.greater(self.magnitude, 0.0)
        self.amin = ops.min(ops.where(positive, self.magnitude, np.inf), axis=2)

    def counts(self, scaled, decode, element):
        """`COUNTS` and `SUMS` of the values `scaled` (`[R, B, size]` magnitudes in the element's
        units) that decode times `decode` (`[R, B, 1]`)."""
        kept = self.finite[:, :, None]
        quantized = _round(scaled, element, saturate=True)
        smallest_normal = 2.0**element.min_exponent
        error = ops.square(quantized * decode - self.magnitude)
        wide = ops.logical_and(
            ops.logical_and(self.finite, ops.greater(self.amax, 0.0)),
            ops.greater(_binade(self.amax) - _binade(self.amin), element.span),
        )
        masks = {
            "to_zero": ops.logical_and(ops.greater(self.magnitude, 0.0), ops.equal(quantized, 0.0)),
            "subnormal": ops.logical_and(
                ops.greater(quantized, 0.0), ops.less(quantized, smallest_normal)
            ),
            "saturated": ops.greater(scaled, element.largest),
        }
        result = {k: _count(ops.logical_and(m, kept), axis=(1, 2)) for k, m in masks.items()}
        result["wide_blocks"] = _count(wide, axis=1)
        result["nonfinite_blocks"] = _count(ops.logical_not(self.finite), axis=1)
        result["squared_error"] = ops.sum(ops.where(kept, error, 0.0), axis=(1, 2))
        result["squared_sum"] = ops.sum(
            ops.where(kept, ops.square(self.magnitude), 0.0), axis=(1, 2)
        )
        return result


def _mx_scale(amax, element):
    """`[R, B, 1]` E8M0 scales `2**(floor(log2(amax)) - emax)`, clamped; the smallest for 0."""
    exponent = ops.clip(_binade(amax) - element.max_exponent, *blocks.E8M0_EXPONENTS)
    exponent = ops.where(ops.greater(amax, 0.0), exponent, blocks.E8M0_EXPONENTS[0])
    return _power_of_two(exponent)[:, :, None]


def _nvfp4_scaled(b, tensor_amax, element):
    """`(scaled, decode)` of NVFP4: each value's magnitude in the element's units, and the
    factor that decodes an element (block scale over tensor scale); `tensor_amax` is `[R, 1]`."""
    quotient = _round(_divide(_E4M3.largest * element.largest, _nonzero(tensor_amax)), _FLOAT32)
    tensor_scale = ops.where(
        ops.greater(tensor_amax, 0.0), ops.minimum(quotient, _FLOAT32.largest), 1.0
    )
    wanted = _round(_round(_divide(b.amax, element.largest), _FLOAT32) * tensor_scale, _FLOAT32)
    block_scale = _round(wanted, _E4M3, saturate=True)[:, :, None]
    product = _round(b.magnitude * tensor_scale[:, :, None], _FLOAT32)
    has_scale = ops.greater(block_scale, 0.0)
    scaled = ops.where(has_scale, _round(_divide(product, _nonzero(block_scale)), _FLOAT32), 0.0)
    return scaled, _divide(block_scale, tensor_scale[:, :, None])


def _round(x, element, saturate=False):
    """Non-negative (or signed) finite float64 `x` rounded to `element`, ties to even: clamped
    to its largest value when `saturate`, else past it Inf (float32's overflow)."""
    magnitude = ops.abs(x)
    exponent = ops.maximum(_binade(magnitude), element.min_exponent)
    quantum = _power_of_two(exponent - element.mantissa)
    rounded = ops.round(magnitude / quantum) * quantum
    if saturate:
        rounded = ops.minimum(rounded, element.largest)
    else:
        rounded = ops.where(ops.greater(rounded, element.largest), np.inf, rounded)
    rounded = ops.where(ops.less(x, 0.0), -rounded, rounded)
    return ops.where(ops.less(magnitude, np.inf), rounded, x)


def _binade(magnitude):
    """`floor(log2(m))` of float64 magnitudes, from their exponent bits: exact for the zero and
    normal values every step here holds (-1023 for 0)."""
    bits = ops.view(ops.cast(magnitude, "float64"), "int64")
    return ops.cast(ops.right_shift(bits, device_precision.int64(52)), "int32") - 1023


def _power_of_two(exponent):
    """`2.0**e` as float64 from integer exponents in float64's normal range, built from bits."""
    biased = ops.cast(exponent, "int64") + device_precision.int64(1023)
    return ops.view(ops.left_shift(biased, device_precision.int64(52)), "float64")


def _divide(x, divisor):
    """`x / divisor` correctly rounded, broadcast to `x`'s shape (`device_precision.divide`: XLA
    would multiply by a rounded reciprocal of a constant or broadcast divisor)."""
    x = ops.convert_to_tensor(x, "float64")
    divisor = ops.convert_to_tensor(divisor, "float64")
    return device_precision.divide(x, divisor, like=ops.zeros_like(divisor) + x)


def _nonzero(x):
    """`x` with zeros replaced by 1, so that a division whose result is discarded is finite."""
    return ops.where(ops.greater(x, 0.0), x, 1.0)


def _count(mask, axis):
    return ops.cast(ops.sum(ops.cast(mask, "int32"), axis=axis), "int32")


def flat_counts(counts, width=None):
    """`group_blocks`' result as flat `{"block/<format>/<count>": [R]}`, with a `width`
    `block_width` (`[R]`: `width`, so that each tensor's row of a group says how its blocks were
    cut)."""
    result = {
        f"block/{name}/{key}": value for name, part in counts.items() for key, value in part.items()
    }
    if width is None:
        return result
    some = next(iter(result.values()))
    result["block_width"] = ops.zeros_like(some, "int32") + width
    return result


def row_records(row):
    """One tensor's `{format: record}` (`blocks.COUNTS`) from its row of the device statistics.

    Args:
      row: `{name: numpy value}` with `flat_counts`' keys and `count` (the
        tensor's number of values).
    """
    width = int(row["block_width"])
    lines = int(row["count"]) // width if width else 0
    n_blocks = block_counts(lines, width)
    result = {}
    for name, spec in blocks.FORMATS.items():
        record = {key: int(row[f"block/{name}/{key}"]) for key in COUNTS}
        record.update({key: float(row[f"block/{name}/{key}"]) for key in SUMS})
        record["blocks"] = n_blocks[spec.block_size]
        result[name] = record
    return result
