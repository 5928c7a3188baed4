"""Training-health flags, decided from the recorded statistics.

Numpy only, in the format so that both sides judge alike: the plugin serves
the flags in `/step` and `/onset`, `tb-gradviz check` and `summary` print
them, and the callback judges each log event to keep its full records where
a flag is first raised (`full_records`). The flags read what every log event
already writes (the stats, units and precision records, or the per-event
digest that holds their counts). Each rule is one function
over `[layers, steps]` arrays (`verdicts`): `/step` applies it to one step of
the full records or of the digest, `/onset` to every step of the digest.

The rules (docs/health.md):

* `nonfinite`: a recorded tensor of the layer holds a NaN or an Inf;
* `vanishing` / `exploding`: the RMS of the gradient at the layer's output
  is below / above that of the reference layer by more than `ratio` (default
  1000, three orders of magnitude). The reference is the chosen layer
  nearest the output whose output gradient has a finite, non-zero RMS:
  gradients that fall or grow by orders of magnitude on their way from the
  loss toward the input. Layers nearer the output than the reference are not
  judged (the loss may read behind them: Keras' cross-entropy reads a
  softmax's logits, so the softmax's own output gradient is exactly zero),
  nor are nested models (their output is their last layer's);
* `dead`: channels of the layer's activation that are exactly zero for every
  probe example and position;
* `underflow` / `overflow`: a gradient of a float16 or bfloat16 layer whose
  values underflow / overflow that format at the run's loss scale (`headroom`);
* `block_underflow`: a gradient over 1 % of whose non-zero values would
  become zero in MXFP8 E4M3 (`block_headroom`); not in `DEFAULT_FAIL_ON`,
  since it says what a format the run may not use would do;
* `stalled` / `skipped_steps`: the layer's recorded weights did not change
  since the previous log event / the optimizer skipped a share of the train
  steps since then (`stalled`).

With `weights=True`, each update record also gets a size (`update_size`):
where the weight's update ratio, per optimizer step, stands against the
~1e-3 that practitioners call healthy. It is a description, not a flag: a
learning-rate schedule or a frozen phase moves it on purpose.

Saturation (a sigmoid or tanh output at its bounds) is not flagged: the
records do not say which activation function a layer applies, and a value
at 0 is a saturated sigmoid but a healthy ReLU.
"""

import bisect
import math

import numpy as np

from tb_gradviz.format import block_headroom, flow, headroom, origin, records, stalled

FLAGS = (
    "nonfinite",
    "vanishing",
    "exploding",
    "dead",
    *headroom.FLAGS,
    *block_headroom.FLAGS,
    *stalled.FLAGS,
)
# The flags `tb-gradviz check` fails on unless told (`--fail-on`): all but what a run in
# another format would meet.
DEFAULT_FAIL_ON = tuple(flag for flag in FLAGS if flag not in block_headroom.FLAGS)
DEFAULT_RATIO = 1000.0


_REFERENCE = (
    "(the layer nearest the output with a non-zero gradient; layers after it and nested models "
    "are not judged)"
)


def rules(ratio=DEFAULT_RATIO):
    """The rule of each flag, as the tab shows it on hover."""
    return {
        "nonfinite": "a recorded activation or gradient holds a NaN or an Inf",
        "vanishing": f"the output gradient's RMS is over {ratio:g}x smaller than at the reference "
        f"layer {_REFERENCE}",
        "exploding": f"the output gradient's RMS is over {ratio:g}x larger than at the reference "
        f"layer {_REFERENCE}",
        "dead": "channels of the activation are exactly zero for every probe example and position",
        **headroom.rules(),
        **block_headroom.rules(),
        **stalled.rules(),
    }


# |w - w_previous| / |w| per optimizer step: ~1e-3 is the usual healthy size.
UPDATE_RATIO_USUAL = 1e-3
UPDATE_RATIO_BIG = 1e-1
UPDATE_RATIO_SMALL = 1e-5
UPDATE_SIZES = ("big", "above", "usual", "below", "small")


def update_size(ratio, interval):
    """Where an update ratio stands against the usual ~1e-3 per step, or None when it cannot say.

    The ratio spans `interval` optimizer steps (the steps between two log
    events) and is judged per step, `ratio / interval`: the net move per step
    (steps that go back and forth move less net than each one alone).

    Returns:
      "big" (per step >= 1e-1: the weights jump), "small" (<= 1e-5: they
      barely move), "usual" (within a decade of 1e-3), "above" or "below"
      (between those); None for a ratio that is not a finite number or an
      interval that is not a positive number of steps.
    """
    if ratio is None or interval is None or not math.isfinite(ratio) or not interval > 0:
        return None
    per_step = ratio / interval
    if per_step >= UPDATE_RATIO_BIG:
        return "big"
    if per_step <= UPDATE_RATIO_SMALL:
        return "small"
    if per_step >= UPDATE_RATIO_USUAL * 10:
        return "above"
    if per_step < UPDATE_RATIO_USUAL / 10:
        return "below"
    return "usual"


def parse_flags(text):
    """Parses a comma-separated list of flags.

    Raises:
      ValueError: an unknown flag, naming the ones allowed.
    """
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in FLAGS]
    if unknown or not chosen:
        raise ValueError(
            f"flags must be a comma-separated list of {', '.join(FLAGS)}; received {text!r}"
        )
    return chosen


# The rules over columns.
#
# Both the per-step records (`/step`) and the per-event digest are judged by
# the functions below, over the same columns: per layer in model order,
#
#   {"layer", "layer_index", "layer_dtype",
#    "tensors": {tensor: {"role", <digest.TENSOR_FIELDS>: [steps] array}},
#    "units": {"channels", "dead_channels"} of [steps] arrays, or None,
#    "precision": {tensor: {<digest.PRECISION_FIELDS>: [steps] array}}}
#
# with the tensors in `/step`'s order and NaN where a layer has no value at a
# step. `/step` judges one step (arrays of length 1), the digest every step.


def _containers(names):
    """Per name, whether another name lies under it (starts with it and "/"): a nested model.

    In sorted order the names under `n` follow `n + "/"` directly, so one search per name.
    """
    ordered = sorted(names)
    under = []
    for n in names:
        prefix = n + "/"
        at = bisect.bisect_left(ordered, prefix)
        under.append(at < len(ordered) and ordered[at].startswith(prefix))
    return np.array(under, bool)


def gradient_verdicts(names, rms, ratio=DEFAULT_RATIO):
    """The vanishing / exploding rules over `[layers, steps]` output-gradient RMS.

    The reference at each step is the last layer in model order (a nested
    model never) with a finite, non-zero RMS; the layers judged are those up
    to it, no nested model, with a finite RMS.

    Returns:
      `(reference, vanishing, exploding)`: the reference's index at each step
      (`[steps]`, -1 where there is none), and `[layers, steps]` booleans.
    """
    container = _containers(names)
    rms = np.asarray(rms, dtype=np.float64).reshape(len(names), -1)
    usable = np.isfinite(rms) & (rms > 0) & ~container[:, None]
    last = np.where(usable.any(axis=0), len(names) - 1 - np.argmax(usable[::-1], axis=0), -1)
    reference_rms = np.where(last >= 0, rms[np.maximum(last, 0), np.arange(rms.shape[1])], np.nan)
    judged = (np.arange(len(names))[:, None] <= last[None, :]) & ~container[:, None]
    judged &= np.isfinite(rms) & (last[None, :] >= 0)
    with np.errstate(invalid="ignore"):
        vanishing = judged & (rms * ratio < reference_rms)
        exploding = judged & (rms > reference_rms * ratio)
    return last, vanishing, exploding


def _nonfinite(tensor):
    return tensor["nan"] + tensor["pos_inf"] + tensor["neg_inf"]


def _layers_nonfinite(layers, steps):
    """`[layers, steps]` bool: whether any of a layer's tensors holds a NaN or an Inf (a tensor
    with an unknown count, NaN, holds none), as `_nonfinite` per tensor, from one sum over
    every tensor's counts at once (an event is judged at every logged step)."""
    counts, owner = [], []
    for i, layer in enumerate(layers):
        for t in layer["tensors"].values():
            counts.append((t["nan"], t["pos_inf"], t["neg_inf"]))
            owner.append(i)
    found = np.zeros((len(layers), steps), bool)
    if counts:
        per_tensor = np.asarray(counts, np.float64).reshape(len(counts), 3, steps).sum(axis=1)
        np.logical_or.at(found, np.asarray(owner), per_tensor > 0)  # NaN > 0 is False
    return found


def _step_count(layers):
    """The steps of `[layers, steps]` columns, read from any layer's tensors or updates (a layer
    the in-step digest holds only updates of has no tensors)."""
    for layer in layers:
        for columns in (*layer["tensors"].values(), *layer.get("updates", {}).values()):
            for value in columns.values():
                if isinstance(value, np.ndarray):
                    return len(value)
    return 0


def verdicts(layers, ratio=DEFAULT_RATIO):
    """Every flag of every layer at every step of `[layers, steps]` columns (see above).

    Returns:
      `{"reference": [steps] index (-1: none), "gradient_rms": [layers, steps],
      flag: [layers, steps] bool for each of FLAGS}`.
    """
    steps = _step_count(layers)
    empty = np.zeros(steps, bool)
    gradient_rms = flow.layers_role_columns(
        [layer["tensors"] for layer in layers], records.OUTPUT_GRADIENT, steps
    )["rms"]
    names = [layer["layer"] for layer in layers]
    reference, vanishing, exploding = gradient_verdicts(names, gradient_rms, ratio)
    with np.errstate(invalid="ignore"):
        dead = [
            empty if layer["units"] is None else layer["units"]["dead_channels"] > 0
            for layer in layers
        ]
    found = {
        "reference": reference,
        "gradient_rms": gradient_rms,
        "nonfinite": _layers_nonfinite(layers, steps),
        "vanishing": vanishing,
        "exploding": exploding,
        "dead": np.array(dead).reshape(len(layers), steps),
    }
    found.update(headroom.verdicts(layers, steps))
    found.update(block_headroom.verdicts(layers, steps))
    found.update(stalled.verdicts(layers, steps))
    return found


def flag_entries(layers, found, index, step, listed=None):
    """The flags of one layer at one step of judged columns, in `FLAGS` order.

    Each flag is `{"flag", "detail", "tensor"}`; `tensor` is the tensor the
    rule reads: the first tensor holding a non-finite value in the order
    the step computed them (`origin.in_layer`: weights, activation, output
    gradient, weights' gradients, input gradient), the output gradient, or
    the activation whose channels are dead.

    Args:
      layers: the columns.
      found: their `verdicts`.
      index, step: the layer's index in `layers` and the step's in the columns.
      listed: the dead channels the units record lists, or None (the digest
        holds their number only).
    """
    layer = layers[index]
    tensors = layer["tensors"]
    flags = []
    if found["nonfinite"][index, step]:
        nonfinite = [
            (name, f"{name}: {int(t['nan'][step])} NaN, {int(inf)} Inf")
            for name in _nonfinite_tensors(tensors, step)
            for t in [tensors[name]]
            for inf in [t["pos_inf"][step] + t["neg_inf"][step]]
        ]
        flags.append(
            {
                "flag": "nonfinite",
                "detail": "; ".join(detail for _, detail in nonfinite),
                "tensor": nonfinite[0][0],
            }
        )
    for flag in ("vanishing", "exploding"):
        if found[flag][index, step]:
            reference = found["reference"][step]
            rms = found["gradient_rms"][index, step]
            reference_rms = found["gradient_rms"][reference, step]
            flags.append(
                {
                    "flag": flag,
                    "detail": f"output-gradient RMS {rms:.3g} vs {reference_rms:.3g} at "
                    f"{layers[reference]['layer']}",
                    "tensor": _first_of_role(tensors, records.OUTPUT_GRADIENT),
                }
            )
    if found["dead"][index, step]:
        dead = int(layer["units"]["dead_channels"][step])
        channels = int(layer["units"]["channels"][step])
        detail = f"{dead} of {channels} channels never non-zero"
        if listed is not None:
            more = "" if len(listed) == dead else ", ..."
            detail += f": {', '.join(map(str, listed))}{more}"
        flags.append(
            {
                "flag": "dead",
                "detail": detail,
                "tensor": _first_of_role(tensors, records.ACTIVATION),
            }
        )
    return (
        flags
        + headroom.flag_entries(layer, found, index, step)
        + block_headroom.flag_entries(layer, found, index, step)
        + stalled.flag_entries(layer, found, index, step)
    )


def _first_of_role(tensors, role):
    """The name of the first tensor of `role`, or None."""
    return next((name for name, t in tensors.items() if t["role"] == role), None)


def _nonfinite_tensors(tensors, step):
    """The layer's tensors holding a NaN or an Inf at `step`, in the order the step computed
    them (`origin.in_layer`)."""
    return [name for name in origin.in_layer(tensors) if _nonfinite(tensors[name])[step] > 0]


def _raised_tensors(layers, found, flag, index, step):
    """The tensors of one layer that raised `flag` at one step: those holding a NaN or an Inf,
    the output gradient, the activation, or the flagged gradients."""
    tensors = layers[index]["tensors"]
    if flag == "nonfinite":
        return _nonfinite_tensors(tensors, step)
    entry = next(e for e in flag_entries(layers, found, index, step) if e["flag"] == flag)
    return entry.get("tensors", [entry["tensor"]])


def flag_origin(layers, found, flag, step):
    """Where `flag` began at one step of judged columns: `(layer index, tensor)`, the first
    tensor that raised it in the order the train step computed them, over the passes the flag
    reads (`origin.step_order`, `origin.PASSES`); None when no layer raised it there.

    Args:
      layers: the columns.
      found: their `verdicts`.
      flag: one of `FLAGS`.
      step: the step's index in the columns.
    """
    raised = found[flag][:, step]
    if not raised.any():
        return None
    by_layer = {}
    for index, tensor in origin.step_order(layers, origin.PASSES[flag]):
        if raised[index]:
            if index not in by_layer:
                by_layer[index] = _raised_tensors(layers, found, flag, index, step)
            if tensor in by_layer[index]:
                return index, tensor
    # A layer-level flag whose tensor has no role the passes order: its first layer.
    index = int(np.argmax(raised))
    return index, (_raised_tensors(layers, found, flag, index, step) or [None])[0]
