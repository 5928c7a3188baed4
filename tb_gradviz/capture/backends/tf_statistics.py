"""The statistics of captured tensors on a TensorFlow device: grouped row-wise ops.

On an accelerator the TensorFlow pass summarises its tensors where they are,
so that only bucket counts and scalars leave the device. `group_summary`
computes `summaries.linear_histogram` and `summaries.stats_vector` of many
equal-sized tensors at once (tests/test_capture.py checks it bit for bit
against the numpy definition and the host kernel).
"""

import numpy as np
import tensorflow as tf

from tb_gradviz.capture import assemble
from tb_gradviz.format import records

# Magnitude bins from a float64 log: bin = floor(2 log10 |x|) + 25, clipped to
# [0, MAGNITUDE_BINS - 1]. Exact for every float32 value (float16 and bfloat16
# widen to float32 exactly): the float32 value nearest to an edge but not on
# it is 5.6e-10 (relative) away from it, i.e. 4.9e-10 away in units of
# 2 log10 |x|, while the float64 log and product err by < 1e-13; the edges
# that are float32 values themselves (1, 10, ..., 1e6) land exactly on an
# integer, which _LOG_NUDGE lifts past any rounding below it.
# tests/test_capture.py checks both the margin and the op on edge neighbours.
_LOG_PER_LN = 2 / np.log(10.0)
_LOG_OFFSET = -records.LOG_MIN_EXPONENT * records.LOG_BINS_PER_DECADE + 1
_LOG_NUDGE = 1e-11
_FLOAT32_EXACT = (tf.float16, tf.bfloat16, tf.float32)
# Edges padded with 0 below and +inf above: bin j is right iff PADDED[j] <= a < PADDED[j + 1].
_PADDED_EDGES = np.concatenate([[0.0], records.LOG_EDGES, [np.inf]])


def summary_chunks(items):
    """Returns the chunks in which `group_summary` summarises `items` (see `assemble.summary_chunks`).

    Args:
      items: a list of `(tensor, divisor)`; divisor is None or a float64 scalar.

    Returns:
      A list of `(indices into items, divisor)`.
    """
    keys = [(t.shape.num_elements(), t.dtype, id(divisor)) for t, divisor in items]
    return [(indices, items[indices[0]][1]) for indices in assemble.summary_chunks(keys)]


def group_summary(tensors, divisor=None, buckets=records.HISTOGRAM_BUCKETS):
    """Returns `(histograms [R, k, 3], stats [R, STATS_LENGTH])` of R tensors, on device.

    Row r is `summaries.linear_histogram` and `summaries.stats_vector` of
    `tensors[r]`: histogram edges, counts and bins exactly, mean, std and sum
    to float64 rounding (the order of additions differs from numpy's).

    Args:
      tensors: floating-point tensors with the same number of elements and
        dtype (float16 and bfloat16 widen exactly).
      divisor: None, or a float64 scalar that the widened values are divided
        by first (the loss scale; a power of two divides exactly).
      buckets: the number of linear histogram buckets.
    """
    x = (
        tf.concat([tf.reshape(t, [1, -1]) for t in tensors], 0)
        if len(tensors) > 1
        else tf.reshape(tensors[0], [1, -1])
    )
    if divisor is None and x.dtype in _FLOAT32_EXACT:
        exact = tf.cast(x, tf.float32)  # min, max and comparisons are cheaper in float32
        v = tf.cast(exact, tf.float64)
        float32_values = True
    else:
        v = tf.cast(x, tf.float64)
        if divisor is not None:
            v = divide(v, divisor)
        exact, float32_values = v, False
    rows = len(tensors)
    count = tf.cast(tf.shape(v)[1], tf.int64)
    zeros = tf.math.count_nonzero(tf.equal(exact, 0), axis=1)
    total = tf.reduce_sum(v, axis=1)
    # Any NaN or Inf makes its row's sum non-finite (and finite values cannot
    # overflow a float64 sum from float32 data; if they did, the masked branch
    # below is still right). The usual case needs no masks.
    all_finite = tf.reduce_all(tf.math.is_finite(total))

    def statistics(masked):
        return lambda: _row_statistics(
            v, exact, total, count, zeros, rows, buckets, masked, float32_values
        )

    nonfinite, low, high, total, squares, linear, magnitude = tf.cond(
        all_finite, statistics(False), statistics(True)
    )
    nans, pos_inf, neg_inf = tf.unstack(nonfinite, axis=1)
    n = tf.cast(count, tf.float64) - nans - pos_inf - neg_inf
    has_values = n > 0
    nan = tf.constant(np.nan, tf.float64)
    n_or_one = tf.maximum(n, 1.0)
    head = tf.stack(
        [
            tf.fill([rows], tf.cast(count, tf.float64)),
            tf.cast(zeros, tf.float64),
            nans,
            pos_inf,
            neg_inf,
            tf.where(has_values, low, nan),
            tf.where(has_values, high, nan),
            tf.where(has_values, total / n_or_one, nan),
            tf.where(has_values, tf.sqrt(squares / n_or_one), nan),
            tf.where(has_values, total, nan),
        ],
        axis=1,
    )
    stats = tf.concat([head, magnitude], 1)
    return _assemble_histograms(low, high, n, linear, buckets), stats


def _row_statistics(v, exact, total, count, zeros, rows, buckets, masked, float32_values):
    """The passes over the values of a `[rows, n]` group.

    `masked=False` assumes every value is finite; `masked=True` leaves NaN and
    ±Inf out of the extrema, the sums and both histograms.
    """
    float_count = tf.cast(count, tf.float64)
    if masked:
        finite = tf.math.is_finite(exact)
        nonfinite = tf.stack(
            [
                tf.math.count_nonzero(tf.math.is_nan(exact), axis=1),
                tf.math.count_nonzero(tf.equal(exact, np.inf), axis=1),
                tf.math.count_nonzero(tf.equal(exact, -np.inf), axis=1),
            ],
            axis=1,
        )
        nonfinite = tf.cast(nonfinite, tf.float64)
        dropped = tf.reduce_sum(nonfinite, axis=1)
        low = tf.reduce_min(tf.where(finite, exact, np.inf), axis=1)
        high = tf.reduce_max(tf.where(finite, exact, -np.inf), axis=1)
        v_or_zero = tf.where(finite, v, 0.0)
        total = tf.reduce_sum(v_or_zero, axis=1)
    else:
        nonfinite = tf.zeros([rows, 3], tf.float64)
        dropped = tf.zeros([rows], tf.float64)
        low, high = tf.reduce_min(exact, axis=1), tf.reduce_max(exact, axis=1)
        v_or_zero = v
    low, high = tf.cast(low, tf.float64), tf.cast(high, tf.float64)
    n = float_count - dropped
    has_values = n > 0
    mean = total / tf.maximum(n, 1.0)
    squares = tf.math.squared_difference(v, mean[:, None])
    if masked:
        squares = tf.where(finite, squares, 0.0)
    squares = tf.reduce_sum(squares, axis=1)

    # Linear buckets, as summaries.linear_histogram: floor((x - low) / width),
    # where x == high may give `buckets` (folded into the last bucket below).
    # Values are >= low, so the cast's truncation is the floor. A row whose
    # values are all equal (or absent) gets start = low (or 0) and width 1,
    # so every value lands in bucket 0 and no index leaves the row's range.
    spread = tf.logical_and(has_values, high - low > 0)
    width = tf.where(spread, divide(high - low, tf.constant(buckets, tf.float64)), 1.0)
    start = tf.where(has_values, low, 0.0)
    shifted = (tf.where(finite, v, start[:, None]) if masked else v) - start[:, None]
    index = tf.cast(shifted / width[:, None], tf.int32)
    linear = _row_counts(index, buckets + 1, rows)
    linear = tf.concat(
        [linear[:, : buckets - 1], tf.reduce_sum(linear[:, buckets - 1 :], axis=1, keepdims=True)],
        1,
    )
    if masked:  # the non-finite values were counted in bucket 0
        linear = linear - tf.pad(dropped[:, None], [[0, 0], [0, buckets - 1]])

    # Magnitude bins: negative values' bins 0..37, then positive values' 38..75.
    # Zeros (and masked non-finite values) land in negative bin 0 and are taken out.
    magnitude_abs = tf.abs(v_or_zero)
    if float32_values:
        estimate = tf.math.log(magnitude_abs) * _LOG_PER_LN + (_LOG_OFFSET + _LOG_NUDGE)
        bins = tf.floor(tf.clip_by_value(estimate, 0.0, records.MAGNITUDE_BINS - 1.0))
        bins = tf.cast(bins, tf.int32)
    else:
        bins = _magnitude_bins(magnitude_abs)
    bins = bins + tf.cast(v_or_zero > 0, tf.int32) * records.MAGNITUDE_BINS
    magnitude = _row_counts(bins, 2 * records.MAGNITUDE_BINS, rows)
    misplaced = tf.cast(zeros, tf.float64) + dropped
    magnitude = magnitude - tf.pad(
        misplaced[:, None], [[0, 0], [0, 2 * records.MAGNITUDE_BINS - 1]]
    )
    return nonfinite, low, high, total, squares, linear, magnitude


def _row_counts(index, length, rows):
    """Per-row counts of `index` (`[rows, n]`, values in `[0, length)`): `[rows, length]` float64."""
    if rows > 1:
        index = index + tf.range(0, rows * length, length, dtype=tf.int32)[:, None]
    counts = tf.math.bincount(
        tf.reshape(index, [-1]), minlength=rows * length, maxlength=rows * length, dtype=tf.float64
    )
    return tf.reshape(counts, [rows, length])


def _magnitude_bins(a):
    """`searchsorted(LOG_EDGES, a, side="right")` for any finite float64 `a >= 0`, exactly.

    The float32 log estimate can be one bin off next to an edge; one
    comparison each way against the exact float64 edges corrects it.
    """
    padded = tf.constant(_PADDED_EDGES, tf.float64)
    last = len(records.LOG_EDGES)
    estimate = tf.floor(tf.math.log(tf.cast(a, tf.float32)) * np.float32(_LOG_PER_LN)) + _LOG_OFFSET
    j = tf.cast(tf.clip_by_value(estimate, 0, last), tf.int32)
    j = (
        j
        - tf.cast(a < tf.gather(padded, j), tf.int32)
        + tf.cast(a >= tf.gather(padded, j + 1), tf.int32)
    )
    return tf.minimum(j, last)


def _assemble_histograms(low, high, n, counts, buckets):
    """`[R, k, 3]` TensorBoard histograms from each row's extrema and bucket counts."""
    has_values = n > 0
    spread = tf.logical_and(has_values, high - low > 0)
    width = tf.where(spread, divide(high - low, tf.constant(buckets, tf.float64)), 1.0)
    start = tf.where(spread, low, 0.0)
    edges = start[:, None] + width[:, None] * tf.range(buckets + 1, dtype=tf.float64)
    edges = tf.concat([edges[:, :-1], tf.where(spread, high, 0.0)[:, None]], 1)
    spread_histogram = tf.stack([edges[:, :-1], edges[:, 1:], counts], axis=2)
    # All values equal: every row [x, x, 0] but the last, which counts them.
    low_rows = tf.tile(tf.where(has_values, low, 0.0)[:, None], [1, buckets])
    last = tf.pad(n[:, None], [[0, 0], [buckets - 1, 0]])
    single = tf.stack([low_rows, low_rows, last], axis=2)
    choice = tf.where(spread, 2, tf.where(has_values, 1, 0))[:, None, None]
    empty = tf.zeros_like(single)
    return tf.where(choice == 2, spread_histogram, tf.where(choice == 1, single, empty))


def divide(x, y):
    """`x / y`, correctly rounded even when `y` is a constant.

    In a tf.function, Grappler rewrites division by a constant into
    multiplication by its reciprocal, which can differ in the last bit
    (span / 30 did), so bucket edges would not be `summaries.linear_histogram`'s.
    DivNoNan is not rewritten; `y` is never zero here.
    """
    return tf.math.divide_no_nan(x, y)
