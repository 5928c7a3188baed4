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
read once (`_Shared`; what it saves: bench/RESULTS.md section 22).

The optimizer's `apply` is wrapped for the step too (`_updates_measured`):
every trainable weight (`weights.step_weights`) is copied just before the
update and compared with itself after it, for the digest's update rows.
"""

import contextlib
import dataclasses
import itertools
import math
import weakref

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
        rows = {}  # (kind, key of the tensor) -> its statistics row
        layers = {c.path: c.layer for c in self.chosen}
        keys = _Keys()
        shared = _Shared(rows)

        def wraps(path):
            first = [True]  # the units of a layer's first output are counted

            def wrap_input(t):
                producer = keys.output_key(t)
                if not t.requires_grad:
                    # The model's own inputs: a leaf of its own, for their gradient.
                    t = t.detach().requires_grad_(True)
                view = t.view_as(t)
                view.register_hook(shared.input_hook(keys.new(view), producer))
                return view

            def wrap_output(t):
                key = keys.output_key(t)
                units_axis = _units_axis(layers[path], t) if first else None
                first.clear()
                rows[("activation", key)] = _row(t, units_axis)
                if t.requires_grad:
                    t.register_hook(shared.output_hook(key))
                return t

            return wrap_input, wrap_output

        scale = probe.loss_scale(self.model)
        updates = {}
        with (
            probe.recording_calls(self.chosen, _is_float, wraps, keys.kept) as recordings,
            _updates_measured(self.model.optimizer, self.weights, updates),
        ):
            logs = self.plain(data)
        shared.held.clear()
        plans, table = [], []
        for c in self.chosen:
            rec = recordings[c.path]
            if not rec.outputs:
                continue
            plan = probe.layer_plan(c, rec, lambda t: (list(t.shape), t.dtype), scale is not None)
            plans.append(plan)
            forward = [("activation", t) for t in rec.outputs]
            forward += [("input_gradient", t) for t in rec.inputs]
            forward += [("output_gradient", t) for t in rec.outputs]
            for kind, t in forward:
                table.append(rows.get((kind, t.key), _unreached(t)))
        self.skipped = [c.path for c in self.chosen if not recordings[c.path].outputs]
        self.layout = in_step.DigestLayout(plans, range(len(table)), self.weights)
        self.stash = {
            "rows": np.stack(table) if table else np.zeros((0, in_step.ROW)),
            "scale": 1.0 if scale is None else scale,
            "step": int(self.model.optimizer.iterations.numpy()),
            **updates,
        }
        return logs


@dataclasses.dataclass(frozen=True)
class _Kept:
    """What a step's recording keeps of a tensor: its shape, dtype and key, not the tensor,
    which would keep its memory from being freed in the backward pass (the page faults that
    cost: bench/RESULTS.md section 22)."""

    shape: tuple
    dtype: str
    key: int


class _Keys:
    """A key for each tensor a step records, given while the tensor is alive: an output keeps
    the key of its first recording (the layer it comes from) for the layers that read it; a
    weak reference tells a live output from a later tensor at the same address."""

    def __init__(self):
        self._count = itertools.count()
        self._outputs = {}  # id(output) -> (weak reference to it, key)
        self._views = {}  # id(input view) -> key, from its wrap until it is kept

    def new(self, view):
        key = next(self._count)
        self._views[id(view)] = key
        return key

    def output_key(self, t):
        """`t`'s key as an output, made on first sight: an input that is no recorded output
        gets one too, which no output's hook asks for."""
        found = self._outputs.get(id(t))
        if found is not None and found[0]() is t:
            return found[1]
        key = next(self._count)
        self._outputs[id(t)] = (weakref.ref(t), key)
        return key

    def kept(self, t):
        key = self._views.pop(id(t), None)
        if key is None:
            key = self.output_key(t)
        return _Kept(tuple(t.shape), str(t.dtype).removeprefix("torch."), key)


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
    hands the output it views (a chosen layer's) the sum of what each of the
    output's readers handed back. Where B is the only reader, that sum is B's
    gradient itself, through the view: the same memory. The input hook keeps
    the gradient it read, with its row, until the output's hook comes: holding
    it keeps autograd from adding another reader's gradient into that memory in
    place, so the same memory means the same values, and the row is taken over.
    Where the output has other readers, the sum is new memory and is read. What
    was held is let go in the output's hook, or at the end of the step
    (`held.clear()`) for an input that is no chosen layer's output.
    """

    def __init__(self, rows):
        self.rows = rows  # (kind, key) -> row, as `TrainStep._logged` reads them
        self.held = {}  # key of a viewed output -> [(gradient, row)] its readers' hooks read

    def input_hook(self, key, producer):
        def hook(gradient):
            row = self.rows["input_gradient", key] = _row(gradient)
            self.held.setdefault(producer, []).append((gradient, row))

        return hook

    def output_hook(self, key):
        def hook(gradient):
            read = self.held.pop(key, [])
            if len(read) == 1 and _same_memory(read[0][0], gradient):
                self.rows["output_gradient", key] = read[0][1]
            else:
                self.rows["output_gradient", key] = _row(gradient)

        return hook


def _same_memory(a, b):
    return (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
        and a.device == b.device
    )


def _unreached(kept):
    """The row of a gradient the backward pass never computed: every value zero."""
    size = math.prod(kept.shape)
    row = np.zeros(in_step.ROW)
    row[0] = size
    row[1 : 1 + len(in_step.BELOW)] = size
    return row


def _units_axis(layer, t):
    """The channel axis of a layer's first activation, as `probe.layer_plan` picks it."""
    if t.dim() < 2:
        return None
    return 1 if getattr(layer, "data_format", None) == "channels_first" else t.dim() - 1
