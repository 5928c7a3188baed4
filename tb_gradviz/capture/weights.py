"""The weight side of the probe pass (`weights=True`): which weights, and how far they moved.

Each backend's pass takes the gradient of the probe loss w.r.t. the chosen
layers' trainable weights in the same backward pass as the activation
gradients, and summarises the weights and their gradients like any other
tensor (`probe.layer_plan` plans them). What is the same on every backend
lives here, in `keras.ops`: which layer records which weight
(`chosen_weights`), and the update size since the previous log event
(`Updates`). `step_weights` lists every trainable weight of the model, whose
update the in-step digest (`digest="step"`) gives from the step itself.
"""

from typing import NamedTuple

import keras
import numpy as np

from tb_gradviz.capture import assemble, selection
from tb_gradviz.format import events, records, summaries


def chosen_weights(chosen):
    """Returns `{path: [(name, variable)]}`: the trainable weights each chosen layer records.

    A weight is recorded once, by the deepest chosen layer that holds it: a
    nested model and its Conv2D both hold the Conv2D's kernel, and when both
    are chosen the Conv2D records it. `name` is the weight's path below its
    layer (`kernel`, or `query/kernel` for a layer that holds layers), made
    unique within the layer. A frozen layer (`trainable=False`) has none.
    """
    owner = _owners(chosen)
    return {c.path: _named(c, owner) for c in chosen}


def _owners(*groups):
    """`{id(variable): path}`: each trainable weight's layer, the deepest of the first group
    that holds it, then of the next."""
    owner = {}
    for group in groups:
        for c in sorted(group, key=lambda c: c.path.count("/"), reverse=True):
            for variable in c.layer.trainable_weights:
                owner.setdefault(id(variable), c.path)
    return owner


def _named(c, owner):
    """`[(name, variable)]` of the weights `owner` gives to the layer `c`, named uniquely."""
    own = [v for v in c.layer.trainable_weights if owner.get(id(v)) == c.path]
    names, seen = [], set()
    for v in own:
        name = _relative_name(v, c.layer)
        unique, k = name, 1
        while unique in seen:
            unique, k = f"{name}_{k}", k + 1
        seen.add(unique)
        names.append(unique)
    return list(zip(names, own))


class StepWeight(NamedTuple):
    """A trainable weight whose update the in-step digest gives (`step_weights`)."""

    layer: str  # its layer's path
    name: str  # as `chosen_weights` names it
    variable: object
    layer_index: int
    layer_class: str
    count: int  # its values


def step_weights(model, chosen):
    """Every floating trainable weight of `model`, each under one layer, in model order.

    A weight's layer is the deepest chosen layer that holds it (as
    `chosen_weights` gives it), else the deepest layer of the model that
    holds it: every layer with trainable weights, chosen or not. A weight no
    layer below the model holds (a subclassed model's own) is left out.
    """
    walked = [
        selection.ChosenLayer(path, layer, i)
        for i, (path, layer) in enumerate(selection.walk_layers(model))
    ]
    trainable = {id(v) for v in model.trainable_weights}
    owner = _owners(list(chosen), walked)
    found = []
    for c in walked:
        for name, v in _named(c, owner):
            if id(v) in trainable and keras.backend.is_float_dtype(v.dtype):
                count = int(np.prod(v.shape, dtype=np.int64))
                found.append(StepWeight(c.path, name, v, c.index, type(c.layer).__name__, count))
    return found


def compute_dtype(layer, variable):
    """The dtype the layer's call computes with one of its weights in.

    Keras casts a float weight to its layer's compute dtype when both the
    layer and the weight autocast (a Dense kernel under `mixed_float16` is
    read in float16); a weight made with `autocast=False` keeps its own
    dtype (BatchNormalization's gamma and beta stay float32). The owner is
    the innermost layer of `layer` that holds the weight, whose policy
    applies.
    """
    dtype = keras.backend.standardize_dtype(variable.dtype)
    owner = next(
        (
            sub
            for sub in layer._flatten_layers(include_self=True, recursive=True)
            if any(v is variable for v in getattr(sub, "_trainable_variables", ()))
        ),
        layer,
    )
    compute = keras.backend.standardize_dtype(owner.compute_dtype or dtype)
    autocast = owner.autocast and getattr(variable, "_autocast", True)
    floats = keras.backend.is_float_dtype(dtype) and keras.backend.is_float_dtype(compute)
    return compute if autocast and floats else dtype


def _relative_name(variable, layer):
    prefix = f"{getattr(layer, 'path', layer.name)}/"
    path = getattr(variable, "path", variable.name)
    return path[len(prefix) :] if path.startswith(prefix) else variable.name


class Updates:
    """How far each recorded weight moved between two log events: `|w - w_previous| / |w|`.

    Keeps one host copy of each recorded weight, taken at the previous log
    event, in the weight's dtype (float16 and bfloat16 widened to float32):
    as much memory as the recorded weights themselves (ResNet50's figure:
    bench/RESULTS.md, section 9), and never more, since each copy is
    overwritten in place. On the host, because frameworks update weights in
    place (TensorFlow's XLA train step) or free their buffers (JAX donates
    them), and so that the norms are summed in float64; an accelerator sends
    the weights once per log event. `in_step_kernel.update_sums` reads each weight and its
    copy in one pass, then overwrites the copy.
    """

    def __init__(self):
        self._previous = {}  # id(variable) -> (variable, step, host copy)

    def records(self, plans, step, host_values=None):
        """Returns the update records (`records.UPDATE_FIELDS`) of the plans' weights at `step`.

        A weight's first log event gives no record (there is nothing to
        compare with); it takes the copy the next one compares with.

        Args:
          plans: the pass's `LayerPlan`s.
          step: the log event's step.
          host_values: `{id(variable): numpy array}` of weights the pass
            already brought to the host (`ProbePass.host_weights`); the
            others are read here.
        """
        host_values = host_values or {}
        result = []
        for plan in plans:
            for name, variable in plan.weights:
                current = host_values.get(id(variable))
                if current is None:
                    current = np.asarray(keras.ops.convert_to_numpy(variable))
                if current.dtype not in (np.float32, np.float64):
                    current = current.astype(np.float32)
                kept = self._previous.get(id(variable))
                if kept is None or kept[2].shape != current.shape or kept[2].dtype != current.dtype:
                    self._previous[id(variable)] = (variable, step, np.array(current, order="C"))
                    continue
                weight_squares, update_squares = _update_sums(current, kept[2])
                self._previous[id(variable)] = (variable, step, kept[2])
                vector = summaries.update_vector(
                    np.sqrt(weight_squares), np.sqrt(update_squares), step - kept[1]
                )
                content = dict(
                    plan.content,
                    weight=name,
                    tensor=records.weight_tensor_name(records.WEIGHT, name),
                )
                result += events.update_records(plan.chosen.path, name, vector, content)
        return result


def _update_sums(current, copy):
    """`summaries.update_sums(current, copy)`; then `copy` holds `current`.

    Summed in one pass by `in_step_kernel` when numba is installed.
    """
    if assemble.numba_available():
        from tb_gradviz.capture import in_step_kernel

        return in_step_kernel.update_sums(current, copy)
    sums = summaries.update_sums(current, copy)
    copy[...] = current
    return sums
