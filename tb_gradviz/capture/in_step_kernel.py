"""The in-step digest's statistics of one tensor in one pass over its values, on the host.

On a CPU a framework's own ops read a tensor once per op (the sum of squares,
the magnitudes, their buckets, their maximum: six passes or more), and every
pass over every chosen layer's tensors costs a noticeable share of the train
step. Here numba compiles the statistics of `capture.in_step` into one pass:
a block of the values at a time (it stays in the L1 cache), a few loops over
it that LLVM vectorizes: the squares (added in float64) and the largest
magnitude, the counts below each of `in_step.THRESHOLDS`, and, for an
activation with a channel axis last, each channel's bits or-ed (whether it is
non-zero anywhere); see `_finite_pass`. A tensor holding a NaN or an Inf (its
sum of squares is not finite) is read once more, one value at a time, to
leave them out.

The kernel releases the GIL, so the framework's other threads go on with the
step while it runs. Imports neither TensorFlow nor Keras.
"""

import numba
import numpy as np

from tb_gradviz.capture import in_step

_SUM = {"reassoc", "nsz", "contract"}  # fastmath flags for the loops that only add
_THRESHOLDS32 = np.array(in_step.THRESHOLDS, np.float32)
# The bits of float16's overflow threshold: a block whose largest magnitude is below it has
# every value below it and below bfloat16's (larger) one too.
_HIGH_BITS = _THRESHOLDS32[3:4].view(np.uint32)[0]
_F0, _F1 = np.float32(0.0), np.float32(1.0)

# Values per block of `_finite_pass`, rounded down to whole periods of the lines: long enough
# that its vectorized loops run at full speed, short enough that the block is still in the L1
# cache when the next loop reads it again.
_BLOCK = 8192
# The shortest run of whole lines the channels' flags are or-ed over at a time: a line of
# 3 values (an image's channels) would leave the vector units idle.
_PERIOD = 64


@numba.njit(nogil=True, cache=True, fastmath=_SUM)
def _finite_pass(bits, values, thresholds, high_bits, width, channels):
    # bits: the values' float32 bit patterns, flat, in lines of `width` (channels). Per block of
    # whole lines, a few loops that each vectorize (one loop doing everything did not vectorize
    # as well: bench/RESULTS.md section 22), the block read from the L1 cache after the first:
    # - the sum of squares (in float64) and the largest magnitude's bits: without the sign bit,
    #   the pattern of a finite float orders as its magnitude does, and an integer maximum
    #   vectorizes whatever a NaN would do (a NaN or an Inf makes the sum of squares
    #   non-finite, and the caller reads the values again);
    # - the counts below the three low thresholds, as float32 sums of 0 or 1 (exact below
    #   2**24 values; an integer count would be widened to 64 bits, lane by lane);
    # - the counts below the two high ones only when the block reaches them: otherwise every
    #   value is below both;
    # - the channels' flags: each channel's bits or-ed, over runs of whole lines of at least
    #   `_PERIOD` values, folded onto the channels at the end (a zero of either sign has no
    #   bit but the sign set).
    t0, t1, t2, t3, t4 = thresholds[0], thresholds[1], thresholds[2], thresholds[3], thresholds[4]
    below = np.zeros(5, np.int64)
    squares = 0.0
    largest = np.uint32(0)
    magnitude = np.uint32(0x7FFFFFFF)
    period = width * max(1, _PERIOD // width)
    ored = np.zeros(period, np.uint32)
    block = max(1, _BLOCK // period) * period
    for start in range(0, bits.size, block):
        block_bits = bits[start : start + block]
        block_values = values[start : start + block]
        block_largest = np.uint32(0)
        for i in range(block_bits.size):
            v = np.float64(block_values[i])
            squares += v * v
            block_largest = max(block_largest, block_bits[i] & magnitude)
        largest = max(largest, block_largest)
        b0 = b1 = b2 = _F0
        for i in range(block_values.size):
            a = abs(block_values[i])
            b0 += _F1 if a < t0 else _F0
            b1 += _F1 if a < t1 else _F0
            b2 += _F1 if a < t2 else _F0
        below[0] += np.int64(b0)
        below[1] += np.int64(b1)
        below[2] += np.int64(b2)
        if block_largest < high_bits:
            below[3] += block_values.size
            below[4] += block_values.size
        else:
            b3 = b4 = _F0
            for i in range(block_values.size):
                a = abs(block_values[i])
                b3 += _F1 if a < t3 else _F0
                b4 += _F1 if a < t4 else _F0
            below[3] += np.int64(b3)
            below[4] += np.int64(b4)
        if channels:
            whole = block_bits.size - block_bits.size % period
            for line in range(0, whole, period):
                line_bits = block_bits[line : line + period]
                for c in range(period):
                    ored[c] |= line_bits[c]
            rest = block_bits[whole:]  # whole lines, fewer than a period's
            for c in range(rest.size):
                ored[c] |= rest[c]
    nonzero = np.zeros(width, np.bool_)
    for j in range(period):
        nonzero[j % width] |= (ored[j] & magnitude) != 0
    return below, squares, largest, nonzero


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
        flat.view(np.uint32).reshape(-1),
        flat.reshape(-1),
        _THRESHOLDS32,
        _HIGH_BITS,
        width,
        units_last,
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
