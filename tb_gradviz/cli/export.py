"""`tb-gradviz export`: every series, routing map and update record as CSV or JSON."""

import csv
import io
import json
import os
import sys

from tb_gradviz.cli.logs import open_logdir, runs_of
from tb_gradviz.cli.status import EXIT_OK, EXIT_OUTPUT, CommandError
from tb_gradviz.format import blocks, precision, records, summaries


def run_export(args):
    if args.output != "-":
        _check_output(args.output)
    gradviz, ctx, experiment = open_logdir(args.logdir)
    runs = runs_of(gradviz, ctx, experiment, args.logdir, args.run)
    series = list(export_series(gradviz, ctx, experiment, runs))
    updates = list(export_updates(gradviz, ctx, experiment, runs))
    text = io.StringIO()
    if args.format == "json":
        maps = list(export_routing_maps(gradviz, ctx, experiment, runs))
        body = {"format_version": EXPORT_FORMAT_VERSION, "series": series, "routing_maps": maps}
        steps = [
            dict(run=run["run"], **gradviz.full_records_impl(ctx, experiment, run["run"]))
            for run in runs
        ]
        if any(s["full"] != s["logged"] for s in steps):  # a run with every step's as before
            body["steps"] = steps
        if updates:  # a run without weights=True exports what it always did
            body["updates"] = updates
        write_json(body, text)
    else:
        write_csv(series, text, updates)
    if args.output == "-":
        sys.stdout.write(text.getvalue())
        return EXIT_OK
    try:
        with open(args.output, "w", newline="") as out:
            out.write(text.getvalue())
    except OSError as e:
        raise CommandError(
            f"cannot write --output {args.output!r}: {e.strerror or e}", EXIT_OUTPUT
        ) from None
    return EXIT_OK


EXPORT_FORMAT_VERSION = 1


def _check_output(output):
    """Refuses an `--output` that cannot be a file, before any log is read."""
    if os.path.isdir(output):
        raise CommandError(
            f"--output must be a file path; received {output!r}, which is a folder", EXIT_OUTPUT
        )
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise CommandError(
            f"cannot write --output {output!r}: folder {parent!r} does not exist", EXIT_OUTPUT
        )


def write_json(body, out):
    """Writes `body` as strict JSON, a non-finite float as the HTTP API writes it.

    NaN, Inf and -Inf become the strings "NaN", "Infinity" and "-Infinity"
    (TensorBoard's `json_util.Cleanse`, which `http_util.Respond` applies to
    every route's body), so that `jq`, `JSON.parse` and `json.loads` read the
    export; `Number("NaN")` and `float("NaN")` read the strings back.
    """
    from tensorboard.backend import json_util

    json.dump(json_util.Cleanse(body), out, allow_nan=False)
    out.write("\n")


def _found(impl, *args):
    """`impl(*args)`, or None when it raises TensorBoard's NotFoundError (a layer without that
    record)."""
    from tensorboard import errors

    try:
        return impl(*args)
    except errors.NotFoundError:
        return None


def export_series(gradviz, ctx, experiment, runs):
    """Yields one dict per run, layer and tensor: `/series` data plus routing, precision (and, as
    `/runs`, a weight's name).

    `precision` has one entry per step of `steps`: the tensor's precision
    record written at that step as `/step` serves it, or None (a run written
    before the record).
    """
    for run in runs:
        recorded = gradviz.precision_impl(ctx, experiment, run["run"])["layers"]
        for layer in run["layers"]:
            routing = _found(gradviz.routing_impl, ctx, experiment, run["run"], layer["layer"])
            tensors = recorded.get(layer["layer"], {})
            for tensor in layer["tensors"]:
                data = gradviz.series_impl(
                    ctx, experiment, run["run"], layer["layer"], tensor["tensor"], width=None
                )
                data["layer_class"] = layer["layer_class"]
                data["routing"] = routing
                data["precision"] = _precision_at_steps(
                    tensors.get(tensor["tensor"]), data["steps"]
                )
                if "weight" in tensor:
                    data["weight"] = tensor["weight"]
                yield data


def _precision_at_steps(recorded, steps):
    """The record at each of `steps` (None where absent); the last record of a step wins."""
    if recorded is None:
        return [None] * len(steps)
    by_step = dict(zip(recorded["steps"], recorded["precision"]))
    return [by_step.get(step) for step in steps]


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
    """Yields the routing maps of each pooling layer that has them: every step, as `/routing_map`
    serves it, from one read of the layer's series (`routing_maps_impl`)."""
    for run in runs:
        for layer in run["layers"]:
            if not layer.get("routing_map"):
                continue
            maps = gradviz.routing_maps_impl(ctx, experiment, run["run"], layer["layer"])
            steps = [body["step"] for body in maps]
            yield {"run": run["run"], "layer": layer["layer"], "steps": steps, "maps": maps}


# The precision record's CSV columns: `precision.finite_nonzero`, then per format
# `precision.<format>.scale_exponent` and `precision.<format>.<setting>.<count>`, then its
# block part's fields, `block/...` as `precision.block....` (`blocks.RECORD_FIELDS`).
PRECISION_COLUMNS = (
    ("precision.finite_nonzero",)
    + tuple(
        column
        for name in precision.FORMATS
        for column in (
            f"precision.{name}.scale_exponent",
            *(
                f"precision.{name}.{setting}.{count}"
                for setting in precision.SETTINGS
                for count in precision.COUNTS
            ),
        )
    )
    + tuple(f"precision.{field.replace('/', '.')}" for field in blocks.RECORD_FIELDS)
)


def _precision_cells(record):
    """A decoded precision record (or None: blank cells) in `PRECISION_COLUMNS` order; the block
    part's cells blank for a record without it."""
    if record is None:
        return [""] * len(PRECISION_COLUMNS)
    cells = [record["finite_nonzero"]]
    for name in precision.FORMATS:
        entry = record["formats"][name]
        cells.append(entry["scale_exponent"])
        cells.extend(
            entry[setting][count] for setting in precision.SETTINGS for count in precision.COUNTS
        )
    return cells + _block_cells(record.get("block_formats"))


def _block_cells(found):
    """The block part of a decoded record in `blocks.RECORD_FIELDS` order ([""] * 34 for None)."""
    if found is None:
        return [""] * len(blocks.RECORD_FIELDS)
    cells = [
        found[name][field]
        for name in blocks.FORMATS
        for field in (*blocks.RECORD_COUNTS, "relative_error")
    ]
    for count in ("blocks", "nonfinite_blocks"):
        for size in blocks.BLOCK_SIZES:
            name = next(n for n, spec in blocks.FORMATS.items() if spec.block_size == size)
            cells.append(found[name][count])
    return cells


def csv_header(updates=False):
    """The CSV columns: the precision record's (`PRECISION_COLUMNS`) after the magnitude bins;
    `updates`: with the update records' (`records.UPDATE_FIELDS`) at the end."""
    return (
        ["run", "layer", "layer_class", "tensor", "role", "shape", "step", "wall_time"]
        + list(records.STATS_FIELDS)
        + list(records.ROUTING_FIELDS)
        + ["hist_low", "hist_high"]
        + [f"hist_{i}" for i in range(records.HISTOGRAM_BUCKETS)]
        + [f"neg_mag_{i}" for i in range(records.MAGNITUDE_BINS)]
        + [f"pos_mag_{i}" for i in range(records.MAGNITUDE_BINS)]
        + list(PRECISION_COLUMNS)
        + (list(records.UPDATE_FIELDS) if updates else [])
    )


def write_csv(series, out, updates=()):
    """One row per run, layer, tensor and step (long format, for pandas).

    With `updates` (`export_updates`), the update record of a weight at a
    step fills the update columns of that weight's `weight/<w>` row (blank on
    every other row, and at a weight's first log event); without, those
    columns are left out. The precision columns are blank on a row without
    a precision record.
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
                + _precision_cells(data["precision"][i])
                + (_update_cells(update, update_row.get(step)) if updates else [])
            )


def _update_cells(update, row):
    if row is None:
        return [""] * len(records.UPDATE_FIELDS)
    return [update[name][row] for name in records.UPDATE_FIELDS]


def _blank_if_none(value):
    return "" if value is None else value
