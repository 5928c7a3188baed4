"""The numpy definition of each record's values: the reference every fast path matches.

`kernels` (numba, on the host) and the device statistics of each backend
compute the same records their own way and are tested against these
functions bit for bit (counts) and to a documented tolerance (sums).
`summary_from_sums` is the one place where every path's sums become records;
it is written in the subset of Python that numba compiles.
"""

import numpy as np

from tb_gradviz.format import precision
from tb_gradviz.format.records import (
    HISTOGRAM_BUCKETS,
    LOG_EDGES,
    MAGNITUDE_BINS,
    NEGATIVE_BINS,
    PRECISION_CAST_LENGTH,
    STAT_COUNT,
    STAT_MAX,
    STAT_MEAN,
    STAT_MIN,
    STAT_NAN,
    STAT_NEG_INF,
    STAT_POS_INF,
    STAT_STD,
    STAT_SUM,
    STAT_ZEROS,
    STATS_FIELDS,
    STATS_LENGTH,
    UPDATE_RATIO,
)

_FIRST_BIN = NEGATIVE_BINS.start


def linear_histogram(values, buckets=HISTOGRAM_BUCKETS):
    """Returns TensorBoard's `[k, 3]` histogram of the finite values of an array.

    Non-finite values are left out (they are counted in the stats record), so
    one NaN never wipes the histogram. Bucket `i` holds `left <= x < right`,
    the last one also `x == max`. All values equal: every row is
    `[x, x, 0]` but the last, which counts them, as in TensorBoard's own
    histogram summary. No values: all zeros.
    """
    values = np.asarray(values, dtype=np.float64).ravel()
    values = values[np.isfinite(values)]
    result = np.zeros((buckets, 3))
    if values.size == 0:
        return result
    low, high = values.min(), values.max()
    if low == high:
        result[:, :2] = low
        result[-1, 2] = values.size
        return result
    width = (high - low) / buckets
    index = np.minimum(np.floor((values - low) / width).astype(np.int64), buckets - 1)
    edges = low + width * np.arange(buckets + 1)
    edges[-1] = high
    result[:, 0] = edges[:-1]
    result[:, 1] = edges[1:]
    result[:, 2] = np.bincount(index, minlength=buckets)
    return result


def stats_vector(values):
    """Returns the float64 stats record (`STATS_LENGTH` values) of an array."""
    values = np.asarray(values, dtype=np.float64).ravel()
    finite = values[np.isfinite(values)]
    head = np.full(len(STATS_FIELDS), np.nan)
    head[: STAT_NEG_INF + 1] = [
        values.size,
        np.count_nonzero(values == 0),
        np.count_nonzero(np.isnan(values)),
        np.count_nonzero(values == np.inf),
        np.count_nonzero(values == -np.inf),
    ]
    if finite.size:
        head[STAT_MIN:] = [finite.min(), finite.max(), finite.mean(), finite.std(), finite.sum()]
    nonzero = finite[finite != 0]
    bins = np.searchsorted(LOG_EDGES, np.abs(nonzero), side="right")
    negative = np.bincount(bins[nonzero < 0], minlength=MAGNITUDE_BINS)
    positive = np.bincount(bins[nonzero > 0], minlength=MAGNITUDE_BINS)
    return np.concatenate([head, negative, positive]).astype(np.float64)


def summary_from_sums(
    n, zeros, nans, pos_inf, neg_inf, low, high, total, squares, linear, magnitude, buckets
):
    """Returns `(linear_histogram, stats_vector)` from a tensor's sums and counts.

    What every fast path computes in its own way (numba on the host, grouped
    ops on a device) and then assembles here: `n` elements, of which `zeros`
    exact zeros and `nans`, `pos_inf`, `neg_inf`; the extrema, the sum and
    the sum of squared deviations from the mean of the finite values; the
    linear bucket counts (`floor((x - low) / width)`, the last bucket also
    holding `high`) and the magnitude counts (`2 * MAGNITUDE_BINS`, negative
    then positive), where the zeros are still in negative bin 0. Written in
    the subset of Python that numba compiles (kernels.py compiles it).
    """
    stats = np.zeros(STATS_LENGTH)
    stats[STAT_COUNT] = n
    stats[STAT_ZEROS] = zeros
    stats[STAT_NAN] = nans
    stats[STAT_POS_INF] = pos_inf
    stats[STAT_NEG_INF] = neg_inf
    stats[_FIRST_BIN:] = magnitude
    stats[_FIRST_BIN] -= zeros
    histogram = np.zeros((buckets, 3))
    finite = n - nans - pos_inf - neg_inf
    if finite == 0:
        stats[STAT_MIN:_FIRST_BIN] = np.nan
        return histogram, stats
    stats[STAT_MIN] = low
    stats[STAT_MAX] = high
    stats[STAT_MEAN] = total / finite
    stats[STAT_STD] = np.sqrt(squares / finite)
    stats[STAT_SUM] = total
    if high > low:
        width = (high - low) / buckets
        for j in range(buckets):
            histogram[j, 0] = low + width * j
            histogram[j, 1] = low + width * (j + 1)
            histogram[j, 2] = linear[j]
        histogram[buckets - 1, 1] = high
    else:  # all equal: every row [x, x, 0] but the last, which counts them
        histogram[:, 0] = low
        histogram[:, 1] = low
        histogram[buckets - 1, 2] = finite
    return histogram, stats


def update_sums(current, previous):
    """Returns `(sum(current**2), sum((current - previous)**2))` in float64.

    The squared norms of an update record.
    """
    current = np.asarray(current, dtype=np.float64)
    delta = current - np.asarray(previous, dtype=np.float64)
    return float(np.sum(current * current)), float(np.sum(delta * delta))


def update_vector(weight_norm, update_norm, interval):
    """Returns a weight's update record from its norm, its change's norm and the steps between."""
    weight_norm, update_norm = float(weight_norm), float(update_norm)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.float64(update_norm) / np.float64(weight_norm)
    return np.array([weight_norm, update_norm, ratio, interval], dtype=np.float64)


def combined_update_ratio(weight_norms, update_norms):
    """The update ratio of several weights taken as one vector (a layer's).

    `|all updates| / |all weights|`.
    """
    weight = float(np.sqrt(np.sum(np.square(np.asarray(weight_norms, dtype=np.float64)))))
    update = float(np.sqrt(np.sum(np.square(np.asarray(update_norms, dtype=np.float64)))))
    return float(update_vector(weight, update, 0)[UPDATE_RATIO])


# Pooling only moves gradient, so the sums on both sides of a pooling layer
# agree up to the rounding of the gradient's dtype (overlapping windows add in
# it, an average pool divides in it): within MASS_TOLERANCE_UNITS units of
# roundoff of sum(|output gradient|).
_UNIT_ROUNDOFF = {
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float32": 2.0**-24,
    "float64": 2.0**-53,
}


MASS_TOLERANCE_UNITS = 32


def mass_conservation(routing, dtype):
    """Returns the verdict on a routing record: did pooling keep the gradient's mass?

    The one judgement that `/routing`, `/step`, the tab and `tb-gradviz
    summary` all show. The difference of the two sums is judged against
    `output_gradient_abs_sum`, not against the sums, which BatchNorm makes
    cancel to almost zero.

    Args:
      routing: a decoded routing record (`decode_routing`).
      dtype: the layer's dtype name, which sets the rounding allowed
        (float32 when unknown).

    Returns:
      `{"difference", "relative", "tolerance", "conserved"}`: input minus
      output sum, its size relative to `output_gradient_abs_sum`, the largest
      relative size allowed, and the verdict: True, False, or None when the
      record predates `output_gradient_abs_sum` (nothing to judge against).
    """
    difference = routing["input_gradient_sum"] - routing["output_gradient_sum"]
    tolerance = MASS_TOLERANCE_UNITS * _UNIT_ROUNDOFF.get(dtype, _UNIT_ROUNDOFF["float32"])
    scale = routing["output_gradient_abs_sum"]
    if not (np.isfinite(scale) and np.isfinite(difference)):
        # No scale (a record from before it): nothing to judge against. A
        # non-finite difference: the mass is not conserved.
        return {
            "difference": difference,
            "relative": float("nan"),
            "tolerance": tolerance,
            "conserved": False if np.isfinite(scale) else None,
        }
    relative = abs(difference) / scale if scale > 0 else (0.0 if difference == 0 else float("inf"))
    return {
        "difference": difference,
        "relative": relative,
        "tolerance": tolerance,
        "conserved": relative <= tolerance,
    }


def precision_from_below(finite, zeros, below, exponents):
    """Returns the cast part of the precision record (`PRECISION_CAST_LENGTH` fields) from counts
    of values below each boundary; the block part (`blocks.record_fields`) follows it.

    Written in the subset of Python that numba compiles (precision_counts compiles it).

    Args:
      finite: the number of finite values; `zeros`: of them, exact zeros.
      below: per boundary of `precision.boundary_table`, in its order, the
        number of finite values whose magnitude is below it (on its side).
      exponents: the scale exponent of each format (`precision.scale_exponent`).
    """
    vector = np.zeros(PRECISION_CAST_LENGTH)
    vector[0] = finite - zeros
    formats = exponents.size
    for f in range(formats):
        vector[1 + f] = exponents[f]
    for j in range(below.size // 3):  # per setting and format: zero, normal, overflow
        at = 1 + formats + 3 * j
        vector[at] = below[3 * j] - zeros
        vector[at + 1] = below[3 * j + 1] - below[3 * j]
        vector[at + 2] = finite - below[3 * j + 2]
    return vector


def precision_vector(values):
    """Returns the cast part of the float64 precision record (`PRECISION_FIELDS` up to
    `PRECISION_CAST_LENGTH`) of an array, as captured.

    The values are not divided by a loss scale: the record says what a
    cast of the tensor as the pass computed it would do.
    """
    values = np.asarray(values, dtype=np.float64).ravel()
    magnitudes = np.abs(values[np.isfinite(values)])
    amax = magnitudes.max() if magnitudes.size else 0.0
    bounds, inclusive = precision.boundary_table(amax)
    below = np.array(
        [
            np.count_nonzero(magnitudes <= b) if side else np.count_nonzero(magnitudes < b)
            for b, side in zip(bounds, inclusive)
        ]
    )
    exponents = np.array([precision.scale_exponent(amax, name) for name in precision.FORMATS])
    return precision_from_below(
        magnitudes.size, np.count_nonzero(magnitudes == 0), below, exponents
    )
