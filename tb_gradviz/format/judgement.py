"""The callback's one judgement of each log event: the flags and warnings it raised.

Each log event is judged once (`Judge.judge`), by the rules `/onset` and
`tb-gradviz check` apply to the written run, over the columns that
`rule_columns.build` gives both sides: the flags (`health.verdicts`) at the
event's step, and, when asked, the warnings (`leading.verdicts`) over the
events of the last `leading.HISTORY` steps, which the judge keeps in memory.
The warnings' series are kept as they come (`history.History`, a column
per event); the columns of every event held are built anew only where those
series are not the events held (another digest layout among them, a missing
value the columns take from the step before): the same verdicts either way.
Its `Judgement` serves the full-records keeper (an onset keeps its full
records, `full_records.Keeper`) and `stop_on=` (`capture/stop_on.py`)
alike, so what stops a fit at step `s` is what `/onset` and `check` name
at step `s`.

Numpy only.
"""

import collections
import functools
import itertools
from typing import NamedTuple

import numpy as np

from tb_gradviz.format import digest, health, history, leading, metadata, rule_columns


class Judgement(NamedTuple):
    """What one log event raised."""

    step: int
    # The digest record the judge computed from the event's records (`digest.digest_records`),
    # to be written with them: one, or none (none either when the event brought its own).
    digests: list
    raised: list  # `{"flag", "class", "step", "layer", "tensor"}` each, flags first

    @property
    def flags(self):
        """The names of the flags (not the warnings) raised."""
        return {entry["flag"] for entry in self.raised if entry["class"] == "flag"}


class _Event(NamedTuple):
    step: int
    content: bytes  # the digest's metadata content (its rows)
    rows: list
    vector: np.ndarray
    loss_scale: tuple  # `(fields, values)` of its loss-scale record, or None
    in_step: bool  # whether its digest is the train step's (a digest-source record says so)


@functools.lru_cache(maxsize=4096)
def _parsed(content):
    try:
        return metadata.parse_plugin_metadata(content)
    except ValueError:
        return None


class Judge:
    """Judges each log event (`judge`), keeping what the rules need of the events before it.

    Args:
      warnings: also judge the warnings, over the events of the last
        `leading.HISTORY` steps (else only the flags, which need the event
        itself and the loss-scale counts of the one before).
    """

    def __init__(self, warnings=False):
        self.warnings = warnings
        self._events = collections.deque()
        self._layers = {}  # layer -> `rule_columns.LayerInfo`, from the events' metadata
        self._before = (0.0, 0.0)  # loss-scale `(batches, applied)` before the first event held
        self._version = 0  # counts the changes of `_layers`
        self._history = history.History()
        self._one = rule_columns.OneEvent()  # the columns of one event, built once per layout

    def judge(self, step, event_records):
        """Judges one event's records at `step`.

        Args:
          step: the event's step.
          event_records: its `(tag, array, summary_metadata)` records: its full
            records, whose digest the judge computes, or a digest made
            elsewhere (the train step's, `capture.in_step`), read as it is.
            The layers' roles and dtypes are those of the tensor records
            judged before when the event holds none.

        Returns:
          The event's `Judgement`.
        """
        event_records = list(event_records)
        given = [r for r in event_records if _is_digest(r)]
        digests = [] if given else digest.digest_records(event_records)
        if not (given or digests):
            return Judgement(step, digests, [])
        self._hold(step, event_records, (given or digests)[0])
        return Judgement(step, digests, self._raised(step))

    def _raised(self, step):
        """The flags and warnings raised at the last event held (at `step`)."""
        last = self._events[-1]
        if self.warnings and self._history.current(
            (last.content, self._version), len(self._events)
        ):
            before = self._before_last()
            if before is not None:
                # The last event's columns alone hold its step's values (none is missing).
                raised = _flags(step, self._columns([last], before, reuse=True))
                layers = self._history.layout.layers
                for warning, at, index, tensor in self._history.warnings():
                    raised.append(_entry(warning, "warning", at, layers[index]["layer"], tensor))
                return raised
        columns = self._columns(reuse=True)
        raised = _flags(step, columns)
        if self.warnings:
            in_step = np.isin(columns.steps, [e.step for e in self._events if e.in_step])
            raised += _warnings(columns, in_step)
        return raised

    def _before_last(self):
        """The loss-scale `(batches, applied)` before the last event held, as the columns of
        every event held count them (the latest event before it with a loss-scale record of
        its fields, else those before the first held); None where its columns alone would not
        have its step's values (a loss-scale record held, none in it)."""
        last = self._events[-1]
        if last.loss_scale is None:
            scaled = any(event.loss_scale is not None for event in self._events)
            return None if scaled else self._before
        fields = last.loss_scale[0]
        for event in itertools.islice(reversed(self._events), 1, None):
            if event.loss_scale is not None and event.loss_scale[0] == fields:
                if "batches" not in fields or "applied" not in fields:
                    return self._before
                values = event.loss_scale[1]
                return (values[fields.index("batches")], values[fields.index("applied")])
        return self._before

    def _hold(self, step, event_records, digest_record):
        events = self._events
        if events and events[-1].step >= step:
            # The steps went back (a model trained anew): a new history.
            events.clear()
            self._before = (0.0, 0.0)
            self._history.clear()
        loss_scale, in_step = None, False
        for _, array, summary_metadata in event_records:
            if summary_metadata is None:
                continue
            parsed = _parsed(summary_metadata.plugin_data.content)
            if parsed is None:
                continue
            if parsed.get("kind") == metadata.KIND_TENSOR:
                self._add_tensor(parsed)
            elif parsed.get("kind") == metadata.KIND_LOSS_SCALE:
                loss_scale = (tuple(parsed["fields"]), np.asarray(array, np.float64).ravel())
            elif parsed.get("kind") == metadata.KIND_DIGEST_SOURCE:
                in_step = bool(digest.marked_in_step(parsed["fields"], array)[0])
        _, vector, summary_metadata = digest_record
        content = summary_metadata.plugin_data.content
        rows = _parsed(content)["rows"]
        events.append(_Event(step, content, rows, np.asarray(vector), loss_scale, in_step))
        kept = leading.HISTORY if self.warnings else 0
        while len(events) > 1 and events[0].step < step - kept:
            self._drop_first()
        if self.warnings:
            self._follow()

    def _follow(self):
        """Writes the last event's column into the history, started anew (from the events held
        of its digest layout) where its layout or the layers' metadata changed."""
        events, history_ = self._events, self._history
        last = events[-1]
        key = (last.content, self._version)
        history_.keep_from(events[0].step)
        if history_.key == key:
            news = [last]
        else:
            layout = history.Layout(last.rows, self._columns([last], self._before).layers)
            history_.start(key, layout)
            news = [event for event in events if event.content == last.content]
        for event in news:
            vector = _today(event)
            if vector is not None:
                history_.append(event.step, vector, event.in_step)

    def _add_tensor(self, parsed):
        layer = parsed["layer"]
        found = self._layers.get(layer)
        if found is None:
            found = self._layers[layer] = rule_columns.LayerInfo(parsed, [])
        if all(content["tensor"] != parsed["tensor"] for content in found.contents):
            found.contents.append(parsed)
            self._version += 1

    def _drop_first(self):
        dropped = self._events.popleft()
        if dropped.loss_scale is not None:
            fields, values = dropped.loss_scale
            if "batches" in fields and "applied" in fields:
                self._before = (
                    values[fields.index("batches")],
                    values[fields.index("applied")],
                )

    def _columns(self, events=None, before=None, reuse=False):
        """The `rule_columns.Columns` of `events` (None: those held), with the loss-scale
        counts `before` the first (None: those before the first held); with `reuse`, one
        event's without a loss-scale record are `rule_columns.OneEvent`'s, whose arrays the
        next such event overwrites (for the flags judged at once)."""
        events = self._events if events is None else events
        before = self._before if before is None else before
        if reuse and len(events) == 1 and events[0].loss_scale is None:
            event = events[0]
            series = rule_columns.DigestSeries(
                event.rows,
                np.array([event.step], np.int64),
                event.vector,
                digest.update_weights(_parsed(event.content) or {}),
            )
            return self._one.build((event.content, self._version), self._layers, series)
        by_rows = {}
        for event in events:
            by_rows.setdefault(event.content, []).append(event)
        digests = [
            rule_columns.DigestSeries(
                alike[0].rows,
                np.array([e.step for e in alike], np.int64),
                np.stack([e.vector for e in alike]),
                digest.update_weights(_parsed(alike[0].content) or {}),
            )
            for alike in by_rows.values()
        ]
        scaled = [e for e in events if e.loss_scale is not None]
        loss_scale = None
        if scaled:
            fields = scaled[-1].loss_scale[0]
            same = [e for e in scaled if e.loss_scale[0] == fields]
            loss_scale = rule_columns.LossScaleSeries(
                fields,
                np.array([e.step for e in same], np.int64),
                np.stack([e.loss_scale[1] for e in same]),
                before,
            )
        return rule_columns.build(self._layers, digests, loss_scale)


@functools.lru_cache(maxsize=64)
def _length(content):
    """The length of a digest vector with this metadata content in today's layout."""
    return digest.row_offsets(_parsed(content)["rows"])[1]


def _today(event):
    """The event's digest vector in today's layout (float64), or None if it is of no layout."""
    vector = np.asarray(event.vector, np.float64)
    if len(vector) == _length(event.content):
        return vector
    upgraded = digest.upgrade(event.rows, vector[None])
    return None if upgraded is None else upgraded[0]


def _is_digest(record):
    summary_metadata = record[2]
    if summary_metadata is None or summary_metadata.plugin_data.plugin_name != digest.PLUGIN_NAME:
        return False
    parsed = _parsed(summary_metadata.plugin_data.content)
    return parsed is not None and parsed.get("kind") == metadata.KIND_DIGEST


def _flags(step, columns):
    """The flags raised at the last step of `columns`."""
    layers = rule_columns.at_step(columns, -1)
    if not layers:
        return []
    found = health.verdicts(layers)
    raised = []
    for flag in health.FLAGS:
        origin = health.flag_origin(layers, found, flag, 0)
        if origin is not None:
            index, tensor = origin
            raised.append(_entry(flag, "flag", step, layers[index]["layer"], tensor))
    return raised


def _warnings(columns, in_step):
    """The warnings raised at the last step of `columns`, judged over all of them (`in_step`:
    `[steps]` bool, where the digest is the train step's)."""
    steps, layers = columns
    if len(steps) < 2 or not layers:
        return []
    last = len(steps) - 1
    found = leading.verdicts(steps, layers, at=[last], in_step=in_step)
    raised = []
    for warning in leading.WARNINGS:
        if found[warning][:, last].any():
            index, tensor = leading.origin_of(layers, found, warning, last)
            raised.append(
                _entry(warning, "warning", int(steps[last]), layers[index]["layer"], tensor)
            )
    return raised


def _entry(flag, kind, step, layer, tensor):
    return {"flag": flag, "class": kind, "step": int(step), "layer": layer, "tensor": tensor}
