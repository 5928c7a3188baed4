"""Synthetic tb_gradviz logs, written with numpy alone.

For plugin tests and benchmarks that need many layers and steps quickly
(e.g. 50 layers x 500 steps): the records have the real format and
metadata, the values are random but shaped like the real thing (ReLU-like
activations, 75 % sparse input-gradients of 2x2/2 max pools).
"""

import numpy as np

from tb_gradviz import format as fmt

_POOL_2X2 = {
    "type": "max",
    "global": False,
    "pool_size": [2, 2],
    "strides": [2, 2],
    "padding": "valid",
    "data_format": "channels_last",
}


def _layer_arrays(rng, batch, size, channels, step):
    """Returns (activation, input_gradient, output_gradient) of a fake 2x2/2 max pool."""
    out_shape = (batch, size // 2, size // 2, channels)
    activation = np.maximum(rng.normal(0.1, 1.0, out_shape), 0)
    output_gradient = rng.normal(0, 1e-3 / (1 + step), out_shape)
    input_gradient = np.zeros((batch, size, size, channels))
    # Route each window's gradient to one position, chosen at random.
    di, dj = rng.integers(0, 2, size=(2,) + out_shape)
    b, i, j, c = np.indices(out_shape)
    input_gradient[b, 2 * i + di, 2 * j + dj, c] = output_gradient
    return activation, input_gradient, output_gradient


def write_run(logdir, layers=4, steps=10, batch=2, size=8, channels=4, seed=0, first_step=1):
    """Writes a run of synthetic max-pool layers into `logdir`.

    Args:
      logdir: the run directory.
      layers: number of layers, named `block<i>/pool`.
      steps: number of log events, at steps `first_step`, `first_step + 1`, ...
      batch, size, channels: the input shape is `[batch, size, size, channels]`.
      seed: numpy seed.

    Returns:
      The list of layer paths written.
    """
    rng = np.random.default_rng(seed)
    names = [f"block{i}/pool" for i in range(layers)]
    log = fmt.EventLog(logdir)
    try:
        for s in range(steps):
            step = first_step + s
            records = []
            for index, name in enumerate(names):
                arrays = _layer_arrays(rng, batch, size, channels, s)
                shapes = [arrays[0].shape, arrays[1].shape, arrays[2].shape]
                for role, array, shape in zip(fmt.ROLES, arrays, shapes):
                    content = {
                        "layer_index": index,
                        "layer_class": "MaxPooling2D",
                        "layer_dtype": "float32",
                        "role": role,
                        "index": 0,
                        "shape": list(shape),
                        "dtype": "float32",
                        "pooling": _POOL_2X2,
                    }
                    records += fmt.tensor_records(
                        name, role, fmt.linear_histogram(array), fmt.stats_vector(array), content
                    )
                activation, input_gradient, output_gradient = arrays
                routing = np.array(
                    [
                        input_gradient.size,
                        activation.size,
                        activation.size,
                        0,
                        input_gradient.sum(),
                        output_gradient.sum(),
                        np.abs(output_gradient).sum(),
                    ],
                    dtype=np.float64,
                )
                records += fmt.routing_records(
                    name,
                    routing,
                    {"layer_index": index, "layer_class": "MaxPooling2D", "layer_dtype": "float32", "pooling": _POOL_2X2},
                )
            log.write(step, records)
    finally:
        log.close()
    return names
