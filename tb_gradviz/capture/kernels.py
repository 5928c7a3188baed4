"""The statistics of one tensor in two fused passes over its values, on the host.

`summaries.linear_histogram` and `summaries.stats_vector` define the records; numpy
computes them in ~20 passes over a float64 copy, TensorFlow's CPU kernels in
~25 (one per op). Here numba compiles the same definition into two passes:
the first takes the sum, the extrema and the zeros, the second, which needs
the extrema and the mean, sums the squared deviations and fills both
histograms. Every count and edge is bit-identical to `records`'; mean, std
and sum differ from numpy's only in the order of float64 additions.

Two kernels: `_summary_float32` for float32 values (what a float32 or mixed
precision model gives without a loss scale), whose loops LLVM vectorizes,
and `_summary` for anything else (float64 values, a divisor, or a NaN or Inf
somewhere), one value at a time. Reassociation (fastmath "reassoc") is
allowed only in the loops that add: it lets LLVM split a sum into vector
lanes. Nowhere else: full fastmath would turn `/ width` into a
multiplication by the reciprocal and move values across bucket edges.

The float32 kernel's second pass makes one increment per value, into a
joint table of (linear bucket, signed magnitude bin), from which both
histograms are sums. Its magnitude bins are "refined": split at the
magnitude histogram's edges and, with the precision record, at the record's
boundaries too, so the same increment also gives the record's counts
(`refined_bins`).

Imports neither TensorFlow nor Keras.
"""

import queue

import numba
import numpy as np

from tb_gradviz.capture import block_counts, block_scales, precision_counts, refined_bins, threads
from tb_gradviz.format import blocks, records, summaries

_MAGNITUDE_BINS = records.MAGNITUDE_BINS
_SUM = {"reassoc", "nsz", "contract"}  # fastmath flags for the loops that only add


# The one-value kernel's magnitude bins without a logarithm (the float32 kernel's are
# refined_bins'). A binary octave [2^e, 2^(e+1)) holds at
# most one half-decade edge (sqrt(10) > 2), so for |v| in that octave
#   searchsorted(LOG_EDGES, |v|, side="right") == OCTAVE_BIN[e] + (|v| >= OCTAVE_EDGE[e]),
# where e is the biased exponent field (0 for zero and subnormals) and
# OCTAVE_EDGE[e] is the edge inside the octave (+inf when there is none).
# tests/test_kernels.py checks the identity on every edge and its neighbours.
def _octave_bins_and_edges(exponent_fields):
    """`(OCTAVE_BIN, OCTAVE_EDGE)` for a binary format, by exponent field.

    The last exponent field (inf and NaN) is left out.
    """
    bias = exponent_fields // 2 - 1
    fields = np.arange(exponent_fields - 1)
    lows = np.ldexp(1.0, fields - bias)
    lows[0] = 0.0  # field 0: zero and subnormals
    highs = np.append(lows[1:], np.inf)
    bins = np.searchsorted(records.LOG_EDGES, lows, side="right").astype(np.int64)
    edges = np.full(len(fields), np.inf)
    for e in fields:
        inside = records.LOG_EDGES[(lows[e] < records.LOG_EDGES) & (highs[e] > records.LOG_EDGES)]
        assert inside.size <= 1, "a binary octave holds two half-decade edges"
        if inside.size:
            edges[e] = inside[0]
    return bins, edges


_OCTAVE_BIN, _OCTAVE_EDGE = _octave_bins_and_edges(2048)


# The float32 kernel works on blocks small enough to stay in the L1 cache
# between its loops.
_BLOCK = 4096


@numba.njit(nogil=True, cache=True, fastmath=_SUM)
def _sum_extrema_zeros(values, bits):
    """Sum in float64, min and max as order keys of the bits, and the count of +-0.0."""
    total = 0.0
    zeros = 0
    low = np.int32(0x7FFFFFFF)
    high = np.int32(-0x80000000)
    for i in range(values.size):
        total += np.float64(values[i])
        x = bits[i]
        key = x ^ ((x >> 31) & 0x7FFFFFFF)  # ordered as the floats are (-0.0 just below +0.0)
        low = min(low, key)
        high = max(high, key)
        zeros += (x & 0x7FFFFFFF) == 0
    return total, low, high, zeros


@numba.njit(nogil=True, cache=True)
def _float32_of_key(key):
    return np.int32(key ^ ((key >> 31) & 0x7FFFFFFF)).view(np.float32)


@numba.njit(nogil=True, cache=True, fastmath=_SUM)
def _squared_deviations(values, mean):
    total = 0.0
    for i in range(values.size):
        d = np.float64(values[i]) - mean
        total += d * d
    return total


@numba.njit(nogil=True, cache=True)
def _linear_buckets(values, low, width, last, out):
    """The `summaries.linear_histogram` bucket of a value: floor((v - low) / width), <= `last`."""
    for i in range(values.size):
        out[i] = min(np.int32(np.floor((np.float64(values[i]) - low) / width)), last)


@numba.njit(nogil=True, cache=True)
def _count_refined(bits, linear, cells, joint, half):
    """Counts (linear bucket, signed refined bin) pairs, zeros in negative bin 0; `half` refined
    bins per sign."""
    columns = 2 * half
    for i in range(bits.size):
        x = bits[i]
        a = x & 0x7FFFFFFF
        entry = cells[a >> refined_bins.CELL_SHIFT]
        b = (entry >> 32) + (a >= (entry & 0xFFFFFFFF)) + (x > 0) * half
        # Two interleaved tables, so that runs of one pair do not wait on each other's increments.
        joint[i & 1, linear[i] * columns + b] += 1


@numba.njit(nogil=True, cache=True)
def _summary_float32(values, buckets, log_keys, log_cells, cells, precise, half, block_out):
    """`_summary` of float32 values, in vectorized loops, and with `precise` their precision
    record third (else an empty array). Returns None for NaN or Inf: `_summary` takes those.

    `cells` is scratch (`refined_bins.CELLS` values) for the cells of the precision record's edges.
    With `half` (NVFP4's block length; 0 for none) the block record's counts are added to
    `block_out` (`block_counts.new_sums`) in the same pass, each stretch of values while it is
    in cache; the rows' width must then be a multiple of 32.
    """
    n = values.size
    bits = values.view(np.int32)
    total, low_key, high_key, zeros = _sum_extrema_zeros(values, bits)
    if n == 0 or not np.isfinite(total):  # nothing, or a NaN or Inf somewhere
        return None
    low = np.float64(_float32_of_key(low_key))
    high = np.float64(_float32_of_key(high_key))
    edges = log_keys
    keys = exponents = np.zeros(0, np.int64)
    placed = np.zeros(0, np.bool_)
    above_all = 0
    if precise:
        amax = max(-low, high)
        keys, exponents = precision_counts.float32_keys(amax)
        above_all = np.int64(np.float32(amax).view(np.int32)) + 1  # above every magnitude
        edges, placed = refined_bins.refined_edges(keys, above_all, log_keys)
        refined_bins.fill_cells(edges, (above_all - 1) >> refined_bins.CELL_SHIFT, cells)
    else:
        cells = log_cells
    if half:
        block_scratch = block_counts.scratch()
        top = np.float32(max(abs(low), abs(high))).view(np.int32)
        tensor_scale = block_scales.tensor_scale_of(top)
    bins = edges.size + 1
    mean = total / n
    width = (high - low) / buckets
    spread = high > low
    joint = np.zeros((2, buckets * 2 * bins), np.int64)
    linear = np.zeros(_BLOCK, np.int32)  # all in bucket 0 when every value is equal
    squares = 0.0
    counted = 0  # the values the block part has counted
    for begin in range(0, n, _BLOCK):
        block = values[begin : begin + _BLOCK]
        squares += _squared_deviations(block, mean)
        if spread:
            _linear_buckets(block, low, width, buckets - 1, linear)
        _count_refined(bits[begin : begin + _BLOCK], linear, cells, joint, bins)
        end = min(begin + _BLOCK, n)
        if half and (end - counted >= block_counts.CHUNK or end == n):
            # The block part every `CHUNK` values, read in the last few blocks (in the L2 cache)
            block_counts.aligned_chunks(
                values,
                counted,
                end,
                half,
                block_scratch,
                block_counts.MX_CONSTANTS,
                block_counts.MX_SPANS,
                tensor_scale,
                block_out,
            )
            counted = end
    pairs = (joint[0] + joint[1]).reshape(buckets, 2 * bins)
    refined = pairs.sum(axis=0)
    magnitude = np.zeros(2 * _MAGNITUDE_BINS, np.int64)
    log_bin = 0  # the magnitude histogram's edges at or below refined bin r's lower edge
    for r in range(bins):
        if r > 0 and log_bin < log_keys.size and log_keys[log_bin] == edges[r - 1]:
            log_bin += 1
        magnitude[log_bin] += refined[r]
        magnitude[_MAGNITUDE_BINS + log_bin] += refined[bins + r]
    histogram, stats = _records(
        n, zeros, 0, 0, 0, low, high, total, squares, pairs.sum(axis=1), magnitude, buckets
    )
    if not precise:
        return histogram, stats, np.zeros(0)
    below = np.empty(keys.size, np.int64)  # magnitudes below each key
    for i in range(keys.size):
        if keys[i] >= above_all:
            below[i] = n
        elif keys[i] <= 1:
            below[i] = zeros
        elif placed[i]:
            at = np.searchsorted(edges, keys[i])  # refined bins 0..at lie below it
            below[i] = refined[: at + 1].sum() + refined[bins : bins + at + 1].sum()
        else:
            below[i] = precision_counts.count_below(bits, keys[i])
    return histogram, stats, precision_counts.from_below(n, zeros, below, exponents)


# The records from the sums and counts: records' one assembly, compiled.
# numba's on-disk cache of this file's kernels keys on this file's stamp only,
# so after editing summaries.summary_from_sums, refined_bins or precision_counts
# in a checkout, delete tb_gradviz/capture/__pycache__/kernels.*.nb[ic]
# (an install writes new files, and recompiles).
_records = numba.njit(nogil=True, cache=True)(summaries.summary_from_sums)


@numba.njit(nogil=True, cache=True)
def _summary(values, divisor, buckets, octave_bin, octave_edge):
    """The records of `values / divisor`, one value at a time (any finite or non-finite values)."""
    n = values.size
    scaled = divisor != 1.0
    zeros = nans = pos_inf = neg_inf = 0
    low, high, total = np.inf, -np.inf, 0.0
    magnitude = np.zeros(2 * _MAGNITUDE_BINS, np.int64)
    for i in range(n):
        v = np.float64(values[i])
        if scaled:
            v = v / divisor
        if v - v != 0.0:  # NaN or +-inf
            if v != v:
                nans += 1
            elif v > 0:
                pos_inf += 1
            else:
                neg_inf += 1
            continue
        total += v
        low = min(low, v)
        high = max(high, v)
        zeros += v == 0.0
        # Zeros land in negative bin 0; _records takes them out.
        a = np.float64(abs(v))
        e = (a.view(np.int64) >> 52) & 0x7FF
        b = octave_bin[e] + (a >= octave_edge[e]) + (v > 0.0) * _MAGNITUDE_BINS
        magnitude[b] += 1
    finite = n - nans - pos_inf - neg_inf
    mean = total / max(finite, 1)
    width = (high - low) / buckets
    linear = np.zeros(buckets, np.int64)
    squares = 0.0
    for i in range(n if finite else 0):
        v = np.float64(values[i])
        if scaled:
            v = v / divisor
        if v - v != 0.0:
            continue
        d = v - mean
        squares += d * d
        if high > low:
            linear[min(int(np.floor((v - low) / width)), buckets - 1)] += 1
    return _records(
        n, zeros, nans, pos_inf, neg_inf, low, high, total, squares, linear, magnitude, buckets
    )


def summary(
    values, divisor=None, buckets=records.HISTOGRAM_BUCKETS, precision=False, block_formats=False
):
    """Returns `(linear_histogram(v), stats_vector(v))` of `v = values / divisor` (`summaries`).

    Args:
      values: a float32 or float64 array (float16 widens exactly: pass it as float32).
      divisor: None, or the float64 number the values are divided by first,
        as `float64(values) / divisor` (the loss scale).
      buckets: the number of linear histogram buckets.
      precision: also return `summaries.precision_vector(values)`, the
        values as they are (not divided), third.
      block_formats: with `precision`, that record's block part
        (`blocks.RECORD_FIELDS`) appended to it. Float32 values with no
        divisor, no NaN or Inf, in rows of whole blocks of 32 are read once
        for everything; others get the block part from `block_counts`.
    """
    values = np.asarray(values)
    if values.dtype not in (np.float32, np.float64):
        raise TypeError(f"summary takes float32 or float64 values; received {values.dtype}")
    if block_formats and not precision:
        raise ValueError("block_formats=True needs precision=True; received precision=False")
    flat = np.ascontiguousarray(values).reshape(-1)
    width = values.shape[-1] if values.ndim else 1
    fused = block_formats and width % 32 == 0
    block_out = block_counts.new_sums()
    result = None
    if divisor is None and flat.dtype == np.float32:
        cells = _borrow_cells() if precision else _NO_CELLS
        try:
            result = _summary_float32(
                flat,
                int(buckets),
                refined_bins.LOG_KEYS,
                refined_bins.LOG_CELLS,
                cells,
                precision,
                block_counts.HALF if fused else 0,
                block_out,
            )
        finally:
            if precision:
                _SPARE_CELLS.put(cells)
        if result is not None and not precision:
            return result[:2]
    if result is None:
        fused = False
        result = _summary(
            flat,
            1.0 if divisor is None else float(divisor),
            int(buckets),
            _OCTAVE_BIN,
            _OCTAVE_EDGE,
        )
        if not precision:
            return result
        result = (*result, _precision_record(flat))
    if not block_formats:
        return result
    if fused:
        block_records = block_counts.as_records(block_out, flat.size // width, width)
    else:
        block_records = block_counts.block_records(values)
    return (*result[:2], np.concatenate([result[2], blocks.record_fields(block_records)]))


def _precision_record(flat):
    if flat.dtype != np.float32:
        return precision_counts.precision_direct(flat)
    cells = _borrow_cells()
    try:
        return precision_counts.float32_record(flat, cells)
    finally:
        _SPARE_CELLS.put(cells)


_NO_CELLS = np.zeros(0, np.int64)
# Scratch for the cells of `_summary_float32`, each lent to one call at a time: kept between
# calls, as the worker threads of `summaries` are not.
_SPARE_CELLS = queue.SimpleQueue()


def _borrow_cells():
    try:
        return _SPARE_CELLS.get_nowait()
    except queue.Empty:
        return np.empty(refined_bins.CELLS, np.int64)


def summaries(
    items, buckets=records.HISTOGRAM_BUCKETS, workers=None, precision=False, block_formats=False
):
    """Returns `[(histogram, stats), ...]` for `items` of `(values, divisor)`, on `workers` threads.

    With `precision`, each also has the precision record of the values third,
    with `block_formats` its block part too (`summary`). The kernel releases
    the GIL; the largest arrays go first.
    """
    return threads.in_threads(
        lambda values, divisor: summary(values, divisor, buckets, precision, block_formats),
        items,
        workers,
    )
