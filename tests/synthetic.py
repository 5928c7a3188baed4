"""Synthetic tb_gradviz logs, written with numpy alone.

For plugin tests and benchmarks that need many layers and steps quickly
(e.g. 50 layers x 500 steps). Each layer is a real 2x2/2 max pool computed
in numpy on a ReLU-like random input: its output, the gradient routed to
each window's first maximum (raster order, as TensorFlow's CPU kernel) and
the routing record counted from those arrays, so ties and zeros are what a
max pool gives. Like the callback, each step is one event holding every
layer.

`write_run` computes every record from its own arrays and writes it with
`events.EventLog`. `write_large_run` is for scale tests (200 layers x 1000
steps is ~0.9 GB of records): it computes a few records per layer, reuses
them across steps, and writes serialized events straight to an
`events.EventFile`.
"""

import time

import numpy as np
from tensorboard.compat.proto import event_pb2

from tb_gradviz.format import digest, digest_levels, digest_parts, events, records, summaries

_POOL_2X2 = {
    "type": "max",
    "global": False,
    "pool_size": [2, 2],
    "strides": [2, 2],
    "padding": "valid",
    "data_format": "channels_last",
}


def max_pool_2x2(inputs, output_gradient):
    """A 2x2/2 max pool of `[b, h, w, c]` inputs (h, w even) and its backward pass.

    Returns:
      `(outputs, input_gradient, routing)`: each window's maximum; the
      upstream gradient of each window sent to its first maximum in raster
      order, zero elsewhere; and the routing record (`records.ROUTING_FIELDS`)
      counted from these arrays.
    """
    b, h, w, c = inputs.shape
    windows = (
        inputs.reshape(b, h // 2, 2, w // 2, 2, c)
        .transpose(0, 1, 3, 5, 2, 4)
        .reshape(b, h // 2, w // 2, c, 4)
    )
    outputs = windows.max(axis=-1)
    winner = windows.argmax(axis=-1)  # the first maximum
    tied = np.count_nonzero((windows == outputs[..., None]).sum(axis=-1) > 1)
    bi, i, j, ci = np.indices(outputs.shape)
    rows, cols = 2 * i + winner // 2, 2 * j + winner % 2
    input_gradient = np.zeros(inputs.shape)
    input_gradient[bi, rows, cols, ci] = output_gradient
    routed = np.zeros(inputs.shape, bool)
    routed[bi, rows, cols, ci] = True
    routing = np.array(
        [
            inputs.size,
            np.count_nonzero(routed),
            outputs.size,
            tied,
            input_gradient.sum(),
            output_gradient.sum(dtype=np.float64),
            np.abs(output_gradient).sum(dtype=np.float64),
        ]
    )
    return outputs, input_gradient, routing


def pool_arrays(rng, batch=2, size=8, channels=4, step=0, gradient_scale=1.0):
    """Returns `(inputs, output_gradient)` of a synthetic max pool at `step`.

    The inputs are ReLU-like (about half exact zeros, so some windows tie);
    the upstream gradient shrinks as `gradient_scale * 1e-3 / (1 + step)`.
    """
    inputs = np.maximum(rng.normal(0.1, 1.0, (batch, size, size, channels)), 0).astype(np.float32)
    output_gradient = rng.normal(
        0, gradient_scale * 1e-3 / (1 + step), (batch, size // 2, size // 2, channels)
    ).astype(np.float32)
    return inputs, output_gradient


def pool_records(rng, name, index, batch=2, size=8, channels=4, step=0, gradient_scale=1.0):
    """Returns the `(tag, array, metadata)` records of one synthetic 2x2/2 max pool.

    Args:
      rng: a `numpy.random.Generator`.
      name: the layer path.
      index: the layer's index in the model.
      batch, size, channels: the input shape is `[batch, size, size, channels]`.
      step: the output gradient shrinks as `gradient_scale * 1e-3 / (1 + step)`.
      gradient_scale: a factor on the output gradient.
    """
    inputs, output_gradient = pool_arrays(rng, batch, size, channels, step, gradient_scale)
    activation, input_gradient, routing = max_pool_2x2(inputs, output_gradient)
    layer_content = {
        "layer_index": index,
        "layer_class": "MaxPooling2D",
        "layer_dtype": "float32",
        "pooling": _POOL_2X2,
    }
    result = []
    for role, array in zip(records.TENSOR_ROLES, (activation, input_gradient, output_gradient)):
        content = dict(layer_content, role=role, index=0, shape=list(array.shape), dtype="float32")
        result += events.tensor_records(
            name, role, summaries.linear_histogram(array), summaries.stats_vector(array), content
        )
    return result + events.routing_records(name, routing, layer_content)


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
    log = events.EventLog(logdir)
    try:
        for s in range(steps):
            step = first_step + s
            step_records = []
            for index, name in enumerate(names):
                step_records += pool_records(rng, name, index, batch, size, channels, s)
            log.write(step, step_records)
    finally:
        log.close()
    return names


def _summary_field(layer_records, with_metadata):
    """The serialized `summary` field (number 5) of an Event holding `layer_records`.

    Serialized fields of one message concatenate: an Event followed by
    several such fields holds one Summary with all their values.
    """
    summary = events.summary_proto(layer_records, lambda tag: with_metadata)
    return event_pb2.Event(summary=summary).SerializeToString()


def _fields_and_digest(layer_records):
    """`(summary fields, digest record)` of an event holding `layer_records` (one list a layer)."""
    fields = b"".join(_summary_field(records_, with_metadata=False) for records_ in layer_records)
    (found,) = digest.digest_records([r for records_ in layer_records for r in records_])
    return fields, found


class DigestFields:
    """The serialized digest field of each event, in its part (`digest_parts.Parts`), as
    `EventLog` writes it: the metadata with the first value of each part's tag. With
    `in_parts=False`, under the rows' tag alone, as before layout 13. With `levels`, followed
    by the digest's coarser levels that the event finishes (`digest_levels.Levels`, layout 15)."""

    def __init__(self, in_parts=True, levels=False):
        self._parts = digest_parts.Parts() if in_parts else None
        self._levels = digest_levels.Levels() if levels and in_parts else None
        self._tags = set()  # the parts' tags written
        self._fields = {}  # (tag, id of the digest record) -> its field without metadata

    def __call__(self, step, found):
        finished = [] if self._levels is None else self._levels.add(step, found)
        record = found if self._parts is None else self._parts.place(step, found)
        tag = record[0]
        levels = b"".join(self._field(level) for level in finished)
        if tag not in self._tags:
            return self._field(record) + levels
        key = (tag, id(found))
        if key not in self._fields:
            self._fields[key] = _summary_field([record], with_metadata=False)
        return self._fields[key] + levels

    def _field(self, record):
        """A record's field, with its metadata when it is its tag's first value."""
        first = record[0] not in self._tags
        self._tags.add(record[0])
        return _summary_field([record], with_metadata=first)


def write_large_run(
    logdir,
    layers=200,
    steps=1000,
    variants=4,
    seed=0,
    first_step=1,
    wall_time=None,
    spike=None,
    layer_spike=None,
    levels=False,
):
    """Writes a large run of synthetic max-pool layers quickly, in the real format.

    Each layer gets `variants` sets of records (computed as `write_run`
    computes them); step `first_step + s` uses set `s % variants`. Each step
    is one event holding every layer in model order, as the callback writes
    it, and each tag's metadata goes with its first value in the file, as
    `EventLog` writes it.

    Args:
      logdir: the run directory.
      layers: number of layers, named `block<i>/pool`.
      steps: number of steps, `first_step`, `first_step + 1`, ...
      variants: distinct record sets per layer.
      seed: numpy seed.
      first_step: the first step.
      wall_time: the first event's wall time (seconds); steps are one
        second apart. Defaults to now.
      spike: None, or `(step, scale)`: at that step every layer's gradients
        are `scale` times larger (a one-step spike).
      layer_spike: None, or `(step, index, scale)`: at that step the gradients of the
        layer at `index` alone are `scale` times larger (by `scale=1e6`, that layer raises
        `exploding` there, against the last layer's).
      levels: whether the digest's coarser levels are written too (`DigestFields`).

    Returns:
      `(names, path)`: the layer paths written and the event file's path.
    """
    rng = np.random.default_rng(seed)
    names = [f"block{i}/pool" for i in range(layers)]
    # variant_fields[variant]: every layer's summary field of that variant;
    # the first event carries the metadata.
    sets = [
        [pool_records(rng, name, index, 2, 8, 4, v) for v in range(variants)]
        for index, name in enumerate(names)
    ]
    # Each event ends with the digest of its records in its part, as `EventLog` writes it.
    digests = [
        digest.digest_records([r for layer in sets for r in layer[v]])[0] for v in range(variants)
    ]
    variant_fields = [
        b"".join(_summary_field(fields, with_metadata=False) for fields in layer_sets)
        for layer_sets in zip(*sets)
    ]
    first_fields = b"".join(
        _summary_field(fields, with_metadata=True) for fields in (layer[0] for layer in sets)
    )
    special = {}  # step -> (fields, digest record) of a spiked event
    if spike is not None:
        spiked = [pool_records(rng, name, i, 2, 8, 4, 0, spike[1]) for i, name in enumerate(names)]
        special[spike[0]] = _fields_and_digest(spiked)
    if layer_spike is not None:
        _, spiked_index, scale = layer_spike
        layer_fields = [
            pool_records(rng, name, i, 2, 8, 4, 0, scale) if i == spiked_index else layer[0]
            for i, (name, layer) in enumerate(zip(names, sets))
        ]
        special.setdefault(layer_spike[0], _fields_and_digest(layer_fields))
    digest_field = DigestFields(levels=levels)
    start = time.time() if wall_time is None else wall_time
    event_file = events.EventFile(logdir, wall_time=start)
    try:
        for s in range(steps):
            step = first_step + s
            prefix = event_pb2.Event(wall_time=start + s, step=step).SerializeToString()
            fields, found = (
                (first_fields if s == 0 else variant_fields[s % variants], digests[s % variants])
                if s == 0 or step not in special
                else special[step]
            )
            fields += digest_field(step, found)
            event_file.write(prefix + fields)
    finally:
        event_file.close()
    return names, event_file.path
