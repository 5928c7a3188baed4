"""`tb-gradviz summary`: a table per run and layer at one step, and the weight updates."""

import collections
import math

from tb_gradviz.board import kept, loss_scale
from tb_gradviz.cli.logs import open_logdir, runs_of
from tb_gradviz.cli.precision import BLOCK_COLUMNS, PRECISION_COLUMNS, block_rows, precision_rows
from tb_gradviz.cli.status import EXIT_NO_DATA, CommandError
from tb_gradviz.format import block_headroom, records

# A run whose summary is longer than this many lines is shortened to fit a screen (without
# `--details`): each table keeps at most `SHORT_ROWS` of its rows.
SCREEN_LINES = 50
SHORT_ROWS = {"layers": 10, "updates": 5, "precision": 5, "block formats": 5}


class Table(collections.namedtuple("Table", "name title columns rows rank kept")):
    """One table of a run's summary: `rank(row)` orders its rows for a shortened summary (lower
    kept first), `kept` says in words which rows that keeps."""


def run_summary(args):
    from tensorboard import errors

    gradviz, ctx, experiment = open_logdir(args.logdir)
    printed = 0
    for run in runs_of(gradviz, ctx, experiment, args.logdir, args.run):
        try:
            snapshot = gradviz.step_impl(ctx, experiment, run["run"], args.step)
        except errors.NotFoundError:
            print(f"run {run['run']}: no step <= {args.step}\n")
            continue
        parts = run_parts(gradviz, ctx, experiment, run, snapshot)
        lines = render(parts)
        if not args.details and len(lines) > SCREEN_LINES:
            lines = render(parts, shorten=True)
        print("\n".join(lines))
        print()
        printed += 1
    if not printed:
        raise CommandError(f"no run has a step <= {args.step}", EXIT_NO_DATA)
    return 0


def run_parts(gradviz, ctx, experiment, run, snapshot):
    """The parts of one run's summary in order: lines of text, and `Table`s."""
    parts = [
        f"run {run['run']}  (step {snapshot['step']})",
        Table(
            "layers",
            None,
            SUMMARY_COLUMNS,
            summary_rows(snapshot, run["layers"]),
            _layer_rank,
            "the rows with a flag or a NaN/Inf, then pooling layers' routing",
        ),
    ]
    steps = gradviz.full_records_impl(ctx, experiment, run["run"])
    if steps["full"] != steps["logged"]:
        parts.append("\n" + kept.line(steps))
    parts.append(
        Table(
            "updates",
            "weight updates  (|w - w_previous| / |w| since the previous log event; "
            "size: per step, against the usual ~1e-3)",
            UPDATE_COLUMNS,
            update_rows(snapshot),
            _update_rank,
            "the layers' combined rows, those whose size is not usual first",
        )
    )
    parts.append(
        Table(
            "precision",
            "precision  (% of the non-zero values a cast flushes to zero/makes subnormal/"
            "overflows: as the values are, gradients at the loss scale; float8 also scaled "
            "to amax)",
            PRECISION_COLUMNS,
            precision_rows(snapshot),
            _precision_rank,
            "the tensors with the largest share lost in float16",
        )
    )
    parts.append(
        Table(
            "block formats",
            f"block formats  (layers' gradients as captured: ok when at most "
            f"{block_headroom.SHARE:.0%} of each gradient's non-zero values become zero, "
            "else z and the largest share that does, in %; s: the largest share that "
            f"saturates, when over {block_headroom.SHARE:.0%})",
            BLOCK_COLUMNS,
            block_rows(snapshot),
            _block_rank,
            "the layers that survive the fewest formats",
        )
    )
    budget = gradviz.budget_impl(ctx, experiment, run["run"])
    if budget is not None:
        parts.append("\n" + budget_line(budget))
    scale = gradviz.loss_scale_impl(ctx, experiment, run["run"])
    if scale is not None:
        parts.append("\n" + loss_scale.line(scale))
    return parts


def render(parts, shorten=False):
    """The lines of a run's summary; `shorten`: each table keeps its `SHORT_ROWS` best-ranked
    rows, in their order, and says how many it left out."""
    lines = []
    for part in parts:
        if isinstance(part, str):
            lines += part.split("\n")
            continue
        if not part.rows and part.title is not None:
            continue
        if part.title is not None:
            lines += ["", part.title]
        rows = part.rows
        if shorten and len(rows) > SHORT_ROWS[part.name]:
            order = sorted(range(len(rows)), key=lambda i: (part.rank(rows[i]), i))
            rows = [rows[i] for i in sorted(order[: SHORT_ROWS[part.name]])]
        lines += table(rows, part.columns).split("\n")
        if len(rows) < len(part.rows):
            lines.append(
                f"... {len(part.rows) - len(rows)} of {len(part.rows)} rows left out (kept: "
                f"{part.kept}); --details shows them"
            )
    return lines


def _layer_rank(row):
    flagged = row[-1] or row[8] not in ("0", "-") or row[9] not in ("0", "-")
    return 0 if flagged else 1 if row[5] else 2


def _update_rank(row):
    if row[1] != LAYER_UPDATE:
        return 2
    return 1 if row[7] == "usual" else 0


def _precision_rank(row):
    # The float16 cell: "to zero/subnormal/overflow" in percent, "-" without values.
    shares = row[PRECISION_COLUMNS.index("float16")].split("/")
    return -sum(float(share) for share in shares[:2] if share != "-")


def _block_rank(row):
    return -sum(not cell.startswith("ok") for cell in row[2:])


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


def budget_line(budget):
    """The cost budget's last record in words (the callback's `budget=`)."""
    share = budget["share"]
    measured = "not measured yet" if math.isnan(share) else f"{100 * share:.1f} % of training time"
    return (
        f"logging budget {100 * budget['budget']:g} %: every {budget['interval']:g} "
        f"(asked: every {budget['asked_interval']:g}), logging took {measured} "
        f"(at step {budget['step']})"
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
            routed = routing if routing and record["role"] == records.INPUT_GRADIENT else None
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
    """Rows of the weight-update table of one run at one step: per layer, its weights and their
    combination.

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
    """'kept', 'off by ...' or '?': the server's verdict (`summaries.mass_conservation`), as the
    tab shows it."""
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


def table(rows, columns=SUMMARY_COLUMNS):
    widths = [max(len(str(c)) for c in column) for column in zip(columns, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)
