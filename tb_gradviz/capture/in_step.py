"""The in-step digest: each logged layer's digest rows computed by the train step itself.

With `GradVizCallback(digest="step")`, the callback rebuilds the model's
train function when training begins (`fit` has made it by then) around a
train step that mirrors the one Keras runs on the backend, and that also
differentiates the loss w.r.t. the chosen layers' inputs and outputs in the
same backward pass that computes the weight gradients. On the steps due to
be logged it returns, next to the logs, a few counts and sums per tensor of
that step (`DigestLayout`); the other steps run Keras' own train function
untouched. The callback turns what the step returned into the digest record
the probe's records would make (`DigestLayout.digest_vector`): the same rows,
under the same tag, so that both are one series.

What each backend's step computes per tensor, in float32 (float16 and
bfloat16 widened exactly; float64 kept):

* the count of `|x|` below each of `THRESHOLDS` (`BELOW`): the first counts
  the exact zeros, the others give the precision row's as-is counts;
* NaN, +Inf and -Inf counts;
* the sum of squares and the largest magnitude over the finite values;
* for an activation with a channel axis, the channels that are zero at
  every example and position (the units row).

Framework-free: numpy, and the format's definitions.
"""

import numpy as np

from tb_gradviz.format import digest, metadata, precision

DIGESTS = ("probe", "step")
PROBE, STEP = DIGESTS

# `|x| < t` for each t counts, in order: exact zeros, and the values a cast to float16
# turns to zero, keeps below the normal range, and keeps finite; then the values a cast
# to bfloat16 keeps finite. bfloat16's zero and normal boundaries lie among float32's
# subnormals, which TensorFlow and XLA flush to zero on a CPU and compare as zero: the
# smallest normal float32 stands for them, and for zero. So a float32 subnormal counts as a
# zero (the probe's values, computed by the same kernels, hold none).
_SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)


def _below_threshold(boundary, inclusive):
    """The float32 `t` with `|x| < t` exactly when `|x| < b` (`<= b` when inclusive)."""
    t = np.float32(boundary)
    if t < boundary or (inclusive and t == boundary):
        t = np.nextafter(t, np.float32(np.inf))
    return float(t)


THRESHOLDS = (
    _SMALLEST_NORMAL,
    *(
        _below_threshold(*precision.BOUNDARIES["float16"][name])
        for name in precision.BOUNDARY_NAMES
    ),
    _below_threshold(*precision.BOUNDARIES["bfloat16"]["overflow"]),
)
BELOW = ("zero", "float16_zero", "float16_normal", "float16_overflow", "bfloat16_overflow")
# The per-tensor counts a step returns: its size, the `BELOW` counts, the non-finite ones.
COUNT_FIELDS = ("count", *BELOW, "nan", "pos_inf", "neg_inf")
# The per-tensor float values: over the finite values, the sum of squares and max |x|.
VALUE_FIELDS = ("sum_of_squares", "max_abs")
# The row of statistics a step returns per tensor: the counts, the values, then the dead
# channels (along the units axis of a layer's first activation; 0 for other tensors).
ROW = len(COUNT_FIELDS) + len(VALUE_FIELDS) + 1

SOURCE_TAG = f"{digest.TAG_PREFIX}/source"
SOURCE_FIELDS = ("in_step",)


def check_digest(value):
    """Returns `digest=` as one of `DIGESTS`.

    Raises:
      TypeError: not a string.
      ValueError: not one of `DIGESTS`.
    """
    allowed = " or ".join(repr(d) for d in DIGESTS)
    if not isinstance(value, str):
        raise TypeError(f"digest must be {allowed}. Received: digest={value!r}")
    if value not in DIGESTS:
        raise ValueError(f"digest must be {allowed}. Received: digest={value!r}")
    return value


def source_records():
    """The record that says an event's digest was computed by the train step (`in_step`: 1)."""
    content = {"kind": metadata.KIND_DIGEST_SOURCE, "fields": list(SOURCE_FIELDS)}
    summary_metadata = metadata.create_summary_metadata(content, plugin_name=digest.PLUGIN_NAME)
    return [(SOURCE_TAG, np.array([1.0]), summary_metadata)]


class DigestLayout:
    """Which statistics a step computes, and the digest rows they fill.

    Built while the step is traced, from the chosen layers' `probe.LayerPlan`s
    and, per plan tensor, the item (a distinct graph tensor) whose statistics
    it reads: an input gradient that is another chosen layer's output
    gradient is summarised once.

    Args:
      plans: the `LayerPlan`s, in model order.
      items: per plan tensor, in plan order, the index of its summarised item.
    """

    def __init__(self, plans, items):
        self.plans = list(plans)
        self.items = list(items)
        rows = []
        for plan in self.plans:
            for t in plan.tensors:
                rows.append((digest.TENSOR, plan.chosen.path, t.name))
                rows.append((digest.PRECISION, plan.chosen.path, t.name))
            if plan.units_axis is not None:
                rows.append((digest.UNITS, plan.chosen.path, plan.tensors[0].name))
        self.rows = tuple(rows)

    def digest_vector(self, rows, scale):
        """The digest vector (`digest.FIELDS` per row, float32) of one step's statistics.

        Args:
          rows: `[items, ROW]`: per item, `COUNT_FIELDS`, `VALUE_FIELDS`, then
            its dead channels (counted for a plan's first activation only).
          scale: the loss scale the gradients were taken at, or None.
        """
        rows = np.asarray(rows, np.float64)
        segments = []
        items = iter(self.items)
        for plan in self.plans:
            first = None
            for t in plan.tensors:
                item = next(items)
                first = item if first is None else first
                segments += _tensor_segments(
                    rows[item, : len(COUNT_FIELDS)],
                    rows[item, len(COUNT_FIELDS) : len(COUNT_FIELDS) + len(VALUE_FIELDS)],
                    scale if t.loss_scaled else None,
                )
            if plan.units_axis is not None:
                channels = plan.tensors[0].shape[plan.units_axis]
                segments.append([channels, rows[first, ROW - 1]])
        return np.concatenate([np.asarray(s, np.float64) for s in segments]).astype(np.float32)

    def digest_record(self, rows, scale):
        """The `(tag, vector, metadata)` digest record of one step (as `digest.digest_records`)."""
        tag, summary_metadata = digest.digest_series(self.rows)
        return tag, self.digest_vector(rows, scale), summary_metadata

    def nonfinite(self, rows):
        """The `layer/tensor` names of the plan tensors holding a NaN or an Inf."""
        found, items = [], iter(self.items)
        nonfinite = np.asarray(rows)[:, len(BELOW) + 1 : len(COUNT_FIELDS)].sum(axis=1)
        for plan in self.plans:
            for t in plan.tensors:
                if nonfinite[next(items)] > 0:
                    found.append(f"{plan.chosen.path}/{t.name}")
        return found


def _tensor_segments(counts, values, scale):
    """The tensor row and the precision row of one tensor."""
    count = counts[0]
    below = dict(zip(BELOW, counts[1 : len(BELOW) + 1]))
    nan, pos_inf, neg_inf = counts[len(BELOW) + 1 :]
    finite = count - nan - pos_inf - neg_inf
    zeros = below["zero"]
    sum_of_squares, max_abs = values
    divisor = 1.0 if scale is None else float(scale)
    if finite > 0:
        rms = np.sqrt(sum_of_squares / finite) / divisor
        max_abs = max_abs / divisor
    else:
        rms = max_abs = np.nan
    tensor_row = [count, zeros, nan, pos_inf, neg_inf, rms, max_abs]
    # `precision.precision_from_below`'s as-is counts; bfloat16 keeps every non-zero normal
    # float32 above its zero and subnormal range (see THRESHOLDS).
    precision_row = [
        finite - zeros,
        below["float16_zero"] - zeros,
        below["float16_normal"] - below["float16_zero"],
        finite - below["float16_overflow"],
        0.0,
        0.0,
        finite - below["bfloat16_overflow"],
        np.nan,  # the block part's count: the probe's alone
    ]
    return [tensor_row, precision_row]


def check_step_arguments(every_n_batches, stop_on, weights):
    """Checks what `digest="step"` needs of the callback's other arguments.

    Raises:
      ValueError: no `every_n_batches` (the step must know ahead that it is
        logged), a `stop_on` (not judged on in-step events yet), or
        `weights=True` (the update rows are the probe's).
    """
    if every_n_batches is None:
        raise ValueError(
            "digest='step' logs from the train step, so it needs every_n_batches. "
            "Received: every_n_batches=None"
        )
    if stop_on is not None:
        raise ValueError(
            "digest='step' does not judge stop_on yet; use digest='probe' with it. "
            f"Received: stop_on={stop_on!r}"
        )
    if weights:
        raise ValueError(
            "digest='step' does not record weights yet; use digest='probe' with them. "
            "Received: weights=True"
        )
