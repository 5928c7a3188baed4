"""Hand-written references in the Keras backend's own autodiff, for tests on every backend."""

import keras
import numpy as np

BACKEND = keras.backend.backend()


def gradients(f, argument):
    """`(f(argument), d f / d argument)` as numpy, in the backend's own autodiff."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        argument = tf.convert_to_tensor(argument)
        with tf.GradientTape() as tape:
            tape.watch(argument)
            value = f(argument)
        # An embedding's gradient comes as tf.IndexedSlices: made dense.
        return np.asarray(value), tf.convert_to_tensor(tape.gradient(value, argument)).numpy()
    if BACKEND == "jax":
        import jax

        value, grad = jax.value_and_grad(f)(keras.ops.convert_to_tensor(argument))
        return np.asarray(value), np.asarray(grad)
    import torch

    argument = keras.ops.convert_to_tensor(argument).detach().requires_grad_(True)
    value = f(argument)
    (grad,) = torch.autograd.grad(value, argument)
    return value.detach().float().cpu().numpy(), grad.float().cpu().numpy()


def numpy(t):
    return keras.ops.convert_to_numpy(
        keras.ops.cast(t, "float32") if "bfloat16" in str(t.dtype) else t
    )


def tracing_count(capture):
    """How many times a capture's probe pass was traced; None on PyTorch, which runs it eagerly."""
    if BACKEND == "tensorflow":
        return capture._probe.experimental_get_tracing_count()
    if BACKEND == "jax":
        return 0 if capture._pass is None else capture._pass._cache_size()
    return None
