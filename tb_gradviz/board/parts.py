"""A series written in parts (the digest, layout 13: `format/digest_parts.py`) read as one.

`joined` copies each part's points into one array of the series' rows as the
part is read, and lets them go before the next part is read: the peak is that
array (float64, as every decoded series) and one part's points (at most
`digest_parts.PART_BYTES`), never every part's points beside it. Rows are
joined in step order (stable: a step in two parts keeps the parts' order); a
row of no known layout or with malformed counts is left out, as
`series.decode_series` leaves it out. Numpy only.
"""

import numpy as np

from tb_gradviz.board.series import MALFORMED, Series, decode_series


def joined(parts, layout, capacity=None, left_out=None):
    """The `Series` of a series' parts.

    Args:
      parts: an iterable of each part's points (`[provider.TensorDatum]`), in
        the parts' order; each part may be read as it is iterated.
      layout: the series' `records.Layout`, of a fixed shape.
      capacity: the most rows of all parts together (their `max_events`), or
        None when some part does not say: the array is then grown as needed.
      left_out: as `series.decode_series` takes it.
    """
    # float64 as every decoded series, unless the layout keeps its written float32 (a level).
    values = np.empty((capacity or 0,) + tuple(layout.shape), getattr(layout, "dtype", np.float64))
    steps, wall_times, kept, filled = [], [], [], 0
    for points in parts:
        if filled + len(points) > len(values):
            values = _grown(values, filled, filled + len(points))
        if all(np.shape(point.numpy) == layout.shape for point in points):
            # Today's layout, the usual case: each point cast into its row, no copy between.
            for row, point in enumerate(points, filled):
                values[row] = point.numpy
            part_steps = np.array([point.step for point in points], np.int64)
            part_wall_times = np.array([point.wall_time for point in points], np.float64)
            valid = layout.valid_rows(values[filled : filled + len(points)])
            if left_out is not None and not valid.all():
                left_out(part_steps[~valid].tolist(), MALFORMED.format(layout.name))
        else:  # rows of earlier layouts, or of none
            part = decode_series(points, layout, left_out)
            values[filled : filled + len(part.steps)] = part.values
            part_steps, part_wall_times = part.steps, part.wall_times
            valid = np.ones(len(part_steps), bool)
        del points  # before the next part is read
        filled += len(part_steps)
        steps.append(part_steps)
        wall_times.append(part_wall_times)
        kept.append(valid)
    if not steps:
        return decode_series([], layout)
    steps, wall_times, kept = map(np.concatenate, (steps, wall_times, kept))
    if kept.all() and 2 * filled >= len(values):
        values = values[:filled]  # a view: the unused end was never written to
    else:
        values = values[np.flatnonzero(kept)]
        steps, wall_times = steps[kept], wall_times[kept]
    if np.all(steps[1:] >= steps[:-1]):
        return Series(steps, wall_times, values)
    order = np.argsort(steps, kind="stable")
    return Series(steps[order], wall_times[order], values[order])


def _grown(values, filled, needed):
    """`values` with room for `needed` rows (at least twice its rows), its first `filled` kept."""
    grown = np.empty((max(needed, 2 * len(values)),) + values.shape[1:], values.dtype)
    grown[:filled] = values[:filled]
    return grown
