"""The `/step` body: every layer of a run at its latest step `<= S`, flagged (docs/API.md).

Built from decoded series (`store`) as `responses` builds the other bodies,
with each layer also as the columns `health` judges (one step), so that the
flags of `/step` and of every step of the digest (`onset`) are one rule.
Imports neither TensorFlow nor Keras.
"""

import numpy as np

from tb_gradviz.board import catalog, responses
from tb_gradviz.format import (
    block_headroom,
    digest,
    flow,
    headroom,
    health,
    records,
    rule_columns,
    summaries,
)


def _stats_row(values):
    """One stats record as `{field: scalar}` (counts as ints) and its magnitude bins."""
    columns = records.stats_columns(values[None])
    stats = {name: columns[name][0].item() for name in records.STATS_FIELDS}
    log = {"negative": columns["negative"][0].tolist(), "positive": columns["positive"][0].tolist()}
    return stats, log


def _routing_row(values, dtype):
    """One routing record as `{field: scalar}` (int counts, NaN kept) with its `mass` verdict."""
    columns = records.routing_columns(values[None])
    result = {
        name: responses.count_list(column)[0]
        if name in records.ROUTING_COUNT_FIELDS
        else column[0].item()
        for name, column in columns.items()
    }
    result["mass"] = summaries.mass_conservation(records.decode_routing(values), dtype)
    return result


def _layer_at(name, layer, series_by_kind, limit):
    """One layer of `/step`: its latest step `<= limit` and each record's value there, or None."""
    found = []
    for listed in layer["tensors"].values():
        series = series_by_kind["stats"][listed.tag]
        row = series.index_at_or_before(limit)
        if row is not None:
            found.append((listed.content, series, row))
    if not found:
        return None, None
    step = max(int(series.steps[row]) for _, series, row in found)
    tensors, columns = {}, {"tensors": {}, "precision": {}, "formats": {}}
    for content, series, row in sorted(found, key=lambda item: rule_columns.tensor_order(item[0])):
        values, log = _stats_row(series.values[row])
        tensor = content["tensor"]
        tensors[tensor] = {
            "step": int(series.steps[row]),
            "role": content["role"],
            "stats": values,
            "log": log,
            "precision": _precision_at(layer, tensor, series_by_kind, series.steps[row]),
        }
        tensors[tensor]["block_headroom"] = block_headroom.tensor_headroom(
            tensors[tensor]["precision"]
        )
        (segment,) = digest.tensor_segments(series.values[row])
        columns["tensors"][tensor] = dict(
            zip(digest.TENSOR_FIELDS, segment[:, None]), role=content["role"]
        )
        columns["formats"][tensor] = headroom.cast_format(content, layer["info"].get("layer_dtype"))
        if tensors[tensor]["precision"] is not None:
            columns["precision"][tensor] = headroom.precision_columns(tensors[tensor]["precision"])
    routing_at = units_at = None
    if layer["routing"] is not None:
        content = layer["routing"].content
        series = series_by_kind["routing"][layer["routing"].tag]
        row = series.index_at_or_before(step)
        if row is not None:
            routing_at = dict(
                _routing_row(series.values[row], content.get("layer_dtype")),
                step=int(series.steps[row]),
            )
    if layer["units"] is not None:
        series = series_by_kind["units"][layer["units"].tag]
        row = series.index_at_or_before(step)
        if row is not None:
            units_at = dict(records.decode_units(series.values[row]), step=int(series.steps[row]))
    updates_at = {}
    for weight, listed in catalog.weight_updates(layer).items():
        series = series_by_kind["updates"][listed.tag]
        row = series.index_at_or_before(step)
        if row is not None:
            values = records.update_columns(series.values[row][None])
            update = {name: column[0].item() for name, column in values.items()}
            update["interval"] = responses.count_list(values["interval"])[0]
            update["size"] = health.update_size(update["update_ratio"], update["interval"])
            updates_at[weight] = dict(update, step=int(series.steps[row]))
    update_ratio = _layer_update_ratio(updates_at)
    columns.update(
        layer=name,
        layer_index=layer["info"]["layer_index"],
        layer_dtype=layer["info"].get("layer_dtype"),
        units=None
        if units_at is None
        else {field: np.array([float(units_at[field])]) for field in records.UNITS_FIELDS},
    )
    snapshot = {
        "layer": name,
        "layer_index": layer["info"]["layer_index"],
        "layer_class": layer["info"].get("layer_class"),
        "layer_dtype": layer["info"].get("layer_dtype"),
        "step": step,
        "tensors": tensors,
        "routing": routing_at,
        "units": units_at,
        "updates": updates_at,
        "update_ratio": update_ratio,
        "update_size": None
        if update_ratio is None
        else health.update_size(update_ratio, _layer_interval(updates_at)),
        "flow": flow.layer_flow(columns),
        "flush_share": headroom.flush_shares(columns),
    }
    return snapshot, columns


def _precision_at(layer, tensor, series_by_kind, step):
    """A tensor's decoded precision record written with its stats at `step`, or None (a run
    written before the record, or a record the provider does not hold)."""
    found = layer.get("precision", {}).get(tensor)
    series = found and series_by_kind.get("precision", {}).get(found.tag)
    if series is None:
        return None
    row = series.index_at_or_before(int(step))
    if row is None or int(series.steps[row]) != int(step):
        return None
    return records.decode_precision(series.values[row])


def _layer_interval(updates):
    """The steps a layer's update records span: their weights' longest interval."""
    intervals = [u["interval"] for u in updates.values() if isinstance(u["interval"], int)]
    return max(intervals) if intervals else None


def _layer_update_ratio(updates):
    """The update ratio of a layer's weights as one vector, or None without update records."""
    if not updates:
        return None
    return summaries.combined_update_ratio(
        [u["weight_norm"] for u in updates.values()], [u["update_norm"] for u in updates.values()]
    )


def step_columns(layers, series_by_kind, limit):
    """A run's layers at its latest step `<= limit`, in model order: `(snapshots, columns)`.

    `snapshots` are `/step`'s layers without their flags; `columns` the same
    layers as `health` judges them (one step).
    """
    found = []
    for name, layer in layers.items():
        snapshot, columns = _layer_at(name, layer, series_by_kind, limit)
        if snapshot is not None:
            found.append((snapshot, columns))
    found.sort(key=lambda item: (item[0]["layer_index"], item[0]["layer"]))
    return [snapshot for snapshot, _ in found], [columns for _, columns in found]


def step_body(run, layers, series_by_kind, limit, ratio=health.DEFAULT_RATIO):
    """The `/step` body: a run's layers at its latest step `<= limit`; None if none has one.

    Args:
      layers: the run's layer index (`store.RunStore.layers()`).
      series_by_kind: `{"stats" | "routing" | "units" | "updates" | "precision": {tag:
        series.Series}}` ("precision" may be absent).
      ratio: the vanishing / exploding ratio of the flags (`health`).
    """
    snapshots, columns = step_columns(layers, series_by_kind, limit)
    if not snapshots:
        return None
    judged = health.verdicts(columns, ratio)
    for i, snapshot in enumerate(snapshots):
        listed = None if snapshot["units"] is None else snapshot["units"]["listed"]
        snapshot["flags"] = health.flag_entries(columns, judged, i, 0, listed)
    reference = int(judged["reference"][0])
    return {
        "run": run,
        "step": max(snapshot["step"] for snapshot in snapshots),
        "layers": snapshots,
        "log_edges": responses.LOG_EDGES,
        "health": {
            "ratio": ratio,
            "reference_layer": None if reference < 0 else snapshots[reference]["layer"],
            "rules": health.rules(ratio),
            # The step the flags are judged at (the digest's may be later: `onset`).
            "step": max(snapshot["step"] for snapshot in snapshots),
        },
    }
