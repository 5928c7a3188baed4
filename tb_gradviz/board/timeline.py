"""The depth x time body: every chosen layer over every logged step, from the per-event digest.

Rows are the layers in model order; columns are the logged steps, grouped
into at most `width` columns of consecutive steps. Each column keeps the
smallest and the largest value of its steps (a min/max envelope), so a
spike at one step out of thousands still shows, and a flag raised at any of
its steps marks the column. Numpy only: the work is a few reductions over
`[layers, steps]` arrays, whatever the number of steps.

The flags are `health`'s rules, applied at each step to the digest:
`nonfinite` (a tensor of the layer holds a NaN or an Inf), `vanishing` /
`exploding` (the output gradient's RMS against the reference layer's, the
layer nearest the output with a finite, non-zero one; nested models and
the layers after the reference are not judged) and `dead` (dead channels).

The field `flush_share` is the share of the chosen role's finite non-zero
values that flush to zero (to zero or subnormal: IEEE underflow, as the
`underflow` flag counts it) in the format the layer computes in, or in
float16 for a float32 layer, from the digest's precision rows.
"""

import numpy as np

from tb_gradviz.board import headroom, health
from tb_gradviz.board.series import column_starts, envelope
from tb_gradviz.format import digest, records

DEFAULT_WIDTH = 1000
MAX_WIDTH = 10000
# What a cell's colour can show: a field of the chosen role's tensors, or the
# layer's update ratio (its weights' largest).
FIELDS = ("rms", "max_abs", "zero_share", "update_ratio", "flush_share")


def digest_layout(rows):
    """The `records.Layout` of a digest with these rows: its length, and its counts checked."""
    offsets, length = digest.row_offsets(rows)
    counted = [
        offset + digest.FIELDS[kind].index(field)
        for (kind, _, _), offset in zip(rows, offsets)
        for field in digest.COUNT_FIELDS[kind]
    ]
    return records.Layout("digest", (length,), lambda values: values[:, counted])


def _of_role(name, role):
    if role in records.WEIGHT_ROLES:
        return name.startswith(role + "/")
    return name == role or (name.startswith(role + "_") and name[len(role) + 1 :].isdigit())


def layer_columns(digests):
    """Merges decoded digests into per-layer `[steps]` arrays, layers in model order.

    Args:
      digests: `[(rows, series)]`: each digest series' rows and its `Series`.

    Returns:
      `(steps, {layer: {(kind, name): {field: [steps] array}}})`, steps sorted;
      NaN where a layer has no value at a step.
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


def _role_values(tensors, role):
    """`(rms, max_abs, zero_share)` `[steps]` arrays of a layer's tensors of one role, or None."""
    chosen = [
        f for (kind, name), f in tensors.items() if kind == digest.TENSOR and _of_role(name, role)
    ]
    if not chosen:
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        finite = [
            np.nan_to_num(f["count"] - f["nan"] - f["pos_inf"] - f["neg_inf"]) for f in chosen
        ]
        total = np.sum(finite, axis=0)
        squares = np.sum(
            [np.where(n > 0, n * np.nan_to_num(f["rms"]) ** 2, 0) for n, f in zip(finite, chosen)],
            axis=0,
        )
        rms = np.where(total > 0, np.sqrt(squares / np.where(total > 0, total, 1)), np.nan)
        max_abs = np.fmax.reduce([f["max_abs"] for f in chosen], axis=0)
        counts = np.sum([f["count"] for f in chosen], axis=0)
        zero_share = np.sum([f["zeros"] for f in chosen], axis=0) / counts
    return rms, max_abs, zero_share


def flush_format(layer_dtype):
    """The format a layer's flush share is taken in: the one it computes in, else float16."""
    return headroom.compute_format(layer_dtype) or "float16"


def _flush_share(tensors, role, name):
    """The `[steps]` share of a layer's `role` tensors' finite non-zero values that flush to zero
    (to zero or subnormal) in format `name`, all of them pooled: NaN where none is finite and
    non-zero; None when the layer has no such tensor or one of them has no precision row."""
    chosen = [n for kind, n in tensors if kind == digest.TENSOR and _of_role(n, role)]
    found = [tensors.get((digest.PRECISION, n)) for n in chosen]
    if not found or any(fields is None for fields in found):
        return None
    flushed = np.sum([f[f"{name}_to_zero"] + f[f"{name}_subnormal"] for f in found], axis=0)
    total = np.sum([f["finite_nonzero"] for f in found], axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, flushed / np.where(total > 0, total, 1), np.nan)


def _layer_rows(layers, role):
    """Per layer, in model order, its `[steps]` values and flags' inputs."""
    result = []
    for layer, tensors in layers.items():
        values = _role_values(tensors, role)
        gradient = _role_values(tensors, records.OUTPUT_GRADIENT)
        some = next(iter(next(iter(tensors.values())).values()))
        nan = np.full(len(some), np.nan)
        nonfinite = np.sum(
            [
                np.nan_to_num(f["nan"] + f["pos_inf"] + f["neg_inf"])
                for (kind, _), f in tensors.items()
                if kind == digest.TENSOR
            ]
            or [np.zeros(len(some))],
            axis=0,
        )
        dead = [f["dead_channels"] for (kind, _), f in tensors.items() if kind == digest.UNITS]
        ratios = [f["update_ratio"] for (kind, _), f in tensors.items() if kind == digest.UPDATE]
        result.append(
            {
                "layer": layer,
                "rms": nan if values is None else values[0],
                "max_abs": nan if values is None else values[1],
                "zero_share": nan if values is None else values[2],
                "update_ratio": np.fmax.reduce(ratios, axis=0) if ratios else nan,
                "gradient_rms": nan if gradient is None else gradient[0],
                "nonfinite": nonfinite,
                "dead": np.nan_to_num(np.fmax.reduce(dead, axis=0))
                if dead
                else np.zeros(len(some)),
            }
        )
    return result


def _gradient_flags(rows, ratio):
    """`(vanishing, exploding)` `[layers, steps]` booleans: `health`'s rule at each step."""
    names = [row["layer"] for row in rows]
    rms = np.array([row["gradient_rms"] for row in rows]).reshape(len(rows), -1)
    return health.gradient_verdicts(names, rms, ratio)[1:]


def timeline_body(
    run,
    digests,
    field="rms",
    role=records.OUTPUT_GRADIENT,
    width=DEFAULT_WIDTH,
    ratio=health.DEFAULT_RATIO,
    layer_dtypes=None,
):
    """The `/timeline` body (docs/API.md), or None when the run has no digest.

    Args:
      run: the run name.
      digests: `[(rows, series)]` of the run's digest series.
      field: what the cells show, one of `FIELDS`.
      role: whose tensors' values they show (`records.ROLES`).
      width: the most columns.
      ratio: the vanishing / exploding ratio.
      layer_dtypes: `{layer: dtype it computes in}`, which sets each layer's
        format for `flush_share` (`flush_format`; float16 for a layer not in it).
    """
    steps, layers = layer_columns(digests)
    if not len(steps) or not layers:
        return None
    rows = _layer_rows(layers, role)
    if field == "flush_share":
        for row in rows:
            row["format"] = flush_format((layer_dtypes or {}).get(row["layer"]))
            share = _flush_share(layers[row["layer"]], role, row["format"])
            row[field] = np.full(len(steps), np.nan) if share is None else share
    starts = column_starts(len(steps), width)
    ends = np.append(starts[1:], len(steps)) - 1
    vanishing, exploding = _gradient_flags(rows, ratio)
    body_rows = []
    for i, row in enumerate(rows):
        flags = {
            "nonfinite": row["nonfinite"] > 0,
            "vanishing": vanishing[i],
            "exploding": exploding[i],
            "dead": row["dead"] > 0,
        }
        body_rows.append(
            {
                "layer": row["layer"],
                field: envelope(row[field], starts),
                **({"format": row["format"]} if field == "flush_share" else {}),
                # The columns where each flag is raised at one of the steps at least.
                "flags": {
                    name: np.flatnonzero(np.logical_or.reduceat(raised, starts)).tolist()
                    for name, raised in flags.items()
                },
            }
        )
    return {
        "run": run,
        "field": field,
        "role": role,
        "steps": len(steps),
        "columns": {
            "first_step": steps[starts].tolist(),
            "last_step": steps[ends].tolist(),
        },
        "layers": body_rows,
    }


def budget_layout(fields):
    """The `records.Layout` of a cost-budget record with these fields (its intervals counted)."""
    counted = [fields.index(name) for name in ("asked_interval", "interval") if name in fields]
    return records.Layout("budget", (len(fields),), lambda values: values[:, counted])


def budget_body(fields, series):
    """The last cost-budget record as `{field: value, "step"}`, or None when there is none."""
    if series is None or not len(series.steps):
        return None
    last = dict(zip(fields, series.values[-1].tolist()))
    return dict(last, step=int(series.steps[-1]))
