"""Training-health flags, decided from the recorded statistics of one step.

Numpy only. The plugin serves the flags in `/step` and `tb-gradviz check` and
`summary` print them, so the tab, the CLI and a CI job judge alike. Nothing
here costs the callback anything: the flags read the stats records every log
event already writes, and the units record for dead channels.

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
  values underflow / overflow that format at the run's loss scale (`headroom`).

With `weights=True`, each update record also gets a size (`update_size`):
where the weight's update ratio, per optimizer step, stands against the
~1e-3 that practitioners call healthy. It is a description, not a flag: a
learning-rate schedule or a frozen phase moves it on purpose.

Saturation (a sigmoid or tanh output at its bounds) is not flagged: the
records do not say which activation function a layer applies, and a value
at 0 is a saturated sigmoid but a healthy ReLU.
"""

import math

from tb_gradviz.board import headroom
from tb_gradviz.format import records

FLAGS = ("nonfinite", "vanishing", "exploding", "dead", *headroom.FLAGS)
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


def _finite_count(stats):
    return stats["count"] - stats["nan"] - stats["pos_inf"] - stats["neg_inf"]


def role_flow(stats_list):
    """The RMS, max |value| and exact-zero fraction over the stats of one role's tensors.

    RMS and max are over the finite values (NaN when there is none); the
    RMS of several tensors is that of all their values together.
    """
    finite = sum(_finite_count(s) for s in stats_list)
    count = sum(s["count"] for s in stats_list)
    if finite:
        squares = sum(
            _finite_count(s) * (s["mean"] ** 2 + s["std"] ** 2)
            for s in stats_list
            if _finite_count(s)
        )
        rms = math.sqrt(squares / finite)
        max_abs = max(max(abs(s["min"]), abs(s["max"])) for s in stats_list if _finite_count(s))
    else:
        rms = max_abs = math.nan
    return {
        "rms": rms,
        "max_abs": max_abs,
        "zero_fraction": sum(s["zeros"] for s in stats_list) / count if count else math.nan,
    }


def layer_flow(tensors):
    """`{role: role_flow}` of one layer of `/step` (`tensors`: name -> {"role", "stats"})."""
    by_role = {}
    for tensor in tensors.values():
        by_role.setdefault(tensor["role"], []).append(tensor["stats"])
    return {role: role_flow(stats) for role, stats in by_role.items() if role in records.ROLES}


def _gradient_rms(layer):
    flow = layer["flow"].get(records.OUTPUT_GRADIENT)
    return None if flow is None else flow["rms"]


def _containers(layers):
    names = [layer["layer"] for layer in layers]
    return {name for name in names if any(other.startswith(name + "/") for other in names)}


def reference_layer(layers):
    """The layer nearest the output whose output gradient has a finite, non-zero RMS, or None.

    Nearest the output: last in model order; a nested model is never the reference.
    """
    containers = _containers(layers)
    for layer in reversed(layers):
        rms = _gradient_rms(layer)
        if layer["layer"] not in containers and rms is not None and math.isfinite(rms) and rms > 0:
            return layer
    return None


def judged_layers(layers, reference):
    """The layers the gradient-RMS rules judge, by name: up to the reference, no nested model."""
    if reference is None:
        return set()
    containers = _containers(layers)
    names = [layer["layer"] for layer in layers]
    return set(names[: names.index(reference["layer"]) + 1]) - containers


def layer_flags(layer, reference, ratio=DEFAULT_RATIO, judged=True):
    """The flags of one layer of `/step` (with its `flow` and `units`), in `FLAGS` order.

    Each flag is `{"flag", "detail", "tensor"}`; `tensor` is the tensor the
    rule reads: the first tensor holding a non-finite value, the output
    gradient, or the activation whose channels are dead.

    `judged`: whether the gradient-RMS rules apply to it (`judged_layers`).
    """
    flags = []
    nonfinite = [
        (
            name,
            f"{name}: {int(t['stats']['nan'])} NaN, "
            f"{int(t['stats']['pos_inf'] + t['stats']['neg_inf'])} Inf",
        )
        for name, t in layer["tensors"].items()
        if t["stats"]["nan"] or t["stats"]["pos_inf"] or t["stats"]["neg_inf"]
    ]
    if nonfinite:
        flags.append(
            {
                "flag": "nonfinite",
                "detail": "; ".join(detail for _, detail in nonfinite),
                "tensor": nonfinite[0][0],
            }
        )
    rms = _gradient_rms(layer)
    if judged and reference is not None and rms is not None and math.isfinite(rms):
        reference_rms = _gradient_rms(reference)
        where = f"output-gradient RMS {rms:.3g} vs {reference_rms:.3g} at {reference['layer']}"
        tensor = _first_of_role(layer, records.OUTPUT_GRADIENT)
        if rms * ratio < reference_rms:
            flags.append({"flag": "vanishing", "detail": where, "tensor": tensor})
        elif rms > reference_rms * ratio:
            flags.append({"flag": "exploding", "detail": where, "tensor": tensor})
    units = layer.get("units")
    if units and units["dead_channels"]:
        listed = ", ".join(map(str, units["listed"]))
        more = "" if len(units["listed"]) == units["dead_channels"] else ", ..."
        flags.append(
            {
                "flag": "dead",
                "detail": f"{units['dead_channels']} of {units['channels']} channels never "
                f"non-zero: {listed}{more}",
                "tensor": _first_of_role(layer, records.ACTIVATION),
            }
        )
    return flags + headroom.flags(layer)


def _first_of_role(layer, role):
    """The name of the layer's first tensor of `role` in `/step`, or None."""
    return next((name for name, t in layer["tensors"].items() if t["role"] == role), None)
