"""The in-step digest on Keras' JAX backend (`capture.in_step`).

`TrainStep(model, chosen, plain).train_function(due)` is the model's new train
function: on a call `due()` says ends at a logged step it runs, for the last
step of the call, `in_step_train_step`: Keras' JAX `train_step` (the same
`compute_loss_and_updates`, `stateless_apply` and metrics update, jitted
with the state donated as Keras jits it) whose differentiated function also
takes, per chosen layer, a zero for each floating input and output, and
hands the layer `t - zero` in their place. `t - (+0.0)` is `t` bit for bit
(signed zeros included, and XLA folds it away), so the forward pass and the
weight gradients are those of Keras' step; the gradient w.r.t. each zero, in
the same backward pass, is minus the gradient w.r.t. the layer's output, or
w.r.t. its input through this layer only (the zero's difference has this
layer as its one consumer). The other steps, and every call not due, run
Keras' own train function untouched.

The step returns the chosen layers' activations and (negated back) gradients
next to the logs and the state; their statistics (`in_step.ROW` per tensor)
are computed as soon as it returns, on a CPU by numba's kernel on the host
threads (`in_step_kernel`, one pass per tensor, the arrays read in place),
on an accelerator by a second jitted program where the tensors are
(`device_rows`); no tensor is kept past its statistics.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from keras.src import backend as keras_backend
from keras.src.trainers.data_adapters import data_adapter_utils

from tb_gradviz.capture import in_step, in_step_kernel, probe, threads


def _is_float(t):
    return isinstance(t, jax.Array) and jnp.issubdtype(t.dtype, jnp.floating)


def _same(t):
    return t


class TrainStep:
    """The chosen layers' in-step train step, and the train function that runs it when due.

    Attributes: as `tf_in_step.TrainStep`'s.
    """

    def __init__(self, model, chosen, plain):
        self.model = model
        self.chosen = list(chosen)
        self.plain = plain  # the train function Keras made
        self.function = None
        self.layout = None
        self.stash = None
        self.skipped = []
        self.due = None
        self._step = None  # the in-step train step, jitted as Keras jits its own
        self._keras_step = None  # Keras' train_step, for the earlier steps of a call
        self._called = []
        self._zero_specs = []
        self._units_axes = []

    def take(self, step):
        """As `tf_in_step.TrainStep.take`."""
        stash, self.stash = self.stash, None
        if stash is None or int(stash["step"]) != step:
            return None
        return stash

    def train_function(self, due):
        """The train function to put in `model.train_function` (made once, then the same)."""
        self.due = due
        if self.function is None:
            model = self.model

            def function(state, iterator):
                # A callback reading its `model` on JAX syncs the state into the variables and
                # marks it synced, which would make fit take the state back from the variables
                # (not the one this call returns) at the next step: the mark is put back.
                synced = model._jax_state_synced
                due = self.due()
                model._jax_state_synced = synced
                if not due:
                    return self.plain(state, iterator)
                return self._logged(state, iterator)

            self.function = function
        return self.function

    def _logged(self, state, iterator):
        """Keras' steps of one call, the last one the in-step step."""
        model = self.model
        data = next(iterator)
        for _ in range(model.steps_per_execution - 1):
            try:
                following = next(iterator)
            except StopIteration:
                break
            _, state = self._keras_train_step(state, data)
            data = following
        if self._step is None:
            self._plan(state, data)
        logs, state, tensors, scale = self._step(state, data)
        rows = self._rows(tensors)
        optimizer_variables = state[2]
        iterations = next(
            v
            for ref, v in zip(model.optimizer.variables, optimizer_variables)
            if ref is model.optimizer.iterations
        )
        self.stash = {
            "rows": rows,
            "scale": float(scale) if self._scaled else 1.0,
            "step": int(iterations),
        }
        return logs, state

    def _keras_train_step(self, state, data):
        if self._keras_step is None:
            self._keras_step = self._jit(self.model.train_step)
        return self._keras_step(state, data)

    def _jit(self, step):
        """`step` compiled as Keras' `make_train_function` compiles `train_step`."""
        model = self.model
        if model.run_eagerly or not model.jit_compile:
            return step
        return jax.jit(step, donate_argnums=0)

    def _plan(self, state, data):
        """Finds which chosen layers run and their tensors' shapes; builds the step."""
        model = self.model
        trainable, non_trainable, optimizer_variables, metrics = state
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)

        def forward(trainable, non_trainable, optimizer_variables, metrics, x, y, sample_weight):
            with probe.recording_calls(
                self.chosen, _is_float, lambda path: (_same, None)
            ) as recordings:
                model.compute_loss_and_updates(
                    trainable,
                    non_trainable,
                    metrics,
                    x,
                    y,
                    sample_weight,
                    training=True,
                    optimizer_variables=optimizer_variables,
                )
            return {
                c.path: (
                    [(t.shape, t.dtype) for t in recordings[c.path].inputs],
                    [(t.shape, t.dtype) for t in recordings[c.path].outputs],
                )
                for c in self.chosen
            }

        found = []
        jax.eval_shape(
            lambda *args: found.append(forward(*args)) or 0,
            trainable,
            non_trainable,
            optimizer_variables,
            metrics,
            x,
            y,
            sample_weight,
        )
        (specs,) = found
        one = jnp.ones((), jnp.float32)
        self._scaled = model.optimizer is not None and model.optimizer.scale_loss(one) is not one
        self._called = [c for c in self.chosen if specs[c.path][1]]
        self.skipped = [c.path for c in self.chosen if not specs[c.path][1]]
        self._zero_specs = [specs[c.path][0] + specs[c.path][1] for c in self._called]
        plans = []
        for c in self._called:
            inputs, outputs = specs[c.path]
            recording = probe.Recording(inputs=list(inputs), outputs=list(outputs))
            plan = probe.layer_plan(
                c, recording, lambda s: (list(s[0]), jnp.dtype(s[1]).name), self._scaled
            )
            plans.append(plan)
            for t in plan.tensors:
                first = t.role == "activation" and t.index == 0
                self._units_axes.append(plan.units_axis if first else None)
        self.layout = in_step.DigestLayout(plans, range(len(self._units_axes)))
        self._on_host = jax.default_backend() == "cpu"
        self._step = self._jit(self.in_step_train_step)

    def in_step_train_step(self, state, data):
        """Keras' JAX `train_step`, returning `(logs, state, tensors, loss scale)`: the tensors
        in the layout's order (per layer: activations, input gradients, output gradients)."""
        model = self.model
        trainable, non_trainable, optimizer_variables, metrics = state
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        zeros = [[jnp.zeros(shape, dtype) for shape, dtype in specs] for specs in self._zero_specs]

        def loss_and_updates(trainable, zeros):
            by_path = {c.path: iter(z) for c, z in zip(self._called, zeros)}

            def wraps(path):
                # The layer's inputs are wrapped first, then its outputs: its zeros' order.
                def minus_zero(t):
                    return t - next(by_path[path])

                return minus_zero, minus_zero

            with probe.recording_calls(self._called, _is_float, wraps) as recordings:
                loss, aux = model.compute_loss_and_updates(
                    trainable,
                    non_trainable,
                    metrics,
                    x,
                    y,
                    sample_weight,
                    training=True,
                    optimizer_variables=optimizer_variables,
                )
            return loss, (aux, [recordings[c.path].outputs for c in self._called])

        grad_fn = jax.value_and_grad(loss_and_updates, argnums=(0, 1), has_aux=True)
        (_, (aux, activations)), (grads, zero_grads) = grad_fn(trainable, zeros)
        unscaled_loss, y_pred, non_trainable, metrics = aux
        scale = jnp.ones((), jnp.float32)
        if self._scaled:
            mapping = list(zip(model.optimizer.variables, optimizer_variables))
            with keras_backend.StatelessScope(state_mapping=mapping):
                scale = jnp.asarray(model.optimizer.scale_loss(scale), jnp.float32)
        trainable, optimizer_variables = model.optimizer.stateless_apply(
            optimizer_variables, grads, trainable
        )
        logs, metrics = model._update_metrics_variables(
            metrics, unscaled_loss, x, y, y_pred, sample_weight
        )
        tensors = []
        for layer_activations, specs, grads_of_zeros in zip(
            activations, self._zero_specs, zero_grads
        ):
            inputs = len(specs) - len(layer_activations)
            # d(t - zero)/d(zero) is -1: the gradients negated back, exactly.
            gradients = [-g for g in grads_of_zeros]
            tensors += [*layer_activations, *gradients[:inputs], *gradients[inputs:]]
        return logs, (trainable, non_trainable, optimizer_variables, metrics), tensors, scale

    def _rows(self, tensors):
        """`[tensors, in_step.ROW]` float64: each tensor's statistics, where it is."""
        if not tensors:
            return np.zeros((0, in_step.ROW))
        if self._on_host:
            items = [(np.asarray(t), axis) for t, axis in zip(tensors, self._units_axes)]
            return np.stack(threads.in_threads(in_step_kernel.row_along, items))
        return device_rows(tensors, self._units_axes)


def device_rows(tensors, units_axes):
    """`[tensors, in_step.ROW]` float64 rows computed by one jitted program where the tensors
    are (`in_step.ROW`'s fields, as `in_step_kernel.row_along` computes them)."""
    with jax.enable_x64(True):  # float64 sums of squares, as the kernel's
        rows = _device_rows(list(tensors), tuple(units_axes))
        return np.asarray(jax.device_get(rows), np.float64)


@functools.partial(jax.jit, static_argnums=1)
def _device_rows(tensors, units_axes):
    return jnp.stack([_device_row(t, axis) for t, axis in zip(tensors, units_axes)])


def _device_row(x, units_axis):
    x = x.astype(jnp.float32)  # float16 and bfloat16 exactly, float64 rounded: the kernel's
    finite = jnp.isfinite(x)
    magnitudes = jnp.where(finite, jnp.abs(x), jnp.inf)

    def count(mask, axis=None):
        return jnp.sum(mask, axis=axis, dtype=jnp.int64).astype(jnp.float64)

    below = [count(magnitudes < t) for t in in_step.THRESHOLDS]
    nonfinite = [count(jnp.isnan(x)), count(x == jnp.inf), count(x == -jnp.inf)]
    squares = jnp.sum(jnp.where(finite, jnp.square(x.astype(jnp.float64)), 0.0))
    largest = jnp.max(jnp.where(finite, jnp.abs(x), 0.0), initial=0.0).astype(jnp.float64)
    dead = jnp.zeros((), jnp.float64)
    if units_axis is not None:
        others = tuple(a for a in range(x.ndim) if a != units_axis)
        dead = count(~jnp.any(x != 0, axis=others))
    return jnp.stack([jnp.float64(x.size), *below, *nonfinite, squares, largest, dead])
