"""`GradVizCallback(stop_on=...)`: stop `fit` after a log event that raised a flag or a warning.

Each log event's records are judged at capture time by the board's own rule
functions, which live in the format so that both sides import them: the
flags (`health.verdicts`) over the event's digest, and the warnings
(`leading.verdicts`) over the digests of the events of the last
`leading.WINDOW` steps, which the callback keeps in memory. So a fit
stopped on a flag or a warning at step `s` is one that `/onset` and
`tb-gradviz check` name at step `s` too.
"""

import collections

import numpy as np

from tb_gradviz.format import digest, full_records, health, leading


class StopOn:
    """Judges each log event and says whether to stop (`judge`)."""

    def __init__(self, names, predicate):
        self.names, self.predicate = names, predicate
        self._window = _Window()  # the digest columns of the events of the last WINDOW steps

    @property
    def active(self):
        return bool(self.names) or self.predicate is not None

    def judge(self, step, written):
        """Judges one event's records at `step`.

        Returns:
          `(stop, raised)`: whether to stop training, and what the event
          raised (all flags and warnings, each `{"flag", "class", "step",
          "layer", "tensor"}`, flags first).
        """
        found = digest.digest_records(written)
        if not found:
            return False, []
        columns = full_records.event_columns(written, found[0])
        window = self._window
        if window.steps and window.steps[-1] >= step:
            window.clear()  # the steps went back (a model trained anew): a new history
        while window.steps and window.steps[0] < step - leading.WINDOW:
            window.drop_first()
        window.append(step, columns)
        raised = _flags(step, columns) + _warnings(window)
        if self.predicate is not None:
            return bool(self.predicate(raised)) if raised else False, raised
        return any(entry["flag"] in self.names for entry in raised), raised


class _Window:
    """The one-step digest columns of the last events, kept as one series per value.

    Each event appends one value to every series (NaN to those it does not
    hold), so judging an event reads series already built: the cost of an
    event is its own values, not the window's (rebuilding every series from
    the window's events at each event took 18 % of a ResNet50 all-layers
    event, bench/RESULTS.md section 15).
    """

    _PARTS = (("tensors", ("rms", "max_abs")), ("updates", digest.UPDATE_FIELDS))

    def __init__(self):
        self.clear()

    def clear(self):
        self.steps = collections.deque()
        self.last = []  # the last event's columns: its layers, in model order
        self._series = {}  # (layer, part, key, field) -> deque of one value per step

    def append(self, step, columns):
        held = len(self.steps)
        appended = set()
        for layer in columns:
            for part, fields in self._PARTS:
                for key, values in layer[part].items():
                    for field in fields:
                        name = (layer["layer"], part, key, field)
                        series = self._series.get(name)
                        if series is None:
                            series = self._series[name] = collections.deque([np.nan] * held)
                        series.append(float(values[field][0]))
                        appended.add(name)
        for name, series in self._series.items():
            if name not in appended:
                series.append(np.nan)
        self.steps.append(step)
        self.last = columns

    def drop_first(self):
        self.steps.popleft()
        for series in self._series.values():
            series.popleft()

    def merged(self):
        """The last event's layers with each tensor's and update's values at every event of the
        window (NaN where an event did not hold it)."""

        def series(name):
            return np.fromiter(self._series[name], np.float64, len(self.steps))

        merged = []
        for layer in self.last:
            name = layer["layer"]
            tensors = {
                tensor: {
                    "role": values["role"],
                    "rms": series((name, "tensors", tensor, "rms")),
                    "max_abs": series((name, "tensors", tensor, "max_abs")),
                }
                for tensor, values in layer["tensors"].items()
            }
            updates = {
                weight: {
                    field: series((name, "updates", weight, field))
                    for field in digest.UPDATE_FIELDS
                }
                for weight in layer["updates"]
            }
            merged.append(dict(layer, tensors=tensors, updates=updates))
        return merged


def _flags(step, columns):
    if not columns:
        return []
    found = health.verdicts(columns)
    raised = []
    for flag in health.FLAGS:
        origin = health.flag_origin(columns, found, flag, 0)
        if origin is not None:
            index, tensor = origin
            raised.append(_entry(flag, "flag", step, columns[index]["layer"], tensor))
    return raised


def _warnings(window):
    """The warnings raised at the last event of `window`, judged over all of it."""
    steps = np.array(window.steps, dtype=np.int64)
    columns = window.merged()
    if len(steps) < 2 or not columns:
        return []
    last = len(steps) - 1
    found = leading.verdicts(steps, columns, at=[last])
    raised = []
    for warning in leading.WARNINGS:
        if found[warning][:, last].any():
            index, tensor = leading.origin_of(columns, found, warning, last)
            raised.append(
                _entry(warning, "warning", int(steps[last]), columns[index]["layer"], tensor)
            )
    return raised


def _entry(flag, kind, step, layer, tensor):
    return {"flag": flag, "class": kind, "step": int(step), "layer": layer, "tensor": tensor}
