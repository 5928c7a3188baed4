"""Variants of capture's statistics, to measure them against alternatives.

The bench scripts pick one with `--summary NAME` before the pass is traced:
where the statistics are computed (`backends.tensorflow.default_statistics`, looked up
when a `LayerCapture` is made) and, on the device, which statistics function
(`tf_statistics.compiled`, looked up at trace time by `LayerCapture._probe_fn`). A device
variant takes `(groups, scaled, mode)` and returns a function of `(tensors, divisor)` that
returns `device_statistics.chunk_statistics`' list of dicts.

- `current`: capture as it is on this machine (on a CPU: the tensors
  leave the pass and `kernels` summarises each in two fused passes).
- `device`: the device statistics, what it runs on an accelerator
  (`device_statistics`: grouped tensors, comparison counts, compiled by XLA).
- `null`: no statistics at all (one sum per tensor): the floor that the
  forward+backward pass and the gradient plumbing cost by themselves.

The per-tensor `previous` variant (boolean masks, searchsorted and bincount per
tensor) is gone with the statistics it measured against; git has it.
"""

import numpy as np
import tensorflow as tf

from tb_gradviz.capture import assemble, device_statistics, kernels
from tb_gradviz.capture.backends import tensorflow as tf_capture
from tb_gradviz.capture.backends import tf_statistics
from tb_gradviz.format import records, summaries


def null_statistics(groups, scaled, mode=None, widths=None):
    """Not a summary: one sum per tensor, so the gradient is still computed (no precision or
    block counts, whatever `widths` asks: `tf_statistics.compiled`'s arguments)."""

    def statistics(tensors, divisor):
        result = []
        for indices in groups:
            totals = tf.stack([tf.reduce_sum(tf.cast(tensors[i], tf.float64)) for i in indices])
            counts = tf.zeros_like(totals, tf.int32)
            row = dict.fromkeys(("zeros", "nans", "pos_inf", "neg_inf"), counts)
            row.update(dict.fromkeys(device_statistics.SUMS, totals))
            row["linear"] = tf.zeros([len(indices), records.HISTOGRAM_BUCKETS], tf.int32)
            row["magnitude"] = tf.zeros([len(indices), 2 * records.MAGNITUDE_BINS], tf.int32)
            result.append(row)
        return result

    return statistics


_DEFAULT_STATISTICS = tf_capture.default_statistics


def _host_statistics(tensors, divisor=None):
    """What the host path computes, on numpy arrays (for `check_exact`)."""
    return kernels.summaries((np.asarray(t), divisor) for t in tensors)


def _device_statistics(compiled):
    def statistics(tensors, divisor=None):
        groups = [list(range(len(tensors)))]
        results = compiled(groups, [divisor is not None] * len(tensors), "stepped")(
            [tf.constant(t) for t in tensors], tf.constant(divisor or 1.0, tf.float64)
        )
        rows = device_statistics.tensor_rows(groups, results, [np.size(t) for t in tensors])
        return [assemble.summary_of_row(row) for row in rows]

    return statistics


# name -> (where, device statistics)
VARIANTS = {
    "current": (None, tf_statistics.compiled),
    "device": ("device", tf_statistics.compiled),
    "null": ("device", null_statistics),
}


def use(name):
    """Makes the next `LayerCapture`s summarise with the variant `name`."""
    where, compiled = VARIANTS[name]
    tf_capture.default_statistics = _DEFAULT_STATISTICS if where is None else (lambda: where)
    tf_statistics.compiled = compiled


def check_exact(name, seed=0):
    """Asserts the variant gives records' numpy reference records, on awkward values."""
    where, compiled = VARIANTS[name]
    if (where or _DEFAULT_STATISTICS()) == "host":
        fn = _host_statistics
    else:
        fn = _device_statistics(compiled)
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
        rows = fn(group)
        for r, array in enumerate(group):
            histogram, stats = rows[r][:2]
            expected = summaries.stats_vector(array)
            np.testing.assert_array_equal(histogram, summaries.linear_histogram(array))
            summed = records.SUMMED_STATS
            np.testing.assert_array_equal(stats[: summed.start], expected[: summed.start])
            np.testing.assert_array_equal(stats[summed.stop :], expected[summed.stop :])
            np.testing.assert_allclose(stats[summed], expected[summed], rtol=1e-9)
