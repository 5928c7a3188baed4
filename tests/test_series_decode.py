"""`series.decode_series`: one decoded time series from the provider's points."""

import numpy as np
from tensorboard.data import provider

from tb_gradviz.board import series
from tb_gradviz.format import records, summaries


def points(steps, malformed=()):
    """Stats records at `steps` (in that order); those in `malformed` with a negative count."""
    result = []
    for step in steps:
        vector = summaries.stats_vector(np.arange(step + 1, dtype=np.float64))
        if step in malformed:
            vector[records.STAT_ZEROS] = -1
        result.append(provider.TensorDatum(step=step, wall_time=100.0 + step, numpy=vector))
    return result


def test_rows_come_sorted_by_step_and_malformed_rows_are_left_out():
    decoded = series.decode_series(points([3, 1, 4, 2], malformed=(4,)), records.STATS)
    assert decoded.steps.tolist() == [1, 2, 3]
    assert decoded.wall_times.tolist() == [101.0, 102.0, 103.0]
    assert records.stats_columns(decoded.values)["count"].tolist() == [2, 3, 4]


def test_rows_already_valid_and_in_step_order_are_kept_as_written():
    written = points([1, 2, 3, 5])
    decoded = series.decode_series(written, records.STATS)
    assert decoded.steps.tolist() == [1, 2, 3, 5]
    np.testing.assert_array_equal(decoded.values, np.stack([p.numpy for p in written]))
    # A step written twice keeps both rows, in the provider's order.
    twice = series.decode_series(points([1, 2]) + points([2]), records.STATS)
    assert twice.steps.tolist() == [1, 2, 2]
