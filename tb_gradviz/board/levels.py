"""A long run's depth x time view from the digest's coarser levels (`format/digest_levels`).

`/timeline` draws at most `width` columns. Over a range of more than
`FINE_EVENTS` events it reads the coarsest level of the run's digest series
that still has `width` points in the range (the finest level when none has),
and the digest itself only where no point of that level covers an event: the
events after its last span (a span not finished yet), and those of a writer
that ended before finishing a span. Each point of the view is then a span of
events, pooled as the level pools them, and its flags are the rules judged
over the pooled values (`health.verdicts`). A run without levels, with
several digest series, or with fewer events in the range is read from its
digest whole, as before (`overview` returns None). Numpy only.
"""

from typing import NamedTuple

import numpy as np

from tb_gradviz.board import catalog
from tb_gradviz.format import digest, digest_levels, digest_parts, metadata, rule_columns

# Over fewer events than this the digest itself is read: it costs little, and every step shows.
# A level of this many events has a point once a writer has written this many.
FINE_EVENTS = 4096
# Where the levels' tags begin (`digest_levels.level_tag`).
LEVEL_PREFIX = f"{digest.TAG_PREFIX}/level/"


class Overview(NamedTuple):
    """What a view of a range is built from: one point per span of events."""

    series: rule_columns.DigestSeries  # the points, by their last step
    first_steps: np.ndarray  # [points] the first step of each point's span
    events: np.ndarray  # [points] the events of each span (1: an event of the digest itself)
    level: int  # the events a point of the level read pools
    key: tuple  # what it is of: the level, the range and the digest's parts read


def level_series(listing, run, skip_warning):
    """`{series tag: {events: catalog.Digest}}`: the levels of each digest series of a run.

    Args:
      listing: the run's series under the digest's plugin (`store.RunStore.digest_listing`).
      run: the run's name, for the warnings.
      skip_warning: a `catalog.SkipWarning`.
    """
    found = {}
    # Only the levels' metadata is parsed: each digest part's repeats every row.
    for tag in sorted(t for t in listing if t.startswith(LEVEL_PREFIX)):
        content = catalog.parse_content(listing[tag], run, tag, skip_warning)
        if content is None or content["kind"] != metadata.KIND_DIGEST_LEVEL:
            continue
        events = content["level"]["events"]
        series = digest_parts.series_tag(content)
        rows, parts = found.setdefault(series, {}).setdefault(events, (content["rows"], []))
        parts.append((content["part"]["first_step"], tag, listing[tag], content["part"]))
    return {
        series: {
            events: catalog.Digest(
                rows,
                tuple((tag, ts) for _, tag, ts, _ in sorted(parts, key=lambda p: p[:2])),
                sum(part["max_events"] for *_, part in parts),
            )
            for events, (rows, parts) in levels.items()
        }
        for series, levels in found.items()
    }


def versions(listing):
    """The `(max_step, max_wall_time)` of each level part listed: a view read from the levels
    is current while they and the digest's parts are."""
    return tuple(
        (tag, (ts.max_step, ts.max_wall_time))
        for tag, ts in sorted(listing.items())
        if tag.startswith(LEVEL_PREFIX)
    )


def overview(run_store, fine, listing, skip_warning, width, start=None, end=None):
    """The `Overview` of a run's range, or None to read its digest whole.

    Args:
      run_store: the run's `store.RunStore`.
      fine: its digest series (`store.RunStore.digests`).
      listing: its series under the digest's plugin (`store.RunStore.digest_listing`).
      skip_warning: a `catalog.SkipWarning`.
      width: the most columns the view draws.
      start, end: the first and last step of the range (None: the run's first, its last).
    """
    if len(fine) != 1:
        return None
    ((series_tag, listed),) = fine.items()
    levels = level_series(listing, run_store.run, skip_warning).get(series_tag)
    if not levels or max(levels) < FINE_EVENTS:
        return None  # no level pools that many events: a short run, read whole
    order = sorted(levels, reverse=True)
    # The coarsest level (a few points) says how many events the range holds: a finer level
    # than needed is never read, nor those between.
    covered = _read_level(run_store, levels, order[0], start, end)[2]
    wide = [events for events in order if covered // events >= width]
    for events in order[order.index(wide[0] if wide else order[-1]) :]:
        series, inside, covered = _read_level(run_store, levels, events, start, end)
        if inside.stop - inside.start >= width:
            break
    counts, first, previous = digest_levels.span_steps(series.values)
    if counts.sum() < FINE_EVENTS:
        return None  # a short run: read whole, every step shown
    if inside.stop - inside.start < width:  # a short window: the digest itself over it
        events, inside = 1, slice(0, 0)
    # Events after the last span shown but before `end` belong to the next span, which ends
    # after the range, when it goes on from it: they are not read from the digest.
    after = inside.stop
    continued = (
        after < len(series.steps) and after > 0 and previous[after] == series.steps[after - 1]
    )
    gaps = _uncovered(series.steps[inside], first[inside], previous[inside], start, end)
    if continued and gaps and gaps[-1][0] == series.steps[after - 1]:
        gaps.pop()
    parts = _parts_over(series_tag, listed, gaps)
    # Views of the level's rows: the one copy is the joined points' (or the columns' decoding).
    steps, first_steps, spans = series.steps[inside], first[inside], counts[inside]
    values = series.values[inside, len(digest_levels.SPAN_FIELDS) :]
    if parts:
        found = listed._replace(parts=parts, capacity=None)
        key = f"{series_tag}#" + ",".join(tag for tag, _ in parts)
        read = run_store.read_digest(key, found, _WrittenDigest(listed.rows))
        kept = np.zeros(len(read.steps), bool)
        for low, high in gaps:
            kept |= (read.steps > low) & (read.steps < high)
        steps = np.concatenate([steps, read.steps[kept]])
        first_steps = np.concatenate([first_steps, read.steps[kept]])
        spans = np.concatenate([spans, np.ones(int(kept.sum()), np.int64)])
        # float64 at once: the columns are decoded as float64, which then copies nothing.
        values = np.concatenate([values, read.values[kept]], dtype=np.float64)
        if np.any(steps[1:] < steps[:-1]):
            order = np.argsort(steps, kind="stable")
            steps, first_steps, spans, values = (
                a[order] for a in (steps, first_steps, spans, values)
            )
    points = rule_columns.DigestSeries(listed.rows, steps, values)
    if hasattr(listed, "update_weights"):
        points = points._replace(update_weights=listed.update_weights)
    key = (events, start, end, tuple(tag for tag, _ in parts))
    return Overview(points, first_steps, spans, events, key)


class _WrittenDigest(digest.DigestLayout):
    """The digest's parts over a range, kept as written (float32): half the bytes of a part
    read for a window, and the columns are decoded from the rows kept of it."""

    dtype = np.float32


def _read_level(run_store, levels, events, start, end):
    """`(Series, rows in the range (a slice), events those rows pool)` of one level."""
    found = levels[events]
    key = digest_levels.level_tag(found.rows, events)
    series = run_store.read_digest(key, found, digest_levels.LevelLayout(found.rows))
    low = 0 if start is None else int(np.searchsorted(series.steps, start, side="left"))
    high = len(series.steps)
    if end is not None:
        high = int(np.searchsorted(series.steps, end, side="right"))
    inside = slice(low, max(low, high))
    return series, inside, int(series.values[inside, 0].sum())


def _uncovered(steps, first, previous, start, end):
    """`[(low, high)]`: the open step ranges of the range where no span is known to cover every
    event (a writer's events before its first span, between writers, after the last span)."""
    low = -np.inf if start is None else start - 1
    high = np.inf if end is None else end + 1
    if not len(steps):
        return [(low, high)]
    gaps = [(low, min(first[0], high))]
    for i in np.flatnonzero(previous[1:] != steps[:-1]) + 1:
        gaps.append((steps[i - 1], first[i]))
    gaps.append((steps[-1], high))
    clipped = [(max(a, low), min(b, high)) for a, b in gaps]
    return [(a, b) for a, b in clipped if a < b - 1]


def _parts_over(series_tag, listed, gaps):
    """The digest's parts (`((tag, time series), ...)`) that may hold a step in `gaps`. A part's
    tag is its series' and its first step (`digest_parts.part_tag`); a digest written whole
    (before layout 13) is one part under the series' tag, read whole."""
    if not gaps:
        return ()
    firsts = [None if tag == series_tag else int(tag.rpartition("/")[2]) for tag, _ in listed.parts]
    if None in firsts:
        return listed.parts
    chosen = []
    for i, (tag, time_series) in enumerate(listed.parts):
        last = time_series.max_step if i + 1 == len(firsts) else firsts[i + 1] - 1
        if any(firsts[i] < high and last > low for low, high in gaps):
            chosen.append((tag, time_series))
    return tuple(chosen)


def loss_scale_at(loss_scale, steps, first_step):
    """The loss-scale record's events at `steps` (the points' last steps) and the one before
    `first_step` (the first point's first): the optimizer's columns
    (`rule_columns.optimizer_columns`) then count each point's steps over its span."""
    if loss_scale is None or not len(steps):
        return loss_scale
    record_steps = np.asarray(loss_scale.steps, np.int64)
    kept = np.isin(record_steps, steps)
    before = int(np.searchsorted(record_steps, first_step)) - 1
    if before >= 0:
        kept[before] = True
    values = np.asarray(loss_scale.values).reshape(len(record_steps), -1)
    return loss_scale._replace(steps=record_steps[kept], values=values[kept])


def spanned(body, view, start=None, end=None):
    """`body` (`timeline.timeline_body` of the view's points) with each column's first step that
    of its first span, `steps` the events shown, and `level`."""
    low = -np.inf if start is None else start
    high = np.inf if end is None else end
    inside = (view.series.steps >= low) & (view.series.steps <= high)
    first_of = dict(zip(view.series.steps.tolist(), view.first_steps.tolist()))
    body["columns"]["first_step"] = [first_of[s] for s in body["columns"]["first_step"]]
    body["steps"] = int(view.events[inside].sum())
    body["level"] = view.level
    return body
