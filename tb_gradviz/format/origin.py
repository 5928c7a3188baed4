"""Where a fault began: the order in which a train step computes the recorded tensors.

A NaN put into one layer's kernel reaches every tensor computed after it:
the activations of the layers after it in the forward pass, then every
gradient in the backward pass, back to the first layer's. In model order
the first layer that holds a non-finite value is then the first layer,
which only received it; in the order the step computed them, the first
tensor that holds one is where it began. So the onset of a flag (`onset`)
is the first tensor, in that order, that raised it at its first step.

The order of one step:

* the forward pass: the layers in model order, each with its weights'
  values (read to compute the activation) and then its activation;
* the backward pass: the layers from last to first, each with its output
  gradient, then its weights' gradients and its input gradient (both are
  computed from the output gradient; the input gradient is what the layer
  before receives).

A nested model's output is its last inner layer's, and its input gradient
its first inner layer's: its activation follows its inner layers' in the
forward pass, its output gradient precedes theirs in the backward pass and
its input gradient follows them.

Each flag is ordered by the pass its rule reads (`PASSES`, docs/health.md):
`nonfinite` by both (a recorded tensor of either pass may hold the first
NaN), `dead` by the forward pass (channels of an activation), `vanishing`,
`exploding`, `underflow`, `overflow` and `block_underflow` by the backward pass (they judge
gradients, which the backward pass computes from the loss toward the
input: the first layer in that order whose gradient fell, grew, flushed or
overflowed is where it began, and the layers after it received it).
"""

import functools

from tb_gradviz.format import records

FORWARD = "forward"
BACKWARD = "backward"
# The roles of a layer's tensors in the order each pass computes them.
FORWARD_ROLES = (records.WEIGHT, records.ACTIVATION)
BACKWARD_ROLES = (records.OUTPUT_GRADIENT, records.WEIGHT_GRADIENT, records.INPUT_GRADIENT)
PASSES = {
    "nonfinite": (FORWARD, BACKWARD),
    "vanishing": (BACKWARD,),
    "exploding": (BACKWARD,),
    "dead": (FORWARD,),
    "underflow": (BACKWARD,),
    "overflow": (BACKWARD,),
    "block_underflow": (BACKWARD,),
    # The weights whose update ratio is 0 are read in the forward pass; a skipped step is
    # the optimizer's, of no tensor (the first layer raising it is named).
    "stalled": (FORWARD,),
    "skipped_steps": (),
}


def in_layer(tensors, roles=FORWARD_ROLES + BACKWARD_ROLES):
    """The names of a layer's tensors (`{name: {"role", ...}}`) of `roles`, in that role order
    (one role's tensors in their own order): the order the step computes them in."""
    return [name for role in roles for name, tensor in tensors.items() if tensor["role"] == role]


def step_order(layers, passes=(FORWARD, BACKWARD)):
    """`[(layer index, tensor)]`: the tensors of `health`'s columns in the order a train step
    computes them, over the passes given (see above).

    Args:
      layers: per layer in model order, `{"layer", "tensors": {name: {"role", ...}}}`.
      passes: `FORWARD`, `BACKWARD` or both, in that order.

    The order depends on the layers' names and their tensors' names and roles alone, and a
    judge asks it at every event a flag is raised in: it is worked out once per structure
    (`_step_order`).
    """
    structure = tuple(
        (layer["layer"], tuple((name, t["role"]) for name, t in layer["tensors"].items()))
        for layer in layers
    )
    return list(_step_order(structure, tuple(passes)))


@functools.lru_cache(maxsize=32)
def _step_order(structure, passes):
    names = [name for name, _ in structure]
    # A nested model spans its inner layers: it ends at the last, begins at the first.
    inner = [[j for j, other in enumerate(names) if other.startswith(name + "/")] for name in names]
    first = [min(found, default=i) for i, found in enumerate(inner)]
    last = [max(found, default=i) for i, found in enumerate(inner)]
    depth = [sum(name.startswith(other + "/") for other in names) for name in names]
    keyed = []
    for i, (_, roles) in enumerate(structure):
        tensors = {name: {"role": role} for name, role in roles}
        if FORWARD in passes:
            # A nested model's activation after its inner layers' (deepest first).
            keyed += [((0, last[i], -depth[i], 0), i, t) for t in in_layer(tensors, FORWARD_ROLES)]
        if BACKWARD in passes:
            # Its output gradient before its inner layers' (outermost first), its input
            # gradient after them (deepest first).
            ahead = in_layer(tensors, BACKWARD_ROLES[:2])
            keyed += [((1, -last[i], 0, depth[i]), i, t) for t in ahead]
            behind = in_layer(tensors, BACKWARD_ROLES[2:])
            keyed += [((1, -first[i], 1, -depth[i]), i, t) for t in behind]
    keyed.sort(key=lambda item: (item[0], item[1]))
    # The sort is stable: a layer's tensors keep `in_layer`'s order under one key.
    return tuple((i, tensor) for _, i, tensor in keyed)
