"""The probe pass on Keras' JAX backend: one jitted `jax.value_and_grad`, traced once.

The pass is a pure function of the model's variables and the probe batch.
Inside it, the wrapped `call` of each chosen layer adds a zero tensor to each
floating input and output, and the gradient of the loss w.r.t. those zeros
is the gradient w.r.t. the layer's input (through this layer only) and
output. The zeros are made inside the jitted function: constants XLA can
fold, and no buffers as large as every captured tensor kept between log
events (as arguments, they were). The model runs through
`model.stateless_call`, so the state it would change (BatchNorm moving
statistics, seed generators, metrics) comes back as new values, which are
dropped: training state is untouched by construction.

The zeros' shapes come from `jax.eval_shape` of the same forward pass, once.
"""

import functools

import jax
import jax.numpy as jnp
import keras
import numpy as np

from tb_gradviz.capture import assemble, device_programs, device_statistics, probe
from tb_gradviz.format import records


def _is_float(t):
    return isinstance(t, jax.Array) and jnp.issubdtype(t.dtype, jnp.floating)


def default_statistics():
    """`"host"` when JAX runs on the CPU, else `"device"` (see `LayerCapture`)."""
    return "host" if jax.default_backend() == "cpu" else "device"


class LayerCapture(probe.ProbePass):
    """The probe pass of `model` on JAX. Args: as `probe.new_capture`.

    `statistics="host"`: the pass returns the tensors and `kernels` summarises
    them. `"device"`: a second jitted function summarises them where they
    are (`device_statistics`, grouped, two reads per group), and only
    sums and counts leave the device.
    """

    def __init__(self, model, chosen, loss=None, training=True, statistics=None):
        super().__init__(model, chosen, loss, training, statistics, default_statistics)
        self.devices = None  # the devices the last pass ran on
        self._pass = None
        self._groups = None  # how `device_statistics` groups the tensors

    def run(self, x, y, sample_weight=None):
        """Runs the pass; returns `(step_records, skipped_paths)` (see `assemble.step_records`)."""
        model = self.model
        state = (
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            [v.value for v in model.metrics_variables],
        )
        divisor = probe.loss_scale(model)
        # An array argument, not a constant baked into the trace: the scale changes.
        scale = None if divisor is None else jnp.float32(divisor)
        if keras.distribution.distribution() is not None:
            # Under keras.distribution the probe runs whole on one device, as
            # without it: the same numbers, and no collective in the pass.
            device = jax.local_devices()[0]
            state, x, y, sample_weight, scale = jax.device_put(
                (state, x, y, sample_weight, scale), device
            )
        if self._pass is None:
            self._plan(state, x, y, sample_weight, scale)
        activations, gradients, weight_gradients, routing_counts, units, maps = self._pass(
            state, x, y, sample_weight, scale
        )
        maps = [assemble.host_map(slices, divisor) for slices in maps]
        self.devices = sorted(str(d) for d in jax.tree_util.tree_leaves(activations)[0].devices())
        tensors = []
        for layer_activations, (input_grads, output_grads), indices, weight_grads in zip(
            activations, gradients, self._weight_indices, weight_gradients
        ):
            weights = [state[0][i] for i in indices]
            tensors += [*layer_activations, *input_grads, *output_grads, *weights, *weight_grads]
        counts = [tuple(np.nan if c is None else int(c) for c in layer) for layer in routing_counts]
        if self.statistics == "host":
            arrays = [assemble.host_array(t) for t in tensors]
            self.host_weights = assemble.host_weights(self.plans, arrays)
            return assemble.host_records(
                self.plans,
                arrays,
                divisor,
                counts,
                self._skipped,
                units,
                maps,
                self.map_settings,
                self.block_formats,
            )
        return assemble.device_records(
            self.plans,
            self._device_rows(tensors, divisor),
            counts,
            self._skipped,
            units,
            maps,
            self.map_settings,
        )

    def _device_rows(self, tensors, divisor):
        """Each tensor's row of `device_statistics`, computed where it is, in one jitted call."""
        scaled = [t.loss_scaled for plan in self.plans for t in plan.tensors]
        if self._groups is None:
            widths = [device_statistics.last_axis(t.shape) for t in tensors]
            keys = [(t.size, t.dtype, d, w) for t, d, w in zip(tensors, scaled, widths)]
            self._groups = device_statistics.chunks(keys)
            platform = next(iter(tensors[0].devices())).platform
            # One jitted program per distinct chunk (`GroupPrograms`), not one over them all.
            programs = device_programs.GroupPrograms(jax.jit, device_statistics.mode_for(platform))
            self._statistics = functools.partial(
                programs, self._groups, scaled, widths=widths if self.block_formats else None
            )
        with jax.enable_x64(True):  # float64 sums and bucket arithmetic, as the definition's
            results = jax.device_get(
                self._statistics(tensors, jnp.float64(divisor if divisor is not None else 1.0))
            )
        return device_statistics.tensor_rows(self._groups, results, [t.size for t in tensors])

    def _plan(self, state, x, y, sample_weight, scale):
        """Finds which layers run and the shapes of their tensors; builds the jitted pass."""

        def forward(state, x, y, sample_weight, scale):
            with probe.recording_calls(
                self.chosen, _is_float, lambda path: (_same, None)
            ) as recordings:
                self._loss_value(state, x, y, sample_weight, scale)
            return [
                (
                    [(t.shape, t.dtype) for t in recordings[c.path].inputs],
                    [(t.shape, t.dtype) for t in recordings[c.path].outputs],
                )
                for c in self.chosen
            ]

        shapes = []

        def shapes_only(*args):
            shapes.append(forward(*args))
            return 0

        jax.eval_shape(shapes_only, state, x, y, sample_weight, scale)
        (layer_shapes,) = shapes
        called = [(c, ins, outs) for c, (ins, outs) in zip(self.chosen, layer_shapes) if outs]
        self._called = [c for c, _, _ in called]
        self._skipped = [c.path for c, (_, outs) in zip(self.chosen, layer_shapes) if not outs]
        self._zero_specs = [ins + outs for _, ins, outs in called]
        device = str(jax.devices()[0].platform)
        # Where each recorded weight is in `model.trainable_variables`, per called layer.
        position = {id(v): i for i, v in enumerate(self.model.trainable_variables)}
        self._weight_indices = [
            [position[id(v)] for _, v in self.weights_of(c.path)] for c in self._called
        ]
        self.plans = []
        for c, ins, outs in called:
            recording = probe.Recording(inputs=list(ins), outputs=list(outs))
            plan = probe.layer_plan(
                c,
                recording,
                lambda spec: (list(spec[0]), jnp.dtype(spec[1]).name),
                scale is not None,
                device=device,
                map_settings=self.map_settings,
                weights=self.weights_of(c.path),
            )
            self.plans.append(plan)
        self._pass = jax.jit(self._pass_fn)

    def _loss_value(self, state, x, y, sample_weight, scale):
        trainable, non_trainable, metrics = state
        model = self.model
        kwargs = {"training": self.training} if model._call_has_training_arg else {}
        y_pred, non_trainable, losses = model.stateless_call(
            trainable, non_trainable, x, return_losses=True, **kwargs
        )
        if self._loss is not None:
            loss = self._loss(y, y_pred, sample_weight=sample_weight)
        else:
            if losses:
                model._losses_override.clear()
                model._losses_override = losses
            loss, _ = model.stateless_compute_loss(
                trainable,
                non_trainable,
                metrics,
                x=x,
                y=y,
                y_pred=y_pred,
                sample_weight=sample_weight,
                training=self.training,
            )
            if losses:
                model._losses_override.clear()
        if scale is not None:
            # Backpropagate what train_step backpropagates, so float16
            # gradients underflow (or overflow) exactly as in training.
            loss = loss * scale.astype(loss.dtype)
        return loss

    def _pass_fn(self, state, x, y, sample_weight, scale):
        zeros = [[jnp.zeros(shape, dtype) for shape, dtype in specs] for specs in self._zero_specs]

        recorded = [i for indices in self._weight_indices for i in indices]

        def loss_of(zeros, weights):
            # The recorded weights are arguments, so that their gradients come from this
            # backward pass.
            trainable = list(state[0])
            for i, w in zip(recorded, weights):
                trainable[i] = w
            by_path = {c.path: iter(z) for c, z in zip(self._called, zeros)}

            def wraps(path):
                # The layer's inputs come first in its zeros, then its outputs.
                add = (lambda t: t + next(by_path[path])) if path in by_path else _same
                return add, add

            with probe.recording_calls(self._called, _is_float, wraps) as recordings:
                loss = self._loss_value((trainable, *state[1:]), x, y, sample_weight, scale)
            activations = [recordings[c.path].outputs for c in self._called]
            pool_inputs = [
                recordings[c.path].inputs[0] if p.has_routing else None
                for c, p in zip(self._called, self.plans)
            ]
            return loss, (activations, pool_inputs)

        (_, (activations, pool_inputs)), (zero_grads, recorded_grads) = jax.value_and_grad(
            loss_of, argnums=(0, 1), has_aux=True
        )(zeros, [state[0][i] for i in recorded])
        recorded_grads = iter(recorded_grads)
        weight_gradients = [
            [next(recorded_grads) for _ in indices] for indices in self._weight_indices
        ]
        gradients = []
        for plan, grads in zip(self.plans, zero_grads):
            inputs = sum(t.role == records.INPUT_GRADIENT for t in plan.tensors)
            gradients.append((grads[:inputs], grads[inputs:]))
        routing_counts = []
        for c, plan, pool_input in zip(self._called, self.plans, pool_inputs):
            if plan.has_routing:
                routing_counts.append(_routing_counts(c.layer.call, pool_input, plan.pooling))
        units = [
            probe.dead_channels(p, a)
            for p, a in zip(self.plans, activations)
            if p.units_axis is not None
        ]
        example = self.map_settings.example if self.map_settings is not None else 0
        maps = [
            probe.map_slices(p, [x], g[0], g[1], example)
            for p, x, g in zip(self.plans, pool_inputs, gradients)
            if p.map_cut is not None
        ]
        return activations, gradients, weight_gradients, routing_counts, units, maps


def _same(t):
    return t


def _routing_counts(original_call, inputs, pooling):
    """`(input_positions, routed_positions, windows, tied_windows)` of a pooling layer.

    Routing is the gradient of `sum(pool(x))`: the positions that receive
    gradient from at least one window (on a tie, XLA's rule picks the first).
    """
    pooled, pullback = jax.vjp(original_call, inputs)
    (routes,) = pullback(jnp.ones_like(pooled))
    tied = probe.tied_windows(inputs, pooling) if pooling["type"] == "max" else None
    if isinstance(tied, float):  # adaptive pooling: windows vary
        tied = None
    return inputs.size, jnp.count_nonzero(routes > 0), pooled.size, tied
