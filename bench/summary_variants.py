"""Variants of `capture.tensor_summary`, to measure a proposed change without editing capture.py.

`capture.py` is owned by someone else while this is measured; the bench
scripts swap `capture.tensor_summary` (looked up at trace time by
`LayerCapture._probe_fn`) for one of these with `--summary NAME`.

- `current`: capture.py as it is.
- `fast`: the proposal. Same records, bit for bit (checked by
  `check_exact`), fewer and cheaper passes over each tensor:
  * no `tf.boolean_mask` (4 per tensor now; each is a compaction with a
    dynamic shape, ~8 ms per 1.2 M float64 values here): non-finite values
    are replaced by 0 or +-inf where a reduction needs it, and sent to an
    extra, dropped bucket in the histograms;
  * no `tf.searchsorted` (~12 ms per 1.2 M values: a binary search per
    value): since LOG_EDGES[k] = 10 ** ((k - 24) / 2), the bin is
    floor(2 log10 |x|) + 25, computed in float32 and corrected by one
    comparison each way against the exact float64 edges;
  * one bincount for both signs' magnitude bins instead of two over masks.
- `fast_xla`: `fast` in a nested `tf.function(jit_compile=True)`, so XLA
  fuses the element-wise passes (bincount with a constant size, as XLA needs).
- `null`: no statistics at all (one sum per tensor): the floor that the
  forward+backward pass and the gradient plumbing cost by themselves.
"""

import numpy as np
import tensorflow as tf

from tb_gradviz import capture
from tb_gradviz import format as fmt

_BINS = fmt.MAGNITUDE_BINS
# Edges padded with 0 below and +inf above, so that bin j is right iff
# PADDED[j] <= a < PADDED[j + 1] for every j in 0..len(LOG_EDGES).
_PADDED_EDGES = np.concatenate([[0.0], fmt.LOG_EDGES, [np.inf]])


def magnitude_bins(a):
    """`searchsorted(LOG_EDGES, a, side="right")` for finite `a >= 0` (float64), exactly."""
    padded = tf.constant(_PADDED_EDGES, tf.float64)
    last = len(fmt.LOG_EDGES)
    offset = -fmt.LOG_MIN_EXPONENT * fmt.LOG_BINS_PER_DECADE + 1
    per_ln = np.float32(fmt.LOG_BINS_PER_DECADE / np.log(10.0))
    # float32 log: a value next to an edge may come out one bin off, which
    # the two comparisons below correct; 0 and tiny values give -inf -> bin 0.
    estimate = tf.floor(tf.math.log(tf.cast(a, tf.float32)) * per_ln) + offset
    j = tf.cast(tf.clip_by_value(estimate, 0, last), tf.int32)
    j = j - tf.cast(a < tf.gather(padded, j), tf.int32) + tf.cast(a >= tf.gather(padded, j + 1), tf.int32)
    return tf.minimum(j, last)


def _counts(index, length, constant_size):
    if constant_size:  # XLA needs the output size as a constant
        return tf.raw_ops.DenseBincount(input=index, size=length, weights=tf.zeros([0], tf.float64))
    return tf.math.bincount(index, minlength=length, maxlength=length, dtype=tf.float64)


def _core(v, buckets, constant_size):
    """The passes over the values: `(head, magnitude counts, bucket counts)`."""
    count = tf.size(v, out_type=tf.int64)
    finite = tf.math.is_finite(v)
    n = tf.math.count_nonzero(finite)
    zeros = tf.math.count_nonzero(tf.equal(v, 0.0))
    nans = tf.math.count_nonzero(tf.math.is_nan(v))
    pos_inf = tf.math.count_nonzero(tf.equal(v, np.inf))
    neg_inf = count - n - nans - pos_inf
    has_values = n > 0
    nan = tf.constant(np.nan, tf.float64)
    finite_or_zero = tf.where(finite, v, 0.0)
    low = tf.where(has_values, tf.reduce_min(tf.where(finite, v, np.inf)), nan)
    high = tf.where(has_values, tf.reduce_max(tf.where(finite, v, -np.inf)), nan)
    total = tf.reduce_sum(finite_or_zero)
    n_float = tf.cast(tf.maximum(n, 1), tf.float64)
    mean = tf.where(has_values, total / n_float, nan)
    squares = tf.where(finite, tf.square(v - mean), 0.0)
    std = tf.where(has_values, tf.sqrt(tf.reduce_sum(squares) / n_float), nan)
    total = tf.where(has_values, total, nan)
    head = tf.stack([tf.cast(c, tf.float64) for c in (count, zeros, nans, pos_inf, neg_inf)] + [low, high, mean, std, total])

    # Negative bins 0..37, positive 38..75; zeros and non-finite values go to 76, dropped.
    bins = magnitude_bins(tf.abs(finite_or_zero)) + tf.cast(v > 0, tf.int32) * _BINS
    bins = tf.where(tf.logical_and(finite, tf.not_equal(v, 0.0)), bins, 2 * _BINS)
    magnitude = _counts(bins, 2 * _BINS + 1, constant_size)[: 2 * _BINS]

    spread = tf.logical_and(has_values, high - low > 0)
    width = tf.where(spread, (high - low) / buckets, 1.0)
    index = tf.cast(tf.floor((finite_or_zero - tf.where(spread, low, 0.0)) / width), tf.int32)
    index = tf.where(finite, tf.clip_by_value(index, 0, buckets - 1), buckets)  # non-finite: dropped
    return head, magnitude, _counts(index, buckets + 1, constant_size)[:buckets]


def _assemble(head, magnitude, counts, buckets):
    """The records from the core's results (a few scalar ops, kept out of XLA:
    its fused multiply-add would round the bucket edges differently)."""
    low, high, n = head[5], head[6], head[0] - head[2] - head[3] - head[4]
    has_values = n > 0
    spread = tf.logical_and(has_values, high - low > 0)
    width = tf.where(spread, (high - low) / buckets, 1.0)
    start = tf.where(spread, low, 0.0)
    edges = start + width * tf.range(buckets + 1, dtype=tf.float64)
    edges = tf.concat([edges[:-1], tf.reshape(tf.where(spread, high, 0.0), [1])], 0)
    spread_histogram = tf.stack([edges[:-1], edges[1:], counts], axis=1)
    first = tf.concat([tf.reshape(n, [1]), tf.zeros([buckets - 1], tf.float64)], 0)
    single = tf.stack([tf.fill([buckets], low), tf.fill([buckets], low), first], axis=1)
    histogram = tf.where(spread, spread_histogram, tf.where(has_values, single, tf.zeros([buckets, 3], tf.float64)))
    return [histogram, tf.concat([head, magnitude], 0)]


def _widen(t, divisor):
    v = tf.reshape(tf.cast(t, tf.float64), [-1])
    return v if divisor is None else v / divisor


def fast_tensor_summary(t, buckets=fmt.HISTOGRAM_BUCKETS, divisor=None):
    """Same contract and results as `capture.tensor_summary`, without masks or searches."""
    return _assemble(*_core(_widen(t, divisor), buckets, constant_size=False), buckets)


@tf.function(jit_compile=True, autograph=False)
def _xla_core(t):
    return _core(_widen(t, None), fmt.HISTOGRAM_BUCKETS, constant_size=True)


@tf.function(jit_compile=True, autograph=False)
def _xla_core_scaled(t, divisor):
    return _core(_widen(t, divisor), fmt.HISTOGRAM_BUCKETS, constant_size=True)


def fast_xla_tensor_summary(t, buckets=fmt.HISTOGRAM_BUCKETS, divisor=None):
    if buckets != fmt.HISTOGRAM_BUCKETS:
        raise ValueError(f"fast_xla is compiled for {fmt.HISTOGRAM_BUCKETS} buckets; received {buckets}")
    core = _xla_core(t) if divisor is None else _xla_core_scaled(t, divisor)
    return _assemble(*core, buckets)


def null_tensor_summary(t, buckets=fmt.HISTOGRAM_BUCKETS, divisor=None):
    """Not a summary: one sum per tensor, so the gradient is still computed."""
    total = tf.reduce_sum(tf.cast(t, tf.float64))
    return [tf.fill([buckets, 3], total), tf.fill([fmt.STATS_LENGTH], total)]


VARIANTS = {
    "current": capture.tensor_summary,
    "fast": fast_tensor_summary,
    "fast_xla": fast_xla_tensor_summary,
    "null": null_tensor_summary,
}


def use(name):
    """Makes `LayerCapture` trace with the variant `name` from now on."""
    capture.tensor_summary = VARIANTS[name]


def check_exact(name, seed=0):
    """Asserts the variant gives format's numpy reference records, on awkward values."""
    fn = tf.function(VARIANTS[name], autograph=False)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((4, 9, 9, 5)).astype(np.float32)
    a[a < 0.3] = 0
    a.flat[:10] = [np.nan, np.inf, -np.inf, 1e-13, -2e7, 1e-12, 10**-0.5, np.float32(10**-0.5), -1e6, 3.1622776e-3]
    cases = [a, np.zeros(7, np.float32), np.full(5, np.nan, np.float32), np.full(6, 2.5, np.float32),
             (rng.standard_normal(1000) * 10.0 ** rng.uniform(-14, 8, 1000)).astype(np.float32)]
    for array in cases:
        histogram, stats = [o.numpy() for o in fn(tf.constant(array))]
        expected = fmt.stats_vector(array)
        np.testing.assert_array_equal(histogram, fmt.linear_histogram(array))
        np.testing.assert_array_equal(stats[:7], expected[:7])
        np.testing.assert_array_equal(stats[10:], expected[10:])
        np.testing.assert_allclose(stats[7:10], expected[7:10], rtol=1e-9)
