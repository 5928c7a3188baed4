"""What a warning asks the user to do: its likely cause and remedy, in one line.

A warning (`leading.WARNINGS`) says that a tensor is changing the way runs
that go on to diverge change first. Which tensor it is says where to look:
the first layer's activation follows the input (the data may have drifted
or a batch be corrupt); attention scores and the output logits grow in
transformers that diverge, which QK-norm and a z-loss hold (arXiv
2309.14322); gradients and weight updates that grow are the learning
rate's or the gradient's size (a lower rate, a longer warm-up, clipping).
`/onset`, `tb-gradviz check` and the tab show the line beside the warning's
detail. Plain Python.
"""

from tb_gradviz.format import records

_ATTENTION = ("MultiHeadAttention", "GroupedQueryAttention", "Attention", "AdditiveAttention")
# The classes of a last layer whose output is the logits.
_OUTPUT = ("Dense", "EinsumDense")

LOWER_RATE = "lower the learning rate (or lengthen its warm-up)"
CLIP = "clip the gradient norm (the optimizer's clipnorm=)"


def remedy(warning, role, layer_class=None, position=None):
    """The likely cause of a warning and what to try, in one line.

    Args:
      warning: one of `leading.WARNINGS`.
      role: the role of the tensor that raised it (`records.ROLES`), or
        "update" for `update_spike`.
      layer_class: the class name of its layer, or None.
      position: "first" for the model's first layer, "last" for the last
        layer logged (the logits, when it is a `Dense` layer), else None.

    Returns:
      A sentence: cause, then remedy.
    """
    if warning in ("update_spike", "update_growth") or role == "update":
        return f"Weight updates jumped against their own recent size: {LOWER_RATE}, or {CLIP}."
    if warning == "peak_ratio":
        if position == "first" and role == records.ACTIVATION:
            return (
                "A few values run far from the rest at the input side: check the input pipeline "
                "for outliers or a corrupt batch (normalise the inputs)."
            )
        return f"A few values run far from the rest: look for outliers in the batch, or {CLIP}."
    if role == records.ACTIVATION:
        if position == "first":
            return (
                "The first layer's output grows: its input may have drifted; check the input "
                f"pipeline (scaling, normalisation), then {LOWER_RATE}."
            )
        if layer_class in _ATTENTION:
            return (
                "Attention activations grow (attention logits running away): add QK-norm "
                f"(normalise queries and keys), or {LOWER_RATE}."
            )
        if position == "last" and layer_class in _OUTPUT:
            return (
                "The output logits grow: add a z-loss (a small penalty on log-sum-exp of the "
                f"logits), or {LOWER_RATE}."
            )
        return (
            f"Activations grow step by step: {LOWER_RATE}, or add normalisation before this layer."
        )
    return f"Gradients grow: {LOWER_RATE}, or {CLIP}."
