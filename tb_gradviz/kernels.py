"""The statistics of one tensor in two fused passes over its values, on the host.

`format.linear_histogram` and `format.stats_vector` define the records; numpy
computes them in ~20 passes over a float64 copy. Here numba compiles the same
definition into two loops over the values as they are (float32 or float64):
the first counts zeros and non-finite values, takes the extrema and the sum,
and bins magnitudes; the second, which needs the extrema and the mean, fills
the linear histogram and sums the squared deviations. Every count and edge is
bit-identical to `format`'s; mean, std and sum differ from numpy's only in
the order of float64 additions.

No fastmath: it would let LLVM turn `/ width` into a multiplication by the
reciprocal and move values across bucket edges.

Imports neither TensorFlow nor Keras.
"""

import concurrent.futures
import os

import numba
import numpy as np

from tb_gradviz import format as fmt

# Magnitude bins without a logarithm. A binary octave [2^e, 2^(e+1)) holds at
# most one half-decade edge (sqrt(10) > 2), so for |v| in that octave
#   searchsorted(LOG_EDGES, |v|, side="right") == _OCTAVE_BIN[e] + (|v| >= _OCTAVE_EDGE[e]),
# where e is the float64 biased exponent field (0 for zero and subnormals) and
# _OCTAVE_EDGE[e] is the edge inside the octave (+inf when there is none).
# tests/test_kernels.py checks the identity on every edge and its neighbours.
def _octave_tables():
    exponents = np.arange(2047)  # field 2047 is inf and NaN, which never reach the bins
    lows = np.ldexp(1.0, exponents - 1023)  # 2^e; field 0 covers zero and subnormals
    lows[0] = 0.0
    highs = np.append(np.ldexp(1.0, exponents[1:] - 1023), np.inf)
    bins = np.searchsorted(fmt.LOG_EDGES, lows, side="right").astype(np.int64)
    edges = np.full(2047, np.inf)
    for e in exponents:
        inside = fmt.LOG_EDGES[(fmt.LOG_EDGES > lows[e]) & (fmt.LOG_EDGES < highs[e])]
        assert inside.size <= 1, "a binary octave holds two half-decade edges"
        if inside.size:
            edges[e] = inside[0]
    return bins, edges


_OCTAVE_BIN, _OCTAVE_EDGE = _octave_tables()
_HEAD = len(fmt.STATS_FIELDS)
_MAGNITUDE_BINS = fmt.MAGNITUDE_BINS


@numba.njit(nogil=True, cache=True)
def _summary(values, divisor, buckets, octave_bin, octave_edge):
    n = values.size
    scaled = divisor != 1.0
    stats = np.zeros(_HEAD + 2 * _MAGNITUDE_BINS)
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
        # Zeros land in negative bin 0 and are taken out below.
        a = np.float64(abs(v))
        e = (a.view(np.int64) >> 52) & 0x7FF
        b = octave_bin[e] + (a >= octave_edge[e]) + (v > 0.0) * _MAGNITUDE_BINS
        magnitude[b] += 1
    magnitude[0] -= zeros
    stats[_HEAD:] = magnitude
    finite = n - nans - pos_inf - neg_inf
    stats[0] = n
    stats[1] = zeros
    stats[2] = nans
    stats[3] = pos_inf
    stats[4] = neg_inf
    histogram = np.zeros((buckets, 3))
    if finite == 0:
        stats[5:_HEAD] = np.nan
        return histogram, stats
    mean = total / finite
    counts = np.zeros(buckets, np.int64)
    width = (high - low) / buckets
    squares = 0.0
    for i in range(n):
        v = np.float64(values[i])
        if scaled:
            v = v / divisor
        if v - v != 0.0:
            continue
        d = v - mean
        squares += d * d
        if high > low:
            counts[min(int(np.floor((v - low) / width)), buckets - 1)] += 1
    stats[5] = low
    stats[6] = high
    stats[7] = mean
    stats[8] = np.sqrt(squares / finite)
    stats[9] = total
    if high > low:
        for j in range(buckets):
            histogram[j, 0] = low + width * j
            histogram[j, 1] = low + width * (j + 1)
            histogram[j, 2] = counts[j]
        histogram[buckets - 1, 1] = high
    else:
        for j in range(buckets):
            histogram[j, 0] = low
            histogram[j, 1] = low
        histogram[0, 2] = finite
    return histogram, stats


def summary(values, divisor=None, buckets=fmt.HISTOGRAM_BUCKETS):
    """Returns `(format.linear_histogram(v), format.stats_vector(v))` of `v = values / divisor`.

    Args:
      values: a float32 or float64 array (float16 widens exactly: pass it as float32).
      divisor: None, or the float64 number the values are divided by first,
        as `float64(values) / divisor` (the loss scale).
      buckets: the number of linear histogram buckets.
    """
    values = np.asarray(values)
    if values.dtype not in (np.float32, np.float64):
        raise TypeError(f"summary takes float32 or float64 values; received {values.dtype}")
    flat = values.reshape(-1)
    return _summary(flat, 1.0 if divisor is None else float(divisor), int(buckets), _OCTAVE_BIN, _OCTAVE_EDGE)


def summaries(items, buckets=fmt.HISTOGRAM_BUCKETS, workers=None):
    """Returns `[(histogram, stats), ...]` for `items` of `(values, divisor)`, using `workers` threads.

    The kernel releases the GIL; the largest arrays go first.
    """
    items = list(items)
    workers = workers or min(len(items), os.cpu_count() or 1)
    if workers <= 1:
        return [summary(values, divisor, buckets) for values, divisor in items]
    order = sorted(range(len(items)), key=lambda i: -np.size(items[i][0]))
    results = [None] * len(items)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = {pool.submit(summary, items[i][0], items[i][1], buckets): i for i in order}
        for future, i in futures.items():
            results[i] = future.result()
    return results
