"""Synthetic tb_gradviz logs, written with numpy alone.

For plugin tests and benchmarks that need many layers and steps quickly
(e.g. 50 layers x 500 steps): the records have the real format and
metadata, the values are random but shaped like the real thing (ReLU-like
activations, 75 % sparse input-gradients of 2x2/2 max pools).

`write_run` computes every record from its own arrays and writes it with
`format.EventLog`. `write_large_run` is for scale tests (200 layers x 1000
steps is ~0.9 GB of records): it computes a few records per layer, reuses
them across steps, and writes serialized events straight to a
`format.EventFile`.
"""

import time

import numpy as np
from tensorboard.compat.proto import event_pb2

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


def pool_records(rng, name, index, batch=2, size=8, channels=4, step=0):
    """Returns the `(tag, array, metadata)` records of one synthetic 2x2/2 max pool.

    Args:
      rng: a `numpy.random.Generator`.
      name: the layer path.
      index: the layer's index in the model.
      batch, size, channels: the input shape is `[batch, size, size, channels]`.
      step: the output gradient shrinks as `1e-3 / (1 + step)`.
    """
    arrays = _layer_arrays(rng, batch, size, channels, step)
    records = []
    for role, array in zip(fmt.ROLES, arrays):
        content = {
            "layer_index": index,
            "layer_class": "MaxPooling2D",
            "layer_dtype": "float32",
            "role": role,
            "index": 0,
            "shape": list(array.shape),
            "dtype": "float32",
            "pooling": _POOL_2X2,
        }
        records += fmt.tensor_records(name, role, fmt.linear_histogram(array), fmt.stats_vector(array), content)
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
    return records


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
                records += pool_records(rng, name, index, batch, size, channels, s)
            log.write(step, records)
    finally:
        log.close()
    return names


def _summary_field(records, with_metadata):
    """The serialized `summary` field (number 5) of an Event holding `records`."""
    summary = fmt.summary_proto(records, lambda tag: with_metadata)
    return event_pb2.Event(summary=summary).SerializeToString()


def write_large_run(logdir, layers=200, steps=1000, variants=4, seed=0, first_step=1, wall_time=None):
    """Writes a large run of synthetic max-pool layers quickly, in the real format.

    Each layer gets `variants` sets of records (computed as `write_run`
    computes them); step `first_step + s` uses set `s % variants`. Each
    (step, layer) is one event, layers of a step in model order, and each
    tag's metadata goes with its first value in the file, as `EventLog`
    writes it. 200 layers x 1000 steps took 8-17 s and 0.9 GB here.

    Args:
      logdir: the run directory.
      layers: number of layers, named `block<i>/pool`.
      steps: number of steps, `first_step`, `first_step + 1`, ...
      variants: distinct record sets per layer.
      seed: numpy seed.
      first_step: the first step.
      wall_time: the first event's wall time (seconds); steps are one
        second apart. Defaults to now.

    Returns:
      `(names, path)`: the layer paths written and the event file's path.
    """
    rng = np.random.default_rng(seed)
    names = [f"block{i}/pool" for i in range(layers)]
    # fields[layer][variant]; the first event of a layer carries the metadata.
    fields = []
    first_fields = []
    for index, name in enumerate(names):
        sets = [pool_records(rng, name, index, 2, 8, 4, v) for v in range(variants)]
        fields.append([_summary_field(records, with_metadata=False) for records in sets])
        first_fields.append(_summary_field(sets[0], with_metadata=True))
    start = time.time() if wall_time is None else wall_time
    events = fmt.EventFile(logdir, wall_time=start)
    try:
        for s in range(steps):
            prefix = event_pb2.Event(wall_time=start + s, step=first_step + s).SerializeToString()
            events.write(*(prefix + (first_fields[i] if s == 0 else fields[i][s % variants]) for i in range(layers)))
    finally:
        events.close()
    return names, events.path
