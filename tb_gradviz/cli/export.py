"""`tb-gradviz export`: every series, routing map and update record as CSV or JSON."""

import csv
import json
import os
import sys

from tb_gradviz.cli.logs import open_logdir, runs_of
from tb_gradviz.cli.status import CommandError
from tb_gradviz.format import records, summaries


def run_export(args):
    gradviz, ctx, experiment = open_logdir(args.logdir)
    runs = runs_of(gradviz, ctx, experiment, args.logdir, args.run)
    series = list(export_series(gradviz, ctx, experiment, runs))
    if args.output != "-":
        parent = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(parent):
            raise CommandError(f"cannot write {args.output!r}: folder {parent!r} does not exist")
    out = sys.stdout if args.output == "-" else open(args.output, "w", newline="")
    try:
        updates = list(export_updates(gradviz, ctx, experiment, runs))
        if args.format == "json":
            maps = list(export_routing_maps(gradviz, ctx, experiment, runs))
            body = {"format_version": 1, "series": series, "routing_maps": maps}
            if updates:  # a run without weights=True exports what it always did
                body["updates"] = updates
            json.dump(body, out, allow_nan=True)
            out.write("\n")
        else:
            write_csv(series, out, updates)
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def _found(impl, *args):
    """`impl(*args)`, or None when it raises TensorBoard's NotFoundError (a layer without that record)."""
    from tensorboard import errors

    try:
        return impl(*args)
    except errors.NotFoundError:
        return None


def export_series(gradviz, ctx, experiment, runs):
    """Yields one dict per run, layer and tensor: `/series` data plus routing (and, as `/runs`, a weight's name)."""
    for run in runs:
        for layer in run["layers"]:
            routing = _found(gradviz.routing_impl, ctx, experiment, run["run"], layer["layer"])
            for tensor in layer["tensors"]:
                data = gradviz.series_impl(
                    ctx, experiment, run["run"], layer["layer"], tensor["tensor"]
                )
                data["layer_class"] = layer["layer_class"]
                data["routing"] = routing
                if "weight" in tensor:
                    data["weight"] = tensor["weight"]
                yield data


def export_updates(gradviz, ctx, experiment, runs):
    """Yields the update records of each layer that has them (`weights=True`): every step.

    Each is the `/updates` body of the layer, plus `steps` and `update_ratio`:
    the layer's weights taken as one vector at each step, as `/step` combines
    them (`summaries.combined_update_ratio`).
    """
    for run in runs:
        for layer in run["layers"]:
            if not layer.get("updates"):
                continue
            body = gradviz.updates_impl(ctx, experiment, run["run"], layer["layer"])
            # The last record of a step wins, as in the series.
            by_step = [{step: i for i, step in enumerate(w["steps"])} for w in body["weights"]]
            body["steps"] = sorted(set().union(*by_step))
            body["update_ratio"] = [
                summaries.combined_update_ratio(
                    [
                        w["weight_norm"][rows[step]]
                        for w, rows in zip(body["weights"], by_step)
                        if step in rows
                    ],
                    [
                        w["update_norm"][rows[step]]
                        for w, rows in zip(body["weights"], by_step)
                        if step in rows
                    ],
                )
                for step in body["steps"]
            ]
            yield body


def export_routing_maps(gradviz, ctx, experiment, runs):
    """Yields the routing maps of each pooling layer that has them: every step, as `/routing_map` serves it."""
    for run in runs:
        for layer in run["layers"]:
            if not layer.get("routing_map"):
                continue
            last = gradviz.routing_map_impl(ctx, experiment, run["run"], layer["layer"])
            maps = [
                gradviz.routing_map_impl(ctx, experiment, run["run"], layer["layer"], step)
                for step in last["steps"]
            ]
            yield {"run": run["run"], "layer": layer["layer"], "steps": last["steps"], "maps": maps}


def csv_header(updates=False):
    """The CSV columns; `updates`: with the update records' (`records.UPDATE_FIELDS`) at the end."""
    return (
        ["run", "layer", "layer_class", "tensor", "role", "shape", "step", "wall_time"]
        + list(records.STATS_FIELDS)
        + list(records.ROUTING_FIELDS)
        + ["hist_low", "hist_high"]
        + [f"hist_{i}" for i in range(records.HISTOGRAM_BUCKETS)]
        + [f"neg_mag_{i}" for i in range(records.MAGNITUDE_BINS)]
        + [f"pos_mag_{i}" for i in range(records.MAGNITUDE_BINS)]
        + (list(records.UPDATE_FIELDS) if updates else [])
    )


def write_csv(series, out, updates=()):
    """One row per run, layer, tensor and step (long format, for pandas).

    With `updates` (`export_updates`), the update record of a weight at a
    step fills the last columns of that weight's `weight/<w>` row (blank on
    every other row, and at a weight's first log event); without, those
    columns are left out.
    """
    by_weight = {}
    for body in updates:
        for w in body["weights"]:
            by_weight[(body["run"], body["layer"], w["weight"])] = (
                {step: i for i, step in enumerate(w["steps"])},
                w,
            )
    writer = csv.writer(out)
    writer.writerow(csv_header(bool(updates)))
    for data in series:
        update_row, update = {}, None
        if data["role"] == records.WEIGHT:
            update_row, update = by_weight.get(
                (data["run"], data["layer"], data.get("weight")), ({}, None)
            )
        routing = data["routing"]
        routing_row = {}
        if routing is not None:
            routing_row = {step: i for i, step in enumerate(routing["steps"])}
        histogram = data["histogram"]
        for i, step in enumerate(data["steps"]):
            r = routing_row.get(step)
            counts = histogram["counts"][i] or [""] * records.HISTOGRAM_BUCKETS
            writer.writerow(
                [data["run"], data["layer"], data["layer_class"], data["tensor"], data["role"]]
                + ["x".join(map(str, data["shape"])), step, data["wall_times"][i]]
                + [data["stats"][name][i] for name in records.STATS_FIELDS]
                + [routing[name][r] if r is not None else "" for name in records.ROUTING_FIELDS]
                + [_blank_if_none(histogram["low"][i]), _blank_if_none(histogram["high"][i])]
                + list(counts)
                + data["log"]["negative"][i]
                + data["log"]["positive"][i]
                + (_update_cells(update, update_row.get(step)) if updates else [])
            )


def _update_cells(update, row):
    if row is None:
        return [""] * len(records.UPDATE_FIELDS)
    return [update[name][row] for name in records.UPDATE_FIELDS]


def _blank_if_none(value):
    return "" if value is None else value
