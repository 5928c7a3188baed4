"""The statistics of captured tensors on their device: grouped rows, comparison counts, two reads.

One implementation for every backend, written in `keras.ops`: JAX runs it
jitted, TensorFlow inside an XLA-compiled `tf.function` (`tf_statistics`),
PyTorch eagerly. Only sums and counts leave the device; `assemble` turns
them into records with `summaries.summary_from_sums`, as it does the host
kernel's.

- Tensors of one number of elements, dtype and divisor are stacked into the
  rows of a `[R, n]` group (`chunks`), so that one launch summarises many.
  A group holds at most `CHUNK_VALUES` values (one tensor at least).
- Each group is read twice. The first read takes the extrema, the sums and
  every count of `device_counts.FIRST_PASS_COUNTS`; the second, which needs
  the row's extrema and mean, the squared deviations and
  `device_counts.SECOND_PASS_COUNTS`.
- The precision record's counts compare each value's magnitude bits with
  integer keys (`device_precision`): the boundaries as they are in the first
  read, scaled by each row's `2**-k` (from the first read's largest finite
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
- How a group is walked depends on what compiles it (`MODES`). XLA on an
  accelerator fuses each comparison into its reduction, so a pass is one
  read of the group (`"fused"`). XLA on the CPU materialises the input of
  every reduction (`T` values per value for `T` thresholds), so there each
  pass walks the group in a loop of `STEP_VALUES` values (`"stepped"`),
  which bounds the working memory whatever the group's size. Without a
  compiler (PyTorch), a pass compares `EAGER_THRESHOLDS` thresholds at a
  time (`"eager"`).

A new per-tensor count (one number, or one per threshold) is one
`device_counts.Count` in `FIRST_PASS_COUNTS` (it sees the values) or
`SECOND_PASS_COUNTS` (it also sees each row's extrema, mean and precision
keys); its result comes back under its name in every tensor's row
(`tensor_rows`).
"""

import keras
import numpy as np

from tb_gradviz.capture import device_blocks, device_counts, device_precision
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
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}. Received: mode={mode!r}")
    n = rows[0].shape[0]
    step = max(1, STEP_VALUES // len(rows)) if mode == "stepped" else n
    thresholds_at_once = EAGER_THRESHOLDS if mode == "eager" else None
    # Stepped, each step stacks its slice of every row: never a copy of the whole group.
    stacked = None if mode == "stepped" else ops.stack(rows)
    bits_width = device_precision.width(rows[0].dtype)
    first_counts, second_counts = (
        tuple(c for c in counts if precision or c.name not in device_counts.PRECISION_COUNTS)
        for counts in (device_counts.FIRST_PASS_COUNTS, device_counts.SECOND_PASS_COUNTS)
    )

    def rows_of(start, length):
        if stacked is not None:
            block = stacked
        else:
            block = ops.stack([ops.slice(t, [start], [length]) for t in rows])
        signed = device_precision.float_bits(block, bits_width)
        bits = ops.expand_dims(device_precision.magnitude_bits(signed, bits_width), 1)
        v = ops.expand_dims(device_precision.widened(block, signed, bits_width), 1)
        if divisor is not None:
            v = device_precision.divide(v, divisor, like=v)
        finite = ops.isfinite(v)
        signed = ops.expand_dims(signed, 1)
        return device_counts.Rows(
            v, finite, ops.where(finite, v, 0.0), bits, bits_width, signed, buckets
        )

    def first_pass(rows):
        v, finite = rows.values, rows.finite
        result = {  # [R, 1] each
            "low": ops.min(ops.where(finite, v, np.inf), axis=2),
            "high": ops.max(ops.where(finite, v, -np.inf), axis=2),
            "total": ops.sum(rows.finite_values, axis=2),
            "raw_sum": ops.sum(v, axis=2),
            "raw_abs_sum": ops.sum(ops.abs(v), axis=2),
        }
        if precision:
            result["amax_bits"] = device_precision.finite_amax_bits(rows.bits, bits_width, axis=2)
        result.update(device_counts.count_all(rows, first_counts, thresholds_at_once))
        return result

    result = _walk(rows_of, first_pass, n, step)
    finite_count = n - (result["nans"] + result["pos_inf"] + result["neg_inf"])
    mean = result["total"][:, 0] / ops.cast(ops.maximum(finite_count, 1), "float64")
    if precision:
        exponents = device_precision.scale_exponents(result.pop("amax_bits")[:, 0], bits_width)
        scaled_keys = device_precision.scaled_keys(exponents, bits_width)

    def second_pass(rows):
        rows.low, rows.high = result["low"][:, :, None], result["high"][:, :, None]
        rows.mean = mean[:, None, None]
        if precision:
            rows.scaled_keys = scaled_keys
        squares = ops.where(rows.finite, ops.square(rows.values - rows.mean), 0.0)
        second = {"squares": ops.sum(squares, axis=2)}
        second.update(device_counts.count_all(rows, second_counts, thresholds_at_once))
        return second

    result.update(_walk(rows_of, second_pass, n, step))
    if precision:
        result["precision_exponents"] = exponents
    if width is not None:
        result.update(device_blocks.flat_counts(device_blocks.group_blocks(rows, width), width))
    for name in SUMS:
        result[name] = ops.reshape(result[name], [-1])
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


_COMBINE = {"low": ops.minimum, "high": ops.maximum, "amax_bits": ops.maximum}


def _walk(rows_of, summarise, n, step):
    """`summarise` of the whole rows: in one go, or combined over a loop of steps and a tail.

    The loop starts from the identity of each combination (not from a first
    step outside it), so that every step's temporaries live in the loop body.
    """
    if step >= n:
        return summarise(rows_of(0, n))
    full, tail = divmod(n, step)

    def body(i, carry):
        return _combine(carry, summarise(rows_of(i * step, step)))

    shapes = keras.tree.map_structure(
        lambda t: keras.KerasTensor(t.shape, t.dtype), summarise(rows_of(0, step))
    )
    identity = {k: _identity(k, t) for k, t in shapes.items()}
    result = ops.fori_loop(0, full, body, identity)
    return _combine(result, summarise(rows_of(full * step, tail))) if tail else result


def _combine(a, b):
    return {k: _COMBINE.get(k, ops.add)(a[k], b[k]) for k in a}


def _identity(name, like):
    value = {"low": np.inf, "high": -np.inf}.get(name, 0)
    return ops.full(like.shape, value, like.dtype)


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


def chunk_statistics(groups, scaled, tensors, divisor, mode="fused", precision=True, widths=None):
    """`group_statistics` of each group of `tensors`, in order (a list of dicts).

    Args:
      groups: `chunks`' lists of indices.
      scaled: per tensor, whether `divisor` divides it.
      tensors: the backend's tensors.
      divisor: the loss scale (a float64 scalar); unused where `scaled` is false.
      mode, precision: as for `group_statistics`.
      widths: None, or per tensor the length of its last axis, to count the
        block record (`chunks` must then have grouped tensors of one width).
    """
    return [
        group_statistics(
            [ops.reshape(tensors[i], [-1]) for i in indices],
            divisor if scaled[indices[0]] else None,
            mode=mode,
            precision=precision,
            width=None if widths is None else widths[indices[0]],
        )
        for indices in groups
    ]


class GroupPrograms:
    """`chunk_statistics`, with one compiled program per distinct group.

    A group's program depends only on its rows' count, length and dtype,
    whether the divisor divides it and its block width: the tensors of
    layers of one shape (a network's repeated blocks) fill groups of one
    signature, which run one program. Compiling a few small programs
    instead of one over every group of an event keeps the compile time to
    seconds. `traces` counts the programs traced.

    Args:
      compile: wraps a function of `(rows, divisor)` into its compiled form
        (`jax.jit`, or `tf.function` with `jit_compile=True`), which traces it
        once per signature of its arguments.
      mode, precision: as for `group_statistics`.
    """

    def __init__(self, compile, mode="fused", precision=True):
        self.compile, self.mode, self.precision = compile, mode, precision
        self.programs = {}
        self.traces = 0

    def __call__(self, groups, scaled, tensors, divisor, widths=None):
        """`chunk_statistics(groups, scaled, tensors, divisor, mode, precision, widths)`."""
        results = []
        for indices in groups:
            rows = [ops.reshape(tensors[i], [-1]) for i in indices]
            divided = bool(scaled[indices[0]])
            width = None if widths is None else widths[indices[0]]
            key = (len(rows), rows[0].shape[0], str(rows[0].dtype), divided, width)
            if key not in self.programs:
                self.programs[key] = self.compile(self._statistics(divided, width))
            results.append(self.programs[key](rows, divisor))
        return results

    def _statistics(self, divided, width):
        def statistics(rows, divisor):
            self.traces += 1
            return group_statistics(
                list(rows),
                divisor if divided else None,
                mode=self.mode,
                precision=self.precision,
                width=width,
            )

        return statistics


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
