"""Activations and gradients of chosen layers, in one compiled pass.

`LayerCapture` traces, once, a `tf.function` that runs the model forward on
the probe batch, takes the loss, and backpropagates to the input and output of
every chosen layer, wherever it sits (Sequential, Functional, subclassed or
nested models). Histograms and statistics are computed on device; only bucket
counts and scalars leave the function. The records follow `format`.

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

    Call `run(x, y, sample_weight)` to get the records of one log event.
    """

    def __init__(self, model, chosen, loss=None, training=True):
        self.model = model
        self.chosen = list(chosen)
        self.training = bool(training)
        self._loss = None if loss is None else as_loss(loss)
        self.plans = None
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
        outputs = [np.asarray(t) for t in outputs]  # counts and scalars only
        return self._records(outputs)

    def collective_ops(self, x, y, sample_weight=None):
        """Returns the sorted op types of the pass that communicate across workers.

        Traces the pass if it is not traced yet (the trace is kept, so `run`
        does not trace again). Empty when the pass runs on this worker alone.
        """
        with self.model.distribute_strategy.scope():
            graph = self._probe.get_concrete_function(x, y, sample_weight).graph
        types = {op.type for op in graph.get_operations()}
        for function in graph.as_graph_def().library.function:
            types.update(node.op for node in function.node_def)
        return sorted(t for t in types if t.startswith(("Collective", "Nccl")))

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
        gradients = tape.gradient(loss, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)

        outputs, self.plans = [], []
        g = iter(gradients)
        for c, rec in plans:
            input_grads = [next(g) for _ in rec.inputs]
            output_grads = [next(g) for _ in rec.outputs]
            plan = LayerPlan(c, [], pooling_description(c.layer))
            groups = (
                (fmt.ACTIVATION, rec.outputs),
                (fmt.INPUT_GRADIENT, input_grads),
                (fmt.OUTPUT_GRADIENT, output_grads),
            )
            for role, tensors in groups:
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
                    outputs.extend(tensor_summary(t, divisor=divisor))
            if plan.pooling is not None and len(rec.inputs) == 1 and len(rec.outputs) == 1:
                plan.has_routing = True
                outputs.append(
                    routing_summary(
                        rec.original_call, rec.inputs[0], input_grads[0], output_grads[0], plan.pooling, divisor=scale
                    )
                )
            self.plans.append(plan)
        self._skipped = [c.path for c in self.chosen if not recordings[c.path].outputs]

        # Written after every read above: automatic control dependencies keep
        # program order for ops on the same variable.
        with tf.control_dependencies(outputs):
            for v, value in zip(state, saved):
                v.assign(value)
        return [tf.identity(t) for t in outputs]

    def _records(self, outputs):
        records = []
        it = iter(outputs)
        for plan in self.plans:
            layer_content = plan.content
            for t in plan.tensors:
                histogram, stats = next(it), next(it)
                content = dict(layer_content, role=t.role, index=t.index, shape=t.shape, dtype=t.dtype)
                if t.role != fmt.ACTIVATION:
                    content["loss_scaled"] = t.loss_scaled
                records += fmt.tensor_records(plan.chosen.path, t.name, histogram, stats, content)
            if plan.has_routing:
                records += fmt.routing_records(plan.chosen.path, next(it), layer_content)
        return records, list(self._skipped)


def tensor_summary(t, buckets=fmt.HISTOGRAM_BUCKETS, divisor=None):
    """Returns `[histogram [k, 3], stats [STATS_LENGTH]]` of a tensor, on device.

    The same computation as `format.linear_histogram` and `format.stats_vector`,
    in float64, so counts agree exactly with the numpy definition.

    Args:
      t: a floating-point tensor (float16 and bfloat16 widen exactly).
      buckets: the number of linear histogram buckets.
      divisor: None, or a float64 scalar that the widened values are divided
        by first (the loss scale; a power of two divides exactly).
    """
    v = tf.reshape(tf.cast(t, tf.float64), [-1])
    if divisor is not None:
        v = _divide(v, divisor)
    count = tf.size(v, out_type=tf.int64)
    zeros = tf.math.count_nonzero(tf.equal(v, 0.0))
    nans = tf.math.count_nonzero(tf.math.is_nan(v))
    pos_inf = tf.math.count_nonzero(tf.equal(v, np.inf))
    neg_inf = tf.math.count_nonzero(tf.equal(v, -np.inf))
    finite = tf.boolean_mask(v, tf.math.is_finite(v))
    n = tf.size(finite, out_type=tf.int64)
    has_values = n > 0
    nan = tf.constant(np.nan, tf.float64)
    low = tf.where(has_values, tf.reduce_min(finite), nan)
    high = tf.where(has_values, tf.reduce_max(finite), nan)
    total = tf.reduce_sum(finite)
    mean = tf.where(has_values, total / tf.cast(tf.maximum(n, 1), tf.float64), nan)
    std = tf.where(has_values, tf.sqrt(tf.reduce_mean(tf.square(finite - mean))), nan)
    total = tf.where(has_values, total, nan)
    head = tf.stack(
        [tf.cast(count, tf.float64), *(tf.cast(c, tf.float64) for c in (zeros, nans, pos_inf, neg_inf)), low, high, mean, std, total]
    )

    nonzero = tf.boolean_mask(finite, tf.not_equal(finite, 0.0))
    bins = tf.searchsorted(tf.constant(fmt.LOG_EDGES, tf.float64), tf.abs(nonzero), side="right")
    negative = _bincount(tf.boolean_mask(bins, nonzero < 0), fmt.MAGNITUDE_BINS)
    positive = _bincount(tf.boolean_mask(bins, nonzero > 0), fmt.MAGNITUDE_BINS)
    stats = tf.concat([head, negative, positive], 0)
    return [_linear_histogram(finite, low, high, n, buckets), stats]


def _divide(x, y):
    """`x / y`, correctly rounded even when `y` is a constant.

    In a tf.function, Grappler rewrites division by a constant into
    multiplication by its reciprocal, which can differ in the last bit
    (span / 30 did), so bucket edges would not be `format.linear_histogram`'s.
    DivNoNan is not rewritten; `y` is never zero here.
    """
    return tf.math.divide_no_nan(x, y)


def _bincount(indices, length):
    return tf.math.bincount(tf.cast(indices, tf.int32), minlength=length, maxlength=length, dtype=tf.float64)


def _linear_histogram(finite, low, high, n, buckets):
    span = high - low
    spread = tf.logical_and(n > 0, span > 0)
    width = tf.where(spread, _divide(span, tf.constant(buckets, tf.float64)), 1.0)
    index = tf.cast(tf.floor((finite - tf.where(spread, low, 0.0)) / width), tf.int64)
    index = tf.clip_by_value(index, 0, buckets - 1)
    counts = _bincount(index, buckets)
    edges = tf.where(spread, low, 0.0) + width * tf.range(buckets + 1, dtype=tf.float64)
    edges = tf.concat([edges[:-1], tf.reshape(tf.where(spread, high, 0.0), [1])], 0)
    spread_histogram = tf.stack([edges[:-1], edges[1:], counts], axis=1)
    # All values equal: every row [x, x, 0] but the first, which counts them.
    single = tf.stack(
        [
            tf.fill([buckets], low),
            tf.fill([buckets], low),
            tf.concat([tf.reshape(tf.cast(n, tf.float64), [1]), tf.zeros([buckets - 1], tf.float64)], 0),
        ],
        axis=1,
    )
    empty = tf.zeros([buckets, 3], tf.float64)
    return tf.where(spread, spread_histogram, tf.where(n > 0, single, empty))


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
