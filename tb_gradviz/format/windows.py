"""The windows the warnings judge a step against, and the rules' arithmetic over them.

A warning (`leading`) judges the value of a series at a logged step against
the same series over the `WINDOW` steps before it. The functions here take
`[series, steps]` log10 values (NaN where there is none) and the logged
steps, and judge every series at once: a window's median (`median_exceeds`),
its lowest point less an allowance per step (`drift_exceeds`, a windowed
CUSUM) and the highest value over a longer history (`record_exceeds`). A
step is judged only when its window holds at least `MIN_POINTS` finite
values and its oldest is at least `WINDOW / 2` steps before it. Numpy only.
"""

import contextlib
import warnings

import numpy as np

WINDOW = 100  # steps of history a step is judged against
MIN_POINTS = 3


def log10(values):
    """log10 of `values` (a copy, logged in place), NaN where a value is not finite and
    positive."""
    values = np.array(values, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        values[~(np.isfinite(values) & (values > 0))] = np.nan
        return np.log10(values, out=values)


# Steps judged together: a chunk gathers `[series, CHUNK, window]` values at once.
CHUNK = 256
# (series, step) pairs whose windows are gathered together to be judged exactly.
PAIRS = 16_384
# Series judged together: the sparse table's levels are `[SERIES, steps]` each.
SERIES = 64
# Judged steps whose windows are read directly, without a sparse table.
FEW = 4
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


def _begins(steps, judged, span=None):
    """Where the window of each of the `judged` steps begins among the logged `steps`: its
    oldest step is `span` (None: `WINDOW`) steps or fewer before."""
    span = WINDOW if span is None else span
    return np.searchsorted(steps, np.asarray(judged) - span, side="left")


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


def _chunk(judged, series):
    """How many of `series` series are judged together: `SERIES` at a time (a sparse table's
    levels are `[SERIES, steps]` each), all at once when `FEW` steps or fewer are judged."""
    return SERIES if len(judged) > FEW else max(series, 1)


def _spread(judged, begins):
    """`(where, inside)` `[len(judged), width]`: each window's step indices (clipped to its
    last) and which of them are in it."""
    width = int(np.max(judged - begins))
    where = begins[:, None] + np.arange(width)[None, :]
    inside = where < judged[:, None]
    return np.minimum(where, judged[:, None] - 1), inside


def _each_window(values, judged, begins, reduce):
    """`[series, len(judged)]`: `reduce(window, axis=1)` of each window `[begins, judged)` of
    `values`, read in place (a window is a run of steps: a view, no copy)."""
    out = np.empty((len(values), len(judged)))
    for i, (begin, end) in enumerate(zip(begins, judged)):
        out[:, i] = reduce(values[:, begin:end], axis=1)
    return out


def _enough(logs, judged, begins):
    """`[series, len(judged)]`: whether each window holds `MIN_POINTS` finite values."""
    if 0 < len(judged) <= FEW:
        # A step or a few: their windows counted directly, not every step's running count.
        return _each_window(np.isfinite(logs), judged, begins, np.count_nonzero) >= MIN_POINTS
    finite = np.cumsum(np.isfinite(logs), axis=1)
    finite = np.concatenate([np.zeros((len(logs), 1), finite.dtype), finite], axis=1)
    return finite[:, judged] - finite[:, begins] >= MIN_POINTS


def _window_min(values, judged, begins):
    """`[series, len(judged)]`: the smallest finite value of each window `[begins, judged)`
    (NaN where none is), from a sparse table of minima over spans of 2**k steps, built one
    level at a time: `O(series x steps x log WINDOW)`, exact (a minimum rounds nothing)."""
    if len(judged) <= FEW:
        # A step or a few (the callback judges its last event): their windows read directly.
        with _quiet():
            return _each_window(values, judged, begins, np.nanmin)
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


def median_exceeds(steps, logs, threshold, at=None, values=None):
    """`[series, steps]` bool: where a value's log10 is over `threshold` above the median log10
    of its window (False where a step is not judged). `logs` is `[series, steps]` log10 values,
    NaN where there is none; `values`, of the same shape, the values judged against the windows
    of `logs` (None: `logs`' own).

    The median of a window is at least its minimum, so a value within `threshold` of its
    window's minimum cannot exceed it: the minima (a sparse table) rule out almost every pair,
    and only the rest have their windows gathered and their medians taken."""
    logs = np.atleast_2d(np.asarray(logs, dtype=np.float64))
    values = logs if values is None else np.atleast_2d(np.asarray(values, dtype=np.float64))
    out = np.zeros(logs.shape, bool)
    judged, begins = _judged(steps, at)
    chunk = _chunk(judged, len(logs))
    for first in range(0, len(logs) if judged.size else 0, chunk):
        part = logs[first : first + chunk]
        now = values[first : first + chunk][:, judged]
        with np.errstate(invalid="ignore"):
            lowest = _window_min(part, judged, begins)
            maybe = _enough(part, judged, begins) & (now - lowest > threshold)
        for rows, picked, past, _ in _pairs(part, judged, begins, *np.nonzero(maybe)):
            with np.errstate(invalid="ignore"):
                raised = now[rows, picked] - nanmedian(past) > threshold
            out[first + rows, judged[picked]] = raised
    return out


def baseline(steps, values, step):
    """The median the growth and spike rules judge `values[step]` against: 10 ** the median
    log10 of the finite, positive `values` (`[steps]`, as the rule reads them) of the step's
    window (`step` an index into the logged `steps`), NaN where the window holds none. In an
    even window that is the geometric mean of the two middle values."""
    steps = np.asarray(steps, dtype=np.int64)
    past = log10(np.asarray(values)[_begins(steps, steps[step]) : step])
    if not np.isfinite(past).any():
        return float("nan")
    return float(10 ** nanmedian(past))


def nanmedian(values):
    """The median over the last axis of the finite values (NaN sorts last), NaN where none is:
    `np.nanmedian`'s, vectorised."""
    ordered = np.sort(values, axis=-1)
    finite = np.sum(np.isfinite(values), axis=-1, keepdims=True)
    low = np.take_along_axis(ordered, np.maximum(finite - 1, 0) // 2, axis=-1)
    high = np.take_along_axis(ordered, finite // 2 - (finite == 0), axis=-1)
    return np.where(finite > 0, (low + high) / 2, np.nan)[..., 0]


def drift(steps, logs, per_step, at=None):
    """`[series, steps]`: the windowed CUSUM of log10 values: the largest
    `log[t] - log[j] - per_step * (steps[t] - steps[j])` over the window's `j` (NaN where a
    step is not judged)."""
    logs = np.atleast_2d(np.asarray(logs, dtype=np.float64))
    out = np.full(logs.shape, np.nan)
    for judged, past, ages in _windows(steps, logs, at):
        enough = np.sum(np.isfinite(past), axis=2) >= MIN_POINTS
        with _quiet():
            lowest = np.nanmin(past + per_step * ages[None], axis=2)
        out[:, judged] = np.where(enough, logs[:, judged] - lowest, np.nan)
    return out


def drift_exceeds(steps, logs, threshold, per_step, at=None):
    """`[series, steps]` bool: where `drift` is over `threshold` (False where a step is not
    judged).

    `log[j] + per_step * (steps[t] - steps[j])` is `log[j] - per_step * steps[j]`, a
    series of its own, plus the judged step's term: its windows' minima (a sparse table) bound
    the drift, and only the pairs the bound cannot rule out are gathered and judged by `drift`'s
    sums."""
    logs = np.atleast_2d(np.asarray(logs, dtype=np.float64))
    out = np.zeros(logs.shape, bool)
    judged, begins = _judged(steps, at)
    steps = np.asarray(steps, dtype=np.int64)
    allowance = per_step * steps.astype(np.float64)
    chunk = _chunk(judged, len(logs))
    for first in range(0, len(logs) if judged.size else 0, chunk):
        part = logs[first : first + chunk]
        now = part[:, judged]
        with np.errstate(invalid="ignore"):
            bound = now - allowance[judged] - _window_min(part - allowance, judged, begins)
            maybe = _enough(part, judged, begins) & (bound > threshold - _BOUND_SLACK)
        for rows, picked, past, where in _pairs(part, judged, begins, *np.nonzero(maybe)):
            ages = steps[judged[picked]][:, None] - steps[where]
            with _quiet():
                lowest = np.nanmin(past + per_step * ages, axis=1)
                out[first + rows, judged[picked]] = now[rows, picked] - lowest > threshold
    return out


@contextlib.contextmanager
def _quiet():
    """An all-NaN slice gives NaN without a RuntimeWarning."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def record_exceeds(steps, logs, threshold, span, at=None, values=None):
    """`[series, steps]` bool: where a value's log10 is over `threshold` above the highest
    log10 of the series over the `span` steps before it (False where a step is not judged, or
    that history holds no value; `values`: as for `median_exceeds`)."""
    logs = np.atleast_2d(np.asarray(logs, dtype=np.float64))
    values = logs if values is None else np.atleast_2d(np.asarray(values, dtype=np.float64))
    out = np.zeros(logs.shape, bool)
    judged, _ = _judged(steps, at)
    if not judged.size:
        return out
    history = _begins(np.asarray(steps, dtype=np.int64), np.asarray(steps)[judged], span)
    chunk = _chunk(judged, len(logs))
    for first in range(0, len(logs), chunk):
        part = logs[first : first + chunk]
        with np.errstate(invalid="ignore"):
            if len(judged) <= FEW:
                with _quiet():
                    highest = _each_window(part, judged, history, np.nanmax)
            else:
                highest = -_window_min(-part, judged, history)
            now = values[first : first + chunk][:, judged]
            out[first : first + chunk, judged] = now - highest > threshold
    return out


def smoothed(steps, logs, span):
    """`[series, steps]`: at each logged step, the median of the series' log10 values over the
    `span` steps up to it (that step's and those of the `span - 1` before; NaN where none is
    finite): a trend without the step-to-step noise. A series logged every `span` steps or
    more sparsely is its own trend."""
    steps = np.asarray(steps, dtype=np.int64)
    logs = np.atleast_2d(np.asarray(logs, dtype=np.float64))
    if not len(steps):
        return logs.copy()
    ends = np.arange(len(steps))
    begins = np.searchsorted(steps, steps - (span - 1), side="left")
    width = int(np.max(ends - begins)) + 1
    where = ends[:, None] - np.arange(width)[None, :]
    inside = where >= begins[:, None]
    past = np.where(inside[None], logs[:, np.maximum(where, 0)], np.nan)
    return nanmedian(past)
