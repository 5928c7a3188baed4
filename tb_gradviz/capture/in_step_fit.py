"""Puts the in-step digest into a model's train function (`GradVizCallback(digest="step")`).

`install` replaces `model.train_function`, which `fit` makes before it calls
`on_train_begin` and looks up again at every step, with the backend's
(`backends.tf_in_step`, `backends.torch_in_step`): on a step due to be logged
it runs a train step that also computes the chosen layers' digest
statistics, on every other step the train function Keras made. Where that
cannot be done (JAX so far, a model with its own `train_step`, `jit_compile`,
a strategy over several replicas, PyTorch on an accelerator, no numba) the
callback keeps the probe's digest, and a message says why, once.
"""

import warnings

import keras

from tb_gradviz.capture import assemble, in_step

_told = set()  # the reasons already told


def unsupported(model):
    """Why the in-step digest cannot run in `model`'s train step, or None when it can."""
    backend = keras.backend.backend()
    if backend not in ("tensorflow", "torch"):
        return (
            "the in-step digest runs on the TensorFlow and PyTorch backends so far; "
            f"Keras runs on {backend!r}"
        )
    if backend == "tensorflow":
        from keras.src.backend.tensorflow.trainer import TensorFlowTrainer as Trainer
    else:
        from keras.src.backend.torch.trainer import TorchTrainer as Trainer
    if type(model).train_step is not Trainer.train_step:
        return (
            f"{type(model).__name__} defines its own train_step, which the in-step digest "
            "cannot mirror"
        )
    if model.jit_compile:
        return (
            "under jit_compile the compiler compiles the step and its statistics into another "
            "program, whose rounding differs from the plain step's: training would not be the "
            "same bit for bit"
        )
    if backend == "torch" and any(p.device.type != "cpu" for p in model.parameters()):
        return "on PyTorch the in-step digest runs on a CPU only so far"
    if not assemble.numba_available():
        return "the in-step digest's kernel needs numba"
    if backend == "tensorflow":
        replicas = model.distribute_strategy.num_replicas_in_sync
        if replicas > 1:
            return f"the model trains under a tf.distribute strategy with {replicas} replicas"
    if getattr(model, "train_function", None) is None:
        return "the model has no train function (fit makes one before on_train_begin)"
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
      step_statistics: what `TrainStep.take` gave: `{"rows", "scale"}`.
      layout: the `in_step.DigestLayout` of the step.
    """
    scale = float(step_statistics["scale"])
    record = layout.digest_record(step_statistics["rows"], scale)
    return [record, *in_step.source_records()]
