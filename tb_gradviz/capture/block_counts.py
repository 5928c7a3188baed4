"""The block record on the host: `format.blocks.block_record`, compiled, one pass per format.

`format.blocks` defines the record with whole-array numpy operations, which
allocate several tensors the size of the input per format. Here numba walks
each block once: its largest and smallest non-zero magnitudes and whether it
holds NaN or Inf, then its values again for the scale it sets. Every step is
the definition's: a power-of-two scale for MX (exact in float64), the float32
arithmetic of NVFP4's two scales, rounding to nearest with ties to even, and
saturation at the element's largest finite value. The squared sums are
accumulated block by block in float64, in another order than numpy's, so they
agree with the definition to rounding, and the counts exactly
(tests/test_block_counts.py).
"""

import math

import numba
import numpy as np

from tb_gradviz.format import blocks

_E4M3 = blocks.ELEMENTS["fp8_e4m3"]
# NVFP4's block scale format, as constants the compiled kernel folds in.
_E4M3_MANTISSA = _E4M3.mantissa
_E4M3_MIN_EXPONENT = _E4M3.min_exponent
_E4M3_LARGEST = _E4M3.largest


@numba.njit(nogil=True, cache=True)
def _round_half_even(value):
    floor = math.floor(value)
    rest = value - floor
    if rest > 0.5 or (rest == 0.5 and floor % 2.0 == 1.0):
        return floor + 1.0
    return floor


@numba.njit(nogil=True, cache=True)
def _quantize(magnitude, mantissa, min_exponent, largest):
    """`blocks.quantize` of one non-negative float64 magnitude."""
    if magnitude == 0.0:
        return 0.0
    exponent = max(math.frexp(magnitude)[1] - 1, min_exponent)
    quantum = math.ldexp(1.0, exponent - mantissa)
    return min(_round_half_even(magnitude / quantum) * quantum, largest)


@numba.njit(nogil=True, cache=True)
def _binade(magnitude):
    return math.frexp(magnitude)[1] - 1


@numba.njit(nogil=True, cache=True)
def _block_counts(rows, size, mantissa, min_exponent, largest, max_exponent, span, nvfp4):
    """`(counts[6], sums[2])` of `blocks.COUNTS` over `rows` (float32 `[R, W]`), blocks of `size`
    along each row."""
    counts = np.zeros(6, np.int64)  # to_zero, subnormal, saturated, wide, blocks, nonfinite
    sums = np.zeros(2)  # squared_error, squared_sum
    smallest_normal = math.ldexp(1.0, min_exponent)
    n_rows, width = rows.shape
    tensor_scale = np.float32(1.0)
    if nvfp4:
        tensor_amax = 0.0
        for r in range(n_rows):
            for start in range(0, width, size):
                stop = min(start + size, width)
                amax, finite = 0.0, True
                for i in range(start, stop):
                    v = abs(np.float64(rows[r, i]))
                    if not math.isfinite(v):
                        finite = False
                    elif v > amax:
                        amax = v
                if finite and amax > tensor_amax:
                    tensor_amax = amax
        if tensor_amax > 0.0:
            tensor_scale = np.float32(_E4M3_LARGEST * largest) / np.float32(tensor_amax)
    for r in range(n_rows):
        for start in range(0, width, size):
            stop = min(start + size, width)
            counts[4] += 1
            amax, amin, finite = 0.0, np.inf, True
            for i in range(start, stop):
                v = abs(np.float64(rows[r, i]))
                if not math.isfinite(v):
                    finite = False
                elif v > 0.0:
                    amax = max(amax, v)
                    amin = min(amin, v)
            if not finite:
                counts[5] += 1
                continue
            if amax > 0.0 and _binade(amax) - _binade(amin) > span:
                counts[3] += 1
            if nvfp4:
                wanted = (np.float32(amax) / np.float32(largest)) * tensor_scale
                block_scale = _quantize(
                    np.float64(wanted), _E4M3_MANTISSA, _E4M3_MIN_EXPONENT, _E4M3_LARGEST
                )
                decode = block_scale / np.float64(tensor_scale)
            else:
                exponent = _binade(amax) - max_exponent if amax > 0.0 else -127
                decode = math.ldexp(1.0, min(max(exponent, -127), 127))
            for i in range(start, stop):
                value = np.float64(rows[r, i])
                v = abs(value)
                if nvfp4:
                    if block_scale > 0.0:
                        product = np.float32(rows[r, i]) * tensor_scale
                        y = abs(np.float64(product / np.float32(block_scale)))
                    else:
                        y = 0.0
                else:
                    y = v / decode
                element = _quantize(y, mantissa, min_exponent, largest)
                if v > 0.0 and element == 0.0:
                    counts[0] += 1
                if element > 0.0 and element < smallest_normal:
                    counts[1] += 1
                if y > largest:
                    counts[2] += 1
                sums[0] += (element * decode - v) ** 2
                sums[1] += v * v
    return counts, sums


def block_record(values, name):
    """`blocks.block_record(values, name)`, compiled: the same dict of `blocks.COUNTS`."""
    if name not in blocks.FORMATS:
        raise ValueError(
            f"Unknown block format {name!r}; expected one of {sorted(blocks.FORMATS)}."
        )
    spec = blocks.FORMATS[name]
    element = blocks.ELEMENTS[spec.element]
    values = np.asarray(values, np.float32)
    if values.ndim == 0:
        rows = values.reshape(1, 1)
    else:
        rows = values.reshape(math.prod(values.shape[:-1]), values.shape[-1])
    counts, sums = _block_counts(
        np.ascontiguousarray(rows),
        spec.block_size,
        element.mantissa,
        element.min_exponent,
        element.largest,
        element.max_exponent,
        element.span,
        spec.scaling == "nvfp4",
    )
    record = dict(zip(blocks.COUNTS[:6], (int(c) for c in counts)))
    record["squared_error"], record["squared_sum"] = float(sums[0]), float(sums[1])
    return record


def block_records(values):
    """`{format: block_record(values, format)}` for every format of `blocks.FORMATS`, in order."""
    return {name: block_record(values, name) for name in blocks.FORMATS}
