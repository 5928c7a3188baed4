"""Variants of capture's statistics, to measure them against alternatives.

The bench scripts pick one with `--summary NAME` before the pass is traced:
where the statistics are computed (`backends.tensorflow.default_statistics`, looked up
when a `LayerCapture` is made) and, on the device, which `group_summary`
(looked up at trace time by `LayerCapture._probe_fn`). A device variant
takes `(tensors, divisor=None, buckets=30)`, tensors of one size and dtype,
and returns `(histograms [R, k, 3], stats [R, STATS_LENGTH])`.

- `current`: the capture as it runs on the machine at hand (on a CPU: the tensors
  leave the pass and `kernels` summarises each in two fused passes).
- `device`: the TensorFlow backend's device statistics, what it runs on an
  accelerator (grouped tensors, row-wise ops, no masks unless a value is NaN
  or Inf, magnitude bins from a float64 log).
- `previous`: the device statistics before the grouping (commit 2610232): per tensor,
  `tf.boolean_mask` of the finite and non-zero values, `tf.searchsorted` for
  the magnitude bins, ~70 ops per tensor.
- `null`: no statistics at all (one sum per tensor): the floor that the
  forward+backward pass and the gradient plumbing cost by themselves.
"""

import numpy as np
import tensorflow as tf

from tb_gradviz.capture import kernels
from tb_gradviz.capture.backends import tensorflow as tf_capture
from tb_gradviz.capture.backends import tf_statistics
from tb_gradviz.format import records, summaries


def _previous_tensor_summary(t, buckets, divisor):
    v = tf.reshape(tf.cast(t, tf.float64), [-1])
    if divisor is not None:
        v = tf_statistics.divide(v, divisor)
    count = tf.size(v, out_type=tf.int64)
    zeros = tf.math.count_nonzero(tf.equal(v, 0.0))
    nans = tf.math.count_nonzero(tf.math.is_nan(v))
    pos_inf = tf.math.count_nonzero(tf.equal(v, np.inf))
    neg_inf = tf.math.count_nonzero(tf.equal(v, -np.inf))
    finite = tf.boolean_mask(v, tf.math.is_finite(v))
    n = tf.size(finite, out_type=tf.int64)
    has_values = n > 0
    nan = tf.constant(np.nan, tf.float64)
    low = tf.where(has_values, tf.reduce_min(finite), nan)
    high = tf.where(has_values, tf.reduce_max(finite), nan)
    total = tf.reduce_sum(finite)
    mean = tf.where(has_values, total / tf.cast(tf.maximum(n, 1), tf.float64), nan)
    std = tf.where(has_values, tf.sqrt(tf.reduce_mean(tf.square(finite - mean))), nan)
    total = tf.where(has_values, total, nan)
    head = tf.stack(
        [tf.cast(c, tf.float64) for c in (count, zeros, nans, pos_inf, neg_inf)]
        + [low, high, mean, std, total]
    )

    def bincount(indices, length):
        return tf.math.bincount(
            tf.cast(indices, tf.int32), minlength=length, maxlength=length, dtype=tf.float64
        )

    nonzero = tf.boolean_mask(finite, tf.not_equal(finite, 0.0))
    bins = tf.searchsorted(
        tf.constant(records.LOG_EDGES, tf.float64), tf.abs(nonzero), side="right"
    )
    stats = tf.concat(
        [
            head,
            bincount(tf.boolean_mask(bins, nonzero < 0), records.MAGNITUDE_BINS),
            bincount(tf.boolean_mask(bins, nonzero > 0), records.MAGNITUDE_BINS),
        ],
        0,
    )

    span = high - low
    spread = tf.logical_and(n > 0, span > 0)
    width = tf.where(spread, tf_statistics.divide(span, tf.constant(buckets, tf.float64)), 1.0)
    index = tf.clip_by_value(
        tf.cast(tf.floor((finite - tf.where(spread, low, 0.0)) / width), tf.int64), 0, buckets - 1
    )
    edges = tf.where(spread, low, 0.0) + width * tf.range(buckets + 1, dtype=tf.float64)
    edges = tf.concat([edges[:-1], tf.reshape(tf.where(spread, high, 0.0), [1])], 0)
    spread_histogram = tf.stack([edges[:-1], edges[1:], bincount(index, buckets)], axis=1)
    first = tf.concat(
        [tf.reshape(tf.cast(n, tf.float64), [1]), tf.zeros([buckets - 1], tf.float64)], 0
    )
    single = tf.stack([tf.fill([buckets], low), tf.fill([buckets], low), first], axis=1)
    histogram = tf.where(
        spread, spread_histogram, tf.where(n > 0, single, tf.zeros([buckets, 3], tf.float64))
    )
    return histogram, stats


def previous_group_summary(tensors, divisor=None, buckets=records.HISTOGRAM_BUCKETS):
    rows = [_previous_tensor_summary(t, buckets, divisor) for t in tensors]
    return tf.stack([h for h, _ in rows]), tf.stack([s for _, s in rows])


def null_group_summary(tensors, divisor=None, buckets=records.HISTOGRAM_BUCKETS):
    """Not a summary: one sum per tensor, so the gradient is still computed."""
    totals = tf.stack([tf.reduce_sum(tf.cast(t, tf.float64)) for t in tensors])
    return tf.tile(totals[:, None, None], [1, buckets, 3]), tf.tile(
        totals[:, None], [1, records.STATS_LENGTH]
    )


_DEFAULT_STATISTICS = tf_capture.default_statistics


def _host_group_summary(tensors, divisor=None, buckets=records.HISTOGRAM_BUCKETS):
    """What the host path computes, on numpy arrays (for `check_exact`)."""
    rows = kernels.summaries((np.asarray(t), divisor) for t in tensors)
    return np.stack([h for h, _ in rows]), np.stack([s for _, s in rows])


# name -> (where, device group_summary)
VARIANTS = {
    "current": (None, tf_statistics.group_summary),
    "device": ("device", tf_statistics.group_summary),
    "previous": ("device", previous_group_summary),
    "null": ("device", null_group_summary),
}


def use(name):
    """Makes the next `LayerCapture`s summarise with the variant `name`."""
    where, group_summary = VARIANTS[name]
    tf_capture.default_statistics = _DEFAULT_STATISTICS if where is None else (lambda: where)
    tf_statistics.group_summary = group_summary


def check_exact(name, seed=0):
    """Asserts the variant gives records' numpy reference records, on awkward values."""
    where, group_summary = VARIANTS[name]
    if (where or _DEFAULT_STATISTICS()) == "host":
        fn = _host_group_summary
    else:
        fn = tf.function(group_summary, autograph=False)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((4, 9, 9, 5)).astype(np.float32)
    a[a < 0.3] = 0
    a.flat[:10] = [
        np.nan,
        np.inf,
        -np.inf,
        1e-13,
        -2e7,
        1e-12,
        10**-0.5,
        np.float32(10**-0.5),
        -1e6,
        3.1622776e-3,
    ]
    groups = [
        [a, rng.standard_normal(a.shape).astype(np.float32)],
        [np.zeros(7, np.float32)],
        [np.full(5, np.nan, np.float32), np.full(5, 2.5, np.float32)],
        [(rng.standard_normal(1000) * 10.0 ** rng.uniform(-14, 8, 1000)).astype(np.float32)],
    ]
    for group in groups:
        histograms, stats = [np.asarray(o) for o in fn([tf.constant(array) for array in group])]
        for r, array in enumerate(group):
            expected = summaries.stats_vector(array)
            np.testing.assert_array_equal(histograms[r], summaries.linear_histogram(array))
            summed = records.SUMMED_STATS
            np.testing.assert_array_equal(stats[r, : summed.start], expected[: summed.start])
            np.testing.assert_array_equal(stats[r, summed.stop :], expected[summed.stop :])
            np.testing.assert_allclose(stats[r, summed], expected[summed], rtol=1e-9)
