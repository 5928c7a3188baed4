"""Warnings: leading indicators of a divergence, each a rule over a tensor's own recent history.

The failure flags (`health`) say what has gone wrong: a NaN, a gradient
ratio past 1,000. A warning says that a tensor is changing in a way that
runs which go on to diverge show first, while nothing has failed yet. Each
rule reads one series of the per-event digest (a tensor's RMS or max |x|,
or a weight's update ratio) and compares its value at a step with the same
series over the `WINDOW` steps before it (its baseline; `windows`), so it
needs no reference value and judges every layer by its own scale:

* `rms_growth`: the tensor's RMS is above `GROWTH` times the median of its
  RMS over the window, and above `RECORD` times its highest over the
  `HISTORY` steps before (a height the layer has shown before, in a swing
  that came back, is not a warning);
* `max_growth`: the same, of its max |x|. At a step whose digest the train
  step computed (`digest="step"`: that step's own batch, where one odd batch
  moves a gradient several-fold and the next is back), both judge the lower
  of the step's value and the previous logged step's, against that previous
  step's window and highs: a growth that holds two steps;
* `rms_drift`: a windowed CUSUM on log RMS: the rise of log10 RMS from the
  lowest point of the window, less an allowance of `DRIFT_PER_STEP` decades
  per step between the two, is above `DRIFT` decades while the RMS is above
  `DRIFT_RECORD` times its highest over the `HISTORY` steps before, or is
  above `DRIFT_ALONE` decades. A steady rise faster than the allowance
  accumulates; noise and slow trends do not. A quiet rise that never jumps
  past the layer's own heights must go further: healthy runs show such rises
  of about a decade as they learn;
* `peak_ratio`: its max |x| / RMS is above `PEAK` times the median of that
  ratio over the window (a few values running away from the rest);
* `update_spike`: a weight's update ratio per optimizer step is above
  `SPIKE` times its median over the window, above `SPIKE_FLOOR` per step,
  and above `RECORD` times its highest over the `HISTORY` steps before;
* `update_growth`: the CUSUM of `rms_drift` over the update ratio's trend
  (its median over the last `SMOOTH` steps), with `UPDATE_DRIFT` and
  `UPDATE_PER_STEP`, from step `UPDATE_FROM` on, above `UPDATE_FLOOR`, of
  weights of `UPDATE_MIN_COUNT` values or more (when recorded): the
  size of each update growing step by step, which a learning rate past
  stability shows first in a network of saturating units.

A step is judged only when the window holds at least `MIN_POINTS` finite
values of the series and its oldest one is at least `WINDOW / 2` steps
before it: the first steps of a run change fast by nature, and a rule
reading them would warn on every run. Values that are not finite or not
positive are left out (a NaN is `nonfinite`'s, not a warning's).

The rules depend only on the `HISTORY` steps before each step, so the
callback, which keeps the last events' digests (`judgement.Judge`), and the
board, which judges every step of a run (`/onset`, `tb-gradviz check`),
decide alike. Numpy only.
"""

from typing import NamedTuple

import numpy as np

from tb_gradviz.format import origin, records, windows
from tb_gradviz.format.windows import WINDOW, log10

WARNINGS = (
    "rms_growth",
    "max_growth",
    "rms_drift",
    "peak_ratio",
    "update_spike",
    "update_growth",
)

MIN_COUNT = 16  # values a tensor must hold to be judged
GROWTH = 5.0
DRIFT = 1.0  # decades
DRIFT_PER_STEP = 0.005  # decades per step
PEAK = 4.0
SPIKE = 5.0
SPIKE_FLOOR = 1e-3
# A growth or a spike is a warning only past the series' own highs: above RECORD times its
# highest value over the HISTORY steps before (a layer whose gradient swings tenfold and back
# every hundred-odd steps has shown those heights before).
HISTORY = 200
RECORD = 2.0
# A drift of DRIFT decades is a warning when the tensor also jumps past its own highs (over
# DRIFT_RECORD times its highest over the HISTORY steps before), as a run on its way to diverge
# does; a quiet rise, which a healthy gradient shows by about a decade as the run learns, is one
# only past DRIFT_ALONE decades.
DRIFT_RECORD = 1.5
DRIFT_ALONE = 1.5  # decades
# update_growth: the update ratio's trend (its median over the last SMOOTH steps) rose
# over UPDATE_DRIFT decades above its lowest of the window, beyond UPDATE_PER_STEP per step,
# from step UPDATE_FROM on (a warm-up's first steps grow by orders, by design), and is over
# UPDATE_FLOOR per step.
UPDATE_DRIFT = 0.3
UPDATE_PER_STEP = 0.005
SMOOTH = 9  # steps
UPDATE_FROM = WINDOW // 2
UPDATE_FLOOR = 1e-4
# update_growth judges weights of this many values or more: the update ratio of a small weight
# (a bias, a one-unit layer's kernel) swings several-fold from step to step.
UPDATE_MIN_COUNT = 256

# The tensors each tensor rule reads: the activation and the gradients.
JUDGED_ROLES = (
    records.ACTIVATION,
    records.OUTPUT_GRADIENT,
    records.WEIGHT_GRADIENT,
    records.INPUT_GRADIENT,
)
# The warnings that read weights' updates rather than tensors.
UPDATE_WARNINGS = ("update_spike", "update_growth")


def rules():
    """The rule of each warning, as the tab and the CLI show it."""
    past_highs = f"and over {RECORD:g}x its highest over the {HISTORY} steps before"
    return {
        "rms_growth": f"a tensor's RMS is over {GROWTH:g}x the median of its RMS over the "
        f"{WINDOW} steps before, {past_highs}",
        "max_growth": f"a tensor's max |x| is over {GROWTH:g}x the median of its max |x| over "
        f"the {WINDOW} steps before, {past_highs}; for both, at a step whose digest the train "
        "step computed, the lower of its value and the logged step before's, judged there",
        "rms_drift": f"a tensor's log10 RMS rose over {DRIFT:g} decades above its lowest point "
        f"of the {WINDOW} steps before, beyond {DRIFT_PER_STEP:g} decades per step, the RMS "
        f"over {DRIFT_RECORD:g}x its highest over the {HISTORY} steps before; or rose so over "
        f"{DRIFT_ALONE:g} decades",
        "peak_ratio": f"a tensor's max |x| / RMS is over {PEAK:g}x its median over the {WINDOW} "
        "steps before",
        "update_spike": f"a weight's update ratio per step is over {SPIKE:g}x its median over "
        f"the {WINDOW} steps before, over {SPIKE_FLOOR:g}, {past_highs}",
        "update_growth": f"a weight's update ratio per step (its median over the last {SMOOTH} "
        f"steps) rose over {UPDATE_DRIFT:g} decades above its lowest of the {WINDOW} steps "
        f"before, beyond {UPDATE_PER_STEP:g} decades per step, from step {UPDATE_FROM} on, "
        f"and is over {UPDATE_FLOOR:g}; weights of {UPDATE_MIN_COUNT} values or more",
    }


# The tensor rules read these fields: their RMS and their max |x|.
_TENSOR_FIELDS = ("rms", "max_abs")


def _logs(series, field, count):
    """`[len(series), count]` log10 values of `field` of each of `series` (`tensor_series`'s
    `values`), filled row by row."""
    out = np.empty((len(series), count))
    for row, values in enumerate(series):
        out[row] = log10(values(field))
    return out


def _few(tensor, min_count=None):
    """`[steps]`: where a tensor holds fewer than `MIN_COUNT` values (a bias of one unit is one
    number, whose magnitude swings by orders as it crosses zero)."""
    count = tensor.get("count")
    if count is None:
        return False
    with np.errstate(invalid="ignore"):
        return np.asarray(count, dtype=np.float64) < (min_count or MIN_COUNT)


def tensor_series(layer):
    """`[(tensor, values)]` of a layer's judged tensors (`JUDGED_ROLES`): `values(field)` is the
    tensor's `[steps]` values of `field` ("rms", "max_abs"), NaN where it holds fewer than
    `MIN_COUNT` values. Each is made when asked, so that every series of a run is never held
    twice at once."""
    found = []
    for name, tensor in layer["tensors"].items():
        if tensor["role"] in JUDGED_ROLES:
            found.append((name, _values_of(tensor)))
    return found


def _values_of(tensor):
    def values(field):
        return np.where(_few(tensor), np.nan, tensor[field])

    return values


def update_series(layer, min_count=None):
    """`[(weight, per-step update ratio)]` of a layer's update rows, `[steps]` each, NaN where
    the weight's values (its `weight/<name>` tensor when recorded, else the count the digest's
    metadata gives, `weight_counts`) are fewer than `min_count` (None: `MIN_COUNT`)."""
    found = []
    counts = layer.get("weight_counts", {})
    for weight, update in layer.get("updates", {}).items():
        values = layer["tensors"].get(f"{records.WEIGHT}/{weight}")
        if values is None and weight in counts:
            values = {"count": counts[weight]}
        few = False if values is None else _few(values, min_count)
        with np.errstate(invalid="ignore", divide="ignore"):
            interval = np.asarray(update["interval"], dtype=np.float64)
            per_step = np.where(interval > 0, update["update_ratio"] / interval, np.nan)
        found.append((weight, np.where(few, np.nan, per_step)))
    return found


class Series(NamedTuple):
    """The `[series, steps]` arrays the rules judge (`judged_series`): each judged tensor's
    log10 RMS, log10 max |x| and their difference (`tensor_series`' order, layer after layer),
    and each weight's update ratio per step, its log10 and the log10 trend `update_growth`
    reads (`update_series`' order; the trend NaN for weights of fewer than `UPDATE_MIN_COUNT`
    values)."""

    rms: np.ndarray
    peak: np.ndarray
    peak_ratio: np.ndarray
    per_step: np.ndarray
    updates: np.ndarray
    trend: np.ndarray


def verdicts(steps, layers, at=None, in_step=None):
    """Every warning of every layer at every step of `[layers, steps]` columns (`health`'s,
    with `updates` as the digest's), all series judged at once.

    Args:
      steps: the logged steps, `[steps]` ints, sorted.
      layers: the layers' columns.
      at: None to judge every step, or the indices of the steps to judge.
      in_step: `[steps]` bool, where the digest is the train step's (`digest="step"`:
        that step's own batch), or None: every step's is the probe's.

    Returns:
      `{warning: [layers, steps] bool}` and, under `"tensors"`, `{warning:
      [layer: [(tensor, [steps] bool)]]}`: which tensors (weights, for
      `update_spike`) raised it, in the layer's order.
    """
    count = len(steps)
    tensors = [tensor_series(layer) for layer in layers]
    updates = [update_series(layer) for layer in layers]
    rms, peak = (
        _logs([v for found in tensors for _, v in found], f, count) for f in _TENSOR_FIELDS
    )
    per_step = np.array([u for found in updates for _, u in found], dtype=np.float64)
    per_step = per_step.reshape(-1, count)
    # update_growth's series: the same weights, those of fewer than UPDATE_MIN_COUNT values out.
    larger = [u for layer in layers for _, u in update_series(layer, UPDATE_MIN_COUNT)]
    larger = np.array(larger, dtype=np.float64).reshape(-1, count)
    with np.errstate(invalid="ignore"):
        series = Series(
            rms, peak, peak - rms, per_step, log10(per_step), update_trend(steps, larger)
        )
    names = [[name for name, _ in found] for found in tensors]
    weights = [[weight for weight, _ in found] for found in updates]
    return by_layer(judged_series(steps, series, at, in_step), names, weights, count)


def by_layer(judged, names, weights, count):
    """`verdicts`' answer from `judged_series`' rows, given each layer's judged tensors
    (`names`) and weights (`weights`), in `Series`' order, over `count` steps."""
    found = {warning: np.zeros((len(names), count), bool) for warning in WARNINGS}
    found["tensors"] = {warning: [] for warning in WARNINGS}
    rows = {"tensors": 0, "updates": 0}
    for i in range(len(names)):
        for warning in WARNINGS:
            kind, judged_names = (
                ("updates", weights[i]) if warning in UPDATE_WARNINGS else ("tensors", names[i])
            )
            raised = judged[warning][rows[kind] : rows[kind] + len(judged_names)]
            found["tensors"][warning].append(list(zip(judged_names, raised)))
            if judged_names:
                found[warning][i] = raised.any(axis=0)
        rows["tensors"] += len(names[i])
        rows["updates"] += len(weights[i])
    return found


def origin_of(columns, found, warning, step):
    """`(layer index, tensor)` where `warning` began at one step (index into the columns)."""
    raised = {
        (index, tensor)
        for index, by_tensor in enumerate(found["tensors"][warning])
        for tensor, at in by_tensor
        if at[step]
    }
    if warning in UPDATE_WARNINGS:
        # Weights: the first layer in model order, its first weight that raised it.
        return min(raised, key=lambda item: (item[0], _weight_order(columns[item[0]], item[1])))
    for index, tensor in origin.step_order(columns, (origin.FORWARD, origin.BACKWARD)):
        if (index, tensor) in raised:
            return index, tensor
    return min(raised)


def _weight_order(layer, weight):
    names = list(layer.get("updates", {}))
    return names.index(weight) if weight in names else len(names)


def judged_series(steps, series, at=None, in_step=None):
    """`{warning: [series, steps] bool}` over a `Series` (False where a step is not judged;
    `at`: the indices of the steps judged, None: all; `in_step`: `[steps]` bool, where the
    digest is the train step's own, or None: none is)."""
    steps = np.asarray(steps, dtype=np.int64)
    growth, spike = np.log10(GROWTH), np.log10(SPIKE)
    record = np.log10(RECORD)
    rms, peak, updates, trend = series.rms, series.peak, series.updates, series.trend

    def past_highs(logs, above=record):
        return windows.record_exceeds(steps, logs, above, HISTORY, at)

    def grows(logs):
        """`rms_growth`, `max_growth`: at a probe step its value; at an in-step step `t`, the
        lower of the values at `t` and at the logged step before, judged at that step (its
        window and highs)."""
        judged = np.arange(len(steps)) if at is None else np.asarray(at, np.int64)
        paired = np.zeros(len(judged), bool) if in_step is None else np.asarray(in_step)[judged]
        own = judged[~paired]
        raised = windows.median_exceeds(steps, logs, growth, own)
        raised &= windows.record_exceeds(steps, logs, record, HISTORY, own)
        judged = judged[paired & (judged > 0)]
        if judged.size:
            pairs = np.full_like(logs, np.nan)
            pairs[:, :-1] = np.minimum(logs[:, :-1], logs[:, 1:])  # NaN where either is
            before = judged - 1
            held = windows.median_exceeds(steps, logs, growth, before, pairs)
            held &= windows.record_exceeds(steps, logs, record, HISTORY, before, pairs)
            raised[:, judged] = held[:, before]
        return raised

    with np.errstate(invalid="ignore"):
        return {
            "rms_growth": grows(rms),
            "max_growth": grows(peak),
            "rms_drift": (
                windows.drift_exceeds(steps, rms, DRIFT, DRIFT_PER_STEP, at)
                & past_highs(rms, np.log10(DRIFT_RECORD))
            )
            | windows.drift_exceeds(steps, rms, DRIFT_ALONE, DRIFT_PER_STEP, at),
            "peak_ratio": windows.median_exceeds(steps, series.peak_ratio, np.log10(PEAK), at),
            "update_spike": windows.median_exceeds(steps, updates, spike, at)
            & (series.per_step > SPIKE_FLOOR)
            & past_highs(updates),
            "update_growth": windows.drift_exceeds(steps, trend, UPDATE_DRIFT, UPDATE_PER_STEP, at)
            & (10**trend > UPDATE_FLOOR),
        }


def update_trend(steps, per_step):
    """`[series, steps]` log10 of the per-step update ratios' trend that `update_growth`
    judges: their median over the last `SMOOTH` steps, from step `UPDATE_FROM` on."""
    logs = log10(np.atleast_2d(per_step))
    early = np.asarray(steps, dtype=np.int64)[None] < UPDATE_FROM
    return windows.smoothed(steps, np.where(early, np.nan, logs), SMOOTH)
