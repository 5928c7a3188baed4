"""The columns the health rules read: each layer's values at each logged step, built in one place.

The flags (`health.verdicts`) and the warnings (`leading.verdicts`) judge
`Columns`, and so does everything that names what they raise: the board's
`/onset`, `/timeline`, `/step` and `tb-gradviz check` over a written run,
and the callback over its last log events (`capture/judge.py`), which keeps
the full records of an onset step and stops `fit` on `stop_on=`. Both sides
call `build`, so they see the same layers, in the same order (model order,
whatever the digest series' tags), the same fields, and the same value at a
step where a layer's row has no point (the latest value before it). Each
layer's columns are as `health` describes them, `{"layer", "layer_index",
"layer_dtype", "layer_class", "tensors", "units", "precision", "formats", "updates"}`
(`formats`: each tensor's `headroom.cast_format`; `updates`: `{weight:
{"update_ratio", "interval"}}`), with `"optimizer": {"batches", "skipped"}`
where the run has a loss-scale record (`format/stalled.py`), and
`"weight_counts": {weight: values}` where the digest's metadata gives them
(`digest.update_weights`).

The in-step digest (`digest="step"`) holds an update row for every trainable
weight of the model, also of layers that have no other row: each such layer
gets columns of its own, in model order by the `layer_index` the metadata
gives, with no tensors (`"tensors": {}`): the warnings read its updates, the
`stalled` flag its update ratios, and the tensor rules pass it over.

Numpy only.
"""

from typing import NamedTuple

import numpy as np

from tb_gradviz.format import digest, headroom, records


class Columns(NamedTuple):
    """A run's layers over its logged steps."""

    steps: np.ndarray  # [steps] ints, sorted
    layers: list  # per layer in model order, `{field: [steps] array}` columns (`health`)


class LayerInfo(NamedTuple):
    """What `build` needs of a layer besides its digest rows."""

    info: dict  # the metadata of one of its records: `layer_index`, `layer_dtype`
    contents: list  # the metadata of each of its tensor (stats) records


class DigestSeries(NamedTuple):
    """A digest series: its rows and its events' vectors."""

    rows: list  # the digest metadata's rows
    steps: np.ndarray  # [events] ints, in order
    values: np.ndarray  # [events, length] vectors
    # What its metadata says of its update rows' weights (`digest.update_weights`): the
    # in-step digest's, whose update rows cover layers that have no other row.
    update_weights: dict = {}


class LossScaleSeries(NamedTuple):
    """A loss-scale record's events (`capture/loss_scale.py`)."""

    fields: tuple  # the record's field names
    steps: np.ndarray  # [events] ints, in order
    values: np.ndarray  # [events, fields]
    before: tuple = (0.0, 0.0)  # `(batches, applied)` counted before the first event


def tensor_order(content):
    """The sort key of a tensor's metadata in a layer: role (`records.ROLES` order), index, name."""
    role = content["role"]
    role_rank = records.ROLES.index(role) if role in records.ROLES else len(records.ROLES)
    return (role_rank, content["index"], content["tensor"])


def build(layers, digests, loss_scale=None):
    """The `Columns` the rules judge.

    Args:
      layers: `{layer: LayerInfo}`, which layers and tensors there are, their
        order, roles and compute dtype.
      digests: `[DigestSeries]`, the run's digest series.
      loss_scale: the run's `LossScaleSeries`, or None without one.

    Returns:
      `Columns`, layers in model order. A row missing at a step takes its
      value at the latest step before (as `/step` takes each record's latest
      row; NaN before its first), a precision row the value at its tensor's
      step, an update row its value at the layer's latest step.
    """
    steps, by_layer = _merged(digests)
    described = {}
    for series in digests:
        described.update(series.update_weights)
    optimizer = None
    if loss_scale is not None:
        optimizer = optimizer_columns(loss_scale, steps)
    columns = []
    for name, layer in layers.items():
        rows = by_layer.get(name)
        if rows:
            found = _layer_columns(name, layer, rows)
            if found is not None:
                if optimizer is not None:
                    found["optimizer"] = optimizer
                columns.append(found)
    held = {layer["layer"] for layer in columns}
    for name, rows in by_layer.items():
        if name not in held:
            found = _update_columns(name, rows, described)
            if found is not None:
                columns.append(found)
    for layer in columns:
        counts = {
            weight: described[(layer["layer"], weight)]["count"]
            for weight in layer["updates"]
            if (layer["layer"], weight) in described
        }
        if counts:
            layer["weight_counts"] = counts
    columns.sort(key=lambda layer: (layer["layer_index"], layer["layer"]))
    return Columns(steps, columns)


class OneEvent:
    """`build` of one event's digest at a time, built once per layout and reused.

    `build`'s columns of a single step are views of the digest's vector, or,
    where a row has no value (a count or channels not finite), arrays that
    depend on which values are finite and on nothing else (NaN, or a value's
    presence). So the columns built from a buffer hold any later event's
    values once its vector is copied into that buffer, as long as the event
    has the same rows, layers and finite values: the callback's judge, which
    judges the in-step digest of every step, builds them once instead of a
    dict per row and field at each event (tests/test_one_event_columns.py checks them
    against `build` over events whose finite values change).
    """

    def __init__(self):
        self._key = self._finite = self._buffer = self._layers = None

    def build(self, key, layers, series):
        """`build(layers, [series])` of one event (`series` of one step, no loss-scale record).

        Args:
          key: what else the columns depend on, equal for equal `layers` and
            `series.rows` and `series.update_weights` (the judge's digest
            metadata content and version of `layers`).
          layers, series: as for `build`.
        """
        vector = np.asarray(series.values, np.float64).reshape(-1)
        upgraded = digest.upgrade(series.rows, vector[None])  # an earlier layout's, in today's
        vector = vector if upgraded is None else upgraded[0]
        finite = np.isfinite(vector)
        if (
            key != self._key
            or len(vector) != len(self._finite)
            or not np.array_equal(finite, self._finite)
        ):
            self._buffer = vector[None].copy()
            self._key, self._finite = key, finite
            built = build(layers, [series._replace(values=self._buffer)])
            self._layers = built.layers
        else:
            self._buffer[0] = vector
        return Columns(np.asarray(series.steps, np.int64), self._layers)


def _update_columns(name, rows, described):
    """The columns of a layer the digest holds only update rows of (the in-step digest's every
    trainable layer), or None when it holds other rows or its metadata does not describe it:
    no tensors, the update rows as they are (each step's update is that step's own)."""
    if any(kind != digest.UPDATE for kind, _ in rows):
        return None
    entries = [described.get((name, weight)) for _, weight in rows]
    if not entries or None in entries:
        return None
    return {
        "layer": name,
        "layer_index": entries[0]["layer_index"],
        "layer_dtype": None,
        "layer_class": entries[0].get("layer_class") or None,
        "tensors": {},
        "units": None,
        "precision": {},
        "formats": {},
        "updates": {weight: dict(fields) for (_, weight), fields in rows.items()},
    }


def _layer_columns(name, layer, rows):
    tensors, precision, formats, present = {}, {}, {}, []
    dtype = layer.info.get("layer_dtype")
    for content in sorted(layer.contents, key=tensor_order):
        fields = rows.get((digest.TENSOR, content["tensor"]))
        if fields is None:
            continue
        present.append(np.isfinite(fields["count"]))
        at = _latest(fields["count"])
        tensors[content["tensor"]] = dict(_take(fields, at), role=content["role"])
        formats[content["tensor"]] = headroom.cast_format(content, dtype)
        found = rows.get((digest.PRECISION, content["tensor"]))
        if found is not None:
            precision[content["tensor"]] = _take(found, at)
    if not tensors:
        return None
    units = next((f for (kind, _), f in rows.items() if kind == digest.UNITS), None)
    logged = _latest(np.where(np.any(present, axis=0), 0.0, np.nan))
    return {
        "layer": name,
        "layer_index": layer.info["layer_index"],
        "layer_dtype": layer.info.get("layer_dtype"),
        "layer_class": layer.info.get("layer_class"),
        "tensors": tensors,
        "units": None if units is None else _take(units, _latest(units["channels"])),
        "precision": precision,
        "formats": formats,
        "updates": {
            weight: _take(fields, logged)
            for (kind, weight), fields in rows.items()
            if kind == digest.UPDATE
        },
    }


def optimizer_columns(loss_scale, steps):
    """The `optimizer` columns `format/stalled.py` judges, at a run's logged steps.

    Args:
      loss_scale: the run's `LossScaleSeries`.
      steps: `[steps]` the steps of the run's columns.

    Returns:
      `{"batches", "skipped"}`: `[steps]` arrays of the train steps run and
      the steps skipped since the previous log event (the first: since
      `loss_scale.before`); NaN at a step without a counted record.
    """
    batches = np.full(len(steps), np.nan)
    skipped = np.full(len(steps), np.nan)
    values = np.asarray(loss_scale.values, np.float64).reshape(len(loss_scale.steps), -1)
    column = {name: values[:, i] for i, name in enumerate(loss_scale.fields)}
    if "batches" not in column or "applied" not in column or not len(loss_scale.steps):
        return {"batches": batches, "skipped": skipped}
    before_batches, before_applied = loss_scale.before
    # A count made NaN (unknown) from some event on stays so: the differences are NaN too.
    ran = np.diff(np.concatenate([[before_batches], column["batches"]]))
    skips = ran - np.diff(np.concatenate([[before_applied], column["applied"]]))
    steps = np.asarray(steps, np.int64)
    record_steps = np.asarray(loss_scale.steps, np.int64)
    where = np.searchsorted(steps, record_steps)
    found = where < len(steps)
    found[found] &= steps[where[found]] == record_steps[found]
    batches[where[found]] = ran[found]
    skipped[where[found]] = skips[found]
    return {"batches": batches, "skipped": skipped}


def at_step(columns, index):
    """The one-step columns of `columns.layers` at step index `index` (`[1]` arrays)."""
    if len(columns.steps) == 1 and index in (0, -1):
        return list(columns.layers)  # one step already (the judge's columns of one event)

    def cut(value):
        if isinstance(value, np.ndarray):
            return value[index : index + 1 or None]
        if isinstance(value, dict):
            return {key: cut(item) for key, item in value.items()}
        return value

    return [cut(layer) for layer in columns.layers]


def _merged(digests):
    """Merges decoded digest series into `[steps]` arrays per layer and row.

    Returns:
      `(steps, {layer: {(kind, name): {field: [steps] array}}})`, steps sorted;
      NaN where a layer's row has no point at a step. The layers' order here
      is the series', not the model's: `build` orders them.
    """
    steps = np.unique(np.concatenate([s.steps for s in digests] or [np.zeros(0, np.int64)]))
    layers = {}
    for series in digests:
        if not len(series.steps):
            continue
        decoded = digest.decode_digest(series.rows, series.values)
        if len(digests) == 1 and len(series.steps) == len(steps):
            # One series, one row per step: its columns are the arrays (the usual case).
            for (kind, layer, name), fields in decoded.items():
                layers.setdefault(layer, {})[(kind, name)] = fields
            continue
        where = np.searchsorted(steps, series.steps)
        for (kind, layer, name), fields in decoded.items():
            target = layers.setdefault(layer, {}).setdefault((kind, name), {})
            for field, column in fields.items():
                full = target.setdefault(field, np.full(len(steps), np.nan))
                full[where] = column
    return steps, layers


def _latest(column):
    """At each step, the index of the latest step `<=` it where `column` has a value; None if
    it has one at every step; -1 before its first."""
    present = np.isfinite(column)
    if present.all():
        return None
    return np.maximum.accumulate(np.where(present, np.arange(len(column)), -1))


def _take(fields, at):
    if at is None:
        return dict(fields)
    return {
        field: np.where(at >= 0, column[np.maximum(at, 0)], np.nan)
        for field, column in fields.items()
    }
