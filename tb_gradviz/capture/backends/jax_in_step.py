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
(`jax_in_step_device`); no tensor is kept past its statistics.

Every trainable weight's update (`weights.step_weights`): the step's
trainable values are not donated, so that after it `|w_after|` and
`|w_after - w_before|` are read from both (the same kernel or program).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jax_core
from keras.src import backend as keras_backend
from keras.src.trainers.data_adapters import data_adapter_utils

from tb_gradviz.capture import in_step, in_step_fit, in_step_kernel, probe, threads
from tb_gradviz.capture.backends import jax_in_step_device


def _is_float(t):
    return isinstance(t, jax.Array) and jnp.issubdtype(t.dtype, jnp.floating)


def _same(t):
    return t


class TrainStep(in_step_fit.TrainStepBase):
    """The chosen layers' in-step train step, and the train function that runs it when due
    (attributes: `in_step_fit.TrainStepBase`)."""

    def __init__(self, model, chosen, plain):
        super().__init__(model, chosen, plain)
        self._step = None  # the in-step train step, jitted as Keras jits its own
        self._keras_step = None  # Keras' train_step, for the earlier steps of a call
        self._called = []
        self._zero_specs = []
        self._units_axes = []

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
        before = state[0]
        logs, state, tensors, scale, iterations = self._step(before, tuple(state[1:]), data)
        self.stash = {
            "rows": self._rows(tensors),
            "scale": float(scale) if self._scaled else 1.0,
            "step": int(iterations[1]),
        }
        if self.weights:
            after = [state[0][i] for i in self._weight_indices]
            before = [before[i] for i in self._weight_indices]
            self.stash["updates"] = self._update_norms(after, before)
            self.stash["applied"] = int(iterations[1]) - int(iterations[0])
        return logs, state

    def _keras_train_step(self, state, data):
        if self._keras_step is None:
            self._keras_step = self._jit(self.model.train_step)
        return self._keras_step(state, data)

    def _jit(self, step, donated=0):
        """`step` compiled as Keras' `make_train_function` compiles `train_step`."""
        model = self.model
        if model.run_eagerly or not model.jit_compile:
            return step
        return jax.jit(step, donate_argnums=donated)

    def _plan(self, state, data):
        """Finds which chosen layers run, their tensors' shapes, and which input gradients are
        another layer's output gradient; builds the step."""
        model = self.model
        trainable, non_trainable, optimizer_variables, metrics = state
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        found = []

        def shapes(trainable, non_trainable, optimizer_variables, metrics, x, y, sample_weight):
            function = self._differentiated(
                (non_trainable, optimizer_variables, metrics), (x, y, sample_weight), None
            )
            _, (_, recordings) = function(trainable, None)
            found.append(
                {
                    path: (
                        [(t.shape, t.dtype) for t in r.inputs],
                        [(t.shape, t.dtype) for t in r.outputs],
                    )
                    for path, r in recordings.items()
                }
            )
            return 0

        jax.eval_shape(
            shapes, trainable, non_trainable, optimizer_variables, metrics, x, y, sample_weight
        )
        (specs,) = found
        self._scaled = False
        if model.optimizer is not None:
            # The variables hold no values while fit runs: the state's stand in for them.
            mapping = list(zip(model.optimizer.variables, optimizer_variables))
            with keras_backend.StatelessScope(state_mapping=mapping):
                one = jnp.ones((), jnp.float32)
                self._scaled = model.optimizer.scale_loss(one) is not one
        self._called = [c for c in self.chosen if specs[c.path][1]]
        self.skipped = [c.path for c in self.chosen if not specs[c.path][1]]
        self._zero_specs = [specs[c.path][0] + specs[c.path][1] for c in self._called]
        plans, tensor_of_zero = [], []  # per zero, the index of its gradient's plan tensor
        units_axes, is_input = [], []
        for c in self._called:
            inputs, outputs = specs[c.path]
            recording = probe.Recording(inputs=list(inputs), outputs=list(outputs))
            plan = probe.layer_plan(
                c, recording, lambda s: (list(s[0]), jnp.dtype(s[1]).name), self._scaled
            )
            plans.append(plan)
            base = len(units_axes) + len(outputs)
            tensor_of_zero += range(base, base + len(inputs) + len(outputs))
            is_input += [True] * len(inputs) + [False] * len(outputs)
            for t in plan.tensors:
                first = t.role == "activation" and t.index == 0
                units_axes.append(plan.units_axis if first else None)
        same = _same_gradients(
            self._differentiated(
                (non_trainable, optimizer_variables, metrics), (x, y, sample_weight), self._called
            ),
            trainable,
            self._zero_specs,
            is_input,
        )
        # The plan tensors the step returns, and the item each plan tensor reads.
        duplicate = {tensor_of_zero[k]: tensor_of_zero[j] for k, j in same.items()}
        self._kept = [i not in duplicate for i in range(len(units_axes))]
        item_of = np.cumsum(self._kept) - 1
        items = [item_of[duplicate.get(i, i)] for i in range(len(units_axes))]
        self._units_axes = [a for a, kept in zip(units_axes, self._kept) if kept]
        self.layout = in_step.DigestLayout(plans, items, self.weights)
        self._on_host = jax.default_backend() == "cpu"
        position = {id(v): i for i, v in enumerate(model.trainable_variables)}
        self._weight_indices = [position[id(w.variable)] for w in self.weights]
        self._iterations_at = next(
            (i for i, v in enumerate(model.optimizer.variables) if v is model.optimizer.iterations),
            None,
        )

        def step(trainable, rest, data):
            # The weights before the update are not donated: their update is read after it.
            return self.in_step_train_step((trainable, *rest), data)

        self._step = self._jit(step, donated=1)

    def _differentiated(self, state, data, called):
        """`(trainable, zeros) -> (scaled loss, (aux, recordings))`: Keras'
        `compute_loss_and_updates` with each of `called`'s floating inputs and outputs `t`
        handed on as `t - zero` (None: handed on as they are, and every chosen layer recorded).

        Args:
          state: `(non_trainable, optimizer_variables, metrics)`.
          data: `(x, y, sample_weight)`.
        """
        non_trainable, optimizer_variables, metrics = state
        x, y, sample_weight = data

        def function(trainable, zeros):
            if called is None:
                chosen, wraps = self.chosen, lambda path: (_same, None)
            else:
                chosen, by_path = called, {c.path: iter(z) for c, z in zip(called, zeros)}

                def wraps(path):
                    # The layer's inputs are wrapped first, then its outputs: its zeros' order.
                    def minus_zero(t):
                        return t - next(by_path[path])

                    return minus_zero, minus_zero

            with probe.recording_calls(chosen, _is_float, wraps) as recordings:
                loss, aux = self.model.compute_loss_and_updates(
                    trainable,
                    non_trainable,
                    metrics,
                    x,
                    y,
                    sample_weight,
                    training=True,
                    optimizer_variables=optimizer_variables,
                )
            return loss, (aux, recordings)

        return function

    def in_step_train_step(self, state, data):
        """Keras' JAX `train_step`, returning `(logs, state, tensors, loss scale, iterations)`:
        the tensors the layout's items read, in its order (per layer: activations, input
        gradients, output gradients; an input gradient that is another layer's output gradient
        left out), and the optimizer's iterations before and after the step."""
        model = self.model
        trainable, non_trainable, optimizer_variables, metrics = state
        iterations = [optimizer_variables[self._iterations_at]]
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        zeros = [[jnp.zeros(shape, dtype) for shape, dtype in specs] for specs in self._zero_specs]
        function = self._differentiated(
            (non_trainable, optimizer_variables, metrics), (x, y, sample_weight), self._called
        )

        def loss_and_updates(trainable, zeros):
            loss, (aux, recordings) = function(trainable, zeros)
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
        tensors = [t for t, kept in zip(tensors, self._kept) if kept]
        iterations.append(optimizer_variables[self._iterations_at])
        state = (trainable, non_trainable, optimizer_variables, metrics)
        return logs, state, tensors, scale, iterations

    def _rows(self, tensors):
        """`[tensors, in_step.ROW]` float64: each tensor's statistics, where it is."""
        if not tensors:
            return np.zeros((0, in_step.ROW))
        if self._on_host:
            items = [(np.asarray(t), axis) for t, axis in zip(tensors, self._units_axes)]
            return np.stack(threads.in_threads(in_step_kernel.row_along, items))
        return jax_in_step_device.rows(tensors, self._units_axes)

    def _update_norms(self, after, before):
        """`[weights, 2]` float64: per weight `|w_after|` and `|w_after - w_before|`."""
        if self._on_host:
            host = [np.asarray(a) for a in after], [np.asarray(b) for b in before]
            return in_step_kernel.update_norms(*host)
        return jax_in_step_device.update_norms(after, before)


def _same_gradients(function, trainable, zero_specs, is_input):
    """`{input zero: output zero}` for each layer input `t - zero_k` whose `t` is another layer's
    `y - zero_j` and is used nowhere else: the gradient w.r.t. both zeros is then the same values
    (what the one consumer hands back is all the gradient the output gets), summarised once.
    Read from the jaxpr of `function` (`TrainStep._differentiated`); a use inside a nested
    jaxpr counts as a use of its own, so a doubt keeps both.

    Args:
      function: `(trainable, zeros) -> (loss, ...)`.
      trainable: the trainable variables' values.
      zero_specs: per called layer, the `(shape, dtype)` of each zero (inputs', then outputs').
      is_input: per zero, in that order, whether it is subtracted from an input.
    """
    zeros = [[jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in specs] for specs in zero_specs]
    jaxpr = jax.make_jaxpr(lambda w, z: function(w, z)[0])(trainable, zeros).jaxpr
    zero_vars = jaxpr.invars[len(jax.tree_util.tree_leaves(trainable)) :]
    zero_of = {v: k for k, v in enumerate(zero_vars)}
    uses, made_by, subtracted_from = {}, {}, {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if not isinstance(v, jax_core.Literal):
                uses[v] = uses.get(v, 0) + 1
        operands = eqn.invars
        if eqn.primitive.name == "sub" and not isinstance(operands[1], jax_core.Literal):
            k = zero_of.get(operands[1])
            if k is not None:
                made_by[eqn.outvars[0]] = k
                subtracted_from[k] = operands[0]
    for v in jaxpr.outvars:
        if not isinstance(v, jax_core.Literal):
            uses[v] = uses.get(v, 0) + 1
    same = {}
    for k, t in subtracted_from.items():
        j = made_by.get(t)
        if is_input[k] and j is not None and not is_input[j] and uses.get(t) == 1:
            same[k] = j
    return same
