"""The capture interface: one probe pass per log event, whatever Keras runs on.

`new_capture(model, chosen, ...)` returns the pass for the Keras backend in
use, from `tb_gradviz.capture.backends` (only that backend is imported):

* `backends.tensorflow`: a `tf.function` traced once, `tf.GradientTape`;
* `backends.jax`: one jitted `jax.value_and_grad` over `model.stateless_call`;
* `backends.torch`: an eager pass and `torch.autograd.grad`.

Each has `run(x, y, sample_weight) -> (records, skipped_paths)`, `plans` and
`chosen`, and gives the same records (tests/test_backends.py checks each
against its framework's own autodiff). What they share lives here: how a
chosen layer's tensors are caught (`recording_calls`), the plan of what is
recorded, and what every pass computes in `keras.ops` (tied windows, dead
channels, the routing map's slices); `assemble` turns it all into records.

How the tensors are caught: while the pass runs, each chosen layer's `call` is
swapped for a wrapper that hands its floating inputs through `wrap_input`
and its floating outputs through `wrap_output`. On TensorFlow the input wrap
is `tf.identity`, on JAX it adds a zero tensor, on PyTorch it takes a view;
either way the gradient at the wrapped input is the one that flows through
this layer only (not the sum over every consumer of that tensor), and the
gradient of the loss w.r.t. the added zeros (the views) is the gradient
w.r.t. the layer's input and output. A probe `keras.Model` built from
`layer.output` would not reach layers of a nested model; the wrapper does.
"""

import contextlib
import importlib
import itertools
import warnings
from dataclasses import dataclass, field

import keras
import numpy as np

from tb_gradviz.capture import weights as weights_module
from tb_gradviz.capture.selection import pooling_description
from tb_gradviz.format import records, routing_map

BACKENDS = ("tensorflow", "jax", "torch")


def new_capture(
    model,
    chosen,
    loss=None,
    training=True,
    statistics=None,
    routing_map=None,
    weights=False,
    block_formats=True,
):
    """Returns the probe pass of `model` for the Keras backend in use.

    Args:
      model: a built, compiled Keras model.
      chosen: the `selection.ChosenLayer`s to capture.
      loss: None for the model's compiled loss, or a `keras.losses.Loss`.
      training: run the model in training mode (BatchNorm batch statistics,
        Dropout on), as a train step does; the state this changes is undone.
      statistics: `"host"`, `"device"` or None (the backend's default: on a
        CPU, `kernels` on the host).
      routing_map: None, or the `routing_map.Settings` of the pooling
        layers' routing maps.
      weights: also record each chosen layer's trainable weights and the
        gradients w.r.t. them (`weights.chosen_weights`), in the same pass.
      block_formats: also write the precision record's block part (what the
        block-scaled formats would do, `format.blocks`), on either path.

    Raises:
      ValueError: Keras runs on a backend tb_gradviz does not support.
    """
    name = keras.backend.backend()
    if name not in BACKENDS:
        raise ValueError(
            f"tb_gradviz captures on the Keras backends {', '.join(BACKENDS)}; "
            f"Keras runs on {name!r} (set KERAS_BACKEND to one of those)"
        )
    module = importlib.import_module(f"tb_gradviz.capture.backends.{name}")
    probe = module.LayerCapture(model, chosen, loss=loss, training=training, statistics=statistics)
    probe.map_settings = routing_map
    probe.block_formats = bool(block_formats)
    probe.weights = weights_module.chosen_weights(probe.chosen) if weights else {}
    return probe


STATISTICS = ("host", "device")


def loss_scale(model):
    """The factor `train_step` multiplies the loss by, as a float, or None.

    Keras' `train_step` backpropagates `optimizer.scale_loss(loss)`: under
    mixed_float16, `LossScaleOptimizer` multiplies by its current dynamic
    scale so that small float16 gradients do not underflow. Read at each log
    event, since the scale changes during training. (The TensorFlow pass reads
    it inside its traced function instead.)
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return None
    one = keras.ops.ones((), "float32")
    scale = optimizer.scale_loss(one)
    return None if scale is one else float(keras.ops.convert_to_numpy(scale))


class ProbePass:
    """What every backend's pass holds: the model, the chosen layers, how it runs.

    Args: as `new_capture`, and `default_statistics`, the backend's function
    that picks where statistics are computed when `statistics` is None.

    Raises:
      ValueError: `statistics` is neither None nor one of `STATISTICS`.
    """

    def __init__(self, model, chosen, loss, training, statistics, default_statistics):
        statistics = default_statistics() if statistics is None else statistics
        if statistics not in STATISTICS:
            raise ValueError(
                f"statistics must be one of {STATISTICS} or None; received {statistics!r}"
            )
        self.statistics = statistics
        self.model = model
        self.chosen = list(chosen)
        self.training = bool(training)
        self._loss = loss
        self.plans = None  # the LayerPlans, known once the pass has run
        self.map_settings = None  # routing_map.Settings, or None for no routing maps
        self.block_formats = True  # write the precision record's block part
        self.weights = {}  # path -> [(name, variable)] recorded (`weights.chosen_weights`)
        # The recorded weights' values on the host after a run with host statistics,
        # `{id(variable): array}` (`assemble.host_weights`); empty otherwise.
        self.host_weights = {}

    def take_host_weights(self):
        """Returns `host_weights` and lets go of them.

        They alias the weights' own buffers (no copy on a CPU), so they are
        not kept past the log event: TensorFlow copies a variable it updates
        while another reference to its buffer lives, and JAX cannot reuse a
        donated buffer.
        """
        taken, self.host_weights = self.host_weights, {}
        return taken

    def weights_of(self, path):
        """The `(name, variable)`s the layer at `path` records (none without `weights=True`)."""
        return self.weights.get(path, [])


@dataclass
class Recording:
    """What one chosen layer's first call saw during the pass."""

    inputs: list = field(default_factory=list)  # as wrapped
    outputs: list = field(default_factory=list)  # before wrapping


@contextlib.contextmanager
def recording_calls(chosen, is_float, wraps, keep=None):
    """Swaps each chosen layer's `call` for one that records its tensors.

    Args:
      chosen: the `ChosenLayer`s.
      is_float: `tensor -> bool`, which inputs and outputs are recorded.
      wraps: `path -> (wrap_input, wrap_output)`: `wrap_input` is applied to
        each floating input before the layer sees it, `wrap_output` (None:
        none) to each floating output before the model sees it.
      keep: `tensor -> what the recording keeps of it`, called on each wrapped
        input once `wrap_input` has made it and on each output before
        `wrap_output` sees it; None keeps the tensors. (A recording that holds
        an eager tensor keeps its memory from being freed in the backward pass.)

    Yields:
      `{path: Recording}`, filled at each layer's first call.
    """
    recordings = {c.path: Recording() for c in chosen}
    originals = []
    for c in chosen:
        layer = c.layer
        had_own_call = "call" in layer.__dict__
        original = layer.call
        recording = recordings[c.path]
        # object.__setattr__: Keras' __setattr__ would try to track the function.
        wrap_input, wrap_output = wraps(c.path)
        call = _recording_call(original, recording, is_float, wrap_input, wrap_output, keep)
        object.__setattr__(layer, "call", call)
        originals.append((layer, had_own_call, original))
    try:
        yield recordings
    finally:
        for layer, had_own_call, original in originals:
            if had_own_call:
                object.__setattr__(layer, "call", original)
            else:
                object.__delattr__(layer, "call")


def _recording_call(original, recording, is_float, wrap_input, wrap_output, keep):
    def wrapped(wrap):
        return lambda t: wrap(t) if is_float(t) else t

    def kept(tensors):
        floats = [t for t in keras.tree.flatten(tensors) if is_float(t)]
        return floats if keep is None else [keep(t) for t in floats]

    def call(*args, **kwargs):
        if recording.outputs or not (args or "inputs" in kwargs):
            return original(*args, **kwargs)
        inputs = args[0] if args else kwargs["inputs"]
        inputs = keras.tree.map_structure(wrapped(wrap_input), inputs)
        recording.inputs = kept(inputs)
        if args:
            outputs = original(inputs, *args[1:], **kwargs)
        else:
            outputs = original(**dict(kwargs, inputs=inputs))
        recording.outputs = kept(outputs)
        if wrap_output is not None:
            outputs = keras.tree.map_structure(wrapped(wrap_output), outputs)
        return outputs

    return call


@dataclass
class TensorPlan:
    """Python-side description of one captured tensor."""

    name: str
    role: str
    index: int
    shape: list
    dtype: str
    loss_scaled: bool = False  # a gradient taken on the loss times the optimizer's loss scale
    weight: str = None  # for the weight roles, the weight's name (`weights.chosen_weights`)
    compute_dtype: str = None  # for the weight roles, the dtype the layer computes with it in


@dataclass
class LayerPlan:
    """What is recorded for one chosen layer: its tensors, and routing for a pooling layer."""

    chosen: object
    tensors: list
    pooling: dict = None
    has_routing: bool = False
    device: str = None  # where the pass ran, e.g. "cpu" or "cuda:0"
    # The channel axis of the first activation, when a units record is written.
    units_axis: int = None
    map_cut: dict = None  # where the routing map is cut (`routing_map.layout`), when one is written
    weights: list = field(default_factory=list)  # the `(name, variable)`s recorded, in tensor order
    made: dict = field(default_factory=dict, repr=False, compare=False)  # (`assemble._made`)

    @property
    def content(self):
        """Metadata shared by every record of this layer."""
        layer = self.chosen.layer
        content = {
            "layer_index": self.chosen.index,
            "layer_class": type(layer).__name__,
            "layer_dtype": str(getattr(layer, "compute_dtype", None) or layer.dtype),
            "pooling": self.pooling,
            "backend": keras.backend.backend(),
        }
        if self.device is not None:
            content["device"] = self.device
        return content


def layer_plan(
    chosen, recording, shapes_and_dtypes, loss_scaled, device=None, map_settings=None, weights=()
):
    """Returns the `LayerPlan` of a layer whose call was recorded.

    Args:
      chosen: the `ChosenLayer`.
      recording: its `Recording`.
      shapes_and_dtypes: `tensor -> (shape list, dtype name)`.
      loss_scaled: whether the gradients are taken on a scaled loss.
      device: where the pass ran, for the metadata.
      map_settings: `routing_map.Settings`, or None for no routing map.
      weights: the `(name, variable)`s the layer records.

    The tensors are, in order: the activations (outputs), the input gradients,
    the output gradients, the weights, the weight gradients.
    """
    plan = LayerPlan(chosen, [], pooling_description(chosen.layer), device=device)
    groups = (
        (records.ACTIVATION, recording.outputs),
        (records.INPUT_GRADIENT, recording.inputs),
        (records.OUTPUT_GRADIENT, recording.outputs),
    )
    for role, forward in groups:
        for i, t in enumerate(forward):
            shape, dtype = shapes_and_dtypes(t)
            name = records.tensor_name(role, i, len(forward))
            scaled = loss_scaled and role != records.ACTIVATION
            plan.tensors.append(TensorPlan(name, role, i, list(shape), dtype, loss_scaled=scaled))
    plan.weights = list(weights)
    for role in records.WEIGHT_ROLES:
        for i, (weight, variable) in enumerate(plan.weights):
            plan.tensors.append(
                TensorPlan(
                    records.weight_tensor_name(role, weight),
                    role,
                    i,
                    list(variable.shape),
                    keras.backend.standardize_dtype(variable.dtype),
                    loss_scaled=loss_scaled and role == records.WEIGHT_GRADIENT,
                    weight=weight,
                    compute_dtype=weights_module.compute_dtype(chosen.layer, variable),
                )
            )
    plan.has_routing = (
        plan.pooling is not None and len(recording.inputs) == 1 and len(recording.outputs) == 1
    )
    if plan.has_routing and map_settings is not None:
        input_shape = shapes_and_dtypes(recording.inputs[0])[0]
        if routing_map.maps_layer(plan.pooling, input_shape):
            plan.map_cut = routing_map.layout(plan.pooling, input_shape, map_settings)
    if recording.outputs:
        rank = len(shapes_and_dtypes(recording.outputs[0])[0])
        if rank >= 2:
            plan.units_axis = (
                1 if getattr(chosen.layer, "data_format", None) == "channels_first" else rank - 1
            )
    return plan


def map_slices(plan, inputs, input_gradients, output_gradients, example):
    """The probe example's slices a routing map is made of (backend tensors); None without a map."""
    if plan.map_cut is None:
        return None
    return inputs[0][example], input_gradients[0][example], output_gradients[0][example]


def dead_channels(plan, activations):
    """Which channels of a layer's first activation are exactly zero everywhere (a boolean vector).

    Zero for every probe example and every position: a ReLU unit that no
    input of the batch switches on. Written in `keras.ops`, so every
    backend's pass computes it the same way; a NaN is not zero.
    """
    x = activations[0]
    axes = [a for a in range(len(x.shape)) if a != plan.units_axis]
    return keras.ops.all(keras.ops.equal(x, 0), axis=axes)


def tied_windows(x, pooling):
    """Returns the number of windows whose maximum occurs at more than one position.

    Written in `keras.ops`, so every backend's pass computes it the same way.
    NaN (as a float) for adaptive pooling, whose windows vary.
    """
    ops = keras.ops
    # Widening float16/bfloat16 is exact, so ties stay ties.
    if keras.backend.standardize_dtype(x.dtype) not in ("float32", "float64"):
        x = ops.cast(x, "float32")
    if pooling["data_format"] == "channels_first":
        rank = len(x.shape)
        x = ops.transpose(x, [0, *range(2, rank), 1])
    spatial = list(range(1, len(x.shape) - 1))
    if pooling["global"]:
        peak = ops.max(x, axis=spatial, keepdims=True)
        occurrences = ops.sum(ops.cast(ops.equal(x, peak), "int32"), axis=spatial)
        return _count_true(ops.greater(occurrences, 1))
    if pooling["pool_size"] is None or pooling["strides"] is None:
        return float("nan")
    sizes, strides = pooling["pool_size"], pooling["strides"]
    if pooling["padding"] == "same":
        paddings = [(0, 0)]
        for axis, k, s in zip(spatial, sizes, strides):
            _, before, after = routing_map.same_padding(x.shape[axis], k, s)
            paddings.append((before, after))
        paddings.append((0, 0))
        # Padding never wins a max in SAME max pooling.
        x = ops.pad(x, paddings, constant_values=-np.inf)
    counts = [(x.shape[a] - k) // s + 1 for a, k, s in zip(spatial, sizes, strides)]
    shifted = []
    for offset in itertools.product(*(range(k) for k in sizes)):
        index = (
            slice(None),
            *(slice(o, o + s * (c - 1) + 1, s) for o, s, c in zip(offset, strides, counts)),
            slice(None),
        )
        shifted.append(x[index])
    peak = shifted[0]
    for s in shifted[1:]:
        peak = ops.maximum(peak, s)
    occurrences = sum(ops.cast(ops.equal(s, peak), "int32") for s in shifted)
    return _count_true(ops.greater(occurrences, 1))


def _count_true(mask):
    return keras.ops.sum(keras.ops.cast(mask, "int32"))


def warn_skipped(paths):
    if paths:
        warnings.warn(
            f"tb_gradviz: these chosen layers were not called while computing the "
            f"model's output on the probe batch, so nothing is logged for them: {', '.join(paths)}",
            stacklevel=3,
        )
