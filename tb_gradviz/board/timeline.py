"""The depth x time body: every chosen layer over every logged step, from the per-event digest.

Rows are the layers of the run's `columns.Columns`, the ones `/onset` and
`tb-gradviz check` judge, in model order, but those the in-step digest holds
only update rows of (no tensors: not chosen layers); columns are the logged steps,
grouped into at most `width` columns of consecutive steps. Each column
keeps the smallest and the largest value of its steps (a min/max
envelope), so a spike at one step out of thousands still shows, and a
flag raised at any of its steps marks the column. Numpy only: the work is
a few reductions over `[layers, steps]` arrays, whatever the number of
steps.

The flags are `health`'s rules (`health.verdicts`), applied at each step to
the same columns as `/onset`'s and `/step`'s.

The field `flush_share` is `headroom.flush_share`: the share of the chosen
role's finite non-zero values that flush to zero (to zero or subnormal:
IEEE underflow, as the `underflow` flag counts it) in the format the layer
computes in, or in float16 for a float32 layer. The field `block_zero_share`
is `block_headroom.role_share`: the share that becomes zero in MXFP8 E4M3
(the `block_underflow` flag's count, the one block format the digest holds).
"""

from typing import NamedTuple

import numpy as np

from tb_gradviz.board.series import column_starts, envelope
from tb_gradviz.format import block_headroom, flow, headroom, health, records

DEFAULT_WIDTH = 1000
MAX_WIDTH = 10000
# What a cell's colour can show: a field of the chosen role's tensors, or the
# layer's update ratio (its weights' largest).
FIELDS = ("rms", "max_abs", "zero_share", "update_ratio", "flush_share", "block_zero_share")


def _field_values(layer, field, role):
    """A layer's `[steps]` values of `field` (`FIELDS`) over its `role` tensors; NaN where it
    has none. `flush_share` and `block_zero_share` also give the format they are taken in."""
    nan = np.full(len(next(iter(layer["tensors"].values()))["count"]), np.nan)
    if field == "update_ratio":
        ratios = [u["update_ratio"] for u in layer.get("updates", {}).values()]
        return (np.fmax.reduce(ratios, axis=0) if ratios else nan), {}
    if field == "flush_share":
        found = headroom.flush_share(layer, role)
        name = headroom.flush_format(layer.get("layer_dtype"))
        return (nan if found is None else found["share"]), {"format": name}
    if field == "block_zero_share":
        found = block_headroom.role_share(layer, role)
        return (nan if found is None else found), {"format": block_headroom.FLAG_FORMAT}
    values = flow.role_columns(layer["tensors"], role)
    if values is None:
        return nan, {}
    return values["zero_fraction" if field == "zero_share" else field], {}


class Source(NamedTuple):
    """What `/timeline` shows of a run for one field, role and ratio, at every logged step: the
    body of any width and range is cut from it (`timeline_body`). It holds copies, never views
    of the digest's columns, so that it can be kept while they are let go."""

    steps: np.ndarray  # [steps] ints, sorted
    # Per layer in model order: `{"layer", "values": [steps] float64, "extra": {...},
    # "flags": {flag: [steps] bool}}`.
    rows: list


def timeline_source(found, field="rms", role=records.OUTPUT_GRADIENT, ratio=health.DEFAULT_RATIO):
    """The `Source` of a run's `/timeline` bodies.

    Args:
      found: the run's `columns.Columns` from its digest: the rows, their
        order and the steps are those `/onset` and `check` judge.
      field: what the cells show, one of `FIELDS`.
      role: whose tensors' values they show (`records.ROLES`).
      ratio: the vanishing / exploding ratio. The flags are judged over every
        logged step, so a step's flags are those `/step` gives it whatever the
        range a body shows.
    """
    steps, layers = found
    judged = health.verdicts(layers, ratio) if layers else {}
    rows = []
    for i, layer in enumerate(layers):
        if not layer["tensors"]:
            continue  # a layer the in-step digest holds only updates of: not a chosen layer
        values, extra = _field_values(layer, field, role)
        rows.append(
            {
                "layer": layer["layer"],
                "values": np.array(values, dtype=np.float64),
                "extra": extra,
                "flags": {flag: np.array(judged[flag][i], dtype=bool) for flag in health.FLAGS},
            }
        )
    return Source(np.array(steps), rows)


def timeline_body(run, source, field, role, width=DEFAULT_WIDTH, start=None, end=None):
    """The `/timeline` body (docs/API.md), or None when the run has no logged step in the range.

    Args:
      run: the run name.
      source: the run's `Source` for this field, role and ratio (`timeline_source`).
      field, role: those of the source.
      width: the most columns.
      start, end: the first and last step shown (None: the run's first, its last).
    """
    steps, rows = source
    if not len(steps) or not rows:
        return None
    low = 0 if start is None else int(np.searchsorted(steps, start, side="left"))
    high = len(steps) if end is None else int(np.searchsorted(steps, end, side="right"))
    if low >= high:
        return None
    shown = slice(low, high)
    starts = column_starts(high - low, width)
    ends = np.append(starts[1:], high - low) - 1
    body_rows = [
        {
            "layer": row["layer"],
            field: envelope(row["values"][shown], starts),
            **row["extra"],
            # The columns where each flag is raised at one of the steps at least.
            "flags": {
                flag: np.flatnonzero(np.logical_or.reduceat(raised[shown], starts)).tolist()
                for flag, raised in row["flags"].items()
            },
        }
        for row in rows
    ]
    return {
        "run": run,
        "field": field,
        "role": role,
        "steps": high - low,
        "start": start,
        "end": end,
        "columns": {
            "first_step": steps[shown][starts].tolist(),
            "last_step": steps[shown][ends].tolist(),
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
