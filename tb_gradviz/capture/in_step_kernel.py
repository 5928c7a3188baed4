"""The in-step digest's statistics of one tensor in one pass over its values, on the host.

On a CPU a framework's own ops read a tensor once per op (the sum of squares,
the magnitudes, their buckets, their maximum: six passes or more), and every
pass over every chosen layer's tensors costs a noticeable share of the train
step. Here numba compiles the statistics of `capture.in_step` into one loop
that LLVM vectorizes: per value, its square is added (in float64), its
magnitude compared with each of `in_step.THRESHOLDS` and with the largest so
far (as integers: see `_finite_pass`), and, for an
activation with a channel axis last, whether it is non-zero is or-ed into its
channel's flag. A tensor holding a NaN or an Inf (its sum of squares is not
finite) is read once more, one value at a time, to leave them out.

The kernel releases the GIL, so the framework's other threads go on with the
step while it runs. Imports neither TensorFlow nor Keras.
"""

import numba
import numpy as np

from tb_gradviz.capture import in_step

_SUM = {"reassoc", "nsz", "contract"}  # fastmath flags for the loop that only adds
_THRESHOLDS32 = np.array(in_step.THRESHOLDS, np.float32)
_THRESHOLD_BITS = _THRESHOLDS32.view(np.uint32)


# Values per block of `_finite_pass`, rounded down to whole lines: long enough that its
# vectorized loop runs at full speed, short enough that the block is still in the L1 cache
# when its lines are read again for the channels.
_BLOCK = 2048


@numba.njit(nogil=True, cache=True, fastmath=_SUM)
def _finite_pass(bits, values, thresholds, width, channels):
    # bits: the values' float32 bit patterns, flat, in lines of `width` (channels). Without the
    # sign bit, the pattern of a finite float orders as its magnitude does, so the comparisons
    # and the maximum are integer ones, which vectorize whatever a NaN would do (a NaN or an Inf
    # makes the sum of squares non-finite, and the caller reads the values again). One loop over
    # each block of whole lines (a slice: its indices are never negative, so numba adds no
    # wraparound check, which would stop LLVM vectorizing it), then the block's lines again,
    # from the cache, for the channels' flags.
    t0, t1, t2, t3, t4 = thresholds[0], thresholds[1], thresholds[2], thresholds[3], thresholds[4]
    b0 = b1 = b2 = b3 = b4 = 0
    squares = 0.0
    largest = np.uint32(0)
    nonzero = np.zeros(width, np.uint8)
    magnitude = np.uint32(0x7FFFFFFF)
    block = max(1, _BLOCK // width) * width
    for start in range(0, bits.size, block):
        block_bits = bits[start : start + block]
        block_values = values[start : start + block]
        for i in range(block_bits.size):
            a = block_bits[i] & magnitude
            v = np.float64(block_values[i])
            squares += v * v
            largest = max(largest, a)
            b0 += a < t0
            b1 += a < t1
            b2 += a < t2
            b3 += a < t3
            b4 += a < t4
        if channels:
            for line in range(0, block_bits.size, width):
                line_bits = block_bits[line : line + width]
                for c in range(width):
                    nonzero[c] |= (line_bits[c] & magnitude) != 0
    return np.array([b0, b1, b2, b3, b4]), squares, largest, nonzero


@numba.njit(nogil=True, cache=True)
def _any_pass(values, thresholds, channels):
    # The same statistics over the finite values, one value at a time.
    rows, width = values.shape
    below = np.zeros(thresholds.size, np.int64)
    nan = pos_inf = neg_inf = 0
    squares = 0.0
    largest = 0.0
    nonzero = np.zeros(width, np.bool_)
    for r in range(rows):
        for c in range(width):
            v = np.float64(values[r, c])
            if channels and v != 0:
                nonzero[c] = True
            if np.isnan(v):
                nan += 1
            elif np.isinf(v):
                if v > 0:
                    pos_inf += 1
                else:
                    neg_inf += 1
            else:
                a = abs(v)
                squares += v * v
                largest = max(largest, a)
                for k in range(thresholds.size):
                    below[k] += a < thresholds[k]
    return below, np.array([nan, pos_inf, neg_inf]), squares, largest, nonzero


def statistics_row(values, units_last):
    """One tensor's statistics as a float64 row of `in_step.ROW` values.

    Args:
      values: the tensor as a numpy array (float32; float16 and bfloat16 are
        widened to it, exactly; float64 is rounded to it).
      units_last: whether to count its dead channels along the last axis.
    """
    values = np.ascontiguousarray(values)
    if values.dtype != np.float32:
        values = values.astype(np.float32)
    width = values.shape[-1] if values.ndim >= 1 and values.shape[-1] > 0 else 1
    flat = values.reshape(-1, width)
    row = np.zeros(in_step.ROW)
    row[0] = values.size
    below, squares, bits, nonzero = _finite_pass(
        flat.view(np.uint32).reshape(-1), flat.reshape(-1), _THRESHOLD_BITS, width, units_last
    )
    largest = float(np.array([bits], np.uint32).view(np.float32)[0])
    nonfinite = np.zeros(3)
    if not np.isfinite(squares):
        below, nonfinite, squares, largest, nonzero = _any_pass(flat, _THRESHOLDS32, units_last)
    counts = len(in_step.BELOW)
    row[1 : 1 + counts] = below
    row[1 + counts : 4 + counts] = nonfinite
    row[4 + counts] = squares
    row[5 + counts] = largest
    row[6 + counts] = np.count_nonzero(nonzero == 0) if units_last else 0
    return row


def row_along(values, units_axis):
    """`statistics_row` with the dead channels along `units_axis` (None: none counted)."""
    values = np.asarray(values)
    last = units_axis is not None and units_axis == values.ndim - 1
    row = statistics_row(values, last)
    if units_axis is not None and not last:
        others = tuple(a for a in range(values.ndim) if a != units_axis)
        row[-1] = np.count_nonzero(~np.any(values != 0, axis=others))
    return row


@numba.njit(nogil=True, cache=True, fastmath=_SUM)
def _update_squares(after, before):
    weight = 0.0
    update = 0.0
    for i in range(after.size):
        a = np.float64(after[i])
        d = a - np.float64(before[i])
        weight += a * a
        update += d * d
    return weight, update


def update_sums(current, previous):
    """`summaries.update_sums(current, previous)` in one fused pass; then `previous[...] = current`
    (a copy).

    Args:
      current: the weight's values now (float32 or float64).
      previous: a contiguous array of the same shape and dtype, overwritten.
    """
    current = np.ascontiguousarray(current).reshape(-1)
    if (
        previous.dtype != current.dtype
        or previous.size != current.size
        or not previous.flags.c_contiguous
    ):
        raise ValueError(
            f"previous must be a contiguous {current.dtype} array of {current.size} values; "
            f"received {previous.dtype}, {previous.size} values"
        )
    sums = _update_squares(current, previous.reshape(-1))
    np.copyto(previous.reshape(-1), current)
    return sums


def update_norms(afters, befores):
    """`[weights, 2]` float64: per weight `|w_after|` and `|w_after - w_before|`, summed in
    float64 in one pass over both (float16 and bfloat16 widened to float32, exactly).

    Args:
      afters, befores: the weights after and before the step's update, as numpy
        arrays, pairwise of one shape.
    """
    norms = np.zeros((len(afters), 2))
    for k, (after, before) in enumerate(zip(afters, befores)):
        after, before = (_flat32(a) for a in (after, before))
        norms[k] = _update_squares(after, before)
    return np.sqrt(norms)


def _flat32(values):
    values = np.ascontiguousarray(values).reshape(-1)
    if values.dtype not in (np.float32, np.float64):
        values = values.astype(np.float32)
    return values
