"""The series the warnings read, held by the callback's judge and appended at each log event.

The board judges a whole run: it builds the columns of every logged step
(`rule_columns.build`) and the series the rules read from them
(`leading.verdicts`). The callback judges its last event only, over the
events of the last `leading.HISTORY` steps (`judgement.Judge`); building
those columns and series again at every event would re-read every event
held, each time. `History` keeps each judged series' values at the events
held (a `leading.Series`, in arrays with room for twice the events a
history holds: an event writes one column, and the columns held move back
to the start only when the room is used up), computes each event's column
once when it comes (its log10 values, and its update trend, which depends
on it and the `leading.SMOOTH` steps before), and judges the last column
over views of the arrays: the arrays `leading.verdicts` builds from the same
events, so the same verdicts.

Its series are those of one digest layout (the digest's rows) and one set
of layers' metadata (`Layout`). Whether they are the events the judge
holds, `current` says: not while the judge holds events of another digest
layout (their columns merge), nor an event where a tensor's count or a
layer's channels are missing (the columns take the value of the step
before there). The judge then builds the columns anew. Numpy only.
"""

import numpy as np

from tb_gradviz.format import digest, leading, records, windows


class Layout:
    """Where each judged series' values are in a digest vector with these rows, for the layers'
    columns of one event (`rule_columns.build`, which sets the layers, their order, their
    judged tensors and weights; `leading.tensor_series`, `leading.update_series`).

    Args:
      rows: the digest's rows, `(kind, layer, name)` each.
      layers: the layers' columns of an event of this digest (`Columns.layers`).
    """

    def __init__(self, rows, layers):
        self.layers = layers
        offsets, _ = digest.row_offsets(rows)
        where = {tuple(row): offset for row, offset in zip(rows, offsets)}

        def at(kind, layer, name, field):
            return where[(kind, layer, name)] + digest.FIELDS[kind].index(field)

        self.names, self.weights = [], []
        tensors, updates, weight_counts, described = [], [], [], []
        for layer in layers:
            names = [name for name, _ in leading.tensor_series(layer)]
            weights = list(layer.get("updates", {}))
            self.names.append(names)
            self.weights.append(weights)
            tensors += [
                [at(digest.TENSOR, layer["layer"], n, f) for f in ("count", "rms", "max_abs")]
                for n in names
            ]
            updates += [
                [at(digest.UPDATE, layer["layer"], w, f) for f in digest.UPDATE_FIELDS]
                for w in weights
            ]
            for weight in weights:
                # A weight's size: its values' count at each step where they are recorded, else
                # the one the digest's metadata gives; without either it is judged whatever
                # its size (`leading.update_series`).
                values = records.weight_tensor_name(records.WEIGHT, weight)
                found = values in layer["tensors"]
                weight_counts.append(
                    at(digest.TENSOR, layer["layer"], values, "count") if found else -1
                )
                count = None if found else layer.get("weight_counts", {}).get(weight)
                described.append(np.nan if count is None else count)
        self.tensors = np.array(tensors, np.int64).reshape(-1, 3).T
        self.updates = np.array(updates, np.int64).reshape(-1, 2).T
        self.weight_counts = np.array(weight_counts, np.int64)
        self.described = np.array(described, np.float64)
        # The values the columns take from the step before where they are missing.
        self.needed = np.array(
            [
                at(kind, layer, name, "count" if kind == digest.TENSOR else "channels")
                for kind, layer, name in map(tuple, rows)
                if kind in (digest.TENSOR, digest.UNITS)
            ],
            np.int64,
        )

    def complete(self, vector):
        """Whether no value that the columns would take from the step before is missing."""
        return bool(np.isfinite(vector[self.needed]).all())

    def column(self, vector):
        """The event's `leading.Series` values but its trend: `(rms, peak, peak_ratio,
        per_step, updates, larger)`, `larger` the log10 of the per-step update ratios of the
        weights of `leading.UPDATE_MIN_COUNT` values or more (NaN for the others), as
        `leading.verdicts` computes them from the event's columns."""
        count, rms, max_abs = (vector[i] for i in self.tensors)
        with np.errstate(invalid="ignore"):
            few = count < leading.MIN_COUNT
        rms = windows.log10(np.where(few, np.nan, rms))
        peak = windows.log10(np.where(few, np.nan, max_abs))
        ratio, interval = (vector[i] for i in self.updates)
        weight_count = np.where(self.weight_counts >= 0, vector[self.weight_counts], self.described)
        with np.errstate(invalid="ignore", divide="ignore"):
            per_step = np.where(interval > 0, ratio / interval, np.nan)
            few = weight_count < leading.MIN_COUNT
            small = weight_count < leading.UPDATE_MIN_COUNT
            judged = np.where(few, np.nan, per_step)
            return (
                rms,
                peak,
                peak - rms,
                judged,
                windows.log10(judged),
                windows.log10(np.where(small, np.nan, per_step)),
            )


class History:
    """The judged series' values at the events held, one column per event (`append`)."""

    def __init__(self, room=2 * (leading.HISTORY + 1)):
        self._room = room
        self.key = None
        self.layout = None
        self._reset()

    def _reset(self):
        self._begin = self._end = 0
        self._steps = np.zeros(self._room, np.int64)
        self._complete = np.zeros(self._room, bool)
        self._in_step = np.zeros(self._room, bool)
        self._arrays = None

    def start(self, key, layout):
        """Holds no event, and the series of `layout` from now on (`key`: what it is of)."""
        self.key, self.layout = key, layout
        self._reset()
        tensors, weights = self.layout.tensors.shape[1], self.layout.updates.shape[1]
        sizes = (tensors,) * 3 + (weights,) * 4
        self._arrays = [np.full((size, self._room), np.nan) for size in sizes]

    def clear(self):
        """Holds no event, until `start`."""
        self.key = None
        self._reset()

    def __len__(self):
        return self._end - self._begin

    def append(self, step, vector, in_step=False):
        """Writes the column of the event at `step` (later than those held) with this `vector`
        (float64, today's layout; `in_step`: the train step's digest)."""
        if self._end == self._room:
            self._make_room()
        end, layout = self._end, self.layout
        values = list(layout.column(vector))
        if step < leading.UPDATE_FROM:  # a warm-up's first steps: no trend (`update_trend`)
            values[-1] = np.full_like(values[-1], np.nan)
        # The arrays: `Layout.column`'s, then the trend.
        for array, value in zip(self._arrays, values):
            array[:, end] = value
        self._steps[end] = step
        self._complete[end] = layout.complete(vector)
        self._in_step[end] = in_step
        # The trend at this step: the median over the steps of the last SMOOTH held.
        first = max(self._begin, end + 1 - leading.SMOOTH)
        self._end = end + 1
        trend = windows.smoothed(
            self._steps[first : end + 1], self._arrays[5][:, first : end + 1], leading.SMOOTH
        )
        self._arrays[6][:, end] = trend[:, -1]

    def _make_room(self):
        held = len(self)
        if held * 2 > self._room:
            self._room *= 2
            grown = [np.full((len(a), self._room), np.nan) for a in self._arrays]
            for new, old in zip(grown, self._arrays):
                new[:, :held] = old[:, self._begin : self._end]
            self._arrays = grown
            for name in ("_steps", "_complete", "_in_step"):
                old = getattr(self, name)
                grown_column = np.zeros(self._room, old.dtype)
                grown_column[:held] = old[self._begin : self._end]
                setattr(self, name, grown_column)
        else:
            for array in self._arrays:
                array[:, :held] = array[:, self._begin : self._end]
            for held_array in (self._steps, self._complete, self._in_step):
                held_array[:held] = held_array[self._begin : self._end]
        self._begin, self._end = 0, held

    def keep_from(self, step):
        """Drops the events before `step`."""
        while self._begin < self._end and self._steps[self._begin] < step:
            self._begin += 1

    def current(self, key, held):
        """Whether these series are those of `key`'s layout over the `held` events the judge
        holds, every one complete."""
        return (
            self.key == key
            and len(self) == held
            and bool(self._complete[self._begin : self._end].all())
        )

    def warnings(self):
        """The warnings raised at the last event held, as `judgement` lists them."""
        if len(self) < 2 or not self.layout.layers:
            return []
        steps = self._steps[self._begin : self._end]
        held = [array[:, self._begin : self._end] for array in self._arrays]
        series = leading.Series(*held[:5], held[6])
        last = len(steps) - 1
        in_step = self._in_step[self._begin : self._end]
        judged = leading.judged_series(steps, series, at=[last], in_step=in_step)
        at_last = {warning: judged[warning][:, last : last + 1] for warning in leading.WARNINGS}
        if not any(raised.any() for raised in at_last.values()):
            return []
        found = leading.by_layer(at_last, self.layout.names, self.layout.weights, 1)
        raised = []
        for warning in leading.WARNINGS:
            if found[warning][:, 0].any():
                index, tensor = leading.origin_of(self.layout.layers, found, warning, 0)
                raised.append((warning, int(steps[last]), index, tensor))
        return raised
