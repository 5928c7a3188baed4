"""The per-tensor counts of the device statistics: what each compares, and how a mask is counted.

`device_statistics` reads a group of tensors twice; each read hands the counts its values as
`Rows` (`[R, 1, n]` per value, `[R, 1, 1]` per row). A count (`Count`) is the reduction of a
comparison (`sum(values >= threshold)`, `sum(bucket == j)`): no scatter, no sort, no
searchsorted. `FIRST_PASS_COUNTS` see the values; `SECOND_PASS_COUNTS` also each row's extrema,
mean and precision keys. `count_all` reduces them, some thresholds at a time, and
`magnitude_bins` turns the cumulative counts against `records.LOG_EDGES` into bins. Written in
`keras.ops`, for every backend.
"""

import dataclasses
import functools

import keras
import numpy as np

from tb_gradviz.capture import device_precision
from tb_gradviz.format import records

ops = keras.ops


@dataclasses.dataclass
class Rows:
    """A group's values, as the counts see them.

    Per-value fields are `[R, 1, n]`, per-row fields `[R, 1, 1]`, so that a
    mask compares them with thresholds shaped `[1, T, 1]` into `[R, T, n]`.
    """

    values: object  # float64, divided by the loss scale where it applies
    finite: object  # bool
    finite_values: object  # float64: the values, 0 where not finite
    bits: object  # int: `device_precision.magnitude_bits` of the values as captured
    bits_width: int  # 32 or 64: the width of `bits`
    signed_bits: object  # int: `device_precision.float_bits`, the sign included
    buckets: int = records.HISTOGRAM_BUCKETS
    low: object = None  # second pass: the finite minimum (+inf without finite values)
    high: object = None  # second pass: the finite maximum (-inf without finite values)
    mean: object = None  # second pass: the mean of the finite values
    scaled_keys: object = None  # second pass: `device_precision.scaled_keys`, `[R, 12]`

    @functools.cached_property
    def linear_bucket(self):
        """Each value's bucket `floor((v - low) / width)`, at most the last; -1 if not finite."""
        spread = ops.greater(self.high, self.low)
        width = ops.where(spread, device_precision.divide(self.high - self.low, self.buckets), 1.0)
        start = ops.where(spread, self.low, 0.0)
        shifted = ops.where(self.finite, self.values, start) - start
        # The quotient is >= 0 wherever it is used, so truncation is its floor;
        # clipping to integers first keeps the cast in range and commutes with it.
        quotient = ops.clip(
            device_precision.divide(shifted, width, like=shifted), 0.0, self.buckets - 1.0
        )
        return ops.where(self.finite, ops.cast(quotient, "int32"), -1)


@dataclasses.dataclass(frozen=True)
class Count:
    """A per-tensor count: the values for which `mask(rows, thresholds)` holds.

    Attributes:
      name: the key of the count in each tensor's row.
      mask: `(Rows, thresholds) -> bool [R, T, n]` (or `[R, 1, n]` without
        thresholds); `thresholds` is a `[1, T, 1]` or `[R, T, 1]` tensor, or None.
      thresholds: None for one count, or a function of the `Rows` that returns
        a 1-D numpy array (float64: the same thresholds for every row) or a
        `[1, T]` or `[R, T]` tensor (per row): one count per threshold.
    """

    name: str
    mask: object
    thresholds: object = None


def _log_edges(rows):
    return records.LOG_EDGES


def _below(rows, keys):
    return ops.less(rows.bits, keys)


def _signed(rows, compare):
    """`compare(bits, 0)`: `<= 0` are the negative values and +-0, `> 0` the positive ones."""
    return compare(rows.signed_bits, ops.zeros_like(rows.signed_bits))


FIRST_PASS_COUNTS = (
    Count("zeros", lambda r, _: ops.equal(r.bits, ops.zeros_like(r.bits))),
    Count("nans", lambda r, _: ops.isnan(r.values)),
    Count("pos_inf", lambda r, _: ops.equal(r.values, np.inf)),
    Count("neg_inf", lambda r, _: ops.equal(r.values, -np.inf)),
    # The magnitude bins: negative side with the zeros (in its bin 0), positive side.
    Count("nonpositive", lambda r, _: ops.logical_and(r.finite, _signed(r, ops.less_equal))),
    Count("positive", lambda r, _: ops.logical_and(r.finite, _signed(r, ops.greater))),
    Count("negative_at_least", lambda r, t: ops.less_equal(r.finite_values, -t), _log_edges),
    Count("positive_at_least", lambda r, t: ops.greater_equal(r.finite_values, t), _log_edges),
    # The zeros, then the values below each precision boundary, as captured.
    Count("precision_as_is", _below, lambda r: device_precision.as_is_keys(r.bits_width)),
)

SECOND_PASS_COUNTS = (
    Count(
        "linear",
        lambda r, t: ops.equal(r.linear_bucket, ops.cast(t, "int32")),
        lambda r: np.arange(r.buckets),
    ),
    Count("precision_scaled", _below, lambda r: r.scaled_keys),
)

# The counts of the precision record, which `precision=False` leaves out.
PRECISION_COUNTS = ("precision_as_is", "precision_scaled")


def count_all(rows, counts, thresholds_at_once=None):
    """`{name: [R] or [R, T]}` of each `Count`, `thresholds_at_once` thresholds at a time."""
    result = {}
    for count in counts:
        if count.thresholds is None:
            result[count.name] = _count_true(count.mask(rows, None))[:, 0]
            continue
        thresholds = count.thresholds(rows)
        if isinstance(thresholds, np.ndarray):
            thresholds = ops.convert_to_tensor(thresholds.astype(np.float64)[None, :])
        total = thresholds.shape[1]
        step = thresholds_at_once or total
        parts = [
            _count_true(count.mask(rows, ops.expand_dims(thresholds[:, i : i + step], 2)))
            for i in range(0, total, step)
        ]
        result[count.name] = parts[0] if len(parts) == 1 else ops.concatenate(parts, axis=1)
    return result


# A float32 sum counts exactly up to this many values, with half the
# temporaries of an integer sum (which JAX widens to int64).
_FLOAT32_COUNTS = 1 << 24


def _count_true(mask):
    """The number of true values of a `[R, T, n]` mask over n (the padding left out), as int32."""
    if mask.shape[2] <= _FLOAT32_COUNTS:
        return ops.cast(ops.sum(ops.cast(mask, "float32"), axis=2), "int32")
    return ops.cast(ops.sum(ops.cast(mask, "int32"), axis=2), "int32")


def magnitude_bins(total, at_least):
    """Bin counts from a side's total and its counts at or beyond each edge (`[R, edges]`)."""
    above = ops.concatenate([total[:, None], at_least], axis=1)
    below = ops.concatenate([at_least, ops.zeros_like(at_least[:, :1])], axis=1)
    return above - below
