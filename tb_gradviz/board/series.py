"""Decoded tb_gradviz series and the caches that outlive a request.

`Series` is one time series decoded into today's record layout
(`records.Layout`); `Caches` holds the plugin's decoded series, listings and
reader threads, each entry valid for one version of its series.
`column_starts` and `envelope` group a series' steps into columns for the
views over steps (`/series`, `/timeline`), keeping each column's extremes.
"""

import collections
import concurrent.futures
import contextlib
import threading

import numpy as np

from tb_gradviz.board import catalog
from tb_gradviz.format import records

# Upper bound of the decoded-series cache, in time series (a 500-step stats
# series is ~350 kB): enough for a few runs of 50 layers.
_CACHE_MAX_SERIES = 2048
_CACHE_MAX_LISTINGS = 16384
# Whole response bodies that cost a pass over a run's every step (`/timeline`).
_CACHE_MAX_BODIES = 16


class Series:
    """One decoded time series: steps, wall times and one record per row.

    Rows are sorted by step (stable, so the provider's order breaks ties);
    rows whose record has no known layout or malformed counts are left out.
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


def decode_series(data, layout):
    """Returns the `Series` of a list of `provider.TensorDatum` in `layout` (a `records.Layout`)."""
    kept = []
    for datum in data:
        array = layout.upgrade(datum.numpy)
        if array is not None:
            kept.append((datum.step, datum.wall_time, array))
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
    rows = np.flatnonzero(valid)[np.argsort(steps[valid], kind="stable")]
    if len(rows) == len(values) and np.all(rows[1:] > rows[:-1]):
        # Every row valid and in step order (the usual case): no copy.
        return Series(steps, wall_times, values)
    return Series(steps[rows], wall_times[rows], values[rows])


class _VersionedCache:
    """Values under a key, each valid for one version, least recently used dropped first.

    Series are cached under their `(max_step, max_wall_time)` from
    `list_tensors`: a reload that adds points changes both, so a stale entry
    is never served.
    """

    def __init__(self, max_entries):
        self._max_entries = max_entries
        self._entries = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, version):
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] != version:
                return None
            self._entries.move_to_end(key)
            return entry[1]

    def put(self, key, version, value):
        with self._lock:
            self._entries[key] = (version, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)


def version(time_series):
    """The version a listed series' cache entries are valid for."""
    return (time_series.max_step, time_series.max_wall_time)


class Caches:
    """What outlives a request: decoded series, listings, reader threads, warnings given."""

    def __init__(self, max_series=_CACHE_MAX_SERIES):
        self.series = _VersionedCache(max_series)
        self.listings = _VersionedCache(_CACHE_MAX_LISTINGS)
        # Under the versions of every series a body read.
        self.bodies = _VersionedCache(_CACHE_MAX_BODIES)
        # /series reads a tensor's stats and its histograms at once: each read
        # of the Rust data server has a fixed wait however small the answer
        # (bench/RESULTS.md, section 4).
        self.readers = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="gradviz-read")
        self.skip_warning = catalog.SkipWarning()
        self._reading = collections.defaultdict(threading.Lock)
        self._reading_guard = threading.Lock()

    @contextlib.contextmanager
    def reading(self, keys):
        """Holds the read of these series keys: another request reading one of them waits.

        The locks are taken in sorted order, so that two requests never wait
        for each other.
        """
        with self._reading_guard:
            locks = [self._reading[key] for key in sorted(set(keys))]
        with contextlib.ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            yield
