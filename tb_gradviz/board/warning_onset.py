"""Where each warning began in a run: the onset of `leading`'s rules, as `onset` finds the flags'.

A warning's onset is the first logged step at which any layer raised it
and, at that step, the first tensor that raised it in the order the train
step computed them (`origin.step_order`: the forward pass in model order,
then the backward pass from the last layer to the first); `update_spike`,
which reads weights, by the forward pass, where weights are read. `/onset`
and `tb-gradviz check` list them after the flags' onsets, each marked
`"class": "warning"`. Numpy only, like the rest of the board.
"""

import numpy as np

from tb_gradviz.format import leading, remedies, windows


def onsets(steps, columns, in_step=None):
    """Each raised warning's onset entry, in `leading.WARNINGS` order.

    Args:
      steps: the logged steps, `[steps]` ints, sorted.
      columns: the layers' columns over those steps (`columns.Columns.layers`).
      in_step: None, or `[steps]` bool: where the train step computed the digest.

    Returns:
      `[{"flag", "class", "step", "layer", "layer_index", "tensor", "detail",
      "persists", "raised_steps", "last_raised_step", "remedy"}]`, as
      `onset.onset_body`'s entries, `flag` naming the warning and `class`
      "warning", with `remedy` its likely cause and what to try in one line.
    """
    if not len(steps) or not columns:
        return []
    found = leading.verdicts(steps, columns, in_step=in_step)
    entries = []
    for warning in leading.WARNINGS:
        by_step = found[warning].any(axis=0)
        if not by_step.any():
            continue
        first = int(np.argmax(by_step))
        index, tensor = leading.origin_of(columns, found, warning, first)
        layer = columns[index]
        text = detail(warning, steps, layer, tensor, first)
        entry = onset_entry(warning, "warning", steps, by_step, layer, tensor, text)
        entry["remedy"] = remedy(warning, columns, index, tensor)
        entries.append(entry)
    return entries


def remedy(warning, columns, index, tensor):
    """The warning's likely cause and remedy (`remedies.remedy`) for `columns[index]`'s
    `tensor`."""
    layer = columns[index]
    found = layer["tensors"].get(tensor)
    role = "update" if warning in leading.UPDATE_WARNINGS or found is None else found["role"]
    position = None
    if layer["layer_index"] == 0:
        position = "first"
    elif index == len(columns) - 1:
        position = "last"
    return remedies.remedy(warning, role, layer.get("layer_class"), position)


def onset_entry(name, kind, steps, by_step, layer, tensor, detail_text):
    """One `/onset` entry, of a flag or a warning (`kind`), raised at the logged steps where
    `by_step` is true and first by `layer`'s `tensor`."""
    first = int(np.argmax(by_step))
    return {
        "flag": name,
        "class": kind,
        "step": int(steps[first]),
        "layer": layer["layer"],
        "layer_index": layer["layer_index"],
        "tensor": tensor,
        "detail": detail_text,
        "persists": bool(by_step[first:].all()),
        "raised_steps": int(by_step.sum()),
        "last_raised_step": int(steps[len(by_step) - 1 - np.argmax(by_step[::-1])]),
    }


def detail(warning, steps, layer, tensor, step):
    """The onset's detail: the value at `step` and the baseline it was judged against."""
    window = steps[(steps >= steps[step] - leading.WINDOW) & (steps < steps[step])]
    span = f"steps {int(window[0])}-{int(window[-1])}" if len(window) else "no step"
    if warning == "update_spike":
        per_step = dict(leading.update_series(layer))[tensor]
        return _against(f"{tensor} update ratio per step", per_step, steps, step, span)
    if warning == "update_growth":
        per_step = dict(leading.update_series(layer, leading.UPDATE_MIN_COUNT))[tensor]
        trend = leading.update_trend(steps, per_step)
        rise = windows.drift(steps, trend, leading.UPDATE_PER_STEP, [step])[0, step]
        return (
            f"{tensor} update ratio per step {10 ** trend[0, step]:.3g} (its median over the "
            f"last {leading.SMOOTH} steps): {rise:.2f} decades above its lowest over {span}, "
            f"beyond {leading.UPDATE_PER_STEP:g} per step"
        )
    # The values the rule read: NaN where the tensor holds too few values to be judged.
    values = dict(leading.tensor_series(layer))[tensor]
    if warning == "max_growth":
        return _against("max |x|", values("max_abs"), steps, step, span)
    if warning == "peak_ratio":
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.asarray(values("max_abs")) / np.asarray(values("rms"))
        return _against("max |x| / RMS", ratio, steps, step, span)
    if warning == "rms_drift":
        rms = np.asarray(values("rms"), dtype=np.float64)
        rise = windows.drift(steps, windows.log10(rms), leading.DRIFT_PER_STEP, [step])[0, step]
        return (
            f"RMS {rms[step]:.3g}: {rise:.2f} decades above its lowest over {span}, "
            f"beyond {leading.DRIFT_PER_STEP:g} per step"
        )
    return _against("RMS", values("rms"), steps, step, span)


def _against(what, values, steps, step, span):
    values = np.asarray(values, dtype=np.float64)
    median = windows.baseline(steps, values, step)
    times = values[step] / median
    return f"{what} {values[step]:.3g}, {times:.3g}x its median {median:.3g} over {span}"
