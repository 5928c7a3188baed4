"""The event writer of tb_gradviz: records into TensorBoard event files.

Imports neither TensorFlow nor Keras, so runs are written the same way on
every backend (and without one, e.g. for benchmarks). What a record holds is
`records`' business; this module frames `(tag, array, metadata)` values as
`Summary` protos, events and TFRecords.
"""

import itertools
import os
import socket
import struct
import time

import google_crc32c
import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

from tb_gradviz.format import digest, digest_levels, digest_parts, metadata, storage, upload
from tb_gradviz.format.records import (
    histogram_tag,
    log_edges_description,
    precision_tag,
    routing_map_tag,
    routing_tag,
    stats_tag,
    units_tag,
    update_tag,
)


def _tensor_proto(array):
    # float32 stays float32 (routing maps, to fit twice the values in their
    # byte budget); everything else is float64.
    float32 = getattr(array, "dtype", None) == np.float32
    array = np.ascontiguousarray(array, dtype=np.float32 if float32 else np.float64)
    return tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT if float32 else types_pb2.DT_DOUBLE,
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
    return (
        header
        + struct.pack("<I", masked_crc32c(header))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


_file_numbers = itertools.count()

# An event file bound for an object store is re-uploaded whole after each log
# event, so it is closed, and the next one begun, after this many events or
# bytes: each upload then puts at most ~ROTATE_BYTES plus one event, and a
# run uploads about ROTATE_EVENTS / 2 times its size in all.
ROTATE_EVENTS = 10
ROTATE_BYTES = 4 << 20


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
        # TensorBoard reads a run's files in name order and skips a file named
        # before one it has read: the number is zero-padded so that a
        # process's tenth file in a second sorts after its ninth.
        number = next(_file_numbers)
        name = (
            f"events.out.tfevents.{int(wall_time):010d}.{socket.gethostname()}.{os.getpid()}"
            f".{number:06d}{suffix}"
        )
        self.name = name
        self.path = os.path.join(os.fspath(logdir), name)
        self.size = 0  # bytes written
        self._stream = open(self.path, "wb")  # noqa: SIM115 (open until close())
        self.write(
            event_pb2.Event(wall_time=wall_time, file_version="brain.Event:2").SerializeToString()
        )

    def write(self, *events):
        """Writes serialized events; `flush` makes them visible to readers."""
        data = b"".join(tfrecord(event) for event in events)
        self._stream.write(data)
        self.size += len(data)

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

    The run directory may be a local path, a `file://` URL or a remote URL
    (`storage.location`). A remote run's file is written to a local spool
    file, uploaded whole after each write by an `upload.Uploader` thread
    (a failing store never stops the writer), and replaced by a new file
    after `ROTATE_EVENTS` events or `ROTATE_BYTES` bytes.

    Each event also gets the digest of its records (`digest.digest_records`),
    unless `with_digest` is False (to write a run as older versions did). A
    digest is written into its series' current part (`digest_parts.Parts`,
    held across files and `close`), unless `digest_in_parts` is False (a digest
    series under one tag, as before layout 13). Each digest also goes into the
    coarser levels of its series (`digest_levels.Levels`, layout 15), written in
    the event that finishes a level's span, unless `with_levels` is False (as
    before layout 15).
    """

    def __init__(self, logdir, with_digest=True, digest_in_parts=True, with_levels=True):
        self.location = logdir if isinstance(logdir, storage.Location) else storage.location(logdir)
        self.logdir = self.location.url
        self._file = None
        self._steps = []  # steps of the events in the current file
        self._tags_with_metadata = set()
        self._with_digest = with_digest
        self._parts = digest_parts.Parts() if with_digest and digest_in_parts else None
        self._levels = None
        if self._parts is not None and with_levels:
            self._levels = digest_levels.Levels()
        self._uploader = upload.Uploader(self.location) if self.location.is_remote else None

    def write(self, step, records, wall_time=None, add_digest=True):
        """Writes one event holding `records` at `step`, and flushes it.

        Args:
          step: the global step (an int).
          records: iterable of `(tag, array, summary_metadata)`; the digest
            is added.
          wall_time: seconds since the epoch; defaults to now.
          add_digest: False to write `records` as they are (they hold their
            digest, or are the full records of an event whose digest is
            written: `full_records.Keeper`).
        """
        records = list(records)
        if self._with_digest and add_digest:
            records += digest.digest_records(records)
        if self._levels is not None:
            records += [level for record in records for level in self._levels.add(step, record)]
        if self._parts is not None:
            records = [self._parts.place(step, record) for record in records]
        first_values = {tag for tag, _, _ in records} - self._tags_with_metadata
        summary = summary_proto(records, first_values.__contains__)
        self._tags_with_metadata |= first_values
        if not summary.value:
            return
        wall_time = time.time() if wall_time is None else wall_time
        if self._file is None:
            folder = self.location.local_path if self._uploader is None else self._uploader.spool()
            self._file = EventFile(folder, wall_time=wall_time)
        event = event_pb2.Event(step=int(step), summary=summary, wall_time=wall_time)
        self._file.write(event.SerializeToString())
        self._file.flush()
        if self._uploader is not None:
            self._steps.append(int(step))
            full = len(self._steps) >= ROTATE_EVENTS or self._file.size >= ROTATE_BYTES
            self._publish(final=full)

    def _publish(self, final):
        if final:
            self._file.close()
        self._uploader.publish(self._file.name, self._file.size, self._steps, final)
        if final:
            self._file = None
            self._steps = []
            self._tags_with_metadata.clear()

    def close(self):
        """Closes the file; a later `write` opens a new one.

        For a remote run, waits (at most `upload.CLOSE_TIMEOUT_S`) until the
        file is uploaded, and warns with what is kept locally if it is not.

        Returns:
          The steps of log events not in the store (always empty for a local run).
        """
        if self._file is not None:
            if self._uploader is not None:
                self._publish(final=True)
            else:
                self._file.close()
                self._file = None
        self._tags_with_metadata.clear()
        return [] if self._uploader is None else self._uploader.close()


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
        (
            hist_tag,
            histogram,
            metadata.create_histogram_metadata(f"tb_gradviz: {tensor} of {layer}"),
        ),
        (stats_tag(layer, tensor), stats, metadata.create_summary_metadata(stats_content)),
    ]


def precision_records(layer, tensor, vector, content):
    """Returns the `(tag, array, metadata)` record of a tensor's precision.

    The values are `summaries.precision_vector`'s.

    Args: as `tensor_records`; `vector` is the `PRECISION_LENGTH` record.
    """
    precision_content = dict(content, kind=metadata.KIND_PRECISION, layer=layer, tensor=tensor)
    return [
        (
            precision_tag(layer, tensor),
            vector,
            metadata.create_summary_metadata(precision_content),
        )
    ]


def routing_records(layer, routing, content):
    """Returns the `(tag, array, metadata)` record of a pooling layer's routing."""
    routing_content = dict(content, kind=metadata.KIND_ROUTING, layer=layer)
    return [(routing_tag(layer), routing, metadata.create_summary_metadata(routing_content))]


def units_records(layer, units, content):
    """Returns the `(tag, array, metadata)` record of a layer's dead units (`units_vector`)."""
    units_content = dict(content, kind=metadata.KIND_UNITS, layer=layer)
    return [(units_tag(layer), units, metadata.create_summary_metadata(units_content))]


def routing_map_records(layer, routing_map, content):
    """Returns the `(tag, array, metadata)` record of a pooling layer's routing map (float32)."""
    map_content = dict(content, kind=metadata.KIND_ROUTING_MAP, layer=layer)
    return [(routing_map_tag(layer), routing_map, metadata.create_summary_metadata(map_content))]


def update_records(layer, weight, update, content):
    """Returns the `(tag, array, metadata)` record of a weight's update size (`update_vector`)."""
    update_content = dict(content, kind=metadata.KIND_UPDATE, layer=layer)
    return [(update_tag(layer, weight), update, metadata.create_summary_metadata(update_content))]
