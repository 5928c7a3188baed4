"""Where each training-health flag began in a run: its onset.

The flags are `health`'s rules over `[layers, steps]` columns (`health.verdicts`),
decided at every logged step as `/step` decides them at that step; the onset
of a flag is the first step at which any layer raised it, the first layer in
model order that raised it there, and the tensor the flag concerns. The
columns come from the per-event digest when the run has one
(`digest_columns`: a few array reductions, whatever the number of steps), and
from the full records, step by step, for a run written before the digest
(`records_columns`). Served by `/onset`, printed by `tb-gradviz check`. Numpy
only, like the rest of the board.
"""

import numpy as np

from tb_gradviz.board import headroom, health, responses, snapshot, timeline
from tb_gradviz.format import digest, records


def onset_body(run, steps, columns, ratio=health.DEFAULT_RATIO, listed=None):
    """The `/onset` body: each raised flag's first step, layer and tensor, and whether it persists.

    Args:
      run: the run name.
      steps: the logged steps, `[steps]` ints, sorted.
      columns: the layers' columns over those steps (`health`), in model order.
      ratio: the vanishing / exploding ratio of the flags (`health`).
      listed: None, or `(layer, step) -> [channel]`: the dead channels listed
        at that step (the `dead` onset's detail names them).

    Returns:
      `{"run", "steps", "first_step", "last_step", "ratio", "onsets"}`:
      `steps` is the number of logged steps judged, and `onsets` holds one
      entry per flag raised at any of them, in `health.FLAGS` order:
      `{"flag", "step", "layer", "layer_index", "tensor", "detail",
      "persists", "raised_steps", "last_raised_step"}`. `persists` is true
      when the flag stayed raised (by any layer) at every logged step from
      its onset through the last; `raised_steps` counts the steps it was
      raised at. None when the run has no logged step.
    """
    if not len(steps) or not columns:
        return None
    found = health.verdicts(columns, ratio)
    onsets = []
    for flag in health.FLAGS:
        by_step = found[flag].any(axis=0)
        if not by_step.any():
            continue
        first = int(np.argmax(by_step))
        index = int(np.argmax(found[flag][:, first]))
        layer = columns[index]
        step = int(steps[first])
        chosen = None
        if flag == "dead" and listed is not None:
            chosen = listed(layer["layer"], step)
        entry = next(
            e
            for e in health.flag_entries(columns, found, index, first, chosen)
            if e["flag"] == flag
        )
        onsets.append(
            {
                "flag": flag,
                "step": step,
                "layer": layer["layer"],
                "layer_index": layer["layer_index"],
                "tensor": entry["tensor"],
                "detail": entry["detail"],
                "persists": bool(by_step[first:].all()),
                "raised_steps": int(by_step.sum()),
                "last_raised_step": int(steps[len(by_step) - 1 - np.argmax(by_step[::-1])]),
            }
        )
    return {
        "run": run,
        "steps": len(steps),
        "first_step": int(steps[0]),
        "last_step": int(steps[-1]),
        "ratio": ratio,
        "onsets": onsets,
    }


def records_columns(layers, series_by_kind):
    """The columns of every logged step from the full records, judged as `/step` judges.

    Args:
      layers: the run's layer index (`store.RunStore.layers()`).
      series_by_kind: every point of the run's series, as for `snapshot.step_body`.

    Returns:
      `(steps, columns, listed)`: `listed(layer, step)` gives the dead channels
      the units record lists there.
    """
    steps = sorted(
        {int(step) for series in series_by_kind["stats"].values() for step in series.steps}
    )
    at_steps = [snapshot.step_columns(layers, series_by_kind, step) for step in steps]
    if not at_steps:
        return np.zeros(0, np.int64), [], None
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
    return np.array(steps), columns, lambda layer, step: listed.get((layer, step))


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
    }


def digest_columns(layers, digests):
    """The columns of every logged step from the run's digest series.

    Args:
      layers: the run's layer index (`store.RunStore.layers()`): which layers
        and tensors are judged, their order, roles and compute dtype.
      digests: `[(rows, series)]` of the run's digest series.

    Returns:
      `(steps, columns)`. A row missing at a step takes its value at the
      latest step before (as `/step` takes each record's latest row), a
      precision row the value at its tensor's step.
    """
    steps, by_layer = timeline.layer_columns(digests)
    columns = []
    for name, layer in layers.items():
        rows = by_layer.get(name)
        if not rows:
            continue
        contents = sorted(
            (content for _, content, _ in layer["tensors"].values()),
            key=responses.tensor_order,
        )
        tensors, precision, formats = {}, {}, {}
        dtype = layer["info"].get("layer_dtype")
        for content in contents:
            fields = rows.get((digest.TENSOR, content["tensor"]))
            if fields is None:
                continue
            at = _latest(fields["count"])
            tensors[content["tensor"]] = dict(_take(fields, at), role=content["role"])
            formats[content["tensor"]] = headroom.cast_format(content, dtype)
            found = rows.get((digest.PRECISION, content["tensor"]))
            if found is not None:
                precision[content["tensor"]] = _take(found, at)
        if not tensors:
            continue
        units = next((f for (kind, _), f in rows.items() if kind == digest.UNITS), None)
        columns.append(
            {
                "layer": name,
                "layer_index": layer["info"]["layer_index"],
                "layer_dtype": layer["info"].get("layer_dtype"),
                "tensors": tensors,
                "units": None if units is None else _take(units, _latest(units["channels"])),
                "precision": precision,
                "formats": formats,
            }
        )
    columns.sort(key=lambda layer: (layer["layer_index"], layer["layer"]))
    return steps, columns


def read_digests(run_store):
    """`[(rows, series)]`: every digest series of a `store.RunStore`'s run, read whole."""
    return [
        (rows, run_store.read({tag: ts}, timeline.digest_layout(rows), digest.PLUGIN_NAME)[tag])
        for tag, (rows, ts) in run_store.digests().items()
    ]


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


def judge_step_from_digest(body, steps, columns, limit, ratio=health.DEFAULT_RATIO):
    """Replaces a `/step` body's flags and reference layer with the digest's at `limit`, and the
    flow of each layer whose full records are not of that step.

    The digest holds every logged step while the full records may be a
    sample: each layer of the body is judged at the digest's latest step
    `<= limit`. A layer the digest does not hold keeps what the records said.
    """
    at = int(np.searchsorted(steps, limit, side="right")) - 1
    if at < 0 or steps[at] < body["step"]:
        return  # a digest kept as a sample, older here than the full records
    one = [_at_step(layer, at) for layer in columns]
    found = health.verdicts(one, ratio)
    index = {layer["layer"]: i for i, layer in enumerate(one)}
    for layer in body["layers"]:
        i = index.get(layer["layer"])
        if i is None:
            continue
        # The channels the units record lists, when it is the one of the digest's step.
        units = layer["units"]
        listed = units["listed"] if units is not None and units["step"] == steps[at] else None
        layer["flags"] = health.flag_entries(one, found, i, 0, listed)
        if layer["step"] != steps[at]:
            # The records' float64 flow where they hold the step, else the digest's float32 one.
            layer["flow"] = health.layer_flow(one[i])
    reference = int(found["reference"][0])
    body["health"]["reference_layer"] = None if reference < 0 else one[reference]["layer"]
    body["health"]["step"] = int(steps[at])


def _at_step(layer, at):
    def cut(fields):
        return {k: v if k == "role" else v[at : at + 1] for k, v in fields.items()}

    return dict(
        layer,
        tensors={name: cut(t) for name, t in layer["tensors"].items()},
        units=None if layer["units"] is None else cut(layer["units"]),
        precision={name: cut(p) for name, p in layer["precision"].items()},
    )


def last_step_body(run, steps, columns, ratio=health.DEFAULT_RATIO, listed=None):
    """Every layer's flags at the last logged step, as `/step` judges them there: what
    `tb-gradviz check` prints, without the full records.

    Returns:
      `{"run", "step", "layers": [{"layer", "layer_index", "step", "units", "flags"}],
      "health": {"ratio", "reference_layer"}}` (a `/step` body's fields that
      hold the flags; `units` is `{"channels", "dead_channels"}` or None), or
      None without a logged step.
    """
    if not len(steps) or not columns:
        return None
    last = len(steps) - 1
    one = [_at_step(layer, last) for layer in columns]
    found = health.verdicts(one, ratio)
    layers = []
    for i, layer in enumerate(one):
        if not any(np.isfinite(t["count"][0]) for t in layer["tensors"].values()):
            continue  # not logged at any step
        units = layer["units"]
        if units is not None and np.isfinite(units["channels"][0]):
            units = {field: int(column[0]) for field, column in units.items()}
        else:
            units = None
        chosen = listed(layer["layer"], int(steps[last])) if listed and units else None
        layers.append(
            {
                "layer": layer["layer"],
                "layer_index": layer["layer_index"],
                "units": units,
                "flags": health.flag_entries(one, found, i, 0, chosen),
            }
        )
    reference = int(found["reference"][0])
    return {
        "run": run,
        "step": int(steps[last]),
        "layers": layers,
        "health": {
            "ratio": ratio,
            "reference_layer": None if reference < 0 else one[reference]["layer"],
            "step": int(steps[last]),
        },
    }
