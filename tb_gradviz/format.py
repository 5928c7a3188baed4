"""The on-disk format of tb_gradviz: tags, record layouts and the event writer.

Imports neither TensorFlow nor Keras. `capture` computes the same records on
device; the numpy functions here are the definition (and are used to write
logs without TensorFlow, e.g. for benchmarks). docs/FORMAT.md describes it all.

Per layer and tensor, one log event writes:

* `gradviz/<layer>/<tensor>`: TensorBoard histogram plugin data, `[k, 3]`
  float64 rows `[left, right, count]` over the finite values (k = 30), so the
  Histograms dashboard and tools such as tbparse read it;
* `gradviz/<layer>/<tensor>/stats`: a float64 vector, `STATS_FIELDS` then the
  symmetric-log bins of the non-zero finite values (`LOG_EDGES`);

and, per pooling layer, `gradviz/<layer>/routing`: a float64 vector of
`ROUTING_FIELDS`.
"""

import itertools
import os
import socket
import struct
import time

import google_crc32c
import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

from tb_gradviz import metadata

TAG_PREFIX = "gradviz"
HISTOGRAM_BUCKETS = 30

STATS_FIELDS = (
    "count",  # all elements
    "zeros",  # exact zeros (+0.0 and -0.0)
    "nan",
    "pos_inf",
    "neg_inf",
    "min",  # min, max, mean, std and sum are over the finite values;
    "max",  # NaN when there is none
    "mean",
    "std",  # population standard deviation
    "sum",
)

# Magnitude bins of the non-zero finite values: half decades from 1e-12 to 1e6.
# Bin j holds |x| in [LOG_EDGES[j-1], LOG_EDGES[j]); bin 0 is |x| < 1e-12
# (underflow, still non-zero) and the last bin is |x| >= 1e6.
LOG_MIN_EXPONENT = -12
LOG_MAX_EXPONENT = 6
LOG_BINS_PER_DECADE = 2
LOG_EDGES = 10.0 ** (
    np.arange(LOG_MIN_EXPONENT * LOG_BINS_PER_DECADE, LOG_MAX_EXPONENT * LOG_BINS_PER_DECADE + 1)
    / LOG_BINS_PER_DECADE
)
MAGNITUDE_BINS = len(LOG_EDGES) + 1
# The vector holds the negative values' magnitude bins, then the positive ones'.
STATS_LENGTH = len(STATS_FIELDS) + 2 * MAGNITUDE_BINS

ROUTING_FIELDS = (
    "input_positions",  # elements of the layer input
    "routed_positions",  # input elements that receive gradient from >= 1 window
    "windows",  # elements of the layer output (one pooling window each)
    "tied_windows",  # max pooling: windows whose maximum occurs more than once (NaN otherwise)
    "input_gradient_sum",
    "output_gradient_sum",
    "output_gradient_abs_sum",  # the scale against which the two sums are compared
)

ACTIVATION = "activation"
INPUT_GRADIENT = "input_gradient"
OUTPUT_GRADIENT = "output_gradient"
ROLES = (ACTIVATION, INPUT_GRADIENT, OUTPUT_GRADIENT)


def tensor_name(role, index, count):
    """Returns the tensor's name in tags: the role, with `_<index>` when a layer has several."""
    return role if count == 1 else f"{role}_{index}"


def histogram_tag(layer, tensor):
    return f"{TAG_PREFIX}/{layer}/{tensor}"


def stats_tag(layer, tensor):
    return f"{TAG_PREFIX}/{layer}/{tensor}/stats"


def routing_tag(layer):
    return f"{TAG_PREFIX}/{layer}/routing"


def linear_histogram(values, buckets=HISTOGRAM_BUCKETS):
    """Returns TensorBoard's `[k, 3]` histogram of the finite values of an array.

    Non-finite values are left out (they are counted in the stats record), so
    one NaN never wipes the histogram. Bucket `i` holds `left <= x < right`,
    the last one also `x == max`. All values equal: every row is
    `[x, x, 0]` but the last, which counts them, as in TensorBoard's own
    histogram summary. No values: all zeros.
    """
    values = np.asarray(values, dtype=np.float64).ravel()
    values = values[np.isfinite(values)]
    result = np.zeros((buckets, 3))
    if values.size == 0:
        return result
    low, high = values.min(), values.max()
    if low == high:
        result[:, :2] = low
        result[-1, 2] = values.size
        return result
    width = (high - low) / buckets
    index = np.minimum(np.floor((values - low) / width).astype(np.int64), buckets - 1)
    edges = low + width * np.arange(buckets + 1)
    edges[-1] = high
    result[:, 0] = edges[:-1]
    result[:, 1] = edges[1:]
    result[:, 2] = np.bincount(index, minlength=buckets)
    return result


def stats_vector(values):
    """Returns the float64 stats record (`STATS_LENGTH` values) of an array."""
    values = np.asarray(values, dtype=np.float64).ravel()
    finite = values[np.isfinite(values)]
    head = np.full(len(STATS_FIELDS), np.nan)
    head[:5] = [
        values.size,
        np.count_nonzero(values == 0),
        np.count_nonzero(np.isnan(values)),
        np.count_nonzero(values == np.inf),
        np.count_nonzero(values == -np.inf),
    ]
    if finite.size:
        head[5:] = [finite.min(), finite.max(), finite.mean(), finite.std(), finite.sum()]
    nonzero = finite[finite != 0]
    bins = np.searchsorted(LOG_EDGES, np.abs(nonzero), side="right")
    negative = np.bincount(bins[nonzero < 0], minlength=MAGNITUDE_BINS)
    positive = np.bincount(bins[nonzero > 0], minlength=MAGNITUDE_BINS)
    return np.concatenate([head, negative, positive]).astype(np.float64)


_HEAD = len(STATS_FIELDS)


def summary_from_sums(n, zeros, nans, pos_inf, neg_inf, low, high, total, squares, linear, magnitude, buckets):
    """Returns `(linear_histogram, stats_vector)` from a tensor's sums and counts.

    What every fast path computes in its own way (numba on the host, grouped
    ops on a device) and then assembles here: `n` elements, of which `zeros`
    exact zeros and `nans`, `pos_inf`, `neg_inf`; the extrema, the sum and
    the sum of squared deviations from the mean of the finite values; the
    linear bucket counts (`floor((x - low) / width)`, the last bucket also
    holding `high`) and the magnitude counts (`2 * MAGNITUDE_BINS`, negative
    then positive), where the zeros are still in negative bin 0. Written in
    the subset of Python that numba compiles (kernels.py compiles it).
    """
    stats = np.zeros(_HEAD + 2 * MAGNITUDE_BINS)
    stats[0] = n
    stats[1] = zeros
    stats[2] = nans
    stats[3] = pos_inf
    stats[4] = neg_inf
    stats[_HEAD:] = magnitude
    stats[_HEAD] -= zeros
    histogram = np.zeros((buckets, 3))
    finite = n - nans - pos_inf - neg_inf
    if finite == 0:
        stats[5:_HEAD] = np.nan
        return histogram, stats
    stats[5] = low
    stats[6] = high
    stats[7] = total / finite
    stats[8] = np.sqrt(squares / finite)
    stats[9] = total
    if high > low:
        width = (high - low) / buckets
        for j in range(buckets):
            histogram[j, 0] = low + width * j
            histogram[j, 1] = low + width * (j + 1)
            histogram[j, 2] = linear[j]
        histogram[buckets - 1, 1] = high
    else:  # all equal: every row [x, x, 0] but the last, which counts them
        histogram[:, 0] = low
        histogram[:, 1] = low
        histogram[buckets - 1, 2] = finite
    return histogram, stats


def decode_stats(vector):
    """Returns the stats record as a dict; `log_counts` holds the two bin lists.

    Raises:
      ValueError: the vector does not have the record's length.
    """
    vector = np.asarray(vector, dtype=np.float64).ravel()
    if vector.size != STATS_LENGTH:
        raise ValueError(f"a stats record has {STATS_LENGTH} values; received {vector.size}")
    result = {name: float(value) for name, value in zip(STATS_FIELDS, vector)}
    tail = vector[len(STATS_FIELDS) :].astype(np.int64)
    result["log_counts"] = {
        "negative": tail[:MAGNITUDE_BINS].tolist(),
        "positive": tail[MAGNITUDE_BINS:].tolist(),
    }
    return result


def decode_routing(vector):
    """Returns the routing record as a dict of `ROUTING_FIELDS`.

    Raises:
      ValueError: the vector does not have the record's length.
    """
    vector = np.asarray(vector, dtype=np.float64).ravel()
    if vector.size != len(ROUTING_FIELDS):
        raise ValueError(f"a routing record has {len(ROUTING_FIELDS)} values; received {vector.size}")
    return {name: float(value) for name, value in zip(ROUTING_FIELDS, vector)}


# Pooling only moves gradient, so the sums on both sides of a pooling layer
# agree up to the rounding of the gradient's dtype (overlapping windows add in
# it, an average pool divides in it): within MASS_TOLERANCE_UNITS units of
# roundoff of sum(|output gradient|).
_UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}
MASS_TOLERANCE_UNITS = 32


def mass_conservation(routing, dtype):
    """Returns the verdict on a routing record: did pooling keep the gradient's mass?

    The one judgement that `/routing`, `/step`, the tab and `tb-gradviz
    summary` all show. The difference of the two sums is judged against
    `output_gradient_abs_sum`, not against the sums, which BatchNorm makes
    cancel to almost zero.

    Args:
      routing: a decoded routing record (`decode_routing`).
      dtype: the layer's dtype name, which sets the rounding allowed
        (float32 when unknown).

    Returns:
      `{"difference", "relative", "tolerance", "conserved"}`: input minus
      output sum, its size relative to `output_gradient_abs_sum`, the largest
      relative size allowed, and the verdict: True, False, or None when the
      record predates `output_gradient_abs_sum` (nothing to judge against).
    """
    difference = routing["input_gradient_sum"] - routing["output_gradient_sum"]
    tolerance = MASS_TOLERANCE_UNITS * _UNIT_ROUNDOFF.get(dtype, _UNIT_ROUNDOFF["float32"])
    scale = routing["output_gradient_abs_sum"]
    if not np.isfinite(scale):
        return {"difference": difference, "relative": float("nan"), "tolerance": tolerance, "conserved": None}
    if not np.isfinite(difference):
        return {"difference": difference, "relative": float("nan"), "tolerance": tolerance, "conserved": False}
    relative = abs(difference) / scale if scale > 0 else (0.0 if difference == 0 else float("inf"))
    return {"difference": difference, "relative": relative, "tolerance": tolerance, "conserved": relative <= tolerance}


def log_edges_description():
    """The magnitude bins as they are written into metadata."""
    return {
        "min_exponent": LOG_MIN_EXPONENT,
        "max_exponent": LOG_MAX_EXPONENT,
        "per_decade": LOG_BINS_PER_DECADE,
    }


def _tensor_proto(array):
    array = np.ascontiguousarray(array, dtype=np.float64)
    return tensor_pb2.TensorProto(
        dtype=types_pb2.DT_DOUBLE,
        tensor_shape=tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=n) for n in array.shape]
        ),
        tensor_content=array.tobytes(),
    )


def summary_proto(records, carries_metadata):
    """Returns a `Summary` holding `records`, each a `(tag, array, summary_metadata)`.

    Args:
      records: the values, in order; arrays are written as float64 tensors.
      carries_metadata: `tag -> bool`, whether that value carries its
        metadata (TensorBoard keeps a series' first metadata, so writers send
        it once per tag and file).
    """
    summary = summary_pb2.Summary()
    for tag, array, summary_metadata in records:
        value = summary.value.add(tag=tag, tensor=_tensor_proto(array))
        if carries_metadata(tag):
            value.metadata.CopyFrom(summary_metadata)
    return summary


def masked_crc32c(data):
    """TFRecord's checksum: CRC32C, rotated right by 15 bits, plus a constant (mod 2^32)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data):
    """Returns `data` framed as a TFRecord: length, its checksum, the data, its checksum."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


_file_numbers = itertools.count()


class EventFile:
    """An event file that TensorBoard reads: `events.out.tfevents.<time>.<host>.<pid>.<n><suffix>`.

    Writes the file-version event first, as TensorBoard's writers do, then
    serialized events as they come. TensorBoard's own `EventFileWriter`
    checksums in pure Python; `google_crc32c` does it in C (the two are
    timed in bench/RESULTS.md, section 1).
    """

    def __init__(self, logdir, suffix=".gradviz", wall_time=None):
        wall_time = time.time() if wall_time is None else wall_time
        os.makedirs(logdir, exist_ok=True)
        name = f"events.out.tfevents.{int(wall_time):010d}.{socket.gethostname()}.{os.getpid()}.{next(_file_numbers)}{suffix}"
        self.path = os.path.join(os.fspath(logdir), name)
        self._stream = open(self.path, "wb")
        self.write(event_pb2.Event(wall_time=wall_time, file_version="brain.Event:2").SerializeToString())

    def write(self, *events):
        """Writes serialized events; `flush` makes them visible to readers."""
        self._stream.write(b"".join(tfrecord(event) for event in events))

    def flush(self):
        self._stream.flush()

    def close(self):
        self._stream.close()


class EventLog:
    """Writes tb_gradviz records into one event file of a run directory.

    The file is created at the first write, so nothing is written if nothing
    fires. Each summary's metadata goes out with the first value of its tag in
    this file only (TensorBoard keeps the first), and every `write` is flushed,
    so an interrupted process leaves whole, readable records.
    """

    def __init__(self, logdir):
        self.logdir = os.fspath(logdir)
        self._file = None
        self._tags_with_metadata = set()

    def write(self, step, records, wall_time=None):
        """Writes one event holding `records` at `step`, and flushes it.

        Args:
          step: the global step (an int).
          records: iterable of `(tag, array, summary_metadata)`.
          wall_time: seconds since the epoch; defaults to now.
        """
        records = list(records)
        first_values = {tag for tag, _, _ in records} - self._tags_with_metadata
        summary = summary_proto(records, first_values.__contains__)
        self._tags_with_metadata |= first_values
        if not summary.value:
            return
        if self._file is None:
            self._file = EventFile(self.logdir)
        event = event_pb2.Event(step=int(step), summary=summary)
        event.wall_time = time.time() if wall_time is None else wall_time
        self._file.write(event.SerializeToString())
        self._file.flush()

    def close(self):
        """Closes the file; a later `write` opens a new one."""
        if self._file is not None:
            self._file.close()
            self._file = None
            self._tags_with_metadata.clear()


def tensor_records(layer, tensor, histogram, stats, content):
    """Returns the `(tag, array, metadata)` records of one tensor of one layer.

    Args:
      layer: the layer path, e.g. `"resnet50/pool1_pool"`.
      tensor: the tensor name, e.g. `"input_gradient"`.
      histogram: the `[k, 3]` linear histogram.
      stats: the `STATS_LENGTH` stats vector.
      content: layer and tensor metadata (see docs/FORMAT.md); the tags and
        the layouts are added here.
    """
    hist_tag = histogram_tag(layer, tensor)
    stats_content = dict(
        content,
        kind=metadata.KIND_TENSOR,
        layer=layer,
        tensor=tensor,
        histogram_tag=hist_tag,
        log_edges=log_edges_description(),
    )
    return [
        (hist_tag, histogram, metadata.create_histogram_metadata(f"tb_gradviz: {tensor} of {layer}")),
        (stats_tag(layer, tensor), stats, metadata.create_summary_metadata(stats_content)),
    ]


def routing_records(layer, routing, content):
    """Returns the `(tag, array, metadata)` record of a pooling layer's routing."""
    routing_content = dict(content, kind=metadata.KIND_ROUTING, layer=layer)
    return [(routing_tag(layer), routing, metadata.create_summary_metadata(routing_content))]
