"""The probe pass on Keras' TensorFlow backend: one `tf.function`, traced once.

It runs the model forward on the probe batch, takes the loss, and
backpropagates with a `tf.GradientTape` to the input and output of every
chosen layer (see `tb_gradviz.capture.probe` for how they are caught). Where the
statistics are computed depends on where the model runs (`default_statistics`):
on a CPU the function returns the tensors and `kernels` summarises each in two
fused passes; on an accelerator `tf_statistics.compiled` summarises them
on the device and only bucket counts and scalars leave it.
"""

import functools

import keras
import numpy as np
import tensorflow as tf

from tb_gradviz.capture import assemble, device_statistics, probe
from tb_gradviz.capture.backends import tf_statistics
from tb_gradviz.format import records


def default_statistics():
    """Returns `"host"` when TensorFlow sees no accelerator, else `"device"`.

    On a CPU the host is the device: the tensors leave the function without a
    copy and the fused `kernels` summarise them faster than TensorFlow's
    one-pass-per-op CPU kernels (bench/RESULTS.md). An accelerator summarises
    its own tensors rather than send every value over the bus.
    """
    accelerators = [d for d in tf.config.list_logical_devices() if d.device_type != "CPU"]
    # Without numba the host statistics fall back to the numpy definition.
    return "device" if accelerators else "host"


def _is_float(t):
    return tf.is_tensor(t) and t.dtype.is_floating


def _identity_wraps(path):
    return tf.identity, None


class LayerCapture(probe.ProbePass):
    """One compiled forward+backward pass that measures the chosen layers.

    Args: as `probe.new_capture`. `statistics="device"` summarises with
    XLA inside the function (`tf_statistics.compiled`),
    `"host"` returns the tensors to `kernels`; both give the same records.

    Call `run(x, y, sample_weight)` to get the records of one log event.
    """

    def __init__(self, model, chosen, loss=None, training=True, statistics=None):
        super().__init__(model, chosen, loss, training, statistics, default_statistics)
        self._collective_ops = None
        # A partial, not the bound method: TensorFlow's retracing warning counts the traces of
        # every function built from the same code together, so the one trace of each capture,
        # over runs trained one after another in a process, reads as retracing; a partial is
        # counted by itself.
        self._probe = tf.function(functools.partial(self._probe_fn), autograph=False)

    def run(self, x, y, sample_weight=None):
        """Runs the pass; returns `(step_records, skipped_paths)`.

        `step_records` is a list of `(tag, array, summary_metadata)` ready
        for `events.EventLog.write`.
        """
        # Always in the model's strategy scope, whether or not `fit` was
        # called inside it: Keras divides losses by the number of replicas
        # only in scope, and one trace must serve every call.
        with self.model.distribute_strategy.scope():
            outputs = self._probe(x, y, sample_weight)
        outputs = tf.nest.map_structure(np.asarray, outputs)  # on a CPU, no copy
        slices = outputs["maps"]
        maps = [assemble.host_map(slices[i : i + 3]) for i in range(0, len(slices), 3)]
        if self.statistics == "host":
            values = outputs["values"]
            self.host_weights = assemble.host_weights(
                self.plans, [values[item] for item in self._items]
            )
            scale = float(outputs["scale"]) if "scale" in outputs else None
            summaries = assemble.host_summaries(
                [
                    (v, scale if divided else None)
                    for v, divided in zip(values, self._divided_items)
                ],
                self.block_formats,
            )
        else:
            rows = device_statistics.tensor_rows(
                self._groups, outputs["statistics"], self._item_sizes
            )
            summaries = [assemble.summary_of_row(row) for row in rows]
        return assemble.step_records(
            self.plans,
            [summaries[item] for item in self._items],
            outputs["routings"],
            self._skipped,
            outputs["units"],
            maps,
            self.map_settings,
        )

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
            loss = self.model.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=self.training
            )
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
        with (
            probe.recording_calls(self.chosen, _is_float, _identity_wraps) as recordings,
            tf.GradientTape() as tape,
        ):
            for t in keras.tree.flatten(x):
                if _is_float(t):
                    tape.watch(t)
            y_pred = self.model(x, training=self.training)
            loss = self._compute_loss(x, y, y_pred, sample_weight)
            if scale is not None:
                # Backpropagate what train_step backpropagates, so float16
                # gradients underflow (or overflow) exactly as in training.
                loss = loss * tf.cast(scale, loss.dtype)

        called = [(c, recordings[c.path]) for c in self.chosen if recordings[c.path].outputs]
        self._skipped = [c.path for c in self.chosen if not recordings[c.path].outputs]
        sources = [t for _, rec in called for t in rec.inputs + rec.outputs]
        # The weights' gradients come from the same backward pass, after the tensors'.
        variables = [_read_variable(v) for c, _ in called for _, v in self.weights_of(c.path)]
        sole_inputs = _sole_inputs_of_outputs(rec for _, rec in called)
        gradients = tape.gradient(
            loss, sources + variables, unconnected_gradients=tf.UnconnectedGradients.ZERO
        )
        # An embedding's kernel gets tf.IndexedSlices (its looked-up rows): made dense, as the
        # weight's values are.
        weight_gradients = iter([tf.convert_to_tensor(g) for g in gradients[len(sources) :]])
        accelerators = [d for d in tf.config.list_logical_devices() if d.device_type != "CPU"]
        device = accelerators[0].device_type.lower() if accelerators else "cpu"

        routings, units, maps, summarised, self.plans = [], [], [], [], []
        # Which summarised item each plan tensor reads: its own, or, for the
        # input gradient that is the same values as another layer's output
        # gradient, that one's (resolved once every item is known).
        item_of_tensor, same_as_output = [], {}
        item_of_output_gradient, item_of_graph_tensor = {}, {}
        g = iter(gradients)
        for c, rec in called:
            input_grads = [next(g) for _ in rec.inputs]
            output_grads = [next(g) for _ in rec.outputs]
            weights = self.weights_of(c.path)
            plan = probe.layer_plan(
                c,
                rec,
                lambda t: (t.shape.as_list(), t.dtype.name),
                scale is not None,
                device=device,
                map_settings=self.map_settings,
                weights=weights,
            )
            values = [_read_variable(v).read_value() for _, v in weights]
            tensors = (
                rec.outputs
                + input_grads
                + output_grads
                + values
                + [next(weight_gradients) for _ in weights]
            )
            forward = rec.outputs + rec.inputs + rec.outputs + [None] * (2 * len(weights))
            for t, forward_t, tensor_plan in zip(tensors, forward, plan.tensors):
                divisor = scale if tensor_plan.role in records.GRADIENT_ROLES else None
                producer = (
                    sole_inputs.get(id(forward_t))
                    if tensor_plan.role == records.INPUT_GRADIENT
                    else None
                )
                if producer is not None:
                    same_as_output[len(item_of_tensor)] = producer
                    item_of_tensor.append(None)
                    continue
                # One graph tensor is summarised once: backprop hands the
                # same gradient tensor to both inputs of an Add, say.
                item = item_of_graph_tensor.setdefault(t.ref(), len(summarised))
                if item == len(summarised):
                    summarised.append((t, divisor))
                if tensor_plan.role == records.OUTPUT_GRADIENT:
                    item_of_output_gradient[id(forward_t)] = item
                item_of_tensor.append(item)
            if plan.has_routing:
                routings.append(
                    routing_summary(
                        c.layer.call,
                        rec.inputs[0],
                        input_grads[0],
                        output_grads[0],
                        plan.pooling,
                        divisor=scale,
                    )
                )
            if plan.units_axis is not None:
                units.append(probe.dead_channels(plan, rec.outputs))
            if plan.map_cut is not None:
                x, gi, go = probe.map_slices(
                    plan, rec.inputs, input_grads, output_grads, self.map_settings.example
                )
                if scale is not None:  # unscaled here: the host sees only these slices
                    gi, go = (tf.cast(g, tf.float32) / tf.cast(scale, tf.float32) for g in (gi, go))
                maps += [x, gi, go]
            self.plans.append(plan)

        for position, producer in same_as_output.items():
            item_of_tensor[position] = item_of_output_gradient[id(producer)]

        self._items = item_of_tensor  # plan tensor k is summarised item self._items[k]
        outputs = {"routings": routings, "units": units, "maps": maps}
        if self.statistics == "host":
            # The values themselves, float16 and bfloat16 widened (exactly)
            # to what the kernel takes, then the loss scale if any divides.
            outputs["values"] = [
                t if t.dtype in (tf.float32, tf.float64) else tf.cast(t, tf.float32)
                for t, _ in summarised
            ]
            self._divided_items = [divisor is not None for _, divisor in summarised]
            if any(self._divided_items):
                outputs["scale"] = scale
        else:
            # All tensors' statistics in one XLA-compiled call (`device_statistics`).
            tensors = [t for t, _ in summarised]
            scaled = [divisor is not None for _, divisor in summarised]
            self._item_sizes = [t.shape.num_elements() for t in tensors]
            widths = [device_statistics.last_axis(t.shape.as_list()) for t in tensors]
            keys = [
                (n, t.dtype, s, w) for n, t, s, w in zip(self._item_sizes, tensors, scaled, widths)
            ]
            self._groups = device_statistics.chunks(keys)
            divisor = tf.constant(1.0, tf.float64) if scale is None else scale
            mode = device_statistics.mode_for(device)
            statistics = tf_statistics.compiled(
                self._groups, scaled, mode, widths if self.block_formats else None
            )
            outputs["statistics"] = statistics(tensors, divisor)

        # Written after every read above: automatic control dependencies keep
        # program order for ops on the same variable.
        with tf.control_dependencies(tf.nest.flatten(outputs)):
            for v, value in zip(state, saved):
                v.assign(value)
        return tf.nest.map_structure(tf.identity, outputs)


def _read_variable(variable):
    """The `tf.Variable` the pass reads for a Keras variable: under a strategy, the copy it reads.

    In cross-replica context a `MirroredVariable` is read from the copy on
    the current device, or the primary one (the one `GradientTape` then
    watches); its own handle exists only inside a replica context.
    """
    value = variable.value
    local = getattr(value, "_get_on_device_or_primary", None)
    return value if local is None else local()


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


def routing_summary(original_call, inputs, input_gradient, output_gradient, pooling, divisor=None):
    """Returns the routing record (`records.ROUTING_FIELDS`) of a pooling layer.

    Routing is the gradient of `sum(pool(x))`: for each input position, how
    many windows send their gradient to it (TensorFlow's MaxPoolGrad picks the
    first maximum of a tied window). It depends on where the maxima are, not
    on the upstream values. The gradient sums are divided by `divisor` (the
    loss scale) when it is given, as the statistics are.
    """

    def gradient(t):
        t = tf.cast(t, tf.float64)
        return t if divisor is None else tf_statistics.divide(t, divisor)

    with tf.GradientTape() as tape:
        tape.watch(inputs)
        pooled = original_call(inputs)
    routes = tape.gradient(pooled, inputs)
    if pooling["type"] == "max":
        tied = probe.tied_windows(inputs, pooling)
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
