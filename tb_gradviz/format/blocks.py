"""Block-scaled formats: what quantizing a tensor to MXFP8/6/4 or NVFP4 does to it, per block.

A block-scaled format stores small blocks of consecutive values that share
one scale, so a tensor whose range fits a format per tensor can still lose
its small values inside a block whose largest value is large. This module is
the numpy definition of the block record: for each format, quantize the
tensor as the format's specification says and count what happened.

Blocks run along the tensor's last axis: the tensor is read as rows of its
last axis (a scalar is one row of one value), and each row is cut into
blocks of `block_size` consecutive values. A row whose length is not a
multiple of the block size ends in a partial block, which is quantized like
a full one over the values it has (padding with zeros would change nothing:
a zero never sets a block's scale and quantizes to zero).

Scales:

* **MX** (OCP Microscaling Formats v1.0, section 6.3): blocks of 32, one
  E8M0 scale `X = 2**(floor(log2(amax)) - emax_elem)` per block, where
  `amax` is the block's largest magnitude and `emax_elem` the exponent of
  the element format's largest normal. `X` is clamped to E8M0's range
  `[2**-127, 2**127]`; a block of zeros gets the smallest scale. Each
  element is `V / X` rounded to the element format (round to nearest, ties
  to even), and a magnitude past the element's largest finite value is
  clamped to it (saturated), as the specification asks of formats with no
  Inf.
* **NVFP4** (NVIDIA's two-level scaling): blocks of 16 FP4 E2M1 elements,
  a float32 scale per tensor `S = 448 * 6 / amax_tensor`, clamped to
  float32's largest finite value as Transformer Engine does (a tensor whose
  largest magnitude is below about 7.9e-36 would otherwise get an infinite
  scale; a tensor of zeros gets `S = 1`), and an FP8 E4M3 scale per block
  `s = e4m3(amax_block / 6 * S)` (saturating), each step rounded to float32
  with IEEE gradual underflow; each element is `fp4((V * S) / s)` with both
  operations in float32, saturating, and decodes as `fp4 * s / S`. A
  block whose E4M3 scale rounds to zero loses all its values.

Non-finite values: a block holding NaN or +-Inf has no finite amax; MX sets
its scale to NaN (E8M0's 0xFF), which makes every element of the block
decode as NaN, and NVFP4's block scale is likewise NaN. Such a block is
counted in `nonfinite_blocks`; its finite values are counted nowhere else
and left out of the error sums. The tensor scale of NVFP4 is taken over the
finite values.

Counts per format (`COUNTS`), over the tensor:

* `to_zero`: non-zero finite values that quantize to zero;
* `subnormal`: values that quantize to a non-zero subnormal of the element;
* `saturated`: values whose scaled magnitude is past the element's largest
  finite value, clamped to it;
* `wide_blocks`: blocks whose own dynamic range exceeds the element
  format's, in binades: `floor(log2(amax)) - floor(log2(amin))`, amin the
  smallest non-zero magnitude, is more than the element's span from its
  smallest subnormal to its largest normal (`Element.span`). No scale keeps
  both ends of such a block: its smallest values fall below the smallest
  subnormal. Exponents alone decide it, so every path computes it exactly;
* `blocks`, `nonfinite_blocks`: the number of blocks, and of those holding
  NaN or Inf;
* `squared_error`, `squared_sum`: the sums of `(q - v)**2` and of `v**2`
  over the finite values of finite blocks (float64); their ratio is the
  relative squared error of the quantized tensor.

Imports only numpy.
"""

import math
from typing import NamedTuple

import numpy as np


class Element(NamedTuple):
    """A narrow float element format with no Inf: its explicit significand bits, the exponent of
    its smallest normal, its largest finite value and the exponent of that value."""

    mantissa: int
    min_exponent: int
    largest: float
    max_exponent: int

    @property
    def smallest_subnormal(self):
        return float(np.ldexp(1.0, self.min_exponent - self.mantissa))

    @property
    def span(self):
        """Binades from the smallest subnormal's to the largest normal's exponent."""
        return self.max_exponent - (self.min_exponent - self.mantissa)


ELEMENTS = {
    "fp8_e4m3": Element(3, -6, 448.0, 8),
    "fp8_e5m2": Element(2, -14, 57344.0, 15),
    "fp6_e2m3": Element(3, 0, 7.5, 2),
    "fp6_e3m2": Element(2, -2, 28.0, 4),
    "fp4_e2m1": Element(1, 0, 6.0, 2),
}


class BlockFormat(NamedTuple):
    """A block-scaled format: its element, its block size and how a block's scale is set."""

    element: str
    block_size: int
    scaling: str  # "mx" (an E8M0 scale per block) or "nvfp4" (E4M3 per block, float32 per tensor)


FORMATS = {
    "mxfp8_e4m3": BlockFormat("fp8_e4m3", 32, "mx"),
    "mxfp8_e5m2": BlockFormat("fp8_e5m2", 32, "mx"),
    "mxfp6_e2m3": BlockFormat("fp6_e2m3", 32, "mx"),
    "mxfp6_e3m2": BlockFormat("fp6_e3m2", 32, "mx"),
    "mxfp4_e2m1": BlockFormat("fp4_e2m1", 32, "mx"),
    "nvfp4": BlockFormat("fp4_e2m1", 16, "nvfp4"),
}
COUNTS = (
    "to_zero",
    "subnormal",
    "saturated",
    "wide_blocks",
    "blocks",
    "nonfinite_blocks",
    "squared_error",
    "squared_sum",
)
E8M0_EXPONENTS = (-127, 127)
_E4M3 = ELEMENTS["fp8_e4m3"]


def quantize(values, element):
    """`values` (float64, finite) rounded to `element` with ties to even, saturating at its
    largest finite value. Exact: every step is a power-of-two scaling or an integer rounding."""
    values = np.asarray(values, np.float64)
    magnitude = np.abs(values)
    exponent = np.frexp(np.where(magnitude > 0, magnitude, 1.0))[1] - 1.0
    exponent = np.maximum(exponent, element.min_exponent)
    quantum = np.ldexp(1.0, (exponent - element.mantissa).astype(np.int64))
    rounded = np.round(magnitude / quantum) * quantum  # numpy rounds half to even
    return np.copysign(np.minimum(rounded, element.largest), values)


def _binade(magnitude):
    """`floor(log2(m))` of positive magnitudes, exactly (frexp, not a rounded log)."""
    return np.frexp(magnitude)[1] - 1


def as_float32(values):
    """`values` read as float32, as every block record reads them: a float64 past float32's range
    becomes Inf, quietly (its block is then a block holding Inf, counted as such)."""
    with np.errstate(over="ignore"):
        return np.asarray(values, np.float32)


def _blocks(values, block_size):
    """The values as `[blocks, block_size]` float64 with a mask of the real (unpadded) entries."""
    values = as_float32(values)
    rows = (
        values.reshape(1, 1)
        if values.ndim == 0
        else values.reshape(math.prod(values.shape[:-1]), values.shape[-1])
    )
    width = rows.shape[1]
    padded = -(-width // block_size) * block_size
    data = np.zeros((rows.shape[0], padded), np.float64)
    data[:, :width] = rows
    real = np.zeros((rows.shape[0], padded), bool)
    real[:, :width] = True
    return data.reshape(-1, block_size), real.reshape(-1, block_size)


def _mx_scales(amax, element):
    """E8M0 scales `2**(floor(log2(amax)) - emax_elem)`, clamped; the smallest for a zero block."""
    positive = amax > 0
    exponent = np.frexp(np.where(positive, amax, 1.0))[1] - 1 - element.max_exponent
    exponent = np.where(positive, exponent, E8M0_EXPONENTS[0])
    return np.ldexp(1.0, np.clip(exponent, *E8M0_EXPONENTS).astype(np.int64))


def _nvfp4_scales(amax, tensor_amax, element):
    """`(block_scale, tensor_scale)`: each block's E4M3 scale `s` and the tensor scale `S`, both
    computed in float32."""
    f32 = np.float32
    if tensor_amax > 0:
        with np.errstate(over="ignore"):
            tensor_scale = f32(_E4M3.largest * element.largest) / f32(tensor_amax)
        tensor_scale = min(tensor_scale, np.finfo(f32).max)
    else:
        tensor_scale = f32(1.0)
    with np.errstate(over="ignore"):
        wanted = (amax.astype(f32) / f32(element.largest)).astype(f32) * tensor_scale
    block_scale = quantize(wanted.astype(np.float64), _E4M3)
    return block_scale, float(tensor_scale)


def block_record(values, name):
    """The block record of `values` (any shape, cast to float32) in format `name`.

    Returns:
        A dict of `COUNTS`: ints, and floats for the two squared sums.

    Raises:
        ValueError: for a format name not in `FORMATS`.
    """
    if name not in FORMATS:
        raise ValueError(f"Unknown block format {name!r}; expected one of {sorted(FORMATS)}.")
    spec = FORMATS[name]
    element = ELEMENTS[spec.element]
    data, real = _blocks(values, spec.block_size)
    finite = np.isfinite(data)
    nonfinite_block = ~finite.all(axis=1)
    data = np.where(finite, data, 0.0)
    magnitude = np.abs(data)
    amax = magnitude.max(axis=1)
    nonzero = magnitude > 0
    amin = np.where(nonzero, magnitude, np.inf).min(axis=1)
    wide = ~nonfinite_block & np.any(nonzero, axis=1)
    wide &= _binade(amax) - _binade(np.where(wide, amin, 1.0)) > element.span

    if spec.scaling == "mx":
        scale = _mx_scales(amax, element)[:, None]
        scaled = data / scale
        decode = scale
    else:
        tensor_amax = float(amax[~nonfinite_block].max(initial=0.0))
        block_scale, tensor_scale = _nvfp4_scales(amax, tensor_amax, element)
        f32 = np.float32
        with np.errstate(divide="ignore", invalid="ignore"):
            scaled = (data.astype(f32) * f32(tensor_scale)).astype(f32) / block_scale[
                :, None
            ].astype(f32)
        scaled = np.where(block_scale[:, None] > 0, scaled.astype(np.float64), 0.0)
        decode = block_scale[:, None] / tensor_scale
    quantized_element = quantize(scaled, element)
    quantized = quantized_element * decode

    counted = real & ~nonfinite_block[:, None]
    smallest_normal = float(np.ldexp(1.0, element.min_exponent))
    element_magnitude = np.abs(quantized_element)
    squared = np.where(counted, (quantized - data) ** 2, 0.0)
    return {
        "to_zero": int(np.count_nonzero(counted & nonzero & (quantized_element == 0))),
        "subnormal": int(
            np.count_nonzero(
                counted & (element_magnitude > 0) & (element_magnitude < smallest_normal)
            )
        ),
        "saturated": int(np.count_nonzero(counted & (np.abs(scaled) > element.largest))),
        "wide_blocks": int(np.count_nonzero(wide)),
        "blocks": int(data.shape[0]),
        "nonfinite_blocks": int(np.count_nonzero(nonfinite_block)),
        "squared_error": float(squared.sum()),
        "squared_sum": float(np.where(counted, data**2, 0.0).sum()),
    }


def relative_squared_error(record):
    """The relative squared error of a block record: 0 for a tensor with no finite energy."""
    total = record["squared_sum"]
    return record["squared_error"] / total if total > 0 else 0.0


# The block part of the precision record (`records.PRECISION_FIELDS` ends with these), per
# format in `FORMATS` order, then the block counts, which depend on the block size only.
RECORD_COUNTS = ("to_zero", "subnormal", "saturated", "wide_blocks")
BLOCK_SIZES = tuple(sorted({spec.block_size for spec in FORMATS.values()}, reverse=True))
RECORD_FIELDS = (
    *(f"block/{name}/{field}" for name in FORMATS for field in (*RECORD_COUNTS, "relative_error")),
    *(f"block/{count}/{size}" for count in ("blocks", "nonfinite_blocks") for size in BLOCK_SIZES),
)
# The fields that count (every field but `relative_error`).
RECORD_COUNT_FIELDS = tuple(f for f in RECORD_FIELDS if not f.endswith("/relative_error"))


def record_fields(records_by_format):
    """The block part of a precision record: `RECORD_FIELDS` as a float64 vector.

    Args:
      records_by_format: `{format: block_record(values, format)}` for every
        format of `FORMATS` (`capture.block_counts.block_records`, or the
        device path's sums). `blocks` and `nonfinite_blocks` of a block size
        are taken from the first format with that size (the others count
        the same blocks).

    Raises:
      ValueError: a format of `FORMATS` is missing.
    """
    missing = [name for name in FORMATS if name not in records_by_format]
    if missing:
        raise ValueError(
            f"a block record for every format of {list(FORMATS)} is needed; received "
            f"{list(records_by_format)}"
        )
    values = []
    for name in FORMATS:
        record = records_by_format[name]
        values += [record[count] for count in RECORD_COUNTS]
        values.append(relative_squared_error(record))
    for count in ("blocks", "nonfinite_blocks"):
        for size in BLOCK_SIZES:
            first = next(name for name, spec in FORMATS.items() if spec.block_size == size)
            values.append(records_by_format[first][count])
    return np.array(values, np.float64)


def numpy_fields(values):
    """`record_fields` of `values` by this module's numpy definition (the host path without
    numba)."""
    return record_fields({name: block_record(values, name) for name in FORMATS})


def decode_fields(fields):
    """The block part of a decoded precision record, from `{field: value}` of `RECORD_FIELDS`.

    Returns:
      `{format: {"to_zero", "subnormal", "saturated", "wide_blocks", "blocks",
      "nonfinite_blocks": int, "relative_error": float}}`, or None when the
      record has no block part (NaN: written before it, or with it turned off).
    """
    if any(math.isnan(fields[field]) for field in RECORD_COUNT_FIELDS):
        return None
    return {
        name: {
            **{count: int(fields[f"block/{name}/{count}"]) for count in RECORD_COUNTS},
            "relative_error": float(fields[f"block/{name}/relative_error"]),
            **{
                count: int(fields[f"block/{count}/{spec.block_size}"])
                for count in ("blocks", "nonfinite_blocks")
            },
        }
        for name, spec in FORMATS.items()
    }
