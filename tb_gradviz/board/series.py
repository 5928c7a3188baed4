"""Decoded tb_gradviz series and the caches that outlive a request.

`Series` is one time series decoded into today's record layout
(`records.Layout`); `Caches` holds the plugin's decoded series, listings and
reader threads, each entry valid for one version of its series, each cache
bounded in entries and in bytes.
`column_starts` and `envelope` group a series' steps into columns for the
views over steps (`/series`, `/timeline`), keeping each column's extremes.
"""

import collections
import concurrent.futures
import contextlib
import logging
import threading
from typing import NamedTuple

import numpy as np

from tb_gradviz.board import catalog
from tb_gradviz.format import records

# Upper bounds of the decoded-series cache, in time series and in bytes: a
# stats series grows with its steps, and a long run's digest series is
# hundreds of MB, so a count alone bounds nothing.
_CACHE_MAX_SERIES = 2048
_CACHE_MAX_SERIES_BYTES = 1 << 30
_CACHE_MAX_LISTINGS = 16384
_CACHE_MAX_LISTING_BYTES = 64 << 20
# Whole response bodies that cost a pass over a run's every step (`/timeline`), and what they are
# cut from (`timeline.Source`).
_CACHE_MAX_BODIES = 16
_CACHE_MAX_BODY_BYTES = 512 << 20
# What an entry costs besides its value: its key, version and bookkeeping.
ENTRY_BYTES = 256
# The steps a warning of rows left out names, at most; the rows remembered as named, at most.
_NAMED_STEPS = 10
_MAX_NAMED_ROWS = 1 << 16

# Why rows whose counts are malformed are left out (`decode_series`).
MALFORMED = "their {} record counts are not all finite and non-negative"

logger = logging.getLogger(__name__)


class Series:
    """One decoded time series: steps, wall times and one record per row.

    Rows are sorted by step (stable, so the provider's order breaks ties);
    rows whose record has no known layout or malformed counts are left out
    (`decode_series` says which).
    `values` is an array of the rows, or a list for records whose size the
    metadata fixes (routing maps).
    """

    __slots__ = ("steps", "wall_times", "values")

    def __init__(self, steps, wall_times, values):
        self.steps = steps
        self.wall_times = wall_times
        self.values = values

    def index_at_or_before(self, step):
        """Returns the row of the latest step `<= step`, or None if there is none."""
        position = int(np.searchsorted(self.steps, step, side="right"))
        return position - 1 if position else None

    def row(self, index):
        """Returns a `Series` of the row `index` alone."""
        values = self.values[index : index + 1]
        return Series(self.steps[index : index + 1], self.wall_times[index : index + 1], values)

    @property
    def nbytes(self):
        """The bytes of its arrays."""
        values = self.values
        held = values.nbytes if isinstance(values, np.ndarray) else sum(a.nbytes for a in values)
        return self.steps.nbytes + self.wall_times.nbytes + held

    def rows_at(self, steps):
        """Returns the row of each of `steps`, None where absent.

        A step repeated in the series gives its last row.
        """
        row_of_step = {step: row for row, step in enumerate(self.steps.tolist())}
        return [row_of_step.get(step) for step in steps]


def column_starts(count, width):
    """Where each of `min(count, width)` columns of consecutive steps begins (equal shares).

    Column `k` holds the steps `starts[k]` to `starts[k + 1] - 1`; every
    column holds `count // width` or one more steps.
    """
    columns = min(count, width)
    return (np.arange(columns) * count) // max(columns, 1)


def envelope(array, starts):
    """`{"min", "max"}`: lists of each column's extremes along the first axis of `array`.

    NaN is ignored, and a column whose values are all NaN gives NaN.
    """
    low, high = np.fmin.reduceat(array, starts), np.fmax.reduceat(array, starts)
    return {"min": low.tolist(), "max": high.tolist()}


def downsampled_columns(steps, columns, width):
    """A stats series in `width` columns of consecutive steps, each keeping its extremes.

    Args:
      steps: the series' `[n]` steps, `n > width`.
      columns: `records.stats_columns` of its rows.
      width: the number of columns.

    Returns:
      `{"columns": {"first_step", "last_step"}, "stats": {field: {"min", "max"}},
      "log": {"edges", "negative", "positive"}}`: per column, its first and last
      step, each stat's extremes and each magnitude bin's largest count.
    """
    starts = column_starts(len(steps), width)
    ends = np.append(starts[1:], len(steps)) - 1
    return {
        "columns": {"first_step": steps[starts].tolist(), "last_step": steps[ends].tolist()},
        "stats": {name: envelope(columns[name], starts) for name in records.STATS_FIELDS},
        "log": {
            "edges": records.LOG_EDGES.tolist(),
            "negative": np.maximum.reduceat(columns["negative"], starts).tolist(),
            "positive": np.maximum.reduceat(columns["positive"], starts).tolist(),
        },
    }


def decode_series(data, layout, left_out=None):
    """Returns the `Series` of a list of `provider.TensorDatum` in `layout` (a `records.Layout`).

    Args:
      left_out: None, or a function called as `left_out(steps, reason)` when
        rows fail validation and are left out: their steps, in the order
        read, and why (`LeftOutRows` logs it).
    """
    kept, unknown = [], []
    for datum in data:
        array = layout.upgrade(datum.numpy)
        if array is not None:
            kept.append((datum.step, datum.wall_time, array))
        else:
            unknown.append(datum.step)
    if unknown and left_out is not None:
        left_out(unknown, f"no {layout.name} record layout has their shape")
    if None in layout.shape:
        # A record whose size its metadata fixes (routing maps): rows stay a
        # list, for the reader to match against that metadata.
        kept.sort(key=lambda entry: entry[0])
        steps = np.array([step for step, _, _ in kept], dtype=np.int64)
        return Series(
            steps, np.array([w for _, w, _ in kept], dtype=np.float64), [a for _, _, a in kept]
        )
    if not kept:
        return Series(
            np.zeros(0, np.int64), np.zeros(0), np.zeros((0,) + tuple(n or 0 for n in layout.shape))
        )
    steps = np.array([step for step, _, _ in kept], dtype=np.int64)
    wall_times = np.array([wall_time for _, wall_time, _ in kept], dtype=np.float64)
    values = np.stack([array for _, _, array in kept])
    # The rows are copied into `values`: let them go before anything else is
    # allocated (a long run's digest series is hundreds of MB).
    del kept
    valid = layout.valid_rows(values)
    if left_out is not None and not valid.all():
        left_out(steps[~valid].tolist(), MALFORMED.format(layout.name))
    rows = np.flatnonzero(valid)[np.argsort(steps[valid], kind="stable")]
    if len(rows) == len(values) and np.all(rows[1:] > rows[:-1]):
        # Every row valid and in step order (the usual case): no copy.
        return Series(steps, wall_times, values)
    return Series(steps[rows], wall_times[rows], values[rows])


def listing_bytes(time_series):
    """The bytes a listed `provider.TensorTimeSeries` holds, besides `ENTRY_BYTES`."""
    texts = (time_series.plugin_content, time_series.description, time_series.display_name)
    return sum(len(text or "") for text in texts)


def body_bytes(value):
    """An estimate of the bytes a JSON-like body holds, besides `ENTRY_BYTES`.

    32 bytes a number or None (the object and the pointer to it), a string's
    length, 64 bytes a list or dict besides its items. A list whose first
    item is a number is taken as a list of numbers, as a body's columns are,
    without visiting the others.
    """
    if isinstance(value, dict):
        return 64 + sum(body_bytes(k) + body_bytes(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        if value and isinstance(value[0], (int, float)):
            return 64 + 32 * len(value)
        return 64 + sum(body_bytes(item) for item in value)
    if isinstance(value, str):
        return len(value)
    if isinstance(value, np.ndarray):
        return value.nbytes
    return 32


class LeftOutRows:
    """Logs the rows of a series that a decode leaves out, naming the run, the tag and the steps.

    Each row once: a series is decoded again whenever points are added to
    it, and the rows already named are not named again. At most
    `_MAX_NAMED_ROWS` rows are remembered; past them a row may be named again,
    never left unnamed.
    """

    def __init__(self):
        self._named = set()
        self._lock = threading.Lock()

    def __call__(self, run, tag, steps, reason):
        with self._lock:
            new = [step for step in steps if (run, tag, step) not in self._named]
            if len(self._named) + len(new) <= _MAX_NAMED_ROWS:
                self._named.update((run, tag, step) for step in new)
        if not new:
            return
        named = ", ".join(str(step) for step in new[:_NAMED_STEPS])
        more = f" and {len(new) - _NAMED_STEPS} more" if len(new) > _NAMED_STEPS else ""
        logger.warning(
            "tb_gradviz leaves out %d row(s) of run %r, tag %r, at step(s) %s%s: %s",
            len(new),
            run,
            tag,
            named,
            more,
            reason,
        )


class _Entry(NamedTuple):
    version: tuple
    value: object
    # What it counts of its cache's bytes.
    size: int


class VersionedCache:
    """Values under a key, each valid for one version, least recently used dropped first.

    Series are cached under their `(max_step, max_wall_time)` from
    `list_tensors`: a reload that adds points changes both, so a stale entry
    is never served. The cache holds at most `max_entries` entries and
    `max_bytes` bytes, an entry counting `size(value) + ENTRY_BYTES`; a
    value larger than that alone is not kept.
    """

    def __init__(self, max_entries, max_bytes, size):
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._size = size
        self._entries = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self):
        """The bytes its entries count."""
        return self._bytes

    def keys_by_use(self):
        """Its keys, least recently used first."""
        with self._lock:
            return list(self._entries)

    def get(self, key, version):
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.version != version:
                return None
            self._entries.move_to_end(key)
            return entry.value

    def put(self, key, version, value):
        size = self._size(value) + ENTRY_BYTES
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            if size > self._max_bytes:
                return
            self._entries[key] = _Entry(version, value, size)
            self._bytes += size
            while len(self._entries) > self._max_entries or self._bytes > self._max_bytes:
                self._bytes -= self._entries.popitem(last=False)[1].size


class _KeyLock:
    """A key's lock and how many hold or wait for it."""

    __slots__ = ("lock", "users")

    def __init__(self):
        self.lock = threading.Lock()
        self.users = 0


class KeyLocks:
    """One lock per key, which lives only while a holder holds or waits for it."""

    def __init__(self):
        self._guard = threading.Lock()
        self._locks = {}

    def __len__(self):
        with self._guard:
            return len(self._locks)

    @contextlib.contextmanager
    def holding(self, keys):
        """Holds the locks of `keys`, taken in sorted order so that two holders never wait for
        each other; each is dropped when its last holder or waiter leaves."""
        keys = sorted(set(keys))
        with self._guard:
            held = [self._locks.setdefault(key, _KeyLock()) for key in keys]
            for key_lock in held:
                key_lock.users += 1
        try:
            with contextlib.ExitStack() as stack:
                for key_lock in held:
                    stack.enter_context(key_lock.lock)
                yield
        finally:
            with self._guard:
                for key, key_lock in zip(keys, held):
                    key_lock.users -= 1
                    if not key_lock.users:
                        del self._locks[key]


def version(time_series):
    """The version a listed series' cache entries are valid for."""
    return (time_series.max_step, time_series.max_wall_time)


class Caches:
    """What outlives a request: decoded series, listings, reader threads, warnings given.

    Args:
      max_series, max_series_bytes: the bounds of the decoded-series cache.
    """

    def __init__(self, max_series=_CACHE_MAX_SERIES, max_series_bytes=_CACHE_MAX_SERIES_BYTES):
        self.series = VersionedCache(max_series, max_series_bytes, lambda s: s.nbytes)
        self.listings = VersionedCache(_CACHE_MAX_LISTINGS, _CACHE_MAX_LISTING_BYTES, listing_bytes)
        # Under the versions of every series a body read.
        self.bodies = VersionedCache(_CACHE_MAX_BODIES, _CACHE_MAX_BODY_BYTES, body_bytes)
        # /series reads a tensor's stats and its histograms at once: each read
        # of the Rust data server has a fixed wait however small the answer
        # (bench/RESULTS.md, section 4).
        self.readers = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="gradviz-read")
        self.skip_warning = catalog.SkipWarning()
        self.left_out = LeftOutRows()
        # The reads in flight, by key (`reading`).
        self.locks = KeyLocks()

    def reading(self, keys):
        """Holds the read of these keys (of series, or of a body): another request reading one
        of them waits, then finds it in its cache. A key's lock lives only while it is read."""
        return self.locks.holding(keys)
