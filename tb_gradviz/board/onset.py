"""Where each training-health flag began in a run: its onset.

The flags of each logged step are decided as `/step` decides them at that
step (`responses.step_body`, `health.layer_flags`); the onset of a flag is
the first step at which any layer raised it, the first layer in model order
that raised it there, and the tensor the flag concerns. Served by `/onset`,
printed by `tb-gradviz check`. Numpy only, like the rest of the board.
"""

from tb_gradviz.board import health, responses


def onset_body(run, layers, series_by_kind, ratio=health.DEFAULT_RATIO):
    """The `/onset` body: each raised flag's first step, layer and tensor, and whether it persists.

    Args:
      run: the run name.
      layers: the run's layer index (`store.RunStore.layers()`).
      series_by_kind: every point of the run's series, as for `responses.step_body`.
      ratio: the vanishing / exploding ratio of the flags (`health`).

    Returns:
      `{"run", "steps", "first_step", "last_step", "ratio", "onsets"}`:
      `steps` is the number of logged steps judged, and `onsets` holds one
      entry per flag raised at any of them, in `health.FLAGS` order:
      `{"flag", "step", "layer", "layer_index", "tensor", "detail",
      "persists", "raised_steps", "last_raised_step"}`. `persists` is true
      when the flag stayed raised (by any layer) at every logged step from
      its onset through the last; `raised_steps` counts the steps it was
      raised at. None when the run has no logged step.
    """
    steps = sorted(
        {int(step) for series in series_by_kind["stats"].values() for step in series.steps}
    )
    onsets = {}
    judged = 0
    for step in steps:
        body = responses.step_body(run, layers, series_by_kind, step, ratio)
        if body is None or body["step"] != step:
            continue
        judged += 1
        first = first_layers_raising(body["layers"])
        for flag, (layer, found) in first.items():
            onset = onsets.get(flag)
            if onset is None:
                onsets[flag] = {
                    "flag": flag,
                    "step": step,
                    "layer": layer["layer"],
                    "layer_index": layer["layer_index"],
                    "tensor": found["tensor"],
                    "detail": found["detail"],
                    "persists": True,
                    "raised_steps": 1,
                    "last_raised_step": step,
                }
            else:
                onset["raised_steps"] += 1
                onset["last_raised_step"] = step
        for flag, onset in onsets.items():
            if flag not in first:
                onset["persists"] = False
    if not judged:
        return None
    return {
        "run": run,
        "steps": judged,
        "first_step": steps[0],
        "last_step": steps[-1],
        "ratio": ratio,
        "onsets": [onsets[flag] for flag in health.FLAGS if flag in onsets],
    }


def first_layers_raising(layers):
    """`{flag: (layer, flag entry)}`: the first layer in model order raising each flag.

    Args:
      layers: the `layers` of a `/step` body (sorted in model order, with their `flags`).
    """
    first = {}
    for layer in layers:
        for found in layer["flags"]:
            first.setdefault(found["flag"], (layer, found))
    return first
