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


def test_rows_left_out_are_reported_with_their_steps_and_why():
    said = []
    data = points([3, 1, 4, 2], malformed=(4, 2))
    data.append(provider.TensorDatum(step=5, wall_time=105.0, numpy=np.zeros(3)))
    decoded = series.decode_series(data, records.STATS, lambda *args: said.append(args))
    assert decoded.steps.tolist() == [1, 3]
    assert said == [
        ([5], "no stats record layout has their shape"),
        ([4, 2], "their stats record counts are not all finite and non-negative"),
    ]
    said.clear()
    series.decode_series(points([1, 2]), records.STATS, lambda *args: said.append(args))
    assert said == []


def test_a_malformed_row_in_an_event_file_is_left_out_with_a_warning_naming_it(tmp_path, caplog):
    """A stats row whose negative magnitude bin 0 is -1 (subnormals counted both as zeros and
    in the bin): `export` leaves it out and says so, naming the run, the tag and the step."""
    import io
    import json
    import sys

    from synthetic import pool_records

    from tb_gradviz import cli
    from tb_gradviz.format import events

    rng = np.random.default_rng(0)
    log = events.EventLog(tmp_path / "run")
    tag = records.stats_tag("pool", "activation")
    try:
        for step in (1, 2, 3):
            written = pool_records(rng, "pool", 0, step=step)
            if step == 2:
                stats = next(array for t, array, _ in written if t == tag)
                stats[records.NEGATIVE_BINS.start] = -1
            log.write(step, written)
    finally:
        log.close()

    def export():
        out, old = io.StringIO(), sys.stdout
        sys.stdout = out
        try:
            assert cli.main(["export", str(tmp_path), "--format", "json"]) == 0
        finally:
            sys.stdout = old
        return {s["tensor"]: s["steps"] for s in json.loads(out.getvalue())["series"]}

    with caplog.at_level("WARNING", logger="tb_gradviz"):
        steps = export()
    assert steps == {
        "activation": [1, 3],
        "input_gradient": [1, 2, 3],
        "output_gradient": [1, 2, 3],
    }
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("tb_gradviz")]
    assert warnings == [
        f"tb_gradviz leaves out 1 row(s) of run 'run', tag {tag!r}, at step(s) 2: their stats "
        "record counts are not all finite and non-negative"
    ]


def test_each_row_left_out_is_logged_once_however_often_its_series_is_decoded(caplog):
    left_out = series.LeftOutRows()
    with caplog.at_level("WARNING", logger="tb_gradviz"):
        left_out("run", "a/stats", [4, 2], "why")
        left_out("run", "a/stats", [4, 2, 7], "why")  # points were added: decoded again
        left_out("other", "a/stats", [4], "why")
        left_out("run", "b/stats", list(range(12)), "why")
    assert [r.getMessage() for r in caplog.records] == [
        "tb_gradviz leaves out 2 row(s) of run 'run', tag 'a/stats', at step(s) 4, 2: why",
        "tb_gradviz leaves out 1 row(s) of run 'run', tag 'a/stats', at step(s) 7: why",
        "tb_gradviz leaves out 1 row(s) of run 'other', tag 'a/stats', at step(s) 4: why",
        "tb_gradviz leaves out 12 row(s) of run 'run', tag 'b/stats', at step(s) "
        "0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 2 more: why",
    ]
    assert {r.levelname for r in caplog.records} == {"WARNING"}


def test_rows_left_out_past_the_rows_remembered_are_named_again_never_left_unnamed(
    caplog, monkeypatch
):
    monkeypatch.setattr(series, "_MAX_NAMED_ROWS", 2)
    left_out = series.LeftOutRows()
    with caplog.at_level("WARNING", logger="tb_gradviz"):
        for steps in ([1, 2], [1, 2], [1, 2, 3], [1, 2, 3]):
            left_out("run", "a/stats", steps, "why")
    assert [r.getMessage() for r in caplog.records] == [
        "tb_gradviz leaves out 2 row(s) of run 'run', tag 'a/stats', at step(s) 1, 2: why",
        "tb_gradviz leaves out 1 row(s) of run 'run', tag 'a/stats', at step(s) 3: why",
        "tb_gradviz leaves out 1 row(s) of run 'run', tag 'a/stats', at step(s) 3: why",
    ]
