"""The bodies of the plugin's JSON answers, built from decoded series (docs/API.md).

Plain functions from `store` data to plain dicts: no provider, no request.
Counts are served as ints; a count that is NaN (`tied_windows` of an average
pool, a field an older layout lacks) stays a float. Imports neither
TensorFlow nor Keras.
"""

from typing import NamedTuple

import numpy as np

from tb_gradviz.board.series import downsampled_columns
from tb_gradviz.format import health, records, routing_map, rule_columns, summaries

LOG_EDGES = records.LOG_EDGES.tolist()


def count_list(column):
    """A column of counts as a list: ints, NaN kept as a float."""
    return [int(v) if np.isfinite(v) else v for v in np.asarray(column, dtype=np.float64).tolist()]


def layer_summary(name, layer):
    """The `/runs` description of one layer of a `store.RunStore.layers()` index."""
    info = layer["info"]
    listed = layer["tensors"].values()
    pooling = layer["routing"].content.get("pooling") if layer["routing"] else None
    if pooling is None:
        pooling = next((t.content["pooling"] for t in listed if t.content.get("pooling")), None)
    contents = sorted((t.content for t in listed), key=rule_columns.tensor_order)
    tensors = [
        {
            "tensor": content["tensor"],
            "role": content["role"],
            "index": content["index"],
            "shape": content["shape"],
            "dtype": content.get("dtype"),
            **({"weight": content["weight"]} if "weight" in content else {}),
        }
        for content in contents
    ]
    weights = [t["weight"] for t in tensors if t["role"] == records.WEIGHT]
    steps = [t.time_series.max_step for t in listed if t.time_series.max_step is not None]
    return {
        "layer": name,
        "layer_index": info["layer_index"],
        "layer_class": info.get("layer_class"),
        "layer_dtype": info.get("layer_dtype"),
        # Files written before other backends existed came from TensorFlow.
        "backend": info.get("backend", "tensorflow"),
        "device": info.get("device"),
        "pooling": pooling,
        "routing_map": layer.get("routing_map") is not None,
        "tensors": tensors,
        "weights": weights,
        "updates": [weight for weight in weights if weight in layer.get("updates", {})],
        "max_step": max(steps) if steps else None,
    }


def runs_body(layer_indexes):
    """The `/runs` body from `{run: layer index}`: runs by name, layers by `layer_index`."""
    runs = []
    for run, layers in sorted(layer_indexes.items()):
        summaries = [layer_summary(name, layer) for name, layer in layers.items()]
        summaries.sort(key=lambda layer: (layer["layer_index"], layer["layer"]))
        runs.append({"run": run, "layers": summaries})
    return {"runs": runs}


def _histogram_columns(histograms, steps):
    """The linear histograms (a `series.Series` or None) at `steps`, None where missing."""
    empty = [None] * len(steps)
    result = {
        "buckets": records.HISTOGRAM_BUCKETS,
        "low": empty,
        "high": list(empty),
        "counts": list(empty),
    }
    if histograms is None or not len(steps):
        return result
    # The last record of a step wins, as the stats rows are also sorted stably by step.
    rows = histograms.rows_at(steps.tolist())
    low = histograms.values[:, 0, 0].tolist()
    high = histograms.values[:, -1, 1].tolist()
    counts = histograms.values[:, :, 2].astype(np.int64).tolist()
    result["low"] = [None if row is None else low[row] for row in rows]
    result["high"] = [None if row is None else high[row] for row in rows]
    result["counts"] = [None if row is None else counts[row] for row in rows]
    return result


def downsampled(stats, width):
    """Whether `/series` sends `stats` (a `series.Series`) in `width` columns, without its
    histograms."""
    return width is not None and len(stats.steps) > width


def series_body(run, content, stats, histograms, width=None):
    """The `/series` body of one tensor: its stats and histograms (`series.Series`, or None).

    With more steps than `width`, the steps are grouped into `width` columns
    and each column keeps its extremes (`series.downsampled_columns`); otherwise, or
    with `width` None, every step is sent.
    """
    columns = records.stats_columns(stats.values)
    body = {
        "run": run,
        "layer": content["layer"],
        "tensor": content["tensor"],
        "role": content["role"],
        "shape": content["shape"],
        "dtype": content.get("dtype"),
        "downsampled": downsampled(stats, width),
        "steps": stats.steps.tolist(),
    }
    if body["downsampled"]:
        return dict(body, **downsampled_columns(stats.steps, columns, width), histogram=None)
    return dict(
        body,
        wall_times=stats.wall_times.tolist(),
        stats={name: columns[name].tolist() for name in records.STATS_FIELDS},
        histogram=_histogram_columns(histograms, stats.steps),
        log={
            "edges": LOG_EDGES,
            "negative": columns["negative"].tolist(),
            "positive": columns["positive"].tolist(),
        },
    )


def routing_body(run, content, routing):
    """The `/routing` body of a pooling layer: its routing series by field, and the verdicts."""
    dtype = content.get("layer_dtype")
    verdicts = [
        summaries.mass_conservation(records.decode_routing(row), dtype) for row in routing.values
    ]
    columns = records.routing_columns(routing.values)
    body = {
        "run": run,
        "layer": content["layer"],
        "pooling": content.get("pooling"),
        "steps": routing.steps.tolist(),
    }
    for name, column in columns.items():
        body[name] = count_list(column) if name in records.ROUTING_COUNT_FIELDS else column.tolist()
    body["mass"] = {
        key: [v[key] for v in verdicts]
        for key in ("difference", "relative", "tolerance", "conserved")
    }
    return body


def updates_body(run, layer, series_by_weight):
    """The `/updates` body: the update records of a layer's weights over steps.

    Args:
      series_by_weight: `{weight: series.Series}` in the layer's weight order.
    """
    weights = []
    for weight, series in series_by_weight.items():
        columns = records.update_columns(series.values)
        entry = {"weight": weight, "steps": series.steps.tolist()}
        entry.update({name: column.tolist() for name, column in columns.items()})
        entry["interval"] = count_list(columns["interval"])
        entry["size"] = [
            health.update_size(r, i) for r, i in zip(entry["update_ratio"], entry["interval"])
        ]
        weights.append(entry)
    return {"run": run, "layer": layer, "weights": weights}


def precision_body(run, series_by_layer):
    """A run's precision records over steps: `{layer: {tensor: series.Series}}` decoded per step."""
    return {
        "run": run,
        "layers": {
            layer: {
                tensor: {
                    "steps": series.steps.tolist(),
                    "precision": [records.decode_precision(row) for row in series.values],
                }
                for tensor, series in by_tensor.items()
            }
            for layer, by_tensor in series_by_layer.items()
        },
    }


def _map_axes(content):
    """How the pool cuts the map's rows and columns into windows; None if the metadata lacks it."""
    depth = content.get("depth")
    try:
        _, rows, cols = routing_map.window_axes(
            content["pooling"],
            depth["size"] if isinstance(depth, dict) else 1,
            content["map"]["height"],
            content["map"]["width"],
        )
    except (KeyError, TypeError, ValueError):
        return None
    return {"rows": rows, "cols": cols}


class RoutingMaps(NamedTuple):
    """A layer's well-formed routing map records (`valid_routing_maps`), in step order."""

    steps: list
    # One `[channels, values]` array per step.
    arrays: list


def valid_routing_maps(content, series):
    """The `RoutingMaps` of a routing map series whose records are of the size its metadata
    `content` gives (not those of a later fit with other settings) and well-formed
    (`routing_map.valid_rows`); each record is checked once."""
    values = content.get("values")
    kept = [
        (int(step), array)
        for step, array in zip(series.steps.tolist(), series.values)
        if array.shape[1] == values and routing_map.valid_rows(array, content).all()
    ]
    return RoutingMaps([step for step, _ in kept], [array for _, array in kept])


def routing_map_body(run, content, maps, index):
    """The `/routing_map` body of the record `index` of `maps` (`valid_routing_maps`)."""
    return {
        "run": run,
        "layer": content["layer"],
        "pooling": content.get("pooling"),
        "backend": content.get("backend", "tensorflow"),
        "device": content.get("device"),
        "example": content["example"],
        "map": content["map"],
        "crop": content["crop"],
        "windows": content["windows"],
        "axes": _map_axes(content),
        "steps": maps.steps,
        "step": maps.steps[index],
        "channels": [routing_map.decode(row, content) for row in maps.arrays[index]],
    }
