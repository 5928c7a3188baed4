"""From the tensors a probe pass captured to the records of one log event.

Every backend's pass ends here: `host_records` when the tensors come back to
the host (statistics by `kernels`, or by `records`' numpy definition without
numba), `device_records` when the backend summarised them on its device and
only sums and counts come back. Both end in `step_records`, which adds the
routing, units and routing-map records and the metadata of each layer.
Imports neither TensorFlow nor a backend: numpy and Keras' ops only.
"""

import functools
import warnings

import keras
import numpy as np

from tb_gradviz.capture import device_blocks
from tb_gradviz.format import blocks, events, records, routing_map, summaries


def host_map(slices, divisor=None):
    """A routing map's slices as numpy (float16/bfloat16 widened), gradients unscaled."""
    x, input_gradient, output_gradient = (
        np.asarray(keras.ops.convert_to_numpy(t), dtype=np.float64) for t in slices
    )
    if divisor is not None:
        input_gradient, output_gradient = input_gradient / divisor, output_gradient / divisor
    return x, input_gradient, output_gradient


def step_records(plans, summaries, routings, skipped, units, maps=(), map_settings=None):
    """Returns `run`'s result: `(step_records, skipped_paths)`.

    Args:
      plans: the `LayerPlan`s, in model order.
      summaries: `(histogram, stats)` of each plan tensor, in plan order,
        or `(histogram, stats, precision)` to write its precision record too.
      routings: the routing vector of each plan with routing, in order.
      skipped: paths of chosen layers that the pass never called.
      units: `dead_channels` of each plan with a `units_axis`, in order.
      maps: per plan with a `map_cut`, in order, the probe example's
        `(input, input_gradient, output_gradient)` as numpy, the gradients
        unscaled.
      map_settings: the `routing_map.Settings` they were taken with.
    """
    result = []
    summaries, routings, units, maps = iter(summaries), iter(routings), iter(units), iter(maps)
    for plan in plans:
        path = plan.chosen.path
        for t in plan.tensors:
            histogram, stats, *precision = next(summaries)
            tensor = functools.partial(events.tensor_records, path, t.name)
            result += _made(plan, ("tensor", t.name), tensor, histogram, stats, content=t)
            if precision:
                vector = functools.partial(events.precision_records, path, t.name)
                result += _made(plan, ("precision", t.name), vector, *precision, content=t)
        if plan.has_routing:
            routing = functools.partial(events.routing_records, path)
            result += _made(plan, ("routing",), routing, next(routings))
        if plan.units_axis is not None:
            vector = records.units_vector(keras.ops.convert_to_numpy(next(units)))
            dead = functools.partial(events.units_records, path)
            result += _made(plan, ("units",), dead, vector, content="units")
        if plan.map_cut is not None:
            array = routing_map.record(plan.pooling, *next(maps), plan.map_cut, map_settings)
            map_content = dict(plan.content, example=map_settings.example, **plan.map_cut)
            result += events.routing_map_records(plan.chosen.path, array, map_content)
    return result, list(skipped)


def _content(plan, of):
    """The metadata content of a plan's records: of a tensor `of` (a plan tensor), of its units
    record ("units"), else the layer's."""
    content = plan.content
    if of == "units":
        return dict(content, tensor=plan.tensors[0].name, channel_axis=plan.units_axis)
    if of is None:
        return content
    content = dict(content, role=of.role, index=of.index, shape=of.shape, dtype=of.dtype)
    if of.role in records.GRADIENT_ROLES:
        content["loss_scaled"] = of.loss_scaled
    if of.weight is not None:
        content["weight"] = of.weight
        content["compute_dtype"] = of.compute_dtype
    return content


def _made(plan, key, make, *arrays, content=None):
    """`make(*arrays, metadata content)`'s `(tag, array, metadata)` records (`_content(plan,
    content)`): made at the plan's first event, then their tags and metadata again, which
    depend on the plan alone, with this event's `arrays` (bench/RESULTS.md section 20: the
    every-layer event's cost before and after)."""
    made = plan.made.get(key)
    if made is None:
        found = make(*arrays, _content(plan, content))
        plan.made[key] = [(tag, metadata) for tag, _, metadata in found]
        return found
    return [(tag, array, metadata) for (tag, metadata), array in zip(made, arrays)]


def summary_of_row(row):
    """`(histogram, stats, precision)` of a tensor from its row of `device_statistics.tensor_rows`.

    `(histogram, stats)` alone when the row has no precision counts; the
    precision record's block part when the row has the block counts.
    """
    histogram, stats = summaries.summary_from_sums(
        n=row["count"],
        zeros=row["zeros"],
        nans=row["nans"],
        pos_inf=row["pos_inf"],
        neg_inf=row["neg_inf"],
        low=row["low"],
        high=row["high"],
        total=row["total"],
        squares=row["squares"],
        linear=row["linear"],
        magnitude=row["magnitude"].astype(np.float64),
        buckets=len(row["linear"]),
    )
    if "precision_as_is" not in row:
        return histogram, stats
    finite = row["count"] - row["nans"] - row["pos_inf"] - row["neg_inf"]
    zeros, *as_is = row["precision_as_is"]
    below = np.concatenate([as_is, row["precision_scaled"]])
    exponents = row["precision_exponents"]
    precision = summaries.precision_from_below(finite, zeros, below, exponents)
    if "block_width" in row:
        block_part = blocks.record_fields(device_blocks.row_records(row))
        precision = np.concatenate([precision, block_part])
    return histogram, stats, precision


def device_records(plans, rows, routing_counts, skipped, units, maps=(), map_settings=None):
    """Returns `run`'s result from statistics computed on a device.

    Args:
      plans: the `LayerPlan`s.
      rows: per plan tensor, in plan order, its row of device statistics
        (`device_statistics.tensor_rows`).
      routing_counts: `(input_positions, routed_positions, windows,
        tied_windows)` of each plan with routing, in order.
      skipped, units, maps, map_settings: as for `host_records`.
    """
    tensor_summaries, routings = [], []
    rows, counts = iter(rows), iter(routing_counts)
    for plan in plans:
        by_name = {}
        for t in plan.tensors:
            row = by_name[t.name] = next(rows)
            tensor_summaries.append(summary_of_row(row))
        if plan.has_routing:
            input_row = by_name[records.INPUT_GRADIENT]
            output_row = by_name[records.OUTPUT_GRADIENT]
            routings.append(
                np.array(
                    [
                        *map(float, next(counts)),
                        input_row["raw_sum"],
                        output_row["raw_sum"],
                        output_row["raw_abs_sum"],
                    ]
                )
            )
    return step_records(plans, tensor_summaries, routings, skipped, units, maps, map_settings)


def host_routing(counts, input_gradient, output_gradient, divisor=None):
    """Returns the routing record (`records.ROUTING_FIELDS`) from counts and host gradients.

    Args:
      counts: `(input_positions, routed_positions, windows, tied_windows)`.
      input_gradient, output_gradient: numpy arrays; their sums are taken in
        float64, divided by `divisor` (the loss scale) when it is given.
    """

    def unscaled(g):
        g = np.asarray(g, dtype=np.float64)
        return g if divisor is None else g / divisor

    input_gradient, output_gradient = unscaled(input_gradient), unscaled(output_gradient)
    with np.errstate(invalid="ignore"):  # inf - inf in a sum is NaN, as on the device
        return np.array(
            [
                *map(float, counts),
                input_gradient.sum(),
                output_gradient.sum(),
                np.abs(output_gradient).sum(),
            ],
            dtype=np.float64,
        )


def host_summaries(items, block_formats=True):
    """Returns `(histogram, stats, precision)` of each `(values, divisor)`, computed on the host.

    The histogram and stats are of `values / divisor`, the precision record
    of the values as they are (gradients at the loss scale): the casts'
    part, then with `block_formats` the block part, else the casts' part
    alone. With numba (every extra installs it), `kernels` summarises in
    two fused passes per tensor, the block part inside the second; without
    it, the numpy definitions in `summaries` and `blocks` do, in ~20 passes
    (a warning says once which extra to install).
    """
    items = list(items)
    if numba_available():
        from tb_gradviz.capture import kernels

        return kernels.summaries(items, precision=True, block_formats=block_formats)
    else:
        result = []
        for values, divisor in items:
            values = np.asarray(values, dtype=np.float64)
            precision = summaries.precision_vector(values)
            if divisor is not None:
                values = values / divisor
            result.append(
                (summaries.linear_histogram(values), summaries.stats_vector(values), precision)
            )
    if not block_formats:
        return result
    parts = block_fields([values for values, _ in items])
    return [
        (histogram, stats, np.concatenate([cast, part]))
        for (histogram, stats, cast), part in zip(result, parts)
    ]


def block_fields(arrays):
    """The block part of the precision record (`blocks.RECORD_FIELDS`) of each array, as it is.

    With numba, `block_counts` computes each on a thread of its own (the
    kernel releases the GIL), the largest arrays first; without, the numpy
    definition (`blocks.numpy_fields`) does.
    """
    arrays = list(arrays)
    if not numba_available():
        return [blocks.numpy_fields(values) for values in arrays]
    from tb_gradviz.capture import block_counts, threads

    def fields(values):
        return blocks.record_fields(block_counts.block_records(values))

    return threads.in_threads(fields, [(values,) for values in arrays])


_warned_no_numba = []


def numba_available():
    """Whether numba imports; warns once, naming the extra to install, when it does not."""
    try:
        import numba  # noqa: F401
    except ImportError:
        if not _warned_no_numba:
            _warned_no_numba.append(True)
            warnings.warn(
                "tb_gradviz: numba is not installed, so statistics are computed without the fused "
                'host kernel (slower); pip install "numba>=0.60" installs it',
                stacklevel=3,
            )
        return False
    return True


def host_array(t):
    """A backend's tensor as the numpy array the host kernels take (float16, bfloat16 widened)."""
    a = np.asarray(keras.ops.convert_to_numpy(t))
    return a if a.dtype in (np.float32, np.float64) else a.astype(np.float32)


def host_weights(plans, arrays):
    """`{id(variable): array}` of the weights among the values of the plan tensors (in plan order).

    The pass has brought them to the host for their statistics; the update
    records (`weights.Updates`) read the same arrays instead of reading the
    weights again.
    """
    arrays = iter(arrays)
    result = {}
    for plan in plans:
        values = [next(arrays) for _ in plan.tensors]
        weights = [a for t, a in zip(plan.tensors, values) if t.role == records.WEIGHT]
        result.update((id(variable), a) for (_, variable), a in zip(plan.weights, weights))
    return result


def host_records(
    plans,
    arrays,
    divisor,
    routing_counts,
    skipped,
    units,
    maps=(),
    map_settings=None,
    block_formats=True,
):
    """Returns `run`'s result from the captured tensors, summarised on the host.

    Args:
      plans: the `LayerPlan`s.
      arrays: the values of each plan tensor, in plan order (numpy arrays;
        float16 and bfloat16 widened to float32).
      divisor: the loss scale the gradients are to be divided by, or None.
      routing_counts: `(input_positions, routed_positions, windows,
        tied_windows)` of each plan with routing, in order.
      skipped: paths of chosen layers that the pass never called.
      units: `dead_channels` of each plan with a `units_axis`, in order
        (numpy or the backend's tensors).
      maps, map_settings: as for `step_records`.
      block_formats: also the precision record's block part (`host_summaries`).
    """
    tensors = [t for plan in plans for t in plan.tensors]
    summaries = host_summaries(
        [(a, divisor if t.loss_scaled else None) for a, t in zip(arrays, tensors)],
        block_formats,
    )
    by_tensor = iter(arrays)
    counts = iter(routing_counts)
    routings = []
    for plan in plans:
        values = {t.name: next(by_tensor) for t in plan.tensors}
        if plan.has_routing:
            routings.append(
                host_routing(
                    next(counts),
                    values[records.INPUT_GRADIENT],
                    values[records.OUTPUT_GRADIENT],
                    divisor,
                )
            )
    return step_records(plans, summaries, routings, skipped, units, maps, map_settings)
