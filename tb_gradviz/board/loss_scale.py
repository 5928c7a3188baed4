"""What a run's loss-scale record says: the scale at each log event and the steps it skipped.

`LossScaleOptimizer` skips a step whose gradients hold an Inf or a NaN (the
`overflow` flag's "lower the loss scale": docs/health.md) and halves its
scale; it doubles the scale after `growth_steps` steps in a row that it
applied. A skipped step does not advance the optimizer's iteration count,
which is the logged step. Between two log events, then, the steps skipped
are the halvings of the scale plus its doublings. It cannot have doubled
when its growth counter at the first event plus the steps applied since
(the difference of the logged steps) is below `growth_steps`: the skipped
steps are then exactly the halvings. Otherwise the halvings (when the scale
fell) are a lower bound. The first event is compared with the optimizer's
initial scale, from a growth counter of 0 at step 0 (a fit that began at
step 0). A record that holds the batches `fit` ran and the steps applied
over them (`capture.loss_scale.BatchCount`) gives the steps skipped exactly,
their difference, whatever the scale did; and, per log event, those since
the previous one, which the `skipped_steps` flag judges (`rule_columns.optimizer_columns`,
`format/stalled.py`). Numpy only, like the rest of the board.
"""

import math

import numpy as np


def skipped_steps(fields, steps, values):
    """The steps `LossScaleOptimizer` skipped over a run's log events (see above).

    Args:
      fields: the record's field names (`capture.loss_scale.FIELDS`).
      steps: `[events]` logged steps, in order.
      values: `[events, fields]` the records.

    Returns:
      `{"skipped", "exact", "first_scale", "last_scale", "step", "batches"}`:
      `skipped` the steps skipped from the optimizer's first step to the last
      event (`step`), exact when `exact` is true and a lower bound otherwise,
      the scale it began with and the one at the last event, and the train
      steps `fit` ran to it (None when the record does not count them; then
      `skipped` is read from the scale's halvings, else it is the batches
      minus the steps applied); None without an event.
    """
    if not len(steps):
        return None
    column = {name: np.asarray(values)[:, i] for i, name in enumerate(fields)}
    counted = _counted(column)
    if counted is not None:
        batches, applied = counted
        return {
            "skipped": int(batches[-1] - applied[-1]),
            "exact": True,
            "first_scale": float(column["initial_scale"][0]),
            "last_scale": float(column["loss_scale"][-1]),
            "step": int(steps[-1]),
            "batches": int(batches[-1]),
        }
    scale, counter = column["loss_scale"], column["growth_counter"]
    growth = column["growth_steps"]
    previous_scale = np.concatenate([column["initial_scale"][:1], scale[:-1]])
    previous_counter = np.concatenate([[0.0], counter[:-1]])
    applied = np.diff(np.concatenate([[0], np.asarray(steps, np.int64)]))
    halvings = np.log2(previous_scale / scale)
    cannot_grow = previous_counter + applied < growth
    return {
        "skipped": int(np.maximum(halvings, 0).sum()),
        "exact": bool(cannot_grow.all()),
        "first_scale": float(column["initial_scale"][0]),
        "last_scale": float(scale[-1]),
        "step": int(steps[-1]),
        "batches": None,
    }


def _counted(column):
    """`(batches, applied)` `[events]` columns of a record that counts them at every event, or
    None (a record without the fields, or an event not counted: a custom training loop)."""
    if "batches" not in column or "applied" not in column:
        return None
    batches, applied = column["batches"], column["applied"]
    if not (np.isfinite(batches).all() and np.isfinite(applied).all()):
        return None
    return batches, applied


def line(body):
    """The loss scale in words, for `tb-gradviz summary` and `check`."""
    skipped = body["skipped"]
    bound = "" if body["exact"] else "at least "
    return (
        f"loss scale {_power(body['first_scale'])} at the start, {_power(body['last_scale'])} "
        f"at step {body['step']}: LossScaleOptimizer skipped {bound}{skipped} "
        f"step{'' if skipped == 1 else 's'} (gradients with an Inf or NaN: each halved the scale "
        "and left the step count where it was)"
    )


def _power(value):
    exponent = math.log2(value) if value > 0 else float("nan")
    return f"2**{int(exponent)}" if exponent == int(exponent) else f"{value:g}"
