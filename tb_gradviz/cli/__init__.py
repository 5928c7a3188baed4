"""`tb-gradviz`: run the demo, summarise or export tb_gradviz logs.

    tb-gradviz demo [--logdir DIR] [--model all|resnet50|cnn] [--no-serve]
    tb-gradviz summary LOGDIR [--run RUN] [--step STEP]
    tb-gradviz export LOGDIR [--format csv|json] [--output FILE]
    tb-gradviz check LOGDIR [--run RUN] [--fail-on FLAGS] [--ratio R]

`summary`, `export` and `check` read through the same code as the
TensorBoard plugin and never import TensorFlow; `demo` does. `check` exits
with status 1 (`EXIT_FLAGGED`) when a chosen training-health flag is raised.
"""

import argparse
import csv
import json
import math
import os
import sys
import time

from tb_gradviz.board import health
from tb_gradviz.format import records, storage, summaries

EXIT_USAGE = 2
EXIT_NO_DATA = 1
EXIT_FLAGGED = 1


class CommandError(Exception):
    """A problem with the user's input: printed as one line, exit status `code`."""

    def __init__(self, message, code=EXIT_USAGE):
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise CommandError(f"{self.prog}: {message}")


def build_parser():
    parser = _Parser(
        prog="tb-gradviz", description="Activations and gradients of Keras layers, in TensorBoard."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    demo = commands.add_parser(
        "demo", help="train ResNet50 and a small CNN with the callback, then serve TensorBoard"
    )
    demo.add_argument(
        "--logdir", default="logs/tb_gradviz_demo", help="where the runs go (default: %(default)s)"
    )
    demo.add_argument(
        "--model",
        choices=("all", "resnet50", "cnn"),
        default="all",
        help="which demo (default: %(default)s)",
    )
    demo.add_argument(
        "--steps",
        type=_positive_int,
        default=None,
        help="training steps per run (default: 48 ResNet50, 40 CNN; the plain CNNs always 12)",
    )
    demo.add_argument(
        "--image-size",
        type=_image_size,
        default=64,
        help="ResNet50 input size, >= 32 (default: %(default)s)",
    )
    demo.add_argument(
        "--batch-size",
        type=_positive_int,
        default=16,
        help="ResNet50 batch size (default: %(default)s)",
    )
    demo.add_argument(
        "--no-serve",
        action="store_true",
        help="write the logs and exit without starting TensorBoard",
    )
    demo.add_argument("--host", default="127.0.0.1", help="TensorBoard host (default: %(default)s)")
    demo.add_argument(
        "--port",
        type=_port,
        default=None,
        help=f"TensorBoard port (default: {DEFAULT_PORT}, TensorBoard's, or a free one when it is busy; 0: a free one)",
    )
    demo.add_argument(
        "--serve-seconds",
        type=_positive_float,
        default=None,
        help="stop serving after this many seconds",
    )

    summary = commands.add_parser(
        "summary", help="a table per run and layer at the last (or a chosen) step"
    )
    summary.add_argument("logdir")
    summary.add_argument("--run", default=None, help="only this run")
    summary.add_argument(
        "--step",
        type=_non_negative_int,
        default=None,
        help="the latest step <= STEP (default: last)",
    )

    export = commands.add_parser(
        "export", help="histograms, statistics and weight updates as CSV or JSON"
    )
    export.add_argument("logdir")
    export.add_argument(
        "--format", choices=("csv", "json"), default="csv", help="(default: %(default)s)"
    )
    export.add_argument("--output", default="-", help="file to write, '-' for stdout (default)")
    export.add_argument("--run", default=None, help="only this run")

    check = commands.add_parser(
        "check",
        help="training-health flags per run and layer at the last step; exit 1 when a chosen one is raised",
    )
    check.add_argument("logdir")
    check.add_argument("--run", default=None, help="only this run")
    check.add_argument(
        "--fail-on",
        type=_flags,
        default=list(health.FLAGS),
        help=f"the flags that fail the check, comma-separated (default: {','.join(health.FLAGS)})",
    )
    check.add_argument(
        "--ratio",
        type=_ratio,
        default=health.DEFAULT_RATIO,
        help="vanishing / exploding: the output-gradient RMS ratio to the reference layer (default: %(default)g)",
    )
    return parser


def _typed(name, convert, check, allowed):
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {allowed}; received {text!r}") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"expected {allowed}; received {text!r}")
        return value

    parse.__name__ = name
    return parse


_positive_int = _typed("positive int", int, lambda v: v > 0, "a positive integer")
_non_negative_int = _typed("step", int, lambda v: v >= 0, "an integer >= 0")
_positive_float = _typed(
    "seconds", float, lambda v: v > 0 and math.isfinite(v), "a positive number"
)
_image_size = _typed(
    "image size", int, lambda v: v >= 32, "an integer >= 32 (ResNet50's smallest input)"
)
_port = _typed("port", int, lambda v: 0 <= v <= 65535, "a port number 0-65535")
_ratio = _typed("ratio", float, lambda v: 1 < v < math.inf, "a finite number above 1")


def _flags(text):
    try:
        return health.parse_flags(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


DEFAULT_PORT = 6006  # TensorBoard's


def main(argv=None):
    """Entry point of the `tb-gradviz` console script; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
        return {"demo": _demo, "summary": _summary, "export": _export, "check": _check}[
            args.command
        ](args)
    except CommandError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


# Reading logs.


def _open_logdir(logdir):
    """Returns `(plugin, ctx, experiment)` over the logdir, read as TensorBoard does.

    A `file://` URL is read as its local path; a remote URL (`gs://`,
    `s3://`, any fsspec protocol) through TensorBoard's own file layer, as
    `tensorboard --logdir URL` reads it.

    Raises:
      CommandError: the logdir is missing, not a directory, cannot be read,
        or holds no tb_gradviz data.
    """
    _use_tensorboard_without_tensorflow()
    try:
        where = storage.location(logdir, "logdir")
    except (TypeError, ValueError) as e:
        raise CommandError(str(e)) from None
    if where.is_remote:
        try:
            found = where.layer.isdir(where.url)
        except Exception as e:  # the store's own error: no bucket, no permission, no network
            raise CommandError(
                f"cannot read logdir {logdir!r}: {type(e).__name__}: {e}", EXIT_NO_DATA
            ) from None
        if not found:
            raise CommandError(f"logdir {logdir!r} does not exist (nothing is stored under it)")
        logdir = where.url
    else:
        if not os.path.exists(where.local_path):
            raise CommandError(f"logdir {logdir!r} does not exist")
        if not os.path.isdir(where.local_path):
            raise CommandError(f"logdir must be a directory; received {logdir!r}, which is a file")
        logdir = where.local_path
    from tensorboard import context
    from tensorboard.backend.event_processing import (
        data_provider,
        event_accumulator,
        plugin_event_multiplexer,
    )
    from tensorboard.plugins import base_plugin

    from tb_gradviz.board import plugin

    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        size_guidance={event_accumulator.TENSORS: 0}
    )
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, logdir)
    gradviz = plugin.GradVizPlugin(base_plugin.TBContext(data_provider=provider, logdir=logdir))
    return gradviz, context.RequestContext(), ""


def _use_tensorboard_without_tensorflow():
    # TensorBoard's readers use the real TensorFlow when it is installed,
    # which costs seconds of import for nothing here; the presence of
    # `tensorboard.compat.notf` is its own switch to the built-in stub.
    if "tensorflow" not in sys.modules:
        import types

        sys.modules.setdefault(
            "tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf")
        )


def _runs(gradviz, ctx, experiment, logdir, only_run):
    runs = gradviz.runs_impl(ctx, experiment)["runs"]
    if not runs:
        raise CommandError(
            f"no tb_gradviz data in {logdir!r}: point it at the log_dir given to GradVizCallback (or a parent of it)",
            EXIT_NO_DATA,
        )
    if only_run is not None:
        names = [r["run"] for r in runs]
        runs = [r for r in runs if r["run"] == only_run]
        if not runs:
            raise CommandError(
                f"no run {only_run!r} with tb_gradviz data; runs are: {', '.join(names)}",
                EXIT_NO_DATA,
            )
    return runs


# summary


def _summary(args):
    from tensorboard import errors

    gradviz, ctx, experiment = _open_logdir(args.logdir)
    printed = 0
    for run in _runs(gradviz, ctx, experiment, args.logdir, args.run):
        try:
            snapshot = gradviz.step_impl(ctx, experiment, run["run"], args.step)
        except errors.NotFoundError:
            print(f"run {run['run']}: no step <= {args.step}\n")
            continue
        print(f"run {run['run']}  (step {snapshot['step']})")
        print(_table(summary_rows(snapshot, run["layers"])))
        updates = update_rows(snapshot)
        if updates:
            print(
                "\nweight updates  (|w - w_previous| / |w| since the previous log event; size: per step, against the usual ~1e-3)"
            )
            print(_table(updates, UPDATE_COLUMNS))
        print()
        printed += 1
    if not printed:
        raise CommandError(f"no run has a step <= {args.step}", EXIT_NO_DATA)
    return 0


SUMMARY_COLUMNS = (
    "layer",
    "tensor",
    "step",
    "shape",
    "zeros %",
    "routed %",
    "max routed %",
    "tied",
    "nan",
    "inf",
    "mass",
    "flags",
)


def summary_rows(snapshot, layers):
    """Rows of the summary table of one run at one step.

    Args:
      snapshot: `/step` data of the run.
      layers: the run's layers as `/runs` gives them (shapes, pooling).
    """
    info = {layer["layer"]: layer for layer in layers}
    rows = []
    for layer in snapshot["layers"]:
        routing = layer.get("routing")
        shapes = {t["tensor"]: t["shape"] for t in info.get(layer["layer"], {}).get("tensors", [])}
        pooling = info.get(layer["layer"], {}).get("pooling") or {}
        for tensor, record in layer["tensors"].items():
            stats = record["stats"]
            routed = routing if routing and tensor.startswith(records.INPUT_GRADIENT) else None
            rows.append(
                (
                    layer["layer"],
                    tensor,
                    str(record["step"]),
                    "x".join(str(n) for n in shapes.get(tensor, [])) or "?",
                    _percent(stats["zeros"], stats["count"]),
                    _percent(routed["routed_positions"], routed["input_positions"])
                    if routed
                    else "",
                    # One winner per window: the most a max pool can route to.
                    _percent(routed["windows"], routed["input_positions"])
                    if routed and pooling.get("type") == "max"
                    else "",
                    _count(routed["tied_windows"]) if routed else "",
                    str(stats["nan"]),
                    str(stats["pos_inf"] + stats["neg_inf"]),
                    mass_conservation(routed) if routed else "",
                    ",".join(flag["flag"] for flag in layer.get("flags", [])),
                )
            )
    return rows


UPDATE_COLUMNS = (
    "layer",
    "weight",
    "step",
    "interval",
    "weight norm",
    "update norm",
    "update ratio",
    "size",
)
LAYER_UPDATE = "(layer)"  # the weight column of a layer's combined row


def update_rows(snapshot):
    """Rows of the weight-update table of one run at one step: per layer, its weights and their combination.

    A layer's combined row (weight `LAYER_UPDATE`) is the server's
    `update_ratio` of the layer, its weights taken as one vector; its
    weights follow in the layer's order (kernel before bias), as `/step`
    gives them. `size` is the server's verdict on the ratio per step
    (`health.update_size`). Empty when no layer has update records
    (`weights=True` logs them from its second log event on).

    Args:
      snapshot: the `/step` body.
    """
    rows = []
    for layer in snapshot["layers"]:
        updates = layer.get("updates") or {}
        if not updates:
            continue
        steps = sorted({u["step"] for u in updates.values()})
        intervals = sorted({u["interval"] for u in updates.values()})
        rows.append(
            (
                layer["layer"],
                LAYER_UPDATE,
                ",".join(map(str, steps)),
                ",".join(map(_interval, intervals)),
                "",
                "",
                _scientific(layer["update_ratio"]),
                layer["update_size"] or "-",
            )
        )
        for weight, update in updates.items():
            rows.append(
                (
                    layer["layer"],
                    weight,
                    str(update["step"]),
                    _interval(update["interval"]),
                    _scientific(update["weight_norm"]),
                    _scientific(update["update_norm"]),
                    _scientific(update["update_ratio"]),
                    update["size"] or "-",
                )
            )
    return rows


def _scientific(value):
    return "-" if value is None else f"{value:.3e}"


def _interval(value):
    return "-" if not math.isfinite(value) else str(int(value))


def mass_conservation(routing):
    """'kept', 'off by ...' or '?': the server's verdict (`summaries.mass_conservation`), as the tab shows it."""
    verdict = routing["mass"]
    if verdict["conserved"] is None:
        return "?"
    return "kept" if verdict["conserved"] else f"off by {abs(verdict['difference']):.3g}"


def _percent(part, whole):
    if not whole or not math.isfinite(part):
        return "-"
    return f"{100.0 * part / whole:.2f}"


def _count(value):
    return "-" if not math.isfinite(value) else str(int(value))


def _table(rows, columns=SUMMARY_COLUMNS):
    widths = [max(len(str(c)) for c in column) for column in zip(columns, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


# check


def _check(args):
    gradviz, ctx, experiment = _open_logdir(args.logdir)
    raised = []
    for run in _runs(gradviz, ctx, experiment, args.logdir, args.run):
        snapshot = gradviz.step_impl(ctx, experiment, run["run"], None, args.ratio)
        rows = [
            (
                layer["layer"],
                flag["flag"],
                "yes" if flag["flag"] in args.fail_on else "no",
                flag["detail"],
            )
            for layer in snapshot["layers"]
            for flag in layer["flags"]
        ]
        raised += [row for row in rows if row[2] == "yes"]
        reference = snapshot["health"]["reference_layer"]
        print(f"run {run['run']}  (step {snapshot['step']}, reference layer {reference or '-'})")
        print(_table(rows, ("layer", "flag", "fails", "detail")) if rows else "no flag raised")
        if all(layer["units"] is None for layer in snapshot["layers"]):
            print("(dead units not recorded: the run was written before tb_gradviz recorded them)")
        print()
    if raised:
        print(
            f"{len(raised)} flag(s) among --fail-on {','.join(args.fail_on)} raised",
            file=sys.stderr,
        )
        return EXIT_FLAGGED
    return 0


# export


def _export(args):
    gradviz, ctx, experiment = _open_logdir(args.logdir)
    runs = _runs(gradviz, ctx, experiment, args.logdir, args.run)
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


# demo


def _demo(args):
    if os.path.exists(args.logdir) and not os.path.isdir(args.logdir):
        raise CommandError(
            f"--logdir must be a directory; received {args.logdir!r}, which is a file"
        )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    started = time.monotonic()
    print(
        f"Training into {os.path.abspath(args.logdir)} (data generated, no download)...", flush=True
    )
    from tb_gradviz import demos

    runs = demos.run_demo(
        args.logdir,
        model=args.model,
        steps=args.steps,
        image_size=args.image_size,
        batch_size=args.batch_size,
    )
    for run, layers in runs.items():
        print(f"  {run}: {', '.join(layers)}")
    print(f"Logs written in {time.monotonic() - started:.0f} s.", flush=True)
    if args.no_serve:
        print(
            f"View them with: tensorboard --logdir {args.logdir} --samples_per_plugin=gradviz=0,histograms=0"
        )
        return 0
    return serve(args.logdir, args.host, args.port, args.serve_seconds)


def serve(logdir, host, port=None, seconds=None):
    """Serves TensorBoard (with the GradViz tab) on logdir until Ctrl-C or `seconds`.

    `port` None is TensorBoard's own default, `DEFAULT_PORT`, or a free port
    (said on stdout) when that one is busy; an explicit busy port fails.
    """
    from tensorboard import program

    def launch(port):
        board = program.TensorBoard()
        board.configure(
            argv=[
                None,
                "--logdir",
                logdir,
                "--host",
                host,
                "--port",
                str(port),
                "--samples_per_plugin",
                "gradviz=0,histograms=0",
            ]
        )
        return board.launch()

    try:
        url = launch(DEFAULT_PORT if port is None else port)
    except program.TensorBoardServerException as e:
        if port is not None:
            raise CommandError(
                f"cannot serve TensorBoard on {host}:{port}: {e.msg}", EXIT_NO_DATA
            ) from None
        print(f"Port {DEFAULT_PORT} is busy ({e.msg}); serving on a free port instead.", flush=True)
        try:
            url = launch(0)
        except program.TensorBoardServerException as e:
            raise CommandError(
                f"cannot serve TensorBoard on {host}: {e.msg}", EXIT_NO_DATA
            ) from None
    print(f"GradViz tab: {url}#gradviz", flush=True)
    print("Press Ctrl-C to stop.", flush=True)
    deadline = None if seconds is None else time.monotonic() + seconds
    try:
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
