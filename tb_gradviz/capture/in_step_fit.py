"""Puts the in-step digest into a model's train function (`GradVizCallback(digest="step")`).

`install` replaces `model.train_function`, which `fit` makes before it calls
`on_train_begin` and looks up again at every step, with the backend's
(`backends.tf_in_step`, `backends.jax_in_step`, `backends.torch_in_step`): on
a step due to be logged it runs a train step that also computes the chosen
layers' digest statistics, on every other step the train function Keras made.
Where that cannot be done (a model with its own `train_step`, `jit_compile`
on TensorFlow or PyTorch, a strategy over several replicas, a
keras.distribution on JAX, PyTorch on an accelerator, no numba on a CPU) the
callback keeps the probe's digest, and a message says why, once.
"""

import warnings

import keras
import numpy as np

from tb_gradviz.capture import assemble, in_step
from tb_gradviz.capture import weights as weights_module
from tb_gradviz.format import digest, metadata

_told = set()  # the reasons already told


class TrainStepBase:
    """What each backend's in-step `TrainStep` holds, and how the callback takes a call's
    statistics (`take`).

    Attributes:
      model, chosen: the model and its chosen layers.
      plain: the train function Keras made.
      function: the train function that runs the in-step step when due (made once).
      layout: the `in_step.DigestLayout`, known once the step is traced.
      stash: what the last in-step call returned, as numpy: `rows`, `scale`,
        `step` (the optimizer's iterations after it), `updates` (`update_norms`
        of `weights`) and `applied` (the optimizer steps it applied); None before one.
      skipped: the chosen layers the last traced step did not call.
      due: `() -> bool`, whether the next call ends at a logged step.
      weights: the `weights.StepWeight`s (every trainable weight) whose update each call gives.
    """

    def __init__(self, model, chosen, plain):
        self.model = model
        self.chosen = list(chosen)
        self.plain = plain
        self.function = None
        self.layout = None
        self.stash = None
        self.skipped = []
        self.due = None
        self.weights = weights_module.step_weights(model, self.chosen)

    def take(self, step):
        """The statistics of the in-step call that ended at optimizer step `step` (and lets go
        of them), or None when the last one ended elsewhere."""
        stash, self.stash = self.stash, None
        if stash is None or int(stash.get("step", -1)) != step:
            return None
        return stash


def unsupported(model):
    """Why the in-step digest cannot run in `model`'s train step, or None when it can."""
    backend = keras.backend.backend()
    if backend not in ("tensorflow", "torch", "jax"):
        return (
            "the in-step digest runs on the TensorFlow, JAX and PyTorch backends; "
            f"Keras runs on {backend!r}"
        )
    if backend == "tensorflow":
        from keras.src.backend.tensorflow.trainer import TensorFlowTrainer as Trainer
    elif backend == "jax":
        from keras.src.backend.jax.trainer import JAXTrainer as Trainer
    else:
        from keras.src.backend.torch.trainer import TorchTrainer as Trainer
    if type(model).train_step is not Trainer.train_step:
        return (
            f"{type(model).__name__} defines its own train_step, which the in-step digest "
            "cannot mirror"
        )
    if backend == "jax":
        reason = _unsupported_on_jax()
        if reason is not None:
            return reason
    elif model.jit_compile:
        return (
            "under jit_compile the compiler compiles the step and its statistics into another "
            "program, whose rounding differs from the plain step's: training would not be the "
            "same bit for bit"
        )
    if backend == "torch" and any(p.device.type != "cpu" for p in model.parameters()):
        return "on PyTorch the in-step digest runs on a CPU only so far"
    if not assemble.numba_available() and (backend != "jax" or _jax_on_cpu()):
        return "the in-step digest's kernel needs numba"
    if backend == "tensorflow":
        replicas = model.distribute_strategy.num_replicas_in_sync
        if replicas > 1:
            return f"the model trains under a tf.distribute strategy with {replicas} replicas"
    if getattr(model, "train_function", None) is None:
        return "the model has no train function (fit makes one before on_train_begin)"
    return None


def _jax_on_cpu():
    import jax

    return jax.default_backend() == "cpu"


def _unsupported_on_jax():
    """Why the JAX step cannot be mirrored, or None: it is jitted for one device, as Keras jits
    its own without a distribution."""
    if keras.distribution.distribution() is not None:
        return (
            "on JAX the in-step digest runs without a keras.distribution so far; "
            f"the model trains under {type(keras.distribution.distribution()).__name__}"
        )
    if keras.config.is_nnx_enabled():
        return "on JAX the in-step digest does not run with Flax NNX enabled"
    return None


def install(model, chosen, due, previous=None):
    """Puts the in-step train function in `model.train_function`; returns its `TrainStep`.

    Args:
      model: the model `fit` trains.
      chosen: the `selection.ChosenLayer`s.
      due: `() -> bool`: whether the step(s) of the next call end at a logged step.
      previous: the `TrainStep` an earlier fit installed, or None: put back (its step
        traced already) while the model's train function is still the one it wraps.

    Returns:
      The backend's `TrainStep` (its `take` gives a step's statistics), or None
      when the probe's digest is kept (`unsupported`): a warning says why, once per reason.
    """
    reason = unsupported(model)
    if reason is not None:
        if reason not in _told:
            _told.add(reason)
            warnings.warn(
                f"tb_gradviz: digest='step' falls back to the probe's digest: {reason}",
                stacklevel=3,
            )
        return None
    if (
        previous is not None
        and previous.model is model
        and previous.plain is model.train_function
        and previous.chosen == list(chosen)
    ):
        step = previous
    else:
        if keras.backend.backend() == "tensorflow":
            from tb_gradviz.capture.backends import tf_in_step as backend
        elif keras.backend.backend() == "jax":
            from tb_gradviz.capture.backends import jax_in_step as backend
        else:
            from tb_gradviz.capture.backends import torch_in_step as backend
        step = backend.TrainStep(model, chosen, model.train_function)
    model.train_function = step.train_function(due)
    return step


def uninstall(step):
    """Puts back the train function Keras made, so that a fit without the callback runs it."""
    if step is not None and step.model.train_function is step.function:
        step.model.train_function = step.plain


def event_records(step_statistics, layout):
    """The records of an in-step event: its digest, and the record saying where it was made.

    Args:
      step_statistics: what `TrainStep.take` gave: `{"rows", "scale"}`, and
        `{"updates", "applied"}` where the model has trainable weights.
      layout: the `in_step.DigestLayout` of the step.
    """
    scale = float(step_statistics["scale"])
    norms, applied = _updates(step_statistics)
    record = layout.digest_record(step_statistics["rows"], scale, norms, applied)
    return [record, *in_step.source_records()]


def _updates(step_statistics):
    if step_statistics is None or "updates" not in step_statistics:
        return None, 1
    return step_statistics["updates"], int(step_statistics["applied"])


def probe_event_records(event_records, step, at):
    """A probe event's records with the digest an in-step run gives it: the probe's digest
    (`digest.digest_records`) followed by the update rows of every trainable weight, from the
    train step that ended at optimizer step `at` (NaN when none did), so that the probe's events
    and the step's are one series.

    Args:
      event_records: the probe's records (without a digest).
      step: the installed `TrainStep`; one that gives no updates (no `weights`) leaves the
        probe's digest to the writer.
      at: the optimizer's iterations now.
    """
    weights = getattr(step, "weights", None)
    if not weights:
        return event_records
    found = digest.digest_records(event_records)
    if not found:
        return event_records
    ((_, vector, summary_metadata),) = found
    content = metadata.parse_plugin_metadata(summary_metadata.plugin_data.content)
    rows = tuple(tuple(row) for row in content["rows"]) + in_step.update_rows(weights)
    norms, applied = _updates(step.take(at))
    tag, described = in_step.update_series(rows, weights)
    vector = in_step.with_updates(vector, weights, norms, applied).astype(np.float32)
    return [*event_records, (tag, vector, described)]
