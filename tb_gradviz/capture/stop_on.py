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
        self._history = collections.deque()  # (step, one-step columns) of the last events

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
        if self._history and self._history[-1][0] >= step:
            self._history.clear()  # the steps went back (a model trained anew): a new history
        while self._history and self._history[0][0] < step - leading.WINDOW:
            self._history.popleft()
        self._history.append((step, columns))
        raised = _flags(step, columns) + _warnings(self._history)
        if self.predicate is not None:
            return bool(self.predicate(raised)) if raised else False, raised
        return any(entry["flag"] in self.names for entry in raised), raised


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


def _warnings(history):
    """The warnings raised at the last event of `history`, judged over all of it."""
    steps = np.array([step for step, _ in history], dtype=np.int64)
    columns = _merged([layers for _, layers in history])
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


def _merged(events):
    """The last event's layers with each tensor's and update's values at every event (NaN where
    an event did not hold it)."""
    merged = []
    for layer in events[-1]:
        name = layer["layer"]
        at = [
            next((other for other in layers if other["layer"] == name), None) for layers in events
        ]

        def series(part, key, field, at=at):
            return np.array(
                [
                    np.nan
                    if other is None or key not in other[part]
                    else other[part][key][field][0]
                    for other in at
                ],
                dtype=np.float64,
            )

        tensors = {
            tensor: {
                "role": values["role"],
                "rms": series("tensors", tensor, "rms"),
                "max_abs": series("tensors", tensor, "max_abs"),
            }
            for tensor, values in layer["tensors"].items()
        }
        updates = {
            weight: {field: series("updates", weight, field) for field in digest.UPDATE_FIELDS}
            for weight in layer["updates"]
        }
        merged.append(dict(layer, tensors=tensors, updates=updates))
    return merged


def _entry(flag, kind, step, layer, tensor):
    return {"flag": flag, "class": kind, "step": int(step), "layer": layer, "tensor": tensor}
