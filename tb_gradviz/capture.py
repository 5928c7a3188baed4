"""Activations and gradients of chosen layers, in one compiled pass.

`LayerCapture` traces, once, a `tf.function` that runs the model forward on
the probe batch, takes the loss, and backpropagates to the input and output of
every chosen layer, wherever it sits (Sequential, Functional, subclassed or
nested models). The records follow `format`. Where the statistics are
computed depends on where the model runs (see `default_statistics`): on a CPU
the function returns the tensors and `kernels` summarises each in two fused
passes; on an accelerator TensorFlow ops summarise them on the device and only
bucket counts and scalars leave it.

The tensors are caught inside the layer's own `call`: while the function is
traced, each chosen layer's `call` is swapped for a wrapper that passes the
inputs through `tf.identity` (so the input gradient is the one that flows
through this layer only, not the sum over every consumer of that tensor) and
keeps the outputs. Building a probe `keras.Model` from `layer.output` does not
reach layers of a nested model; the wrapper does.
"""

import contextlib
import difflib
import fnmatch
import itertools
import warnings
from dataclasses import dataclass, field

import keras
import numpy as np
import tensorflow as tf

from tb_gradviz import format as fmt
from tb_gradviz import kernels

_MAX_POOLING = tuple(
    getattr(keras.layers, name)
    for name in ("MaxPooling1D", "MaxPooling2D", "MaxPooling3D", "AdaptiveMaxPooling1D", "AdaptiveMaxPooling2D", "AdaptiveMaxPooling3D")
    if hasattr(keras.layers, name)
)
_AVERAGE_POOLING = tuple(
    getattr(keras.layers, name)
    for name in (
        "AveragePooling1D",
        "AveragePooling2D",
        "AveragePooling3D",
        "AdaptiveAveragePooling1D",
        "AdaptiveAveragePooling2D",
        "AdaptiveAveragePooling3D",
    )
    if hasattr(keras.layers, name)
)
_GLOBAL_MAX_POOLING = (keras.layers.GlobalMaxPooling1D, keras.layers.GlobalMaxPooling2D, keras.layers.GlobalMaxPooling3D)
_GLOBAL_AVERAGE_POOLING = (
    keras.layers.GlobalAveragePooling1D,
    keras.layers.GlobalAveragePooling2D,
    keras.layers.GlobalAveragePooling3D,
)
POOLING_LAYERS = _MAX_POOLING + _AVERAGE_POOLING + _GLOBAL_MAX_POOLING + _GLOBAL_AVERAGE_POOLING

_GLOB_CHARACTERS = frozenset("*?[")


@dataclass
class ChosenLayer:
    """A layer to capture: its path from the root model and its position."""

    path: str
    layer: keras.layers.Layer
    index: int


def walk_layers(model):
    """Returns `(path, layer)` for every layer below `model`, depth first.

    Paths join layer names with "/" from the model's children down, e.g.
    `resnet50/pool1_pool`. Input layers are skipped; a layer reached twice
    (shared) is listed once, at its first path.
    """
    seen = set()
    result = []

    def visit(parent, prefix):
        for child in _children(parent):
            if id(child) in seen or isinstance(child, keras.layers.InputLayer):
                continue
            seen.add(id(child))
            path = f"{prefix}{child.name}"
            result.append((path, child))
            visit(child, path + "/")

    visit(model, "")
    return result


def _children(layer):
    # `_flatten_layers` is how Keras lists sublayers of any layer (models,
    # and plain layers that hold layers); `.layers` only exists on models.
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is not None:
        return list(flatten(include_self=False, recursive=False))
    return list(getattr(layer, "layers", []))


def is_pooling_layer(layer):
    return isinstance(layer, POOLING_LAYERS)


def check_layer_spec(spec):
    """Returns the layer selection as a list, or None for the default.

    Raises:
      TypeError: an item is not a string, a layer class or a callable.
    """
    if spec is None:
        return None
    items = list(spec) if isinstance(spec, (list, tuple, set, frozenset)) else [spec]
    if not items:
        raise ValueError(
            "layers must name at least one layer; received an empty "
            f"{type(spec).__name__}. Pass None to log all pooling layers."
        )
    for item in items:
        if isinstance(item, str) or callable(item):
            continue
        raise TypeError(
            "layers must be None, a layer name or path, a glob pattern, a Keras "
            f"layer class, a predicate, or a list of those; received {item!r} "
            f"of type {type(item).__name__}"
        )
    return items


def select_layers(model, spec):
    """Returns the `ChosenLayer`s of `model` that `spec` asks for, in model order.

    Args:
      model: a built Keras model.
      spec: None (all pooling layers), or a list as returned by
        `check_layer_spec`: exact paths (`"resnet50/pool1_pool"`), bare layer
        names (every layer of that name, at any depth), glob patterns on paths
        (`"resnet50/conv*_out"`), layer classes, or predicates `layer -> bool`.

    Raises:
      ValueError: a name or pattern matches no layer (the message lists the
        nearest names), or nothing at all is chosen.
    """
    spec = check_layer_spec(spec)
    layers = walk_layers(model)
    indexed = [ChosenLayer(path, layer, i) for i, (path, layer) in enumerate(layers)]
    if spec is None:
        chosen = [c for c in indexed if is_pooling_layer(c.layer)]
        if not chosen:
            raise ValueError(
                f"Model {model.name!r} has no pooling layer, which is what tb_gradviz "
                "logs by default. Choose layers with layers=[...]: names or paths "
                "(e.g. 'conv2d' or 'resnet50/pool1_pool'), glob patterns "
                "('resnet50/conv*_out'), layer classes (keras.layers.Conv2D) or a "
                "predicate (lambda layer: ...)."
            )
        return chosen
    picked = set()
    for item in spec:
        matches = [c for c in indexed if _matches(item, c)]
        if not matches and isinstance(item, str):
            raise ValueError(_no_match_message(model, item, [c.path for c in indexed]))
        picked.update(c.index for c in matches)
    if not picked:
        raise ValueError(
            f"layers={spec!r} chose no layer of model {model.name!r}. Its layers are: "
            f"{_preview([c.path for c in indexed])}"
        )
    return [c for c in indexed if c.index in picked]


def _matches(item, chosen):
    if isinstance(item, str):
        if _GLOB_CHARACTERS & set(item):
            return fnmatch.fnmatchcase(chosen.path, item)
        return item in (chosen.path, chosen.layer.name)
    if isinstance(item, type):
        return isinstance(chosen.layer, item)
    return bool(item(chosen.layer))


def _no_match_message(model, item, paths):
    names = sorted(set(paths) | {p.rsplit("/", 1)[-1] for p in paths})
    nearest = difflib.get_close_matches(item, names, n=5, cutoff=0.5)
    hint = f" Nearest: {', '.join(repr(n) for n in nearest)}." if nearest else ""
    kind = "pattern" if _GLOB_CHARACTERS & set(item) else "name"
    return (
        f"No layer of model {model.name!r} matches the {kind} {item!r}.{hint} "
        f"Layers are named by path from the model, e.g. 'resnet50/pool1_pool': {_preview(paths)}"
    )


def _preview(paths, limit=12):
    shown = ", ".join(paths[:limit])
    return shown + (f", ... ({len(paths)} in all)" if len(paths) > limit else "")


def pooling_description(layer):
    """Returns the pooling geometry of a pooling layer as plain data, else None."""
    if not is_pooling_layer(layer):
        return None
    is_global = isinstance(layer, _GLOBAL_MAX_POOLING + _GLOBAL_AVERAGE_POOLING)
    is_max = isinstance(layer, _MAX_POOLING + _GLOBAL_MAX_POOLING)
    pool_size = getattr(layer, "pool_size", None)
    strides = getattr(layer, "strides", None)
    return {
        "type": "max" if is_max else "average",
        "global": is_global,
        "pool_size": None if is_global or pool_size is None else list(pool_size),
        "strides": None if is_global or strides is None else list(strides),
        "padding": "valid" if is_global else getattr(layer, "padding", "valid"),
        "data_format": getattr(layer, "data_format", "channels_last"),
    }


@dataclass
class _Recording:
    """What one chosen layer's first call saw while the probe was traced."""

    inputs: list = field(default_factory=list)  # after tf.identity
    outputs: list = field(default_factory=list)
    original_call: object = None  # for routing


@contextlib.contextmanager
def _recording_calls(chosen):
    """Swaps each chosen layer's `call` for one that records its tensors."""
    recordings = {c.path: _Recording() for c in chosen}
    originals = []
    for c in chosen:
        layer = c.layer
        had_own_call = "call" in layer.__dict__
        original = layer.call
        recording = recordings[c.path]
        recording.original_call = original
        # object.__setattr__: Keras' __setattr__ would try to track the function.
        object.__setattr__(layer, "call", _recording_call(original, recording))
        originals.append((layer, had_own_call, original))
    try:
        yield recordings
    finally:
        for layer, had_own_call, original in originals:
            if had_own_call:
                object.__setattr__(layer, "call", original)
            else:
                object.__delattr__(layer, "call")


def _recording_call(original, recording):
    def call(*args, **kwargs):
        if recording.outputs or not (args or "inputs" in kwargs):
            return original(*args, **kwargs)
        inputs = args[0] if args else kwargs["inputs"]
        inputs = keras.tree.map_structure(_identity_if_float, inputs)
        recording.inputs = [t for t in keras.tree.flatten(inputs) if _is_float(t)]
        if args:
            outputs = original(inputs, *args[1:], **kwargs)
        else:
            outputs = original(**dict(kwargs, inputs=inputs))
        recording.outputs = [t for t in keras.tree.flatten(outputs) if _is_float(t)]
        return outputs

    return call


def _is_float(t):
    return tf.is_tensor(t) and t.dtype.is_floating


def _identity_if_float(t):
    return tf.identity(t) if _is_float(t) else t


def as_loss(loss):
    """Returns `loss` as a `keras.losses.Loss`, which takes `sample_weight`.

    `keras.losses.get("mse")` returns the plain function `mean_squared_error`,
    which gives one value per example and knows no sample weights; wrapping it
    reduces it the way `compile` does.

    Raises:
      ValueError: Keras does not know the loss (Keras' own message).
      TypeError: it resolves to something that is not callable.
    """
    loss = keras.losses.get(loss)
    if isinstance(loss, keras.losses.Loss):
        return loss
    if not callable(loss):
        raise TypeError(f"loss must be a Keras loss name, a function (y_true, y_pred) or a Loss; received {loss!r}")
    return _FunctionLoss(loss)


class _FunctionLoss(keras.losses.Loss):
    def __init__(self, fn):
        super().__init__(name=getattr(fn, "__name__", "loss"))
        self.fn = fn

    def call(self, y_true, y_pred):
        return self.fn(y_true, y_pred)


@dataclass
class TensorPlan:
    """Python-side description of one captured tensor (set at trace time)."""

    name: str
    role: str
    index: int
    shape: list
    dtype: str
    loss_scaled: bool = False  # a gradient taken on the loss times the optimizer's loss scale


@dataclass
class LayerPlan:
    chosen: ChosenLayer
    tensors: list
    pooling: dict = None
    has_routing: bool = False

    @property
    def content(self):
        """Metadata shared by every record of this layer."""
        layer = self.chosen.layer
        return {
            "layer_index": self.chosen.index,
            "layer_class": type(layer).__name__,
            "layer_dtype": str(getattr(layer, "compute_dtype", None) or layer.dtype),
            "pooling": self.pooling,
        }


class LayerCapture:
    """One compiled forward+backward pass that measures the chosen layers.

    Args:
      model: a built, compiled Keras model.
      chosen: the `ChosenLayer`s to capture (see `select_layers`).
      loss: None to use the model's compiled loss (`model.compute_loss`), or a
        Keras loss (name, function `(y_true, y_pred)` or `keras.losses.Loss`).
      training: call the model in training mode (BatchNormalization uses
        batch statistics, Dropout drops), as in a train step. The state that
        this changes (moving statistics, seed generators, metrics) is saved
        before the pass and written back after it, inside the same function.
      statistics: `"host"` (the tensors leave the function and `kernels`
        summarises them), `"device"` (TensorFlow ops summarise them in the
        function, `group_summary`), or None for `default_statistics()`.
        Both give the same records.

    Call `run(x, y, sample_weight)` to get the records of one log event.
    """

    def __init__(self, model, chosen, loss=None, training=True, statistics=None):
        statistics = default_statistics() if statistics is None else statistics
        if statistics not in STATISTICS:
            raise ValueError(f"statistics must be one of {STATISTICS} or None; received {statistics!r}")
        self.model = model
        self.chosen = list(chosen)
        self.training = bool(training)
        self.statistics = statistics
        self._loss = None if loss is None else as_loss(loss)
        self.plans = None
        self._collective_ops = None
        self._probe = tf.function(self._probe_fn, autograph=False)

    @property
    def tracing_count(self):
        return self._probe.experimental_get_tracing_count()

    def run(self, x, y, sample_weight=None):
        """Runs the pass; returns `(step_records, skipped_paths)`.

        `step_records` is a list of `(tag, array, summary_metadata)` ready
        for `format.EventLog.write`.
        """
        # Always in the model's strategy scope, whether or not `fit` was
        # called inside it: Keras divides losses by the number of replicas
        # only in scope, and one trace must serve every call.
        with self.model.distribute_strategy.scope():
            outputs = self._probe(x, y, sample_weight)
        outputs = [np.asarray(t) for t in outputs]  # on a CPU, no copy
        routings = outputs[self._routing_start :]
        if self.statistics == "host":
            scale = float(outputs[self._routing_start - 1]) if any(self._divided_items) else None
            summaries = kernels.summaries(
                (values, scale if divided else None) for values, divided in zip(outputs, self._divided_items)
            )
        else:
            summaries = [(outputs[position][row], outputs[position + 1][row]) for position, row in self._group_rows]
        return self._records([summaries[item] for item in self._items], routings)

    def collective_ops(self, x, y, sample_weight=None):
        """Returns the sorted op types of the pass that communicate across workers.

        Traces the pass if it is not traced yet (the trace is kept, so `run`
        does not trace again). Empty when the pass runs on this worker alone.
        Computed once: the probe batch, hence the trace, does not change, and
        serialising the graph at every log event would cost each worker time.
        """
        if self._collective_ops is not None:
            return self._collective_ops
        with self.model.distribute_strategy.scope():
            graph = self._probe.get_concrete_function(x, y, sample_weight).graph
        types = {op.type for op in graph.get_operations()}
        for function in graph.as_graph_def().library.function:
            types.update(node.op for node in function.node_def)
        self._collective_ops = sorted(t for t in types if t.startswith(("Collective", "Nccl")))
        return self._collective_ops

    def _state_components(self):
        """Returns the per-device variables behind all state the pass may write.

        That is BatchNorm moving statistics, seed generator states (Dropout)
        and metric accumulators (CompileLoss tracks per-output losses).
        Under a `tf.distribute` strategy these are MirroredVariables and
        SyncOnReadVariables, and the pass runs in cross-replica context, where
        neither round-trips through `read` + `assign`: reading a mirrored
        variable gives the primary replica's copy and assigning writes it to
        every copy (Keras 3 BatchNorm updates each replica's copy on its own,
        so the copies differ); reading a SUM on-read variable sums the copies
        (a collective under MultiWorkerMirroredStrategy) and assigning divides
        by the number of copies. Each local copy is saved and restored by
        itself instead, which needs no cross-device communication.
        """
        strategy = self.model.distribute_strategy
        seen, result = set(), []
        for v in list(self.model.non_trainable_variables) + list(self.model.metrics_variables):
            backing = v.value if isinstance(v, keras.Variable) else v
            for component in strategy.experimental_local_results(backing):
                if id(component) not in seen:
                    seen.add(id(component))
                    result.append(component)
        return result

    def _compute_loss(self, x, y, y_pred, sample_weight):
        if self._loss is not None:
            loss = self._loss(y, y_pred, sample_weight=sample_weight)
        else:
            loss = self.model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=self.training)
        # In a strategy's scope Keras divides each replica's loss by the
        # number of replicas, so that the all-reduced sum is the batch's mean.
        # The probe runs the whole batch at once: undo it.
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas > 1:
            loss = loss * tf.cast(replicas, loss.dtype)
        return loss

    def _loss_scale(self):
        """The factor `train_step` multiplies the loss by, or None.

        Keras' `train_step` backpropagates `optimizer.scale_loss(loss)`:
        under mixed_float16, `LossScaleOptimizer` multiplies by its current
        dynamic scale so that small float16 gradients do not underflow.
        """
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            return None
        one = tf.constant(1.0, tf.float32)
        scale = optimizer.scale_loss(one)
        return None if scale is one else tf.cast(scale, tf.float64)

    def _probe_fn(self, x, y, sample_weight):
        state = self._state_components()
        saved = [tf.identity(v.read_value()) for v in state]
        scale = self._loss_scale()
        with _recording_calls(self.chosen) as recordings, tf.GradientTape() as tape:
            for t in keras.tree.flatten(x):
                if _is_float(t):
                    tape.watch(t)
            y_pred = self.model(x, training=self.training)
            loss = self._compute_loss(x, y, y_pred, sample_weight)
            if scale is not None:
                # Backpropagate what train_step backpropagates, so float16
                # gradients underflow (or overflow) exactly as in training.
                loss = loss * tf.cast(scale, loss.dtype)

        plans, sources = [], []
        for c in self.chosen:
            rec = recordings[c.path]
            if not rec.outputs:
                continue
            plans.append((c, rec))
            sources.extend(rec.inputs)
            sources.extend(rec.outputs)
        sole_inputs = _sole_inputs_of_outputs(rec for _, rec in plans)
        gradients = tape.gradient(loss, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)

        routings, summarised, self.plans = [], [], []
        # Which summarised item each plan tensor reads: its own, or, for the
        # input gradient that is the same values as another layer's output
        # gradient, that one's (resolved once every item is known).
        item_of_tensor, same_as_output = [], {}
        item_of_output_gradient, item_of_graph_tensor = {}, {}
        g = iter(gradients)
        for c, rec in plans:
            input_grads = [next(g) for _ in rec.inputs]
            output_grads = [next(g) for _ in rec.outputs]
            plan = LayerPlan(c, [], pooling_description(c.layer))
            groups = (
                (fmt.ACTIVATION, rec.outputs, rec.outputs),
                (fmt.INPUT_GRADIENT, input_grads, rec.inputs),
                (fmt.OUTPUT_GRADIENT, output_grads, rec.outputs),
            )
            for role, tensors, forward in groups:
                divisor = None if role == fmt.ACTIVATION else scale
                for i, t in enumerate(tensors):
                    plan.tensors.append(
                        TensorPlan(
                            fmt.tensor_name(role, i, len(tensors)),
                            role,
                            i,
                            t.shape.as_list(),
                            t.dtype.name,
                            loss_scaled=divisor is not None,
                        )
                    )
                    producer = sole_inputs.get(id(forward[i])) if role == fmt.INPUT_GRADIENT else None
                    if producer is not None:
                        same_as_output[len(item_of_tensor)] = producer
                        item_of_tensor.append(None)
                        continue
                    # One graph tensor is summarised once: backprop hands the
                    # same gradient tensor to both inputs of an Add, say.
                    item = item_of_graph_tensor.setdefault(t.ref(), len(summarised))
                    if item == len(summarised):
                        summarised.append((t, divisor))
                    if role == fmt.OUTPUT_GRADIENT:
                        item_of_output_gradient[id(forward[i])] = item
                    item_of_tensor.append(item)
            if plan.pooling is not None and len(rec.inputs) == 1 and len(rec.outputs) == 1:
                plan.has_routing = True
                routings.append(
                    routing_summary(
                        rec.original_call, rec.inputs[0], input_grads[0], output_grads[0], plan.pooling, divisor=scale
                    )
                )
            self.plans.append(plan)
        self._skipped = [c.path for c in self.chosen if not recordings[c.path].outputs]

        for position, producer in same_as_output.items():
            item_of_tensor[position] = item_of_output_gradient[id(producer)]

        self._items = item_of_tensor  # plan tensor k is summarised item self._items[k]
        if self.statistics == "host":
            # The values themselves, float16 and bfloat16 widened (exactly)
            # to what the kernel takes, then the loss scale if any divides.
            outputs = [t if t.dtype in (tf.float32, tf.float64) else tf.cast(t, tf.float32) for t, _ in summarised]
            self._divided_items = [divisor is not None for _, divisor in summarised]
            if any(self._divided_items):
                outputs.append(scale)
        else:
            # All tensors' statistics at once, a group of equal-sized tensors
            # per op (see group_summary); item i is row self._group_rows[i][1]
            # of outputs self._group_rows[i][0] (histograms) and the next (stats).
            outputs, self._group_rows = [], [None] * len(summarised)
            for indices, divisor in summary_chunks(summarised):
                histograms, stats = group_summary([summarised[i][0] for i in indices], divisor=divisor)
                for row, i in enumerate(indices):
                    self._group_rows[i] = (len(outputs), row)
                outputs += [histograms, stats]
        self._routing_start = len(outputs)
        outputs += routings

        # Written after every read above: automatic control dependencies keep
        # program order for ops on the same variable.
        with tf.control_dependencies(outputs):
            for v, value in zip(state, saved):
                v.assign(value)
        return [tf.identity(t) for t in outputs]

    def _records(self, summaries, routings):
        """Returns `run`'s result from each plan tensor's `(histogram, stats)` and the routings."""
        records = []
        summaries, routings = iter(summaries), iter(routings)
        for plan in self.plans:
            layer_content = plan.content
            for t in plan.tensors:
                histogram, stats = next(summaries)
                content = dict(layer_content, role=t.role, index=t.index, shape=t.shape, dtype=t.dtype)
                if t.role != fmt.ACTIVATION:
                    content["loss_scaled"] = t.loss_scaled
                records += fmt.tensor_records(plan.chosen.path, t.name, histogram, stats, content)
            if plan.has_routing:
                records += fmt.routing_records(plan.chosen.path, next(routings), layer_content)
        return records, list(self._skipped)


STATISTICS = ("host", "device")


def default_statistics():
    """Returns where `LayerCapture` computes statistics: `"host"` when TensorFlow sees no accelerator.

    On a CPU the host is the device: the tensors leave the function without a
    copy, and the fused `kernels` summarise all of ResNet50's in 0.12 s where
    TensorFlow's one-pass-per-op CPU kernels take ~0.8 s (bench/RESULTS.md).
    An accelerator summarises its own tensors rather than send every value
    over the bus.
    """
    accelerators = [d for d in tf.config.list_logical_devices() if d.device_type != "CPU"]
    return "device" if accelerators else "host"


def _sole_inputs_of_outputs(recordings):
    """Maps each recorded input that is the only use of a recorded output to that output.

    When layer B's input is layer A's output and nothing else uses it, the
    gradient through B's input (what B hands back) is all the gradient A's
    output gets: B's input gradient and A's output gradient are the same
    values, bit for bit, and are summarised once. In a chain of chosen layers
    (conv, BatchNorm, ReLU, ...) that is every other gradient tensor.

    Returns:
      `{id(input identity tensor): output tensor}`; empty when executing
      eagerly, where tensors have no consumers to look at.
    """
    if tf.executing_eagerly():
        return {}
    recordings = list(recordings)
    # Graph tensors are named uniquely; `op.inputs` need not return the same Python objects.
    outputs = {t.name: t for rec in recordings for t in rec.outputs}
    result = {}
    for rec in recordings:
        for t in rec.inputs:
            source = t.op.inputs[0] if t.op.type == "Identity" else None
            if source is None or source.name not in outputs:
                continue
            # Consumers in the forward graph only: the backward pass is built after this.
            if [op.name for op in source.consumers()] == [t.op.name]:
                result[id(t)] = outputs[source.name]
    return result


# Statistics are computed for many tensors at once: the captured tensors are
# grouped by (number of elements, dtype, loss-scaled) and each group is
# stacked into a `[rows, n]` matrix summarised with row-wise ops. ResNet50's
# 544 tensors have ~20 distinct sizes, so the graph holds a few hundred
# statistics ops instead of ~40k (trace and graph optimisation time grows with
# the op count), and small tensors no longer pay a per-op overhead each.
# A group is cut into chunks of at most this many values (one row at least),
# so that stacking copies little and the float64 temporaries stay small.
_CHUNK_VALUES = 1 << 21

# Magnitude bins from a float64 log: bin = floor(2 log10 |x|) + 25, clipped to
# [0, MAGNITUDE_BINS - 1]. Exact for every float32 value (float16 and bfloat16
# widen to float32 exactly): the float32 value nearest to an edge but not on
# it is 5.6e-10 (relative) away from it, i.e. 4.9e-10 away in units of
# 2 log10 |x|, while the float64 log and product err by < 1e-13; the edges
# that are float32 values themselves (1, 10, ..., 1e6) land exactly on an
# integer, which _LOG_NUDGE lifts past any rounding below it.
# tests/test_capture.py checks both the margin and the op on edge neighbours.
_LOG_PER_LN = 2 / np.log(10.0)
_LOG_OFFSET = -fmt.LOG_MIN_EXPONENT * fmt.LOG_BINS_PER_DECADE + 1
_LOG_NUDGE = 1e-11
_FLOAT32_EXACT = (tf.float16, tf.bfloat16, tf.float32)
# Edges padded with 0 below and +inf above: bin j is right iff PADDED[j] <= a < PADDED[j + 1].
_PADDED_EDGES = np.concatenate([[0.0], fmt.LOG_EDGES, [np.inf]])


def summary_chunks(items):
    """Returns the chunks in which `group_summary` summarises `items`.

    Args:
      items: a list of `(tensor, divisor)`; divisor is None or a float64 scalar.

    Returns:
      A list of `(indices into items, divisor)`: tensors of one number of
      elements, dtype and divisor, at most `_CHUNK_VALUES` values per chunk
      (or one tensor). A tensor whose size is not known at trace time is a
      chunk by itself.
    """
    groups = {}
    for i, (t, divisor) in enumerate(items):
        size = t.shape.num_elements()
        key = (size, t.dtype, id(divisor)) if size is not None else ("dynamic", i)
        groups.setdefault(key, []).append(i)
    chunks = []
    for key, indices in groups.items():
        rows = max(1, _CHUNK_VALUES // max(key[0], 1)) if key[0] != "dynamic" else 1
        for begin in range(0, len(indices), rows):
            part = indices[begin : begin + rows]
            chunks.append((part, items[part[0]][1]))
    return chunks


def group_summary(tensors, divisor=None, buckets=fmt.HISTOGRAM_BUCKETS):
    """Returns `(histograms [R, k, 3], stats [R, STATS_LENGTH])` of R tensors, on device.

    Row r is `format.linear_histogram` and `format.stats_vector` of
    `tensors[r]`: histogram edges, counts and bins exactly, mean, std and sum
    to float64 rounding (the order of additions differs from numpy's).

    Args:
      tensors: floating-point tensors with the same number of elements and
        dtype (float16 and bfloat16 widen exactly).
      divisor: None, or a float64 scalar that the widened values are divided
        by first (the loss scale; a power of two divides exactly).
      buckets: the number of linear histogram buckets.
    """
    x = tf.concat([tf.reshape(t, [1, -1]) for t in tensors], 0) if len(tensors) > 1 else tf.reshape(tensors[0], [1, -1])
    if divisor is None and x.dtype in _FLOAT32_EXACT:
        exact = tf.cast(x, tf.float32)  # min, max and comparisons are cheaper in float32
        v = tf.cast(exact, tf.float64)
        float32_values = True
    else:
        v = tf.cast(x, tf.float64)
        if divisor is not None:
            v = _divide(v, divisor)
        exact, float32_values = v, False
    rows = len(tensors)
    count = tf.cast(tf.shape(v)[1], tf.int64)
    zeros = tf.math.count_nonzero(tf.equal(exact, 0), axis=1)
    total = tf.reduce_sum(v, axis=1)
    # Any NaN or Inf makes its row's sum non-finite (and finite values cannot
    # overflow a float64 sum from float32 data; if they did, the masked branch
    # below is still right). The usual case needs no masks.
    all_finite = tf.reduce_all(tf.math.is_finite(total))

    def statistics(masked):
        return lambda: _row_statistics(v, exact, total, count, zeros, rows, buckets, masked, float32_values)

    nonfinite, low, high, total, squares, linear, magnitude = tf.cond(all_finite, statistics(False), statistics(True))
    nans, pos_inf, neg_inf = tf.unstack(nonfinite, axis=1)
    n = tf.cast(count, tf.float64) - nans - pos_inf - neg_inf
    has_values = n > 0
    nan = tf.constant(np.nan, tf.float64)
    n_or_one = tf.maximum(n, 1.0)
    head = tf.stack(
        [
            tf.fill([rows], tf.cast(count, tf.float64)),
            tf.cast(zeros, tf.float64),
            nans,
            pos_inf,
            neg_inf,
            tf.where(has_values, low, nan),
            tf.where(has_values, high, nan),
            tf.where(has_values, total / n_or_one, nan),
            tf.where(has_values, tf.sqrt(squares / n_or_one), nan),
            tf.where(has_values, total, nan),
        ],
        axis=1,
    )
    stats = tf.concat([head, magnitude], 1)
    return _assemble_histograms(low, high, n, linear, buckets), stats


def _row_statistics(v, exact, total, count, zeros, rows, buckets, masked, float32_values):
    """The passes over the values of a `[rows, n]` group.

    `masked=False` assumes every value is finite; `masked=True` leaves NaN and
    ±Inf out of the extrema, the sums and both histograms.
    """
    float_count = tf.cast(count, tf.float64)
    if masked:
        finite = tf.math.is_finite(exact)
        nonfinite = tf.stack(
            [
                tf.math.count_nonzero(tf.math.is_nan(exact), axis=1),
                tf.math.count_nonzero(tf.equal(exact, np.inf), axis=1),
                tf.math.count_nonzero(tf.equal(exact, -np.inf), axis=1),
            ],
            axis=1,
        )
        nonfinite = tf.cast(nonfinite, tf.float64)
        dropped = tf.reduce_sum(nonfinite, axis=1)
        low = tf.reduce_min(tf.where(finite, exact, np.inf), axis=1)
        high = tf.reduce_max(tf.where(finite, exact, -np.inf), axis=1)
        v_or_zero = tf.where(finite, v, 0.0)
        total = tf.reduce_sum(v_or_zero, axis=1)
    else:
        nonfinite = tf.zeros([rows, 3], tf.float64)
        dropped = tf.zeros([rows], tf.float64)
        low, high = tf.reduce_min(exact, axis=1), tf.reduce_max(exact, axis=1)
        v_or_zero = v
    low, high = tf.cast(low, tf.float64), tf.cast(high, tf.float64)
    n = float_count - dropped
    has_values = n > 0
    mean = total / tf.maximum(n, 1.0)
    squares = tf.math.squared_difference(v, mean[:, None])
    if masked:
        squares = tf.where(finite, squares, 0.0)
    squares = tf.reduce_sum(squares, axis=1)

    # Linear buckets, as format.linear_histogram: floor((x - low) / width),
    # where x == high may give `buckets` (folded into the last bucket below).
    # Values are >= low, so the cast's truncation is the floor. A row whose
    # values are all equal (or absent) gets start = low (or 0) and width 1,
    # so every value lands in bucket 0 and no index leaves the row's range.
    spread = tf.logical_and(has_values, high - low > 0)
    width = tf.where(spread, _divide(high - low, tf.constant(buckets, tf.float64)), 1.0)
    start = tf.where(has_values, low, 0.0)
    shifted = (tf.where(finite, v, start[:, None]) if masked else v) - start[:, None]
    index = tf.cast(shifted / width[:, None], tf.int32)
    linear = _row_counts(index, buckets + 1, rows)
    linear = tf.concat([linear[:, : buckets - 1], tf.reduce_sum(linear[:, buckets - 1 :], axis=1, keepdims=True)], 1)
    if masked:  # the non-finite values were counted in bucket 0
        linear = linear - tf.pad(dropped[:, None], [[0, 0], [0, buckets - 1]])

    # Magnitude bins: negative values' bins 0..37, then positive values' 38..75.
    # Zeros (and masked non-finite values) land in negative bin 0 and are taken out.
    magnitude_abs = tf.abs(v_or_zero)
    if float32_values:
        estimate = tf.math.log(magnitude_abs) * _LOG_PER_LN + (_LOG_OFFSET + _LOG_NUDGE)
        bins = tf.floor(tf.clip_by_value(estimate, 0.0, fmt.MAGNITUDE_BINS - 1.0))
        bins = tf.cast(bins, tf.int32)
    else:
        bins = _magnitude_bins(magnitude_abs)
    bins = bins + tf.cast(v_or_zero > 0, tf.int32) * fmt.MAGNITUDE_BINS
    magnitude = _row_counts(bins, 2 * fmt.MAGNITUDE_BINS, rows)
    misplaced = tf.cast(zeros, tf.float64) + dropped
    magnitude = magnitude - tf.pad(misplaced[:, None], [[0, 0], [0, 2 * fmt.MAGNITUDE_BINS - 1]])
    return nonfinite, low, high, total, squares, linear, magnitude


def _row_counts(index, length, rows):
    """Per-row counts of `index` (`[rows, n]`, values in `[0, length)`): `[rows, length]` float64."""
    if rows > 1:
        index = index + tf.range(0, rows * length, length, dtype=tf.int32)[:, None]
    counts = tf.math.bincount(tf.reshape(index, [-1]), minlength=rows * length, maxlength=rows * length, dtype=tf.float64)
    return tf.reshape(counts, [rows, length])


def _magnitude_bins(a):
    """`searchsorted(LOG_EDGES, a, side="right")` for any finite float64 `a >= 0`, exactly.

    The float32 log estimate can be one bin off next to an edge; one
    comparison each way against the exact float64 edges corrects it.
    """
    padded = tf.constant(_PADDED_EDGES, tf.float64)
    last = len(fmt.LOG_EDGES)
    estimate = tf.floor(tf.math.log(tf.cast(a, tf.float32)) * np.float32(_LOG_PER_LN)) + _LOG_OFFSET
    j = tf.cast(tf.clip_by_value(estimate, 0, last), tf.int32)
    j = j - tf.cast(a < tf.gather(padded, j), tf.int32) + tf.cast(a >= tf.gather(padded, j + 1), tf.int32)
    return tf.minimum(j, last)


def _assemble_histograms(low, high, n, counts, buckets):
    """`[R, k, 3]` TensorBoard histograms from each row's extrema and bucket counts."""
    has_values = n > 0
    spread = tf.logical_and(has_values, high - low > 0)
    width = tf.where(spread, _divide(high - low, tf.constant(buckets, tf.float64)), 1.0)
    start = tf.where(spread, low, 0.0)
    edges = start[:, None] + width[:, None] * tf.range(buckets + 1, dtype=tf.float64)
    edges = tf.concat([edges[:, :-1], tf.where(spread, high, 0.0)[:, None]], 1)
    spread_histogram = tf.stack([edges[:, :-1], edges[:, 1:], counts], axis=2)
    # All values equal: every row [x, x, 0] but the first, which counts them.
    low_rows = tf.tile(tf.where(has_values, low, 0.0)[:, None], [1, buckets])
    first = tf.pad(n[:, None], [[0, 0], [0, buckets - 1]])
    single = tf.stack([low_rows, low_rows, first], axis=2)
    choice = tf.where(spread, 2, tf.where(has_values, 1, 0))[:, None, None]
    empty = tf.zeros_like(single)
    return tf.where(choice == 2, spread_histogram, tf.where(choice == 1, single, empty))


def tensor_summary(t, buckets=fmt.HISTOGRAM_BUCKETS, divisor=None):
    """Returns `[histogram [k, 3], stats [STATS_LENGTH]]` of one tensor, on device.

    `group_summary` of a group of one; see there.
    """
    histograms, stats = group_summary([t], divisor=divisor, buckets=buckets)
    return [histograms[0], stats[0]]


def _divide(x, y):
    """`x / y`, correctly rounded even when `y` is a constant.

    In a tf.function, Grappler rewrites division by a constant into
    multiplication by its reciprocal, which can differ in the last bit
    (span / 30 did), so bucket edges would not be `format.linear_histogram`'s.
    DivNoNan is not rewritten; `y` is never zero here.
    """
    return tf.math.divide_no_nan(x, y)


def routing_summary(original_call, inputs, input_gradient, output_gradient, pooling, divisor=None):
    """Returns the routing record (`format.ROUTING_FIELDS`) of a pooling layer.

    Routing is the gradient of `sum(pool(x))`: for each input position, how
    many windows send their gradient to it (TensorFlow's MaxPoolGrad picks the
    first maximum of a tied window). It depends on where the maxima are, not
    on the upstream values. The gradient sums are divided by `divisor` (the
    loss scale) when it is given, as in `tensor_summary`.
    """

    def gradient(t):
        t = tf.cast(t, tf.float64)
        return t if divisor is None else _divide(t, divisor)

    with tf.GradientTape() as tape:
        tape.watch(inputs)
        pooled = original_call(inputs)
    routes = tape.gradient(pooled, inputs)
    if pooling["type"] == "max":
        tied = _tied_windows(inputs, pooling)
    else:
        tied = tf.constant(np.nan, tf.float64)
    return tf.stack(
        [
            tf.cast(tf.size(inputs), tf.float64),
            tf.cast(tf.math.count_nonzero(routes > 0), tf.float64),
            tf.cast(tf.size(pooled), tf.float64),
            tf.cast(tied, tf.float64),
            tf.reduce_sum(gradient(input_gradient)),
            tf.reduce_sum(gradient(output_gradient)),
            tf.reduce_sum(tf.abs(gradient(output_gradient))),
        ]
    )


def _channels_last(x, data_format):
    if data_format != "channels_first":
        return x
    rank = x.shape.rank
    return tf.transpose(x, [0, *range(2, rank), 1])


def _tied_windows(inputs, pooling):
    """Number of windows whose maximum occurs at more than one position."""
    # Widening float16/bfloat16 is exact, so ties stay ties.
    x = inputs if inputs.dtype in (tf.float32, tf.float64) else tf.cast(inputs, tf.float32)
    x = _channels_last(x, pooling["data_format"])
    spatial = list(range(1, x.shape.rank - 1))
    if pooling["global"]:
        peak = tf.reduce_max(x, axis=spatial, keepdims=True)
        occurrences = tf.reduce_sum(tf.cast(tf.equal(x, peak), tf.int32), axis=spatial)
        return tf.math.count_nonzero(occurrences > 1)
    if pooling["pool_size"] is None or pooling["strides"] is None:
        return tf.constant(np.nan, tf.float64)  # adaptive pooling: windows vary
    sizes, strides = pooling["pool_size"], pooling["strides"]
    if pooling["padding"] == "same":
        paddings = [[0, 0]]
        for axis, k, s in zip(spatial, sizes, strides):
            n = x.shape[axis]
            out = -(-n // s)
            total = max((out - 1) * s + k - n, 0)
            paddings.append([total // 2, total - total // 2])
        paddings.append([0, 0])
        # Padding never wins a max in TensorFlow's SAME max pooling.
        x = tf.pad(x, paddings, constant_values=-np.inf)
    counts = [(x.shape[a] - k) // s + 1 for a, k, s in zip(spatial, sizes, strides)]
    shifted = []
    for offset in itertools.product(*(range(k) for k in sizes)):
        begin = [0, *offset, 0]
        end = [0, *(o + s * (c - 1) + 1 for o, s, c in zip(offset, strides, counts)), 0]
        shifted.append(
            tf.strided_slice(x, begin, end, [1, *strides, 1], begin_mask=1 | (1 << (len(spatial) + 1)), end_mask=1 | (1 << (len(spatial) + 1)))
        )
    peak = shifted[0]
    for s in shifted[1:]:
        peak = tf.maximum(peak, s)
    occurrences = tf.add_n([tf.cast(tf.equal(s, peak), tf.int32) for s in shifted])
    return tf.math.count_nonzero(occurrences > 1)


def warn_skipped(paths):
    if paths:
        warnings.warn(
            f"tb_gradviz: these chosen layers were not called while computing the "
            f"model's output on the probe batch, so nothing is logged for them: {', '.join(paths)}",
            stacklevel=3,
        )
