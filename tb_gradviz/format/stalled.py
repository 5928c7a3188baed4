"""The stalled-training flags: weights that did not move, steps the optimizer skipped.

Under float16 or bfloat16 a `LossScaleOptimizer` skips every step whose
gradients hold an Inf or a NaN, and logs nothing: a run whose steps are all
skipped looks healthy while no weight is ever updated. Two rules of
`health` read that, over `[layers, steps]` arrays of its columns:

* `stalled`: the weights a layer records (`weights=True`) have an update
  ratio `|w - w_previous| / |w|` of exactly 0 since the previous log event:
  their values did not change (a learning rate of 0, every step skipped,
  updates too small for the weights' format). A weight whose ratio is not a
  number is passed over: at the first log event (no update record yet), or
  a weight of all zeros that stayed so (0 / 0, a bias with a learning rate
  of 0); one that became all zeros (an infinite ratio) moved. Whatever the
  steps between the events: 0 of them means the optimizer applied no step
  at all. From the digest's update rows;
* `skipped_steps`: of the train steps `fit` ran since the previous log
  event, the share the optimizer skipped (the batches minus the steps it
  applied, both in the loss-scale record) is at least `SKIPPED_SHARE`.
  A `LossScaleOptimizer` that works as designed skips a step now and then
  (each time its scale has grown too far), well under that share. It is a
  fact of the optimizer, not of a layer: each layer logged at the step
  raises it. Read from each layer's `optimizer` columns (`{"batches",
  "skipped"}`: `[steps]` arrays, the same for every layer; NaN where not
  counted), which the plugin adds from the loss-scale record; a layer
  without them is not judged.

Numpy only, like the rest of `health`.
"""

import numpy as np

from tb_gradviz.format import records

FLAGS = ("stalled", "skipped_steps")
# Of the batches since the previous log event, the share skipped that raises `skipped_steps`.
SKIPPED_SHARE = 0.1


def rules():
    """The rule of each flag, as the tab shows it on hover."""
    return {
        "stalled": "every recorded weight of the layer has an update ratio of exactly 0: its "
        "values did not change since the previous log event (weights=True)",
        "skipped_steps": f"the optimizer skipped at least {SKIPPED_SHARE:.0%} of the train steps "
        "since the previous log event (LossScaleOptimizer: gradients with an Inf or a NaN)",
    }


def largest_update_ratios(layers, steps):
    """`[layers, steps]`: each layer's largest update ratio over its recorded weights whose ratio
    is a number; NaN where it has none (no weight recorded, no update record yet)."""
    largest = np.full((len(layers), steps), np.nan)
    for i, layer in enumerate(layers):
        updates = layer.get("updates") or {}
        if updates:
            ratios = np.array([u["update_ratio"] for u in updates.values()], np.float64)
            largest[i] = np.fmax.reduce(ratios.reshape(len(updates), steps), axis=0)
    return largest


def stalled_verdicts(largest):
    """`[layers, steps]` booleans: the `stalled` rule over `largest_update_ratios`."""
    return np.asarray(largest, np.float64) == 0


def skipped_verdicts(skipped, batches, share=SKIPPED_SHARE):
    """`[layers, steps]` booleans: the `skipped_steps` rule over `[layers, steps]` counts of the
    steps skipped and the batches run since the previous log event (NaN: not counted)."""
    skipped = np.asarray(skipped, np.float64)
    batches = np.asarray(batches, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (batches > 0) & (skipped >= share * batches)


def _optimizer_columns(layers, steps):
    """`(skipped, batches)`: `[layers, steps]` arrays of the layers' optimizer columns, NaN where
    a layer has none or is not logged at the step."""
    skipped = np.full((len(layers), steps), np.nan)
    batches = np.full((len(layers), steps), np.nan)
    for i, layer in enumerate(layers):
        optimizer = layer.get("optimizer")
        if optimizer is None:
            continue
        logged = np.any([np.isfinite(t["count"]) for t in layer["tensors"].values()], axis=0)
        skipped[i] = np.where(logged, optimizer["skipped"], np.nan)
        batches[i] = np.where(logged, optimizer["batches"], np.nan)
    return skipped, batches


def verdicts(layers, steps):
    """`{"stalled", "skipped_steps"}`: `[layers, steps]` booleans of `health`'s layer columns."""
    return {
        "stalled": stalled_verdicts(largest_update_ratios(layers, steps)),
        "skipped_steps": skipped_verdicts(*_optimizer_columns(layers, steps)),
    }


def flag_entries(layer, found, index, step):
    """The stalled and skipped-steps flags of one layer at one step of judged columns:
    `[{"flag", "detail", "tensor"}]` (`tensor`: the first weight's values, or None)."""
    flags = []
    if found["stalled"][index, step]:
        updates = {name: u for name, u in layer["updates"].items() if u["update_ratio"][step] == 0}
        intervals = {int(u["interval"][step]) for u in updates.values()}
        span = (
            "the optimizer applied no step"
            if intervals == {0}
            else f"over {_steps(max(intervals))} since the previous log event"
        )
        first = records.weight_tensor_name(records.WEIGHT, next(iter(updates)))
        flags.append(
            {
                "flag": "stalled",
                "detail": f"{', '.join(updates)} unchanged (update ratio 0): {span}",
                "tensor": first if first in layer["tensors"] else None,
            }
        )
    if found["skipped_steps"][index, step]:
        skipped = int(layer["optimizer"]["skipped"][step])
        batches = int(layer["optimizer"]["batches"][step])
        flags.append(
            {
                "flag": "skipped_steps",
                "detail": f"the optimizer skipped {skipped} of {batches} train steps "
                f"({skipped / batches:.1%}) since the previous log event",
                "tensor": None,
            }
        )
    return flags


def _steps(count):
    return f"{count} step{'' if count == 1 else 's'}"
