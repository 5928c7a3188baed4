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


def update_segments(norms, applied):
    """The digest's `update` rows (`[weights, 2]`: `update_ratio`, `interval`) of one step.

    Args:
      norms: `[weights, 2]`, per weight `|w_after|` and `|w_after - w_before|`
        over the step, or None when the step gave none (all NaN).
      applied: the optimizer steps the step applied (1; 0 when a
        `LossScaleOptimizer` skipped it: then every update is 0, and so is
        its ratio).
    """
    if norms is None:
        return None
    norms = np.asarray(norms, np.float64).reshape(-1, 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = norms[:, 1] / norms[:, 0]  # NaN when both are 0, inf when only the weight is
    return np.column_stack([ratio, np.full(len(norms), float(applied))])


class DigestLayout:
    """Which statistics a step computes, and the digest rows they fill.

    Built while the step is traced, from the chosen layers' `probe.LayerPlan`s
    and, per plan tensor, the item (a distinct graph tensor) whose statistics
    it reads: an input gradient that is another chosen layer's output
    gradient is summarised once. The `update` rows of every trainable weight
    (`weights.step_weights`) follow the other rows, as the probe's digest puts
    its update rows after the others (`digest.digest_records`).

    Args:
      plans: the `LayerPlan`s, in model order.
      items: per plan tensor, in plan order, the index of its summarised item.
      updates: the `weights.StepWeight`s whose update the step gives.
    """

    def __init__(self, plans, items, updates=()):
        self.plans = list(plans)
        self.updates = list(updates)
        self.items = np.asarray(list(items), np.int64)
        rows, scaled, first_items, channels = [], [], [], []
        # Where each row's values are in the pool `digest_vector` builds: the tensor rows'
        # fields, then the precision rows', then the units rows'.
        tensors = len(self.items)
        tensor_fields, precision_fields = len(digest.TENSOR_FIELDS), len(digest.PRECISION_FIELDS)
        units_at = tensors * (tensor_fields + precision_fields)
        gather = []
        k = 0
        for plan in self.plans:
            first = k
            for t in plan.tensors:
                rows.append((digest.TENSOR, plan.chosen.path, t.name))
                rows.append((digest.PRECISION, plan.chosen.path, t.name))
                gather += range(k * tensor_fields, (k + 1) * tensor_fields)
                at = tensors * tensor_fields + k * precision_fields
                gather += range(at, at + precision_fields)
                scaled.append(t.loss_scaled)
                k += 1
            if plan.units_axis is not None:
                rows.append((digest.UNITS, plan.chosen.path, plan.tensors[0].name))
                at = units_at + 2 * len(first_items)
                gather += [at, at + 1]
                first_items.append(self.items[first])
                channels.append(plan.tensors[0].shape[plan.units_axis])
        self.rows = tuple(rows) + update_rows(self.updates)
        self._scaled = np.asarray(scaled, bool)
        self._first_items = np.asarray(first_items, np.int64)
        self._channels = np.asarray(channels, np.float64)
        self._gather = np.asarray(gather, np.int64)

    def digest_vector(self, rows, scale, norms=None, applied=1):
        """The digest vector (`digest.FIELDS` per row, float32) of one step's statistics.

        Args:
          rows: `[items, ROW]`: per item, `COUNT_FIELDS`, `VALUE_FIELDS`, then
            its dead channels (counted for a plan's first activation only).
          scale: the loss scale the gradients were taken at, or None.
          norms, applied: the step's update norms (`update_segments`).
        """
        rows = np.asarray(rows, np.float64).reshape(-1, ROW)
        per_tensor = rows[self.items]
        divisor = np.where(self._scaled, 1.0 if scale is None else float(scale), 1.0)
        tensor_rows, precision_rows = _segments(per_tensor, divisor)
        units = np.column_stack([self._channels, rows[self._first_items, ROW - 1]])
        pool = np.concatenate([tensor_rows.ravel(), precision_rows.ravel(), units.ravel()])
        vector = pool[self._gather]
        return with_updates(vector, self.updates, norms, applied).astype(np.float32)

    def digest_record(self, rows, scale, norms=None, applied=1):
        """The `(tag, vector, metadata)` digest record of one step (as `digest.digest_records`)."""
        tag, summary_metadata = update_series(self.rows, self.updates)
        return tag, self.digest_vector(rows, scale, norms, applied), summary_metadata

    def nonfinite(self, rows):
        """The `layer/tensor` names of the plan tensors holding a NaN or an Inf."""
        rows = np.asarray(rows).reshape(-1, ROW)
        nonfinite = rows[self.items, len(BELOW) + 1 : len(COUNT_FIELDS)].sum(axis=1) > 0
        names = [f"{plan.chosen.path}/{t.name}" for plan in self.plans for t in plan.tensors]
        return [name for name, found in zip(names, nonfinite) if found]


def update_rows(updates):
    """The digest's `update` rows of `weights.StepWeight`s."""
    return tuple((digest.UPDATE, w.layer, w.name) for w in updates)


def update_series(rows, updates):
    """The tag and metadata of a digest with these rows, whose update rows are those of
    `updates` (`weights.StepWeight`s): the metadata describes their layers and sizes."""
    described = [(w.layer_index, w.layer_class, w.count) for w in updates] if updates else None
    return digest.digest_series(rows, described)


def with_updates(vector, updates, norms, applied=1):
    """`vector` (a digest's other rows) followed by the update rows of `updates`, from the step's
    `norms` (`update_segments`; NaN without them)."""
    segments = update_segments(norms, applied)
    if segments is None:
        segments = np.full((len(updates), len(digest.UPDATE_FIELDS)), np.nan)
    return np.concatenate([np.asarray(vector, np.float64), segments.ravel()])


def _segments(per_tensor, divisor):
    """The tensor rows and the precision rows (`[n, fields]` each) of `[n, ROW]` statistics."""
    count = per_tensor[:, 0]
    below = dict(zip(BELOW, per_tensor[:, 1 : len(BELOW) + 1].T))
    nan, pos_inf, neg_inf = per_tensor[:, len(BELOW) + 1 : len(COUNT_FIELDS)].T
    sum_of_squares, max_abs = per_tensor[:, len(COUNT_FIELDS) : len(COUNT_FIELDS) + 2].T
    finite = count - nan - pos_inf - neg_inf
    zeros = below["zero"]
    with np.errstate(invalid="ignore", divide="ignore"):
        rms = np.where(finite > 0, np.sqrt(sum_of_squares / finite) / divisor, np.nan)
        max_abs = np.where(finite > 0, max_abs / divisor, np.nan)
    tensor_rows = np.column_stack([count, zeros, nan, pos_inf, neg_inf, rms, max_abs])
    # `precision.precision_from_below`'s as-is counts; bfloat16 keeps every non-zero normal
    # float32 above its zero and subnormal range (see THRESHOLDS).
    none = np.zeros_like(count)
    precision_rows = np.column_stack(
        [
            finite - zeros,
            below["float16_zero"] - zeros,
            below["float16_normal"] - below["float16_zero"],
            finite - below["float16_overflow"],
            none,
            none,
            finite - below["bfloat16_overflow"],
            np.full_like(count, np.nan),  # the block part's count: the probe's alone
        ]
    )
    return tensor_rows, precision_rows


def check_step_arguments(every_n_batches, weights):
    """Checks what `digest="step"` needs of the callback's other arguments.

    Raises:
      ValueError: no `every_n_batches` (the step must know ahead that it is
        logged), or `weights=True` (the update rows are the probe's).
    """
    if every_n_batches is None:
        raise ValueError(
            "digest='step' logs from the train step, so it needs every_n_batches. "
            "Received: every_n_batches=None"
        )
    if weights:
        raise ValueError(
            "digest='step' does not record weights yet; use digest='probe' with them. "
            "Received: weights=True"
        )
