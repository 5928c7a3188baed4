"""The probe pass on Keras' PyTorch backend: one eager pass and `torch.autograd.grad`.

Each chosen layer's wrapped `call` hands the layer a view of its input and
the model a view of its output (`_own_node`); `torch.autograd.grad` of the
loss w.r.t. those views gives the gradient w.r.t. the layer's input (through
this layer only: the layer is the view's one consumer) and output, without
touching any parameter's `.grad`, and frees the graph. A view copies nothing,
where adding a zero tensor that requires grad (what the JAX pass does)
allocated and added every captured tensor once more in eager PyTorch
(bench/RESULTS.md, section 6).

The state the forward pass changes (BatchNorm moving statistics, seed
generators, metrics) is saved before and written back after, and so is
PyTorch's global random state, which Dropout without a seed draws from.
"""

import contextlib

import keras
import numpy as np
import torch

from tb_gradviz.capture import assemble, device_statistics, probe


def _is_float(t):
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def default_statistics():
    """`"host"` when Keras runs PyTorch on the CPU, else `"device"` (see `LayerCapture`)."""
    return "host" if keras.ops.ones(()).device.type == "cpu" else "device"


class LayerCapture(probe.ProbePass):
    """The probe pass of `model` on PyTorch. Args: as `probe.new_capture`.

    `statistics="host"`: the pass hands the tensors to `kernels` on the host.
    `"device"`: `device_statistics` summarises them where they are, in eager
    ops over groups of equal-sized tensors, and only sums and counts leave
    the device.
    """

    def __init__(self, model, chosen, loss=None, training=True, statistics=None):
        super().__init__(model, chosen, loss, training, statistics, default_statistics)

    def run(self, x, y, sample_weight=None):
        """Runs the pass; returns `(step_records, skipped_paths)` (see `assemble.step_records`)."""
        model = self.model
        scale = probe.loss_scale(model)
        state = list(model.non_trainable_variables) + list(model.metrics_variables)
        saved = [v.value.detach().clone() for v in state]
        nodes = {c.path: [] for c in self.chosen}

        def wraps(path):
            def own_node(t):
                node = _own_node(t)
                nodes[path].append(node)
                return node

            return own_node, own_node

        try:
            with _kept_random_state(), torch.enable_grad():
                with probe.recording_calls(self.chosen, _is_float, wraps) as recordings:
                    loss = self._loss_value(x, y, sample_weight)
                if scale is not None:
                    # Backpropagate what train_step backpropagates, so float16
                    # gradients underflow (or overflow) exactly as in training.
                    loss = loss * scale
                called = [c for c in self.chosen if recordings[c.path].outputs]
                # The weights' gradients come from the same backward pass, after the views'.
                sources = [node for c in called for node in nodes[c.path]]
                sources += [v.value for c in called for _, v in self.weights_of(c.path)]
                gradients = torch.autograd.grad(loss, sources, allow_unused=True)
                gradients = iter(
                    torch.zeros_like(z) if g is None else g for z, g in zip(sources, gradients)
                )
                tensors, routing_counts, units, maps, self.plans = [], [], [], [], []
                device = str(loss.device)
                layer_gradients = []
                for c in called:
                    rec = recordings[c.path]
                    layer_gradients.append(
                        (
                            [next(gradients) for _ in rec.inputs],
                            [next(gradients) for _ in rec.outputs],
                        )
                    )
                for c, (input_grads, output_grads) in zip(called, layer_gradients):
                    rec = recordings[c.path]
                    weights = self.weights_of(c.path)
                    plan = probe.layer_plan(
                        c,
                        rec,
                        lambda t: (list(t.shape), str(t.dtype).removeprefix("torch.")),
                        scale is not None,
                        device,
                        map_settings=self.map_settings,
                        weights=weights,
                    )
                    values = [v.value for _, v in weights]
                    weight_grads = [next(gradients) for _ in weights]
                    tensors += [
                        t.detach()
                        for t in (*rec.outputs, *input_grads, *output_grads, *values, *weight_grads)
                    ]
                    if plan.has_routing:
                        routing_counts.append(
                            _routing_counts(c.layer.call, rec.inputs[0], plan.pooling)
                        )
                    if plan.units_axis is not None:
                        units.append(probe.dead_channels(plan, [t.detach() for t in rec.outputs]))
                    if plan.map_cut is not None:
                        slices = probe.map_slices(
                            plan,
                            [rec.inputs[0].detach()],
                            input_grads,
                            output_grads,
                            self.map_settings.example,
                        )
                        maps.append(assemble.host_map(slices, scale))
                    self.plans.append(plan)
        finally:
            for v, value in zip(state, saved):
                v.assign(value)
        skipped = [c.path for c in self.chosen if not recordings[c.path].outputs]
        if self.statistics == "host":
            arrays = [assemble.host_array(t) for t in tensors]
            self.host_weights = assemble.host_weights(self.plans, arrays)
            return assemble.host_records(
                self.plans,
                arrays,
                scale,
                routing_counts,
                skipped,
                units,
                maps,
                self.map_settings,
                self.block_formats,
            )
        return assemble.device_records(
            self.plans,
            self._device_rows(tensors, scale),
            routing_counts,
            skipped,
            units,
            maps,
            self.map_settings,
        )

    def _device_rows(self, tensors, divisor):
        """Each tensor's row of `device_statistics`, computed where it is (eager ops)."""
        scaled = [t.loss_scaled for plan in self.plans for t in plan.tensors]
        widths = [device_statistics.last_axis(t.shape) for t in tensors]
        keys = [(t.numel(), t.dtype, d, w) for t, d, w in zip(tensors, scaled, widths)]
        groups = device_statistics.chunks(keys)
        with torch.no_grad():
            results = device_statistics.chunk_statistics(
                groups,
                scaled,
                tensors,
                divisor,
                mode="eager",
                widths=widths if self.block_formats else None,
            )
            return device_statistics.tensor_rows(groups, results, [t.numel() for t in tensors])

    def _loss_value(self, x, y, sample_weight):
        y_pred = self.model(x, training=self.training)
        if self._loss is not None:
            return self._loss(y, y_pred, sample_weight=sample_weight)
        return self.model.compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=self.training
        )


def _own_node(t):
    """A tensor equal to `t`, at a node of the autograd graph of its own.

    Its one consumer is the layer it is handed to (or, for an output, the
    model), so the gradient w.r.t. it is the gradient through that consumer
    alone. A tensor outside the graph (the model's input) becomes a leaf
    that requires grad, sharing `t`'s memory.
    """
    return t.view_as(t) if t.requires_grad else t.detach().requires_grad_()


@contextlib.contextmanager
def _kept_random_state():
    """Restores PyTorch's global random state (CPU and every CUDA device) on exit."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _routing_counts(original_call, inputs, pooling):
    """`(input_positions, routed_positions, windows, tied_windows)` of a pooling layer.

    Routing is the gradient of `sum(pool(x))`: the positions that receive
    gradient from at least one window.
    """
    inputs = inputs.detach().requires_grad_(True)
    pooled = original_call(inputs)
    (routes,) = torch.autograd.grad(pooled.sum(), inputs)
    with torch.no_grad():
        tied = probe.tied_windows(inputs.detach(), pooling) if pooling["type"] == "max" else np.nan
        tied = np.nan if isinstance(tied, float) else int(tied)
        return inputs.numel(), int(torch.count_nonzero(routes > 0)), pooled.numel(), tied
