"""The in-step digest on Keras' PyTorch backend (`capture.in_step`).

PyTorch runs the train step eagerly, so nothing of it is rebuilt: on a step
`due()` says is logged, the train function Keras made runs with the chosen
layers' `call` wrapped (`probe.recording_calls`), as the probe wraps them. The
wrapper hands each layer a view of each floating input and registers a hook
on it, and a hook on each floating output: the backward pass of Keras' own
`loss.backward()`, the one that gives the weight gradients, hands each hook
the gradient w.r.t. the layer's input (through this layer only: the layer is
the view's one consumer) or output. Each activation is summarised when the
layer returns it, each gradient when its hook receives it, by the numba
kernel (`in_step_kernel`); no tensor is kept past the backward pass. A view and
a hook that returns nothing change no value: training is the same bit for bit.

An input gradient that is also the gradient of a chosen layer's output (layer
B reads A's output and nothing else does: a chain of conv, BatchNorm, ReLU) is
read once (`_Shared`): about a third of the values of every ResNet50 layer.

The optimizer's `apply` is wrapped for the step too (`_updates_measured`):
every trainable weight (`weights.step_weights`) is copied just before the
update and compared with itself after it, for the digest's update rows.
"""

import contextlib

import numpy as np
import torch

from tb_gradviz.capture import in_step, in_step_fit, in_step_kernel, probe


def _is_float(t):
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def _row(t, units_axis=None):
    return in_step_kernel.row_along(t.detach().float().cpu().numpy(), units_axis)


class TrainStep(in_step_fit.TrainStepBase):
    """The chosen layers' hooks, and the train function that sets them when due (attributes:
    `in_step_fit.TrainStepBase`)."""

    def train_function(self, due):
        """The train function to put in `model.train_function` (made once, then the same)."""
        self.due = due
        if self.function is None:

            def function(data):
                if not self.due():
                    return self.plain(data)
                return self._logged(data)

            self.function = function
        return self.function

    def _logged(self, data):
        rows = {}  # (kind, id of the tensor) -> its statistics row
        layers = {c.path: c.layer for c in self.chosen}
        shared = _Shared()

        def wraps(path):
            first = []

            def wrap_input(t):
                if not t.requires_grad:
                    # The model's own inputs: a leaf of its own, for their gradient.
                    t = t.detach().requires_grad_(True)
                view = t.view_as(t)
                view.register_hook(shared.input_hook(rows, ("input_gradient", id(view)), t))
                return view

            def wrap_output(t):
                units_axis = None if first else _units_axis(layers[path], t)
                rows[("activation", id(t))] = _row(t, units_axis)
                first.append(t)
                if t.requires_grad:
                    t.register_hook(shared.output_hook(rows, ("output_gradient", id(t)), t))
                return t

            return wrap_input, wrap_output

        scale = probe.loss_scale(self.model)
        updates = {}
        with (
            probe.recording_calls(self.chosen, _is_float, wraps) as recordings,
            _updates_measured(self.model.optimizer, self.weights, updates),
        ):
            logs = self.plain(data)
        shared.held.clear()
        plans, table = [], []
        for c in self.chosen:
            rec = recordings[c.path]
            if not rec.outputs:
                continue
            plan = probe.layer_plan(
                c,
                rec,
                lambda t: (list(t.shape), str(t.dtype).removeprefix("torch.")),
                scale is not None,
            )
            plans.append(plan)
            forward = [("activation", t) for t in rec.outputs]
            forward += [("input_gradient", t) for t in rec.inputs]
            forward += [("output_gradient", t) for t in rec.outputs]
            for kind, t in forward:
                table.append(rows.get((kind, id(t)), _unreached(t)))
        self.skipped = [c.path for c in self.chosen if not recordings[c.path].outputs]
        self.layout = in_step.DigestLayout(plans, range(len(table)), self.weights)
        self.stash = {
            "rows": np.stack(table) if table else np.zeros((0, in_step.ROW)),
            "scale": 1.0 if scale is None else scale,
            "step": int(self.model.optimizer.iterations.numpy()),
            **updates,
        }
        return logs


@contextlib.contextmanager
def _updates_measured(optimizer, weights, found):
    """Within it, the optimizer's `apply` (the update `train_step` applies) also puts each
    weight's `|w_after|` and `|w_after - w_before|` in `found["updates"]`, and the optimizer
    steps it applied in `found["applied"]`: a copy of each weight is taken just before the
    update, and let go once its norms are known."""
    if optimizer is None or not weights:
        yield
        return
    apply = optimizer.apply

    def measured(*args, **kwargs):
        iterations = int(optimizer.iterations.numpy())
        before = [w.variable.value.detach().clone() for w in weights]
        result = apply(*args, **kwargs)
        after = [w.variable.value.detach() for w in weights]
        found["updates"] = in_step_kernel.update_norms(
            [_host(a) for a in after], [_host(b) for b in before]
        )
        found["applied"] = int(optimizer.iterations.numpy()) - iterations
        return result

    optimizer.apply = measured  # the instance's, over the class's method
    try:
        yield
    finally:
        del optimizer.apply


def _host(t):
    return (t.float() if t.dtype in (torch.float16, torch.bfloat16) else t).cpu().numpy()


class _Shared:
    """The gradient hooks of one step, which read an input gradient that is also the gradient
    of the output it reads once.

    The backward pass hands layer B's view of its input its gradient first, then
    hands the output `t` it views (a chosen layer's) the sum of what each of
    `t`'s readers handed back. Where B is the only reader, that sum is B's
    gradient itself, through the view: the same memory. The input hook keeps
    the gradient it read, with its row, until `t`'s hook comes: holding it
    keeps autograd from adding another reader's gradient into that memory in
    place, so the same memory means the same values, and the row is taken
    over. Where `t` has other readers, the sum is new memory and is read.
    What was held is let go in `t`'s hook, or at the end of the step
    (`held.clear()`) for an input that is no chosen layer's output.
    """

    def __init__(self):
        self.held = {}  # id of the viewed tensor -> [(gradient, row)] its readers' hooks read

    def input_hook(self, rows, key, viewed):
        def hook(gradient):
            rows[key] = _row(gradient)
            self.held.setdefault(id(viewed), []).append((gradient, rows[key]))

        return hook

    def output_hook(self, rows, key, output):
        def hook(gradient):
            read = self.held.pop(id(output), [])
            same = [row for held, row in read if _same_memory(held, gradient)]
            rows[key] = same[0] if len(same) == 1 and len(read) == 1 else _row(gradient)

        return hook


def _same_memory(a, b):
    return (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
        and a.device == b.device
    )


def _unreached(t):
    """The row of a gradient the backward pass never computed: every value zero."""
    row = np.zeros(in_step.ROW)
    row[0] = t.numel()
    row[1 : 1 + len(in_step.BELOW)] = t.numel()
    return row


def _units_axis(layer, t):
    """The channel axis of a layer's first activation, as `probe.layer_plan` picks it."""
    if t.dim() < 2:
        return None
    return 1 if getattr(layer, "data_format", None) == "channels_first" else t.dim() - 1
