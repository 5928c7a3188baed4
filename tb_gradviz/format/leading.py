"""Warnings: leading indicators of a divergence, each a rule over a tensor's own recent history.

The failure flags (`health`) say what has gone wrong: a NaN, a gradient
ratio past 1,000. A warning says that a tensor is changing in a way that
runs which go on to diverge show first, while nothing has failed yet. Each
rule reads one series of the per-event digest (a tensor's RMS or max |x|,
or a weight's update ratio) and compares its value at a step with the same
series over the `WINDOW` steps before it (its baseline), so it needs no
reference value and judges every layer by its own scale:

* `rms_growth`: the tensor's RMS is above `GROWTH` times the median of its
  RMS over the window;
* `max_growth`: its max |x| is above `GROWTH` times the median of its max
  |x| over the window;
* `rms_drift`: a windowed CUSUM on log RMS: the rise of log10 RMS from the
  lowest point of the window, less an allowance of `DRIFT_PER_STEP` decades
  per step between the two, is above `DRIFT` decades. A steady rise faster
  than the allowance accumulates; noise and slow trends do not;
* `peak_ratio`: its max |x| / RMS is above `PEAK` times the median of that
  ratio over the window (a few values running away from the rest);
* `update_spike` (`weights=True`): a weight's update ratio per optimizer
  step is above `SPIKE` times its median over the window, and above
  `SPIKE_FLOOR` per step.

A step is judged only when the window holds at least `MIN_POINTS` finite
values of the series and its oldest one is at least `WINDOW / 2` steps
before it: the first steps of a run change fast by nature, and a rule
reading them would warn on every run. Values that are not finite or not
positive are left out (a NaN is `nonfinite`'s, not a warning's).

The rules depend only on the window before each step, so the callback,
which keeps the last events' digest rows (`GradVizCallback(stop_on=...)`),
and the board, which judges every step of a run (`/onset`, `tb-gradviz
check`), decide alike. Numpy only.
"""

import contextlib
import warnings

import numpy as np

from tb_gradviz.format import origin, records

WARNINGS = ("rms_growth", "max_growth", "rms_drift", "peak_ratio", "update_spike")

WINDOW = 100  # steps of history a step is judged against
MIN_POINTS = 3
MIN_COUNT = 16  # values a tensor must hold to be judged
GROWTH = 5.0
DRIFT = 1.0  # decades
DRIFT_PER_STEP = 0.005  # decades per step
PEAK = 4.0
SPIKE = 5.0
SPIKE_FLOOR = 1e-3

# The tensors each tensor rule reads: the activation and the gradients.
JUDGED_ROLES = (
    records.ACTIVATION,
    records.OUTPUT_GRADIENT,
    records.WEIGHT_GRADIENT,
    records.INPUT_GRADIENT,
)


def rules():
    """The rule of each warning, as the tab and the CLI show it."""
    return {
        "rms_growth": f"a tensor's RMS is over {GROWTH:g}x the median of its RMS over the "
        f"{WINDOW} steps before",
        "max_growth": f"a tensor's max |x| is over {GROWTH:g}x the median of its max |x| over "
        f"the {WINDOW} steps before",
        "rms_drift": f"a tensor's log10 RMS rose over {DRIFT:g} decades above its lowest point "
        f"of the {WINDOW} steps before, beyond {DRIFT_PER_STEP:g} decades per step",
        "peak_ratio": f"a tensor's max |x| / RMS is over {PEAK:g}x its median over the {WINDOW} "
        "steps before",
        "update_spike": f"a weight's update ratio per step is over {SPIKE:g}x its median over "
        f"the {WINDOW} steps before, and over {SPIKE_FLOOR:g}",
    }


def _log(values):
    """log10 of `values` (a copy, logged in place), NaN where a value is not finite and
    positive."""
    values = np.array(values, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        values[~(np.isfinite(values) & (values > 0))] = np.nan
        return np.log10(values, out=values)


# The tensor rules read these fields: their RMS and their max |x|.
_TENSOR_FIELDS = ("rms", "max_abs")


def _logs(series, field, count):
    """`[len(series), count]` log10 values of `field` of each of `series` (`tensor_series`'s
    `values`), filled row by row."""
    out = np.empty((len(series), count))
    for row, values in enumerate(series):
        out[row] = _log(values(field))
    return out


# Steps judged together: a chunk gathers `[series, CHUNK, window]` values at once.
CHUNK = 256
# (series, step) pairs whose windows are gathered together to be judged exactly.
PAIRS = 16_384
# Series judged together: the sparse table's levels are `[SERIES, steps]` each.
SERIES = 64
# A drift within this of its threshold by the bound is judged exactly (the bound sums in
# another order than the rule; the two differ by rounding, far less than this).
_BOUND_SLACK = 1e-6


def _judged(steps, at):
    """`(judged, begins)`: the step indices judged (`at`, None: all) whose window spans
    `WINDOW / 2` steps or more, and where each one's window begins: the window of step index
    `t` is `[begins, t)`."""
    steps = np.asarray(steps, dtype=np.int64)
    begins = _begins(steps, steps)
    at = np.arange(len(steps)) if at is None else np.asarray(at, dtype=np.int64)
    spans = np.where(begins[at] < at, steps[at] - steps[begins[at]], -1)
    at = at[spans >= WINDOW / 2]
    return at, begins[at]


def _begins(steps, judged):
    """Where the window of each of the `judged` steps begins among the logged `steps`: its
    oldest step is `WINDOW` steps or fewer before."""
    return np.searchsorted(steps, np.asarray(judged) - WINDOW, side="left")


def _windows(steps, logs, at):
    """Yields `(judged, past, ages)` per chunk of the steps judged (`at`, None: all):

    `judged` the chunk's step indices whose window spans `WINDOW / 2` steps or more, `past`
    `[series, len(judged), width]` the windows' log10 values (NaN past a window's end), `ages`
    `[len(judged), width]` the steps from each window value to its judged step."""
    steps = np.asarray(steps, dtype=np.int64)
    at, begins = _judged(steps, at)
    for first in range(0, len(at), CHUNK):
        judged, begin = at[first : first + CHUNK], begins[first : first + CHUNK]
        where, inside = _spread(judged, begin)
        past = np.where(inside[None], logs[:, where], np.nan)
        yield judged, past, steps[judged][:, None] - steps[where]


def _spread(judged, begins):
    """`(where, inside)` `[len(judged), width]`: each window's step indices (clipped to its
    last) and which of them are in it."""
    width = int(np.max(judged - begins))
    where = begins[:, None] + np.arange(width)[None, :]
    inside = where < judged[:, None]
    return np.minimum(where, judged[:, None] - 1), inside


def _enough(logs, judged, begins):
    """`[series, len(judged)]`: whether each window holds `MIN_POINTS` finite values."""
    finite = np.cumsum(np.isfinite(logs), axis=1)
    finite = np.concatenate([np.zeros((len(logs), 1), finite.dtype), finite], axis=1)
    return finite[:, judged] - finite[:, begins] >= MIN_POINTS


def _window_min(values, judged, begins):
    """`[series, len(judged)]`: the smallest finite value of each window `[begins, judged)`
    (NaN where none is), from a sparse table of minima over spans of 2**k steps, built one
    level at a time: `O(series x steps x log WINDOW)`, exact (a minimum rounds nothing)."""
    lengths = judged - begins
    levels = np.floor(np.log2(np.maximum(lengths, 1))).astype(np.int64)
    out = np.full((len(values), len(judged)), np.nan)
    level = values
    for k in range(int(levels.max(initial=0)) + 1):
        if k:
            half = 1 << (k - 1)
            level = np.fmin(level[:, :-half], level[:, half:])  # level[i]: min of [i, i + 2**k)
        picked = np.flatnonzero(levels == k)
        if picked.size:
            head = level[:, begins[picked]]
            tail = level[:, judged[picked] - (1 << k)]
            out[:, picked] = np.fmin(head, tail)
    return out


def _pairs(logs, judged, begins, series, columns):
    """Yields `(rows, columns, past, ages)` per batch of the (series, judged step) pairs picked
    by `series` and `columns` (indices into `judged`): each pair's window of log10 values
    `[pairs, width]` (NaN past its end), as `_windows` gathers them."""
    for first in range(0, len(series), PAIRS):
        rows, picked = series[first : first + PAIRS], columns[first : first + PAIRS]
        where, inside = _spread(judged[picked], begins[picked])
        yield rows, picked, np.where(inside, logs[rows[:, None], where], np.nan), where


def median_exceeds(steps, logs, threshold, at=None):
    """`[series, steps]` bool: where a value's log10 is over `threshold` above the median log10
    of its window (False where a step is not judged). `logs` is `[series, steps]` log10 values,
    NaN where there is none.

    The median of a window is at least its minimum, so a value within `threshold` of its
    window's minimum cannot exceed it: the minima (a sparse table) rule out almost every pair,
    and only the rest have their windows gathered and their medians taken."""
    logs = np.atleast_2d(np.asarray(logs, dtype=np.float64))
    out = np.zeros(logs.shape, bool)
    judged, begins = _judged(steps, at)
    for first in range(0, len(logs) if judged.size else 0, SERIES):
        part = logs[first : first + SERIES]
        now = part[:, judged]
        with np.errstate(invalid="ignore"):
            lowest = _window_min(part, judged, begins)
            maybe = _enough(part, judged, begins) & (now - lowest > threshold)
        for rows, picked, past, _ in _pairs(part, judged, begins, *np.nonzero(maybe)):
            with np.errstate(invalid="ignore"):
                raised = now[rows, picked] - _nanmedian(past) > threshold
            out[first + rows, judged[picked]] = raised
    return out


def baseline(steps, values, step):
    """The median the growth and spike rules judge `values[step]` against: 10 ** the median
    log10 of the finite, positive `values` (`[steps]`, as the rule reads them) of the step's
    window (`step` an index into the logged `steps`), NaN where the window holds none. In an
    even window that is the geometric mean of the two middle values."""
    steps = np.asarray(steps, dtype=np.int64)
    past = _log(np.asarray(values)[_begins(steps, steps[step]) : step])
    if not np.isfinite(past).any():
        return float("nan")
    return float(10 ** _nanmedian(past))


def _nanmedian(values):
    """The median over the last axis of the finite values (NaN sorts last), NaN where none is:
    `np.nanmedian`'s, vectorised."""
    ordered = np.sort(values, axis=-1)
    finite = np.sum(np.isfinite(values), axis=-1, keepdims=True)
    low = np.take_along_axis(ordered, np.maximum(finite - 1, 0) // 2, axis=-1)
    high = np.take_along_axis(ordered, finite // 2 - (finite == 0), axis=-1)
    return np.where(finite > 0, (low + high) / 2, np.nan)[..., 0]


def drift(steps, logs, at=None):
    """`[series, steps]`: the windowed CUSUM of log10 values: the largest
    `log[t] - log[j] - DRIFT_PER_STEP * (steps[t] - steps[j])` over the window's `j` (NaN where a
    step is not judged)."""
    logs = np.atleast_2d(np.asarray(logs, dtype=np.float64))
    out = np.full(logs.shape, np.nan)
    for judged, past, ages in _windows(steps, logs, at):
        enough = np.sum(np.isfinite(past), axis=2) >= MIN_POINTS
        with _quiet():
            lowest = np.nanmin(past + DRIFT_PER_STEP * ages[None], axis=2)
        out[:, judged] = np.where(enough, logs[:, judged] - lowest, np.nan)
    return out


def drift_exceeds(steps, logs, at=None):
    """`[series, steps]` bool: where `drift` is over `DRIFT` (False where a step is not judged).

    `log[j] + DRIFT_PER_STEP * (steps[t] - steps[j])` is `log[j] - DRIFT_PER_STEP * steps[j]`, a
    series of its own, plus the judged step's term: its windows' minima (a sparse table) bound
    the drift, and only the pairs the bound cannot rule out are gathered and judged by `drift`'s
    sums."""
    logs = np.atleast_2d(np.asarray(logs, dtype=np.float64))
    out = np.zeros(logs.shape, bool)
    judged, begins = _judged(steps, at)
    steps = np.asarray(steps, dtype=np.int64)
    allowance = DRIFT_PER_STEP * steps.astype(np.float64)
    for first in range(0, len(logs) if judged.size else 0, SERIES):
        part = logs[first : first + SERIES]
        now = part[:, judged]
        with np.errstate(invalid="ignore"):
            bound = now - allowance[judged] - _window_min(part - allowance, judged, begins)
            maybe = _enough(part, judged, begins) & (bound > DRIFT - _BOUND_SLACK)
        for rows, picked, past, where in _pairs(part, judged, begins, *np.nonzero(maybe)):
            ages = steps[judged[picked]][:, None] - steps[where]
            with _quiet():
                lowest = np.nanmin(past + DRIFT_PER_STEP * ages, axis=1)
                out[first + rows, judged[picked]] = now[rows, picked] - lowest > DRIFT
    return out


@contextlib.contextmanager
def _quiet():
    """An all-NaN slice gives NaN without a RuntimeWarning."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _few(tensor):
    """`[steps]`: where a tensor holds fewer than `MIN_COUNT` values (a bias of one unit is one
    number, whose magnitude swings by orders as it crosses zero)."""
    count = tensor.get("count")
    if count is None:
        return False
    with np.errstate(invalid="ignore"):
        return np.asarray(count, dtype=np.float64) < MIN_COUNT


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


def update_series(layer):
    """`[(weight, per-step update ratio)]` of a layer's update rows, `[steps]` each, NaN where
    the weight's values (its `weight/<name>` tensor, when recorded) are fewer than `MIN_COUNT`."""
    found = []
    for weight, update in layer.get("updates", {}).items():
        values = layer["tensors"].get(f"{records.WEIGHT}/{weight}")
        few = False if values is None else _few(values)
        with np.errstate(invalid="ignore", divide="ignore"):
            interval = np.asarray(update["interval"], dtype=np.float64)
            per_step = np.where(interval > 0, update["update_ratio"] / interval, np.nan)
        found.append((weight, np.where(few, np.nan, per_step)))
    return found


def verdicts(steps, layers, at=None):
    """Every warning of every layer at every step of `[layers, steps]` columns (`health`'s,
    with `updates` as the digest's), all series judged at once.

    Args:
      steps: the logged steps, `[steps]` ints, sorted.
      layers: the layers' columns.
      at: None to judge every step, or the indices of the steps to judge.

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
    with np.errstate(invalid="ignore"):
        judged = {
            "rms_growth": median_exceeds(steps, rms, np.log10(GROWTH), at),
            "max_growth": median_exceeds(steps, peak, np.log10(GROWTH), at),
            "rms_drift": drift_exceeds(steps, rms, at),
            "peak_ratio": median_exceeds(steps, peak - rms, np.log10(PEAK), at),
            "update_spike": median_exceeds(steps, _log(per_step), np.log10(SPIKE), at)
            & (per_step > SPIKE_FLOOR),
        }
    found = {warning: np.zeros((len(layers), count), bool) for warning in WARNINGS}
    found["tensors"] = {warning: [] for warning in WARNINGS}
    rows = {"tensors": 0, "updates": 0}
    for i in range(len(layers)):
        for warning in WARNINGS:
            kind, names = (
                ("updates", [w for w, _ in updates[i]])
                if warning == "update_spike"
                else ("tensors", [name for name, _ in tensors[i]])
            )
            raised = judged[warning][rows[kind] : rows[kind] + len(names)]
            found["tensors"][warning].append(list(zip(names, raised)))
            if names:
                found[warning][i] = raised.any(axis=0)
        rows["tensors"] += len(tensors[i])
        rows["updates"] += len(updates[i])
    return found


def origin_of(columns, found, warning, step):
    """`(layer index, tensor)` where `warning` began at one step (index into the columns)."""
    raised = {
        (index, tensor)
        for index, by_tensor in enumerate(found["tensors"][warning])
        for tensor, at in by_tensor
        if at[step]
    }
    if warning == "update_spike":
        # Weights: the first layer in model order, its first weight that spiked.
        return min(raised, key=lambda item: (item[0], _weight_order(columns[item[0]], item[1])))
    for index, tensor in origin.step_order(columns, (origin.FORWARD, origin.BACKWARD)):
        if (index, tensor) in raised:
            return index, tensor
    return min(raised)


def _weight_order(layer, weight):
    names = list(layer.get("updates", {}))
    return names.index(weight) if weight in names else len(names)
