"""The statistics of captured tensors on their device: packed chunks, comparison counts, two reads.

One implementation for every backend, written in `keras.ops`: JAX runs it
jitted, TensorFlow inside an XLA-compiled `tf.function` (`tf_statistics`),
PyTorch eagerly. Only sums and counts leave the device; `assemble` turns
them into records with `summaries.summary_from_sums`, as it does the host
kernel's.

- Tensors are named in groups (`chunks`: one number of elements, dtype and
  divisor, at most `CHUNK_VALUES` values), and each group's results come back
  as `[R, ...]` rows. The work itself runs on chunks (`device_packing`): the
  tensors of one dtype packed, zero-padded, into `[rows, ROW_VALUES]` buffers
  of a few shapes, where each tensor has a slot and each row says (as data)
  which slot it holds, which of its values are padding and whether the
  divisor divides it (`packed_statistics`). A chunk's program depends on its
  dtype, rows and slots only, so an event of any depth compiles a few
  (`device_programs.GroupPrograms`). Each row's sums and counts are combined
  into its slot's by a one-hot comparison (`device_packing.to_slots`).
- Each chunk is read twice. The first read takes the extrema, the sums and
  every count of `device_counts.FIRST_PASS_COUNTS`; the second, which needs
  each tensor's extrema and mean, the squared deviations,
  `device_counts.SECOND_PASS_COUNTS` and the block record (`device_blocks`,
  which needs NVFP4's tensor amax from the first).
- The precision record's counts compare each value's magnitude bits with
  integer keys (`device_precision`): the boundaries as they are in the first
  read, scaled by each tensor's `2**-k` (from the first read's largest finite
  magnitude) in the second. They see the values as captured, not divided.
- Every count is the reduction of a comparison (`device_counts`:
  `sum(values >= threshold)`, `sum(bucket == j)`): no scatter, no sort, no
  searchsorted. The magnitude bins come from cumulative counts against
  `records.LOG_EDGES`, the linear buckets from a one-hot comparison of each
  value's bucket, `floor((v - low) / width)`, in float64 as the definition.
- Values are widened to float64 exactly (`device_precision.widened`: float32
  subnormals too, which a device that flushes to zero would make 0), zero
  and sign read from the bits, so counts and extrema equal
  `summaries.stats_vector`'s and `linear_histogram`'s exactly, and the sums
  differ from numpy's only in the order of float64 additions.
- How a chunk is walked depends on what compiles it (`MODES`). XLA on an
  accelerator fuses each comparison into its reduction, so a pass is one
  read of the chunk (`"fused"`). XLA on the CPU materialises the input of
  every reduction (`T` values per value for `T` thresholds), so there each
  pass walks the chunk in a loop of whole rows, `STEP_VALUES` values at most
  (`"stepped"`), which bounds the working memory whatever the chunk's size. Without a
  compiler (PyTorch), a pass compares `EAGER_THRESHOLDS` thresholds at a
  time (`"eager"`).

A new per-tensor count (one number, or one per threshold) is one
`device_counts.Count` in `FIRST_PASS_COUNTS` (it sees the values) or
`SECOND_PASS_COUNTS` (it also sees each tensor's extrema, mean and precision
keys); its result comes back under its name in every tensor's row
(`tensor_rows`).
"""

import keras
import numpy as np

from tb_gradviz.capture import device_blocks, device_counts, device_packing, device_precision
from tb_gradviz.format import records

ops = keras.ops

# The most values one group stacks (a single larger tensor is a group of its own).
CHUNK_VALUES = 1 << 21

MODES = ("fused", "stepped", "eager")

# "stepped": the values of a group (all its rows together) read per step of the loop.
STEP_VALUES = 1 << 14

# "eager": the thresholds compared at once (each materialises a boolean per value).
EAGER_THRESHOLDS = 4

# The sums and extrema of each row, as `summaries.summary_from_sums` names them,
# then the plain sum and the sum of magnitudes of all values (the routing
# record's; NaN when a value is).
SUMS = ("low", "high", "total", "squares", "raw_sum", "raw_abs_sum")


def group_statistics(
    rows,
    divisor=None,
    buckets=records.HISTOGRAM_BUCKETS,
    mode="fused",
    precision=True,
    width=None,
):
    """Returns the sums and counts of each of `rows`, as a dict of `[R, ...]` tensors.

    Args:
      rows: R flat floating-point tensors of one length and dtype (float16
        and bfloat16 widen exactly).
      divisor: None, or the float64 number the widened values are divided by
        first (the loss scale).
      buckets: the number of linear histogram buckets.
      mode: one of `MODES`: how the group is walked (see the module docstring).
      precision: whether to count the precision record
        (`device_counts.PRECISION_COUNTS`).
      width: None, or the length of the last axis of the tensors the rows
        hold: then the block record (`device_blocks`) of each row too, of the
        values as captured (not divided).

    Returns:
      `SUMS` (float64 `[R]`), every count of `device_counts`' `FIRST_PASS_COUNTS`
      and `SECOND_PASS_COUNTS` (int32 `[R]` or `[R, T]`), `magnitude`, the
      `[R, 2 * MAGNITUDE_BINS]` bins (negative then positive, the zeros in
      negative bin 0) that `summaries.summary_from_sums` takes, and with
      `precision`, `precision_exponents` (int64 `[R, 4]`: the scale exponent
      per format), and with `width`, `block/<format>/<count>` of
      `device_blocks.COUNTS` and `SUMS` (`[R]`) and `block_width`.

    Raises:
      ValueError: `mode` is not one of `MODES`.
    """
    scaled = [divisor is not None] * len(rows)
    divisor = 1.0 if divisor is None else divisor
    widths = None if width is None else [width] * len(rows)
    (result,) = chunk_statistics(
        [list(range(len(rows)))], scaled, rows, divisor, mode, precision, widths, buckets
    )
    return result


def packed_statistics(
    buffer, data, divisor, slots, mode, precision, blocks, buckets=records.HISTOGRAM_BUCKETS
):
    """The sums and counts of the tensors packed in a chunk, per slot (`device_packing`).

    Args:
      buffer: the chunk, `[rows, ROW_VALUES]` values of one dtype.
      data: `device_packing.Chunk.data`, as tensors.
      divisor: the float64 scalar that divides the rows whose `scaled` is 1.
      slots: the number of slots.
      mode, precision: as for `group_statistics`.
      blocks: whether to count the block record.
      buckets: the number of linear histogram buckets.

    Returns:
      `group_statistics`' dict with a row per slot, without `block_width`.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}. Received: mode={mode!r}")
    n_rows, row_values = buffer.shape
    # Stepped: the most whole rows within STEP_VALUES values, a power of two (which divides
    # the chunk's rows).
    step = _floor_power_of_two(STEP_VALUES // row_values) if mode == "stepped" else n_rows
    step = min(step, n_rows)
    thresholds_at_once = EAGER_THRESHOLDS if mode == "eager" else None
    bits_width = device_precision.width(buffer.dtype)
    inf_bits = ops.convert_to_tensor(
        np.array(device_precision.INF_BITS[bits_width], "int64" if bits_width == 64 else "int32")
    )
    divisor = ops.cast(divisor, "float64")
    first_counts, second_counts = (
        tuple(c for c in counts if precision or c.name not in device_counts.PRECISION_COUNTS)
        for counts in (device_counts.FIRST_PASS_COUNTS, device_counts.SECOND_PASS_COUNTS)
    )
    slot_ids = ops.arange(slots, dtype="int32")

    def rows_of(start, length):
        raw = ops.slice(buffer, [start, 0], [length, row_values])
        row = {k: ops.slice(v, [start], [length])[:, None] for k, v in data.items()}
        position = row["first"] + ops.arange(row_values, dtype="int32")[None, :]
        # A padding row's line is 0: PyTorch's integer remainder by 0 raises, so take it by 1.
        line = ops.maximum(row["line"], 1)
        valid = ops.logical_and(
            ops.less(position, row["length"]), ops.less(position % line, row["width"])
        )
        signed = device_precision.float_bits(raw, bits_width)
        bits = device_precision.magnitude_bits(signed, bits_width)
        bits = ops.where(valid, bits, inf_bits)  # padding: above every key, not finite
        v = device_precision.widened(raw, signed, bits_width)
        row_divisor = ops.where(ops.equal(row["scaled"], 1), divisor, ops.cast(1.0, "float64"))
        v = device_precision.divide(v, row_divisor, like=v)
        finite = ops.logical_and(ops.isfinite(v), valid)
        rows = device_counts.Rows(
            v[:, None],
            finite[:, None],
            ops.where(finite, v, 0.0)[:, None],
            bits[:, None],
            bits_width,
            signed[:, None],
            buckets,
        )
        return rows, ops.equal(row["slot"], slot_ids[None, :]), raw  # one-hot [r, slots]

    def first_pass(read):
        rows, one_hot, raw = read
        v, finite = rows.values, rows.finite
        result = {  # [r] each
            "low": ops.min(ops.where(finite, v, np.inf), axis=2)[:, 0],
            "high": ops.max(ops.where(finite, v, -np.inf), axis=2)[:, 0],
            "total": ops.sum(rows.finite_values, axis=2)[:, 0],
            "raw_sum": ops.sum(v, axis=2)[:, 0],
            "raw_abs_sum": ops.sum(ops.abs(v), axis=2)[:, 0],
        }
        if precision:
            result["amax_bits"] = device_precision.finite_amax_bits(rows.bits, bits_width, axis=2)[
                :, 0
            ]
        if blocks:
            result["block_amax"] = device_blocks.finite_amax(device_blocks.block_values(raw))
        result.update(device_counts.count_all(rows, first_counts, thresholds_at_once))
        return device_packing.to_slots(result, one_hot)

    result = _walk(rows_of, first_pass, n_rows, step)
    finite_count = result["nonpositive"] + result["positive"]
    mean = result["total"] / ops.cast(ops.maximum(finite_count, 1), "float64")
    if precision:
        exponents = device_precision.scale_exponents(result.pop("amax_bits"), bits_width)
        scaled_keys = device_precision.scaled_keys(exponents, bits_width)
    block_amax = result.pop("block_amax", None)

    def second_pass(read):
        rows, one_hot, raw = read

        def of_slot(x):
            return device_packing.from_slots(x, one_hot)

        rows.low = of_slot(result["low"])[:, None, None]
        rows.high = of_slot(result["high"])[:, None, None]
        rows.mean = of_slot(mean)[:, None, None]
        if precision:
            rows.scaled_keys = of_slot(scaled_keys)
        squares = ops.where(rows.finite, ops.square(rows.values - rows.mean), 0.0)
        second = {"squares": ops.sum(squares, axis=2)[:, 0]}
        second.update(device_counts.count_all(rows, second_counts, thresholds_at_once))
        if blocks:
            counts = device_blocks.row_counts(device_blocks.block_values(raw), of_slot(block_amax))
            second.update(device_blocks.flat_counts(counts))
        return device_packing.to_slots(second, one_hot)

    result.update(_walk(rows_of, second_pass, n_rows, step))
    if precision:
        result["precision_exponents"] = exponents
    result["magnitude"] = ops.concatenate(
        [
            device_counts.magnitude_bins(result["nonpositive"], result["negative_at_least"]),
            device_counts.magnitude_bins(result["positive"], result["positive_at_least"]),
        ],
        axis=1,
    )
    return result


def mode_for(platform):
    """The `MODES` entry for compiled statistics on a platform ("cpu", "gpu", "tpu", ...)."""
    return "stepped" if platform == "cpu" else "fused"


_COMBINE = {"low": ops.minimum, "high": ops.maximum}
_COMBINE.update(dict.fromkeys(("amax_bits", "block_amax"), ops.maximum))


def _floor_power_of_two(n):
    return 1 << max(int(n).bit_length() - 1, 0)


def _walk(rows_of, summarise, n, step):
    """`summarise` of the whole rows: in one go, or combined over a loop of steps (`step`
    divides `n`: both are powers of two).

    The loop starts from the identity of each combination (not from a first
    step outside it), so that every step's temporaries live in the loop body.
    """
    if step >= n:
        return summarise(rows_of(0, n))

    def body(i, carry):
        return _combine(carry, summarise(rows_of(i * step, step)))

    shapes = keras.tree.map_structure(
        lambda t: keras.KerasTensor(t.shape, t.dtype), summarise(rows_of(0, step))
    )
    identity = {k: _identity(k, t) for k, t in shapes.items()}
    return ops.fori_loop(0, n // step, body, identity)


def _combine(a, b):
    return {k: _COMBINE.get(k, ops.add)(a[k], b[k]) for k in a}


def _identity(name, like):
    return ops.full(like.shape, device_packing.identity(name), like.dtype)


def last_axis(shape):
    """The length of a tensor's last axis, along which its blocks are cut (1 for a scalar; None
    when the shape does not say, and the block record is then left out)."""
    if len(shape) == 0:
        return 1
    return None if shape[-1] is None else int(shape[-1])


def chunks(keys):
    """Returns how tensors are grouped: lists of indices into `keys`.

    Args:
      keys: per tensor, `(number of elements, anything else that must match)`;
        a number of elements of None (unknown) makes a group of its own.
    """
    groups = {}
    for i, key in enumerate(keys):
        groups.setdefault(key if key[0] is not None else ("unknown", i), []).append(i)
    result = []
    for key, indices in groups.items():
        rows = max(1, CHUNK_VALUES // max(key[0], 1)) if key[0] != "unknown" else 1
        result += [indices[begin : begin + rows] for begin in range(0, len(indices), rows)]
    return result


def chunk_statistics(
    groups,
    scaled,
    tensors,
    divisor,
    mode="fused",
    precision=True,
    widths=None,
    buckets=records.HISTOGRAM_BUCKETS,
):
    """`group_statistics` of each group of `tensors`, in order (a list of dicts).

    The tensors are packed into chunks (`device_packing`) and each chunk's
    statistics computed in the caller's program (`GroupPrograms` compiles a
    program per distinct chunk instead).

    Args:
      groups: `chunks`' lists of indices.
      scaled: per tensor, whether `divisor` divides it.
      tensors: the backend's tensors.
      divisor: the loss scale (a float64 scalar), or None; unused where `scaled` is false.
      mode, precision, buckets: as for `group_statistics`.
      widths: None, or per tensor the length of its last axis, to count the
        block record (`chunks` must then have grouped tensors of one width).
    """
    return device_packing.run(
        groups,
        scaled,
        tensors,
        1.0 if divisor is None else divisor,  # None: no loss scale, nothing divided
        widths,
        CHUNK_VALUES,
        pack=device_packing.pack,
        statistics=lambda chunk, buffer, data, divisor: packed_statistics(
            buffer, data, divisor, chunk.slots, mode, precision, widths is not None, buckets
        ),
    )


def tensor_rows(groups, results, sizes):
    """Each tensor's row of its group's results: `{name: numpy value}`, with `count`.

    Args:
      groups: `chunks`' lists of indices.
      results: `chunk_statistics`' dicts, as the backend's tensors or numpy.
      sizes: the number of elements of each tensor.
    """
    rows = [None] * len(sizes)
    for indices, result in zip(groups, results):
        arrays = {name: np.asarray(ops.convert_to_numpy(t)) for name, t in result.items()}
        for r, i in enumerate(indices):
            rows[i] = {name: a[r] for name, a in arrays.items()}
            rows[i]["count"] = sizes[i]
    return rows
