"""Coarser levels of the digest: one pooled digest per span of events, written as the run goes.

A run logged at every step has tens of thousands of digests; a view of the
whole run (`/timeline`) draws at most a few thousand columns, and reading
every digest to pool them costs seconds and gigabytes. So the writer
(`events.EventLog`) also pools, for each level in `LEVELS`, every `events`
consecutive digests of a series into one (layout 15, docs/FORMAT.md), and a
reader of the whole run reads the coarsest level that still gives the columns
it draws (`board/levels.py`), and the digests themselves only where no level
covers them yet.

A level's value is a float32 vector: `SPAN_FIELDS` (the span: how many events,
its first step, the step of the writer's event before it), then one digest of
the series' rows (`digest.FIELDS`) pooled over the span (`Pool`):

* counts (`digest.COUNT_FIELDS`: a `tensor` row's `count`, `zeros`, `nan`,
  `pos_inf`, `neg_inf`; a `units` row's `channels` and `dead_channels`; a
  `precision` row's counts) are summed, so a count raised at any event of the
  span is raised in the level; a precision row's `mxfp8_e4m3_to_zero` is NaN
  when any event of the span does not know it;
* `rms` is that of all the span's finite values together,
  sqrt(sum finite * rms**2 / sum finite), finite = count - nan - pos_inf - neg_inf;
* `max_abs` and an `update` row's `update_ratio` and `interval` are the span's
  largest (NaN ignored).

Its tag is `gradviz_digest/level/<events>/<12 hex of the rows>`, written in
parts as the digest is (`digest_parts`): `.../<first step>`. Numpy only.
"""

from typing import NamedTuple

import numpy as np

from tb_gradviz.format import digest, digest_parts, metadata

# Events pooled by each level. A reader needs a level of at least as many
# points as columns: with a factor of 4 between levels it reads at most four
# times as many, and the levels add about 1/12 to the digest's bytes.
LEVELS = (16, 64, 256, 1024, 4096)
# The span before the pooled digest: how many events; the first step and the step of the
# writer's event just before the span (high and low 24 bits, exact in float32; high -1: none).
SPAN_FIELDS = (
    "events",
    "first_step_high",
    "first_step_low",
    "previous_step_high",
    "previous_step_low",
)
_LOW = 1 << 24


def level_tag(rows, events):
    """The tag of the level of `events` events of a digest with these rows (its parts' prefix)."""
    return digest.digest_tag(rows).replace(digest.TAG_PREFIX, f"{digest.TAG_PREFIX}/level/{events}")


def _part(described, events, first_step, max_events):
    """A level part's tag and summary metadata: kind `digest_level`, what the digest's metadata
    says (its `rows`, ...), `level` and `part`."""
    content = dict(
        described,
        kind=metadata.KIND_DIGEST_LEVEL,
        level={"events": int(events)},
        part={"first_step": int(first_step), "max_events": int(max_events)},
    )
    tag = digest_parts.part_tag(level_tag(described["rows"], events), first_step)
    return tag, metadata.create_summary_metadata(content, plugin_name=digest.PLUGIN_NAME)


def _split(step):
    return (-1.0, 0.0) if step is None else divmod(int(step), _LOW)


def span_steps(values):
    """`(events, first_step, previous_step)` `[n]` int arrays of `[n, len(SPAN_FIELDS) + ...]`
    level vectors; previous_step -1 where the span begins its writer's first event."""
    values = np.asarray(values).reshape(-1, np.shape(values)[-1])[:, : len(SPAN_FIELDS)]
    values = values.astype(np.float64)
    first = values[:, 1].astype(np.int64) * _LOW + values[:, 2].astype(np.int64)
    previous = np.where(
        values[:, 3] < 0, -1, values[:, 3].astype(np.int64) * _LOW + values[:, 4].astype(np.int64)
    )
    return values[:, 0].astype(np.int64), first, previous


class _Fields(NamedTuple):
    """Where each kind of pooled field is in a digest of some rows."""

    summed: np.ndarray  # counts (the others are the largest, but rms)
    rms: np.ndarray  # each tensor row's rms
    counts: np.ndarray  # [tensor rows, 4]: its count, nan, pos_inf, neg_inf


def _fields(rows):
    offsets, _ = digest.row_offsets(rows)
    summed, rms, counts = [], [], []
    tensor = digest.TENSOR_FIELDS
    for (kind, _, _), offset in zip(rows, offsets):
        names = digest.FIELDS[kind]
        for i, name in enumerate(names):
            if kind == digest.TENSOR and name == "rms":
                rms.append(offset + i)
            elif name in digest.COUNT_FIELDS[kind]:
                summed.append(offset + i)
        if kind == digest.TENSOR:
            counts.append(
                [offset + tensor.index(f) for f in ("count", "nan", "pos_inf", "neg_inf")]
            )
    as_array = lambda found: np.array(found, np.int64)  # noqa: E731
    return _Fields(as_array(summed), as_array(rms), as_array(counts).reshape(-1, 4))


class Pool:
    """One span's pooled digest of some rows, added to an event at a time (float64 sums)."""

    def __init__(self, rows, fields=None):
        self._fields = _fields(rows) if fields is None else fields
        self.events = 0
        self.first_step = None
        self.previous_step = None
        self._sum = self._max = self._squares = self._finite = None

    def add(self, step, vector, previous_step=None):
        """Adds one event's digest (today's layout) at `step`; `previous_step` is the step of the
        writer's event before it (None: none), kept when it begins the span."""
        vector = np.asarray(vector, np.float64)
        counts = vector[self._fields.counts]
        finite = counts[:, 0] - counts[:, 1:].sum(axis=1)
        some = finite > 0
        finite = np.where(some, finite, 0.0)
        squares = finite * np.where(some, vector[self._fields.rms], 0.0) ** 2
        if self._sum is None:
            self.first_step, self.previous_step = int(step), previous_step
            self._sum, self._max = vector.copy(), vector.copy()
            self._squares, self._finite = squares, finite
        else:
            # Every field summed and every field's largest: `vector` takes each from one.
            np.add(self._sum, vector, out=self._sum)
            np.fmax(self._max, vector, out=self._max)
            self._squares += squares
            self._finite += finite
        self.events += 1

    def merge(self, other):
        """Adds a finished `Pool` of the same rows, of the events right after this one's."""
        if self._sum is None:
            self.first_step, self.previous_step = other.first_step, other.previous_step
            self._sum, self._max = other._sum.copy(), other._max.copy()
            self._squares, self._finite = other._squares.copy(), other._finite.copy()
        else:
            np.add(self._sum, other._sum, out=self._sum)
            np.fmax(self._max, other._max, out=self._max)
            self._squares += other._squares
            self._finite += other._finite
        self.events += other.events

    def vector(self):
        """The level's float32 vector: `SPAN_FIELDS`, then the pooled digest."""
        f = self._fields
        values = self._max.copy()
        values[f.summed] = self._sum[f.summed]
        with np.errstate(invalid="ignore", divide="ignore"):
            values[f.rms] = np.where(
                self._finite > 0, np.sqrt(self._squares / np.maximum(self._finite, 1e-300)), np.nan
            )
        span = [self.events, *_split(self.first_step), *_split(self.previous_step)]
        return np.concatenate([span, values]).astype(np.float32)


def pooled(rows, steps, vectors):
    """The one level vector of these digests (`[n, length]`, today's layout) at `steps`."""
    pool = Pool(rows)
    for step, vector in zip(steps, vectors):
        pool.add(step, vector)
    return pool.vector()


class _Series(NamedTuple):
    """What `Levels` holds of one digest series."""

    described: dict  # its metadata's content but `version`, `kind` and `part`
    fields: _Fields
    pools: dict  # events -> the `Pool` of the span being filled
    parts: dict  # events -> `[tag, summary metadata, max_events, points]` of its open part
    last_step: object  # the step of the writer's last event of the series, or None


class Levels:
    """Pools each digest series' events into its levels as they are written, and puts each
    level point into its part: the one owner of that state. The writer holds one `Levels` for
    all its events (across files and repeated `fit` calls); a span left unfinished when the
    writer ends is not written, and a reader reads those events from the digest itself."""

    def __init__(self, levels=LEVELS):
        levels = tuple(int(events) for events in levels)
        # Each level pools whole spans of the one before it: an event is added once, to the
        # finest, and each finished span to the next.
        if not levels or levels[0] < 1 or any(b % a or b <= a for a, b in zip(levels, levels[1:])):
            raise ValueError(
                "levels must be increasing event counts, each a multiple of the one before; "
                f"received {levels}"
            )
        self._levels = levels
        self._series = {}  # digest tag -> `_Series`, or None for another record

    def add(self, step, record):
        """The level records (`(tag, float32 vector, metadata)`) that `record` finishes: none
        for a record that is not a whole-series digest (`digest.digest_records`' record)."""
        tag, vector, summary_metadata = record
        found = self._series.get(tag, False)
        if found is False:
            found = self._series[tag] = _described(summary_metadata)
        if found is None:
            return []
        finished, done = [], None
        for events in self._levels:
            pool = found.pools.get(events)
            if pool is None:
                pool = found.pools[events] = Pool(found.described["rows"], found.fields)
            if done is None:
                pool.add(step, vector, found.last_step)
            else:
                pool.merge(done)
            if pool.events < events:
                break
            del found.pools[events]
            finished.append(self._placed(found, events, pool))
            done = pool
        self._series[tag] = found._replace(last_step=int(step))
        return finished

    @staticmethod
    def _placed(found, events, pool):
        """The record of a finished span, in its level's part (a new one when it is full)."""
        point = pool.vector()
        part = found.parts.get(events)
        if part is None or part[3] >= part[2]:
            max_events = digest_parts.events_per_part(point.nbytes)
            part = found.parts[events] = [
                *_part(found.described, events, pool.first_step, max_events),
                max_events,
                0,
            ]
        part[3] += 1
        return part[0], point, part[1]


def _described(summary_metadata):
    """The `_Series` of a whole-series digest's metadata, None for another record."""
    if summary_metadata is None or summary_metadata.plugin_data.plugin_name != (digest.PLUGIN_NAME):
        return None
    try:
        parsed = metadata.parse_plugin_metadata(summary_metadata.plugin_data.content)
    except ValueError:
        return None
    if parsed["kind"] != metadata.KIND_DIGEST or "part" in parsed:
        return None
    described = {k: v for k, v in parsed.items() if k not in ("version", "kind", "part")}
    return _Series(described, _fields(described["rows"]), {}, {}, None)


class LevelLayout:
    """The `layout.Layout`-like reading of a level with these rows: its length, and its counts
    (the span's events, the pooled digest's) checked as the digest's are."""

    # Read as written: a level is a reader's largest series, and float32 loses nothing of it.
    dtype = np.float32

    def __init__(self, rows):
        inner = digest.DigestLayout(rows)
        self.name = "digest level"
        self.shape = (len(SPAN_FIELDS) + inner.shape[0],)
        self._inner = inner

    def upgrade(self, array):
        array = np.asarray(array, dtype=np.float64)
        return array if array.shape == self.shape else None

    def valid_rows(self, values):
        values = np.asarray(values).reshape(len(values), -1)
        span = values[:, : len(SPAN_FIELDS)]
        whole = np.all(np.isfinite(span), axis=1) & (span[:, 0] >= 1)
        return whole & self._inner.valid_rows(values[:, len(SPAN_FIELDS) :])
