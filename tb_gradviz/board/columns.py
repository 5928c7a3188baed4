"""The columns every view of a run over its steps reads: each layer's values at every step.

`/onset`, `/timeline`, `tb-gradviz check` and the digest's part of `/step`
judge and show the same `Columns`: one function builds them from the run's
per-event digest (`digest_columns`), so the views agree on which layers
there are, their order (model order, whatever the digest series' tags),
the steps, and a layer's value at a step where its series has no point (the
latest value before it, as `/step` takes each record's latest row). A run
written before the digest is judged from its full records step by step
(`records_columns`). Each layer's columns are as `health` describes them,
`{"layer", "layer_index", "layer_dtype", "tensors", "units", "precision",
"formats"}` (`formats`: each tensor's `headroom.cast_format`), with, from
the digest, `"updates": {weight: {"update_ratio", "interval"}}`.
Numpy only, like the rest of the board.
"""

from typing import NamedTuple

import numpy as np

from tb_gradviz.board import responses, snapshot
from tb_gradviz.format import digest, headroom, records


class Columns(NamedTuple):
    """A run's layers over its logged steps."""

    steps: np.ndarray  # [steps] ints, sorted
    layers: list  # per layer in model order, `{field: [steps] array}` columns (`health`)


def digest_layout(rows):
    """The `records.Layout` of a digest with these rows: its length (an earlier digest's
    upgraded), and its counts checked (`digest.DigestLayout`)."""
    return digest.DigestLayout(rows)


def read_digests(run_store):
    """`[(rows, series)]`: every digest series of a `store.RunStore`'s run, read whole, its
    parts joined in step order (`store.RunStore.read_digest`)."""
    return [
        (found.rows, run_store.read_digest(tag, found, digest_layout(found.rows)))
        for tag, found in run_store.digests().items()
    ]


def _merged(digests):
    """Merges decoded digest series into `[steps]` arrays per layer and row.

    Returns:
      `(steps, {layer: {(kind, name): {field: [steps] array}}})`, steps sorted;
      NaN where a layer's row has no point at a step. The layers' order here
      is the series', not the model's: `digest_columns` orders them.
    """
    steps = np.unique(np.concatenate([s.steps for _, s in digests] or [np.zeros(0, np.int64)]))
    layers = {}
    for rows, series in digests:
        if not len(series.steps):
            continue
        decoded = digest.decode_digest(rows, series.values)
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


def digest_columns(layers, digests):
    """The run's `Columns` from its digest series.

    Args:
      layers: the run's layer index (`store.RunStore.layers()`): which layers
        and tensors there are, their order, roles and compute dtype.
      digests: `[(rows, series)]` of the run's digest series (`read_digests`).

    Returns:
      `Columns`, layers in model order. A row missing at a step takes its
      value at the latest step before (as `/step` takes each record's latest
      row; NaN before its first), a precision row the value at its tensor's
      step, an update row its value at the layer's latest step.
    """
    steps, by_layer = _merged(digests)
    columns = []
    for name, layer in layers.items():
        rows = by_layer.get(name)
        if not rows:
            continue
        contents = sorted(
            (content for _, content, _ in layer["tensors"].values()),
            key=responses.tensor_order,
        )
        tensors, precision, formats, present = {}, {}, {}, []
        dtype = layer["info"].get("layer_dtype")
        for content in contents:
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
            continue
        units = next((f for (kind, _), f in rows.items() if kind == digest.UNITS), None)
        logged = _latest(np.where(np.any(present, axis=0), 0.0, np.nan))
        columns.append(
            {
                "layer": name,
                "layer_index": layer["info"]["layer_index"],
                "layer_dtype": layer["info"].get("layer_dtype"),
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
        )
    columns.sort(key=lambda layer: (layer["layer_index"], layer["layer"]))
    return Columns(steps, columns)


def records_columns(layers, series_by_kind):
    """The `Columns` of every logged step from the full records, judged as `/step` judges.

    Args:
      layers: the run's layer index (`store.RunStore.layers()`).
      series_by_kind: every point of the run's series, as for `snapshot.step_body`.

    Returns:
      `(Columns, listed)`: `listed(layer, step)` gives the dead channels the
      units record lists there.
    """
    steps = sorted(
        {int(step) for series in series_by_kind["stats"].values() for step in series.steps}
    )
    at_steps = [snapshot.step_columns(layers, series_by_kind, step) for step in steps]
    if not at_steps:
        return Columns(np.zeros(0, np.int64), []), None
    # Each layer's tensors are all present at the last step: they define the columns.
    _, last = at_steps[-1]
    index = {layer["layer"]: i for i, layer in enumerate(last)}
    columns = [_empty_like(layer, len(steps)) for layer in last]
    listed = {}
    for s, (bodies, at) in enumerate(at_steps):
        for body, layer in zip(bodies, at):
            target = columns[index[layer["layer"]]]
            for name, tensor in layer["tensors"].items():
                for field in digest.TENSOR_FIELDS:
                    target["tensors"][name][field][s] = tensor[field][0]
            for name, fields in layer["precision"].items():
                for field, value in fields.items():
                    target["precision"].setdefault(
                        name, {f: np.full(len(steps), np.nan) for f in digest.PRECISION_FIELDS}
                    )[field][s] = value[0]
            if layer["units"] is not None and target["units"] is not None:
                for field, value in layer["units"].items():
                    target["units"][field][s] = value[0]
                listed[(layer["layer"], steps[s])] = body["units"]["listed"]
    return Columns(np.array(steps), columns), lambda layer, step: listed.get((layer, step))


def _empty_like(layer, steps):
    def nan():
        return np.full(steps, np.nan)

    return {
        "layer": layer["layer"],
        "layer_index": layer["layer_index"],
        "layer_dtype": layer["layer_dtype"],
        "tensors": {
            name: dict({field: nan() for field in digest.TENSOR_FIELDS}, role=tensor["role"])
            for name, tensor in layer["tensors"].items()
        },
        "units": None if layer["units"] is None else {field: nan() for field in layer["units"]},
        "precision": {},
        "formats": layer.get("formats", {}),
        "updates": {},
    }


def listed_dead_channels(run_store, layers):
    """`(layer, step) -> [channel]`: the dead channels a layer's units record lists at that very
    step, or None (no units record there: the digest counts them, the record lists them)."""

    def listed(layer, step):
        units = layers[layer]["units"]
        if units is None:
            return None
        tag, _, time_series = units
        series = run_store.read({tag: time_series}, records.UNITS)[tag]
        row = series.index_at_or_before(step)
        if row is None or int(series.steps[row]) != step:
            return None
        return records.decode_units(series.values[row])["listed"]

    return listed


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
