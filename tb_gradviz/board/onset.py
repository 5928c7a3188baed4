"""Where each training-health flag began in a run: its onset.

The flags are `health`'s rules over a run's `columns.Columns` (every layer
at every logged step, from the per-event digest or, in a run written
before it, the full records), decided at every step as `/step` decides
them at that step. The onset of a flag is the first step at which any layer
raised it and, at that step, where it began: the first tensor that raised
it in the order the train step computed them (`origin`: the forward pass in
model order, then the backward pass from the last layer to the first, each
flag over the passes its rule reads). Served by `/onset`, printed by
`tb-gradviz check`. Numpy only, like the rest of the board.
"""

import numpy as np

from tb_gradviz.board import warning_onset
from tb_gradviz.format import flow, headroom, health


def onset_body(run, steps, columns, ratio=health.DEFAULT_RATIO, listed=None, in_step=None):
    """The `/onset` body: each raised flag's first step, layer and tensor, and whether it persists.

    Args:
      run: the run name.
      steps: the logged steps, `[steps]` ints, sorted.
      columns: the layers' columns over those steps (`columns.Columns.layers`).
      ratio: the vanishing / exploding ratio of the flags (`health`).
      listed: None, or `(layer, step) -> [channel]`: the dead channels listed
        at that step (the `dead` onset's detail names them).
      in_step: None, or `[steps]` bool: where the train step computed the
        digest (the warnings judge those steps as `leading.verdicts` says).

    Returns:
      `{"run", "steps", "first_step", "last_step", "ratio", "onsets"}`:
      `steps` is the number of logged steps judged, and `onsets` holds one
      entry per flag raised at any of them, in `health.FLAGS` order, then one
      per warning raised (`warning_onset`, in `leading.WARNINGS` order):
      `{"flag", "class", "step", "layer", "layer_index", "tensor", "detail",
      "persists", "raised_steps", "last_raised_step"}`: `layer` and `tensor`
      are where the flag began at `step` (`health.flag_origin`), `detail`
      that layer's flag there; `class` is "flag" or "warning". `persists` is true
      when the flag stayed raised (by any layer) at every logged step from
      its onset through the last; `raised_steps` counts the steps it was
      raised at. None when the run has no logged step.
    """
    if not len(steps) or not columns:
        return None
    found = health.verdicts(columns, ratio)
    onsets = []
    for flag in health.FLAGS:
        by_step = found[flag].any(axis=0)
        if not by_step.any():
            continue
        first = int(np.argmax(by_step))
        index, tensor = health.flag_origin(columns, found, flag, first)
        layer = columns[index]
        step = int(steps[first])
        chosen = None
        if flag == "dead" and listed is not None:
            chosen = listed(layer["layer"], step)
        entry = next(
            e
            for e in health.flag_entries(columns, found, index, first, chosen)
            if e["flag"] == flag
        )
        onsets.append(
            warning_onset.onset_entry(flag, "flag", steps, by_step, layer, tensor, entry["detail"])
        )
    onsets += warning_onset.onsets(steps, columns, in_step)
    return {
        "run": run,
        "steps": len(steps),
        "first_step": int(steps[0]),
        "last_step": int(steps[-1]),
        "ratio": ratio,
        "onsets": onsets,
    }


def judge_step_from_digest(body, steps, columns, limit, ratio=health.DEFAULT_RATIO):
    """Replaces a `/step` body's flags and reference layer with the digest's at `limit`, and the
    flow and flush shares of each layer whose full records are not of that step.

    The digest holds every logged step while the full records may be a
    sample: each layer of the body is judged at the digest's latest step
    `<= limit`. A layer the digest does not hold keeps what the records said.
    """
    at = int(np.searchsorted(steps, limit, side="right")) - 1
    if at < 0 or steps[at] < body["step"]:
        return  # a digest kept as a sample, older here than the full records
    one = [_at_step(layer, at) for layer in columns]
    found = health.verdicts(one, ratio)
    index = {layer["layer"]: i for i, layer in enumerate(one)}
    for layer in body["layers"]:
        i = index.get(layer["layer"])
        if i is None:
            continue
        # The channels the units record lists, when it is the one of the digest's step.
        units = layer["units"]
        listed = units["listed"] if units is not None and units["step"] == steps[at] else None
        layer["flags"] = health.flag_entries(one, found, i, 0, listed)
        if layer["step"] != steps[at]:
            # The records' float64 flow where they hold the step, else the digest's float32 one.
            layer["flow"] = flow.layer_flow(one[i])
            layer["flush_share"] = headroom.flush_shares(one[i])
    reference = int(found["reference"][0])
    body["health"]["reference_layer"] = None if reference < 0 else one[reference]["layer"]
    body["health"]["step"] = int(steps[at])


def _at_step(layer, at):
    def cut(fields):
        return {k: v if k == "role" else v[at : at + 1] for k, v in fields.items()}

    return dict(
        layer,
        tensors={name: cut(t) for name, t in layer["tensors"].items()},
        units=None if layer["units"] is None else cut(layer["units"]),
        precision={name: cut(p) for name, p in layer["precision"].items()},
        updates={name: cut(u) for name, u in layer.get("updates", {}).items()},
        optimizer=None if layer.get("optimizer") is None else cut(layer["optimizer"]),
    )


def last_step_body(run, steps, columns, ratio=health.DEFAULT_RATIO, listed=None):
    """Every layer's flags at the last logged step, as `/step` judges them there: what
    `tb-gradviz check` prints, without the full records.

    Returns:
      `{"run", "step", "layers": [{"layer", "layer_index", "step", "units", "flags"}],
      "health": {"ratio", "reference_layer"}}` (a `/step` body's fields that
      hold the flags; `units` is `{"channels", "dead_channels"}` or None), or
      None without a logged step.
    """
    if not len(steps) or not columns:
        return None
    last = len(steps) - 1
    one = [_at_step(layer, last) for layer in columns]
    found = health.verdicts(one, ratio)
    layers = []
    for i, layer in enumerate(one):
        if not any(np.isfinite(t["count"][0]) for t in layer["tensors"].values()):
            continue  # not logged at any step
        units = layer["units"]
        if units is not None and np.isfinite(units["channels"][0]):
            units = {field: int(column[0]) for field, column in units.items()}
        else:
            units = None
        chosen = listed(layer["layer"], int(steps[last])) if listed and units else None
        layers.append(
            {
                "layer": layer["layer"],
                "layer_index": layer["layer_index"],
                "units": units,
                "flags": health.flag_entries(one, found, i, 0, chosen),
            }
        )
    reference = int(found["reference"][0])
    return {
        "run": run,
        "step": int(steps[last]),
        "layers": layers,
        "health": {
            "ratio": ratio,
            "reference_layer": None if reference < 0 else one[reference]["layer"],
            "step": int(steps[last]),
        },
    }
