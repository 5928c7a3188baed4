"""Checks of `GradVizCallback`'s arguments, and the probe batch it measures.

Keras' convention throughout: `TypeError` when an argument's type is not one
of those allowed, `ValueError` when its type is allowed and its value is
not. Every message says what is allowed and ends "Received: <argument>=...".
"""

import collections.abc
import os
import sys

import keras
import numpy as np

from tb_gradviz.format import health, leading, storage

_ALTERNATIVES = (
    "the batch itself, (x, y) or (x, y, sample_weight), or a source that can be read again: "
    "a tf.data.Dataset, a keras.utils.PyDataset or a PyTorch DataLoader"
)


def received(name, value):
    """The end of every message: `Received: name=value`."""
    return f"Received: {name}={value!r}"


def check_bool(name, value):
    """Returns `value` as a bool; numpy's bools are accepted.

    Raises:
      TypeError: `value` is not True or False.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False. {received(name, value)}")
    return bool(value)


def check_block_formats(value):
    """Returns `block_formats` as None (chosen per model: `selection.block_formats_for`) or a bool.

    Raises:
      TypeError: `value` is not None, True or False.
    """
    if value is None:
        return None
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(
            "block_formats must be None (on for layers that compute in 16 or 8 bits and for "
            f"pooling layers), True or False. {received('block_formats', value)}"
        )
    return bool(value)


def check_positive_int(name, value):
    """Returns `value` as an int >= 1.

    Raises:
      TypeError: `value` is not an integer (a bool is not one).
      ValueError: it is below 1.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive integer. {received(name, value)}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer. {received(name, value)}")
    return int(value)


def check_frequency(every_n_epochs, every_n_batches):
    """Returns `(every_n_epochs, every_n_batches)`, exactly one of them an int, the other None.

    Raises:
      TypeError, ValueError: one is not a positive integer, both are given,
        or neither.
    """
    if every_n_batches is None:
        if every_n_epochs is None:
            raise ValueError(
                "every_n_epochs=None logs only with every_n_batches; pass one of them. "
                "Received: every_n_epochs=None, every_n_batches=None"
            )
        return check_positive_int("every_n_epochs", every_n_epochs), None
    every_n_batches = check_positive_int("every_n_batches", every_n_batches)
    if every_n_epochs is not None and not (
        isinstance(every_n_epochs, (int, np.integer))
        and not isinstance(every_n_epochs, (bool, np.bool_))
        and every_n_epochs == 1
    ):
        raise ValueError(
            "Pass either every_n_epochs or every_n_batches, not both. "
            f"Received: every_n_epochs={every_n_epochs!r}, every_n_batches={every_n_batches!r}"
        )
    return None, every_n_batches


def check_step(step):
    """Returns `log_now`'s `step` as an int >= 0.

    Raises:
      TypeError: `step` is not an integer (a bool is not one).
      ValueError: it is negative.
    """
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)):
        raise TypeError(f"step must be a non-negative integer. {received('step', step)}")
    if step < 0:
        raise ValueError(f"step must be a non-negative integer. {received('step', step)}")
    return int(step)


def check_log_dir(log_dir):
    """Returns the `storage.Location` of `log_dir`, a directory that can be created.

    A URL is only parsed, without touching the network: a store's errors come
    at the first upload, and training goes on (`upload.Uploader`).

    Raises:
      TypeError, ValueError: `log_dir` is not a path or URL, or a local one
        is a file or lies below a file.
    """
    location = storage.location(log_dir, "log_dir")
    if location.local_path is None:
        return location
    path = os.path.abspath(location.local_path)  # "a_file/" is the file too
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(
            f"log_dir must be a directory; it is a file. {received('log_dir', location.url)}"
        )
    # Fail now rather than at the first log event, after training has run.
    ancestor = os.path.dirname(path)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise ValueError(
            f"log_dir must be a directory; it cannot be created inside {ancestor!r}, a file. "
            f"{received('log_dir', location.url)}"
        )
    return location


def check_probe_inputs(model, x):
    """Checks the probe's `x` against the inputs the model declares.

    Functional and Sequential models declare their inputs (`keras.Input`);
    dimensions given as None there (the batch, or a free image size) accept
    any size. Subclassed models declare none, and are not checked.

    Raises:
      ValueError: an input is missing, or has another rank or size than
        declared; the message gives the received and the expected shapes.
    """
    try:
        declared = model.inputs
    except AttributeError:
        return  # a subclassed model, or a Sequential one without an Input
    if isinstance(model, keras.Sequential) or len(declared) == 1:
        expected = [(None, declared[0])]
    elif isinstance(model.input, dict):
        expected = list(model.input.items())
    else:
        expected = [(t.name, t) for t in declared]

    if isinstance(x, dict) and expected[0][0] is not None:
        missing = [name for name, _ in expected if name not in x]
        if missing:
            raise ValueError(
                f"probe_data x has no input named {', '.join(map(repr, missing))} for model "
                f"{model.name!r}, which expects keys {[n for n, _ in expected]}. "
                f"Received: probe_data x, a dict with keys {sorted(x)}"
            )
        pairs = [(name, spec, x[name]) for name, spec in expected]
    else:
        received_inputs = keras.tree.flatten(x)
        if len(received_inputs) != len(expected):
            raise ValueError(
                f"probe_data x must hold {len(expected)} input(s) for model {model.name!r}. "
                f"Received: probe_data x with {len(received_inputs)}"
            )
        pairs = [(name, spec, t) for (name, spec), t in zip(expected, received_inputs)]

    for name, spec, tensor in pairs:
        want, got = tuple(spec.shape), tuple(tensor.shape)
        fits = len(want) == len(got) and all(w is None or w == g for w, g in zip(want[1:], got[1:]))
        if not fits:
            which = "" if name is None else f" {name!r}"
            raise ValueError(
                f"probe_data x{which} does not fit model {model.name!r}: it expects shape "
                f"{want} (None: any size). Received: probe_data x{which} of shape {got}"
            )


def probe_batch(probe_data):
    """Returns `(x, y, sample_weight)` backend tensors from the callback's `probe_data`.

    `probe_data` is `(x, y)` or `(x, y, sample_weight)` (numpy arrays or
    tensors of any backend, or dicts/lists of them), or a source of such
    batches that can be read again, whose first batch is taken: a
    `tf.data.Dataset`, a `keras.utils.PyDataset`, a PyTorch `DataLoader`, or
    any other iterable whose `iter()` gives a new iterator.

    Raises:
      TypeError: `probe_data` (or a source's first batch) is not a tuple or
        list, or is a one-shot iterator such as a generator: taking its
        first batch would consume it, and if the same iterator feeds `fit`,
        training would silently lose that batch.
      ValueError: the tuple does not hold 2 or 3 parts, x or y is None, a
        source yields nothing, or the parts disagree on the batch size.
    """
    probe_data, source = _first_batch(probe_data)
    label = "probe_data=" if source == "probe_data" else ""
    if not isinstance(probe_data, (tuple, list)):
        raise TypeError(
            f"{source} must be (x, y) or (x, y, sample_weight). "
            f"Received: {label}{_describe(probe_data)}"
        )
    if len(probe_data) not in (2, 3):
        raise ValueError(
            f"{source} must be (x, y) or (x, y, sample_weight). "
            f"Received: {label}a {type(probe_data).__name__} of length {len(probe_data)}"
        )
    x, y, *rest = probe_data
    sample_weight = rest[0] if rest else None
    if x is None or y is None:
        raise ValueError(
            f"{source} must hold both x and y. Received: x={type(x).__name__}, y={type(y).__name__}"
        )
    x, y = (keras.tree.map_structure(_as_tensor, part) for part in (x, y))
    if sample_weight is not None:
        sample_weight = _as_tensor(sample_weight)
    sizes = {
        int(t.shape[0])
        for t in keras.tree.flatten((x, y, sample_weight))
        if t is not None and len(t.shape) and t.shape[0] is not None
    }
    if len(sizes) > 1:
        raise ValueError(
            f"The parts of {source} must have the same batch size. "
            f"Received: batch sizes {sorted(sizes)}"
        )
    if sizes == {0}:
        raise ValueError(f"{source} needs at least one example. Received: batch size 0")
    return x, y, sample_weight


def _first_batch(probe_data):
    """Returns `(batch, name)`: `probe_data` itself, or the first batch of a source of batches."""
    if (
        isinstance(probe_data, (tuple, list, dict, str, bytes, np.ndarray))
        or keras.ops.is_tensor(probe_data)
        or not hasattr(probe_data, "__iter__")
    ):
        return probe_data, "probe_data"
    kind = _source_kind(probe_data)
    if kind is None:
        raise TypeError(
            f"probe_data is a one-shot iterator (a {type(probe_data).__name__}): taking its first "
            "batch would consume it, and if it also feeds fit, training would lose that batch. "
            f"Pass {_ALTERNATIVES}. Received: probe_data={probe_data!r}"
        )
    if isinstance(probe_data, keras.utils.PyDataset):
        batch = probe_data[0] if len(probe_data) else None
    else:
        batch = next(iter(probe_data), None)
    if batch is None:
        raise ValueError(
            f"probe_data must yield at least one (x, y) batch. Received: an empty {kind}"
        )
    return batch, f"the first batch of probe_data (a {kind})"


def _source_kind(probe_data):
    """Names the kind of batch source `probe_data` is; None for a one-shot iterator."""
    # Only a module the user has already imported can have made probe_data.
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(probe_data, tf.data.Dataset):
        return "tf.data.Dataset"
    if isinstance(probe_data, keras.utils.PyDataset):
        return "keras.utils.PyDataset"
    data = sys.modules.get("torch.utils.data")
    if data is not None and isinstance(probe_data, data.DataLoader):
        return "torch DataLoader"
    if isinstance(probe_data, collections.abc.Iterator):
        return None
    return type(probe_data).__name__


def _describe(value):
    if isinstance(value, np.ndarray) or keras.ops.is_tensor(value):
        return f"a {type(value).__name__} of shape {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 80 else f"a {type(value).__name__}"


def _as_tensor(t):
    # Tensors of another framework (a tf.data batch on JAX, say) pass through numpy.
    if not keras.ops.is_tensor(t) and hasattr(t, "numpy"):
        t = t.numpy()
    return keras.ops.convert_to_tensor(t)


def check_loss(model, loss):
    """Raises ValueError when the probe has no loss: neither `loss` nor a compiled or added one."""
    if loss is None and getattr(model, "_compile_loss", None) is None and not model.losses:
        raise ValueError(
            "GradVizCallback needs a loss: compile the model with one, or pass loss= "
            "(a Keras loss name, function or Loss instance). Received: loss=None"
        )


def check_probe_targets(model, loss, x, y, sample_weight):
    """Checks that the probe's `y` fits the model's output under the loss.

    The loss is computed once on zeros of the model's declared output shape,
    before any step, so a `y` that the loss cannot take (another shape, a
    label beyond the classes) fails when `fit` starts rather than at the
    first log event. Models that declare no single output with a known
    shape apart from the batch (subclassed models, several outputs, free
    dimensions) are not checked.

    Raises:
      ValueError: the loss fails on `y`; the message gives both shapes.
    """
    try:
        outputs = model.outputs
    except (AttributeError, ValueError):
        return
    if not outputs or len(outputs) != 1:
        return
    shape = tuple(outputs[0].shape)[1:]
    batch = len(keras.tree.flatten(x)[0])
    if any(dim is None for dim in shape):
        return
    y_pred = keras.ops.zeros((batch, *shape), dtype=outputs[0].dtype)
    try:
        if loss is not None:
            loss(y, y_pred, sample_weight=sample_weight)
        else:
            model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
    except Exception as error:  # the loss's own error, whatever its type, is quoted
        shapes = keras.tree.map_structure(lambda t: tuple(np.shape(t)), y)
        raise ValueError(
            f"probe_data's y does not fit the output of model {model.name!r}, of shape "
            f"{(batch, *shape)}, under its loss: {type(error).__name__}: {error}. "
            f"Received: probe_data y of shape {shapes}"
        ) from error


def check_stop_on(stop_on):
    """Returns `(names, predicate)` from the callback's `stop_on=`.

    `stop_on` is None, a flag or warning name, a list or tuple of them, or a
    callable called with the list of what a log event raised (each
    `{"flag", "class", "step", "layer", "tensor"}`) that returns True to stop.

    Raises:
      TypeError: not None, a str, a list or tuple of str, or a callable.
      ValueError: an unknown name, or an empty list.
    """
    allowed = ", ".join(health.FLAGS + leading.WARNINGS)
    if stop_on is None:
        return (), None
    if callable(stop_on):
        return (), stop_on
    names = [stop_on] if isinstance(stop_on, str) else stop_on
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise TypeError(
            "stop_on must be None, a flag or warning name, a list of them, or a callable "
            f"(raised -> bool); the names are {allowed}. Received: stop_on={stop_on!r}"
        )
    unknown = [name for name in names if name not in health.FLAGS + leading.WARNINGS]
    if unknown or not names:
        raise ValueError(
            f"stop_on must name flags or warnings among {allowed}; "
            f"received unknown {unknown or 'nothing'}. Received: stop_on={stop_on!r}"
        )
    return tuple(dict.fromkeys(names)), None
