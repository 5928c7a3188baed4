"""The in-step digest on Keras' TensorFlow backend (`capture.in_step`).

`TrainStep(model, chosen, plain).train_function(due)` is the model's new train
function: on a step `due()` says is logged it runs `in_step_train_step`
(Keras' own `train_step` for TensorFlow, plus the chosen layers' statistics,
compiled by `Trainer._make_function` as Keras compiles its own: the same
`jit_compile`, `steps_per_execution` loop and strategy), otherwise `plain`,
the train function Keras made, untouched.

The chosen layers' tensors are caught as the probe catches them
(`probe.recording_calls`): each floating input goes through `tf.identity`,
whose gradient is the gradient through this layer only, and the loss's
gradient w.r.t. each output is asked of the same tape, in the one backward
pass that gives the weight gradients. Neither changes a value: training is
the same bit for bit (tests/test_in_step.py).

Every trainable weight of the model (`weights.step_weights`) is read just
before `apply_gradients` and again after it, and the step returns each
weight's `|w_after|` and `|w_after - w_before|`: the digest's update rows,
with no copy of the weights kept past the step.
"""

import keras
import numpy as np
import tensorflow as tf
from keras.src.losses import loss as loss_module
from keras.src.trainers.data_adapters import data_adapter_utils

from tb_gradviz.capture import assemble, in_step, in_step_fit, in_step_kernel, probe
from tb_gradviz.capture.backends.tensorflow import _sole_inputs_of_outputs

# The chosen layers whose tensors one call of the host kernel takes: each call from the graph
# costs about as much as the kernel's pass over a small tensor, and a gradient waits for the
# others of its call (a few layers apart in the backward pass) before it is freed.
LAYERS_PER_CALL = 8


def _is_float(t):
    return tf.is_tensor(t) and t.dtype.is_floating


class TrainStep(in_step_fit.TrainStepBase):
    """The chosen layers' in-step train step, and the train function that runs it when due
    (attributes: `in_step_fit.TrainStepBase`)."""

    def train_function(self, due):
        """The train function to put in `model.train_function` (made once, then the same).

        Args:
          due: `() -> bool`, whether the step(s) this call runs end at a logged step.
        """
        self.due = due
        if self.function is not None:
            return self.function
        in_step_function = self.model._make_function(self.in_step_train_step)
        plain = self.plain

        def function(iterator):
            if not self.due():
                return plain(iterator)
            logs, statistics = in_step_function(iterator)
            self.stash = {k: v.numpy() for k, v in statistics.items()}
            return logs

        self.function = function
        return function

    def in_step_train_step(self, data):
        """Keras' TensorFlow `train_step`, returning `(logs, statistics)`."""
        model = self.model
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:

            def watched_identity(t):
                # Watched: a layer reading the model's inputs is reached by no watched tensor.
                t = tf.identity(t)
                tape.watch(t)
                return t

            with probe.recording_calls(
                self.chosen, _is_float, lambda path: (watched_identity, None)
            ) as recordings:
                y_pred = model(x, training=True) if model._call_has_training_arg else model(x)
            loss = model._compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
            model._loss_tracker.update_state(
                loss_module.unscale_loss_for_distribution(loss),
                sample_weight=tf.shape(next(i for i in keras.tree.flatten(x) if i is not None))[0],
            )
            if model.optimizer is not None:
                loss = model.optimizer.scale_loss(loss)
        scale = probe_scale(model)
        called = [(c, recordings[c.path]) for c in self.chosen if recordings[c.path].outputs]
        self.skipped = [c.path for c in self.chosen if not recordings[c.path].outputs]
        sources = [t for _, rec in called for t in rec.inputs + rec.outputs]
        weights = list(model.trainable_weights)
        gradients = tape.gradient(loss, weights + sources)
        # The weights as the update finds them: each read keeps its values (an update writes
        # into a copy while the read holds the buffer), and is let go with the step.
        updated = [w.variable for w in self.weights] if model.optimizer is not None else []
        before = [tf.identity(v.value) for v in updated]
        if updated:
            iterations = tf.identity(model.optimizer.iterations)
        if weights:
            model.optimizer.apply_gradients(zip(gradients[: len(weights)], weights))
        source_gradients = [
            tf.zeros_like(t) if g is None else g for t, g in zip(sources, gradients[len(weights) :])
        ]
        statistics = {"rows": self._statistics(called, source_gradients, scale is not None)}
        statistics["scale"] = tf.constant(1.0) if scale is None else scale
        if model.optimizer is not None:
            statistics["step"] = tf.identity(model.optimizer.iterations)
        if updated:
            after = [tf.identity(v.value) for v in updated]
            statistics["updates"] = update_norms(after, before, self.on_host)
            statistics["applied"] = statistics["step"] - iterations
        logs = model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        return logs, statistics

    def _statistics(self, called, gradients, loss_scaled):
        sole_inputs = _sole_inputs_of_outputs(rec for _, rec in called)
        plans, items, summarised, group_of = [], [], [], []
        seen, item_of_output_gradient, same_as_output = {}, {}, {}
        g = iter(gradients)
        for c, rec in called:
            input_grads = [next(g) for _ in rec.inputs]
            output_grads = [next(g) for _ in rec.outputs]
            plan = probe.layer_plan(
                c, rec, lambda t: (t.shape.as_list(), t.dtype.name), loss_scaled
            )
            tensors = rec.outputs + input_grads + output_grads
            forward = rec.outputs + rec.inputs + rec.outputs
            for t, forward_t, tensor_plan in zip(tensors, forward, plan.tensors):
                producer = None
                if tensor_plan.role == "input_gradient":
                    producer = sole_inputs.get(id(forward_t))
                if producer is not None:
                    same_as_output[len(items)] = producer
                    items.append(None)
                    continue
                item = seen.setdefault(t.ref(), len(summarised))
                if item == len(summarised):
                    axis = plan.units_axis if tensor_plan.role == "activation" else None
                    summarised.append((t, axis if forward_t is rec.outputs[0] else None))
                    group_of.append(len(plans) // LAYERS_PER_CALL)
                if tensor_plan.role == "output_gradient":
                    item_of_output_gradient[id(forward_t)] = item
                items.append(item)
            plans.append(plan)
        for position, producer in same_as_output.items():
            items[position] = item_of_output_gradient[id(producer)]
        self.layout = in_step.DigestLayout(plans, items, self.weights)
        if not self.on_host:
            return tf.stack([tensor_statistics(t, axis, False) for t, axis in summarised])
        groups = {}
        for (t, axis), group in zip(summarised, group_of):
            groups.setdefault(group, []).append((t, axis))
        return tf.concat([host_statistics(group) for group in groups.values()], 0)

    @property
    def on_host(self):
        """Whether numba's kernel computes the statistics (`in_step_kernel`): on a CPU, without
        XLA, where TensorFlow's ops would read each tensor once per op."""
        if self.model.jit_compile or not assemble.numba_available():
            return False
        return all(d.device_type == "CPU" for d in tf.config.list_logical_devices())


def update_norms(after, before, on_host):
    """`[weights, 2]` float64: per weight `|w_after|` and `|w_after - w_before|` (numba's one
    pass over both on a CPU, `in_step_kernel.update_norms`; else TensorFlow's ops, in float32)."""
    if not after:
        return tf.zeros([0, 2], tf.float64)
    if on_host:
        count = len(after)

        def norms(*values):
            return in_step_kernel.update_norms(values[:count], values[count:])

        found = tf.numpy_function(norms, after + before, tf.float64, stateful=False)
        return tf.ensure_shape(found, [count, 2])
    rows = []
    for a, b in zip(after, before):
        if a.dtype in (tf.float16, tf.bfloat16):
            a, b = tf.cast(a, tf.float32), tf.cast(b, tf.float32)  # exact
        a, b = tf.reshape(a, [-1]), tf.reshape(b, [-1])
        rows.append(tf.stack([tf.norm(a), tf.norm(a - b)]))
    return tf.cast(tf.stack(rows), tf.float64)


def probe_scale(model):
    """The loss scale `train_step` multiplies the loss by, as a float32 tensor, or None."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return None
    one = tf.constant(1.0, tf.float32)
    scale = optimizer.scale_loss(one)
    return None if scale is one else tf.cast(scale, tf.float32)


def host_statistics(tensors):
    """The rows (`[len(tensors), in_step.ROW]` float64) of `(tensor, units_axis)`s, by numba's
    kernel in one call from the graph."""
    axes = [axis for _, axis in tensors]

    def rows(*values):
        return np.stack([in_step_kernel.row_along(v, axis) for v, axis in zip(values, axes)])

    found = tf.numpy_function(rows, [t for t, _ in tensors], tf.float64, stateful=False)
    return tf.ensure_shape(found, [len(tensors), in_step.ROW])


def tensor_statistics(x, units_axis, on_host):
    """One tensor's row of `in_step.ROW` float64 statistics (`in_step.DigestLayout`).

    Args:
      x: the tensor.
      units_axis: the axis whose dead channels are counted, or None.
      on_host: compute them with numba's kernel (`in_step_kernel`), one pass;
        else with TensorFlow's ops.
    """
    if on_host:
        return host_statistics([(x, units_axis)])[0]
    return _ops_statistics(x, units_axis, on_host)


def _ops_statistics(x, units_axis, bucketize):
    """`tensor_statistics` in TensorFlow's ops; the common case, every value finite, reads the
    values a few times (the sum of squares, finite only then, the magnitudes' buckets and
    maximum); a tensor holding a NaN or an Inf takes the branch that leaves them out."""
    if x.dtype in (tf.float16, tf.bfloat16):
        x = tf.cast(x, tf.float32)  # exact
    rank = len(x.shape)
    others = [a for a in range(rank) if a != units_axis]
    size = tf.cast(tf.size(x, out_type=tf.int64), tf.float64)
    sum_of_squares = tf.reduce_sum(tf.square(x))

    def dead_channels(nonzero_anywhere):
        if units_axis is None:
            return tf.constant(0.0, tf.float64)
        return _count(tf.logical_not(nonzero_anywhere))

    def finite():
        magnitudes = tf.abs(x)
        if units_axis is not None:
            channel_max = tf.reduce_max(magnitudes, axis=others)
            max_abs = tf.reduce_max(channel_max)
            dead = dead_channels(channel_max > 0)
        else:
            max_abs = tf.reduce_max(magnitudes)
            dead = dead_channels(None)
        below = _below(tf.reshape(magnitudes, [-1]), bucketize)
        squares = tf.cast(sum_of_squares, tf.float64)
        return tf.concat(
            [
                [size],
                below,
                tf.zeros([3], tf.float64),
                [squares, tf.cast(max_abs, tf.float64)],
                [dead],
            ],
            0,
        )

    def not_finite():
        nonfinite = [_count(tf.math.is_nan(x)), _count(tf.equal(x, float("inf")))]
        nonfinite.append(_count(tf.equal(x, float("-inf"))))
        zeroed = tf.where(tf.math.is_finite(x), x, tf.zeros_like(x))
        magnitudes = tf.abs(zeroed)
        max_abs = tf.cast(tf.reduce_max(magnitudes), tf.float64)
        squares = tf.reduce_sum(tf.square(tf.cast(zeroed, tf.float64)))
        below = _below(tf.reshape(magnitudes, [-1]), bucketize) - tf.add_n(nonfinite)
        dead = dead_channels(
            None if units_axis is None else tf.reduce_any(tf.not_equal(x, 0), axis=others)
        )
        return tf.concat([[size], below, tf.stack(nonfinite), [squares, max_abs], [dead]], 0)

    return tf.cond(tf.math.is_finite(sum_of_squares), finite, not_finite)


def _count(mask, axis=None):
    return tf.reduce_sum(tf.cast(mask, tf.float64), axis=axis)


def _below(magnitudes, bucketize):
    """The counts (float64) of `magnitudes` (flat, finite) below each of `in_step.THRESHOLDS`."""
    if not bucketize:
        # XLA fuses the comparisons and the sum into one pass over the values.
        thresholds = tf.constant(in_step.THRESHOLDS, magnitudes.dtype)
        return _count(magnitudes[None, :] < thresholds[:, None], axis=1)
    buckets = tf.raw_ops.Bucketize(input=magnitudes, boundaries=list(in_step.THRESHOLDS))
    size = len(in_step.THRESHOLDS) + 1
    histogram = tf.math.bincount(buckets, minlength=size, maxlength=size, dtype=tf.int64)
    return tf.cast(tf.cumsum(histogram)[:-1], tf.float64)
