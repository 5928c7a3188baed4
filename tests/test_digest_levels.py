"""The digest's coarser levels (layout 15): what the writer pools, `/timeline` read from them."""

import json

import numpy as np
import pytest
import synthetic
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import event_pb2
from test_plugin import PREFIX, make_app

from tb_gradviz.board import levels
from tb_gradviz.format import (
    digest,
    digest_levels,
    events,
    metadata,
    records,
    rule_columns,
    summaries,
)

WHOLE = {"gradviz": 0, "histograms": 0, "gradviz_digest": 0}
# A run long enough to be read from its levels (`levels.FINE_EVENTS`), with a tail no level covers.
STEPS = levels.FINE_EVENTS + 105


def written(logdir):
    """`{tag: [(step, vector, content)]}` of every digest-plugin value in a run's event files."""
    found = {}
    for path in sorted(logdir.iterdir()):
        for raw in event_file_loader.RawEventFileLoader(str(path)).Load():
            event = event_pb2.Event.FromString(raw)
            for value in event.summary.value:
                if not value.tag.startswith(digest.TAG_PREFIX):
                    continue
                vector = np.frombuffer(value.tensor.tensor_content, np.float32)
                content = value.metadata.plugin_data.content or None
                parsed = None if content is None else metadata.parse_plugin_metadata(content)
                found.setdefault(value.tag, []).append((event.step, vector, parsed))
    return found


def write_varied(logdir, steps, first_step=1, log=None):
    """`steps` events of two layers whose values vary by step, with NaN, Inf, zeros and units."""
    rng = np.random.default_rng(first_step)
    log = log or events.EventLog(logdir)
    for step in range(first_step, first_step + steps):
        records_of_step = []
        for index, layer in enumerate(("a", "b")):
            values = rng.normal(0, 10.0 ** rng.integers(-4, 2), 96)
            values[: rng.integers(0, 20)] = 0.0
            if step % 7 == index:
                values[5] = np.nan
            if step % 11 == 0:
                values[6] = -np.inf
            content = {"layer_index": index, "role": records.OUTPUT_GRADIENT, "index": 0}
            records_of_step += events.tensor_records(
                layer,
                records.OUTPUT_GRADIENT,
                summaries.linear_histogram(values),
                summaries.stats_vector(values),
                dict(content, shape=[96]),
            )
            records_of_step += events.precision_records(
                layer, records.OUTPUT_GRADIENT, summaries.precision_vector(values), content
            )
            records_of_step += events.units_records(
                layer,
                records.units_vector(rng.random(8) < 0.1),
                {"layer_index": index, "tensor": records.OUTPUT_GRADIENT, "channel_axis": -1},
            )
        # A weight of layer a, and its update record at most events (an update row, NaN without).
        weight = records.weight_tensor_name(records.WEIGHT, "kernel")
        kernel = rng.normal(size=32)
        records_of_step += events.tensor_records(
            "a",
            weight,
            summaries.linear_histogram(kernel),
            summaries.stats_vector(kernel),
            {
                "layer_index": 0,
                "role": records.WEIGHT,
                "index": 1,
                "weight": "kernel",
                "shape": [32],
            },
        )
        if step % 5:
            update = summaries.update_vector(10.0, rng.random(), rng.integers(1, 4))
            content = {"layer_index": 0, "weight": "kernel", "tensor": weight}
            records_of_step += events.update_records("a", "kernel", update, content)
        log.write(step, records_of_step)
    return log


def test_each_level_equals_the_pooled_digests_of_its_span(tmp_path):
    write_varied(tmp_path, 140).close()
    found = written(tmp_path)
    fine = [point for tag, points in found.items() if "/level/" not in tag for point in points]
    rows = next(content for *_, content in fine if content)["rows"]
    assert {kind for kind, _, _ in rows} == set(digest.ROW_KINDS)
    steps = np.array([step for step, _, _ in fine])
    vectors = np.stack([vector for _, vector, _ in fine]).astype(np.float64)
    decoded = digest.decode_digest(rows, vectors)
    # 140 events: 8 spans of 16 and 2 of 64 (pooled from those of 16), 12 events in none.
    for pooled_events, ends in ((16, list(range(16, 129, 16))), (64, [64, 128])):
        level = [
            p for tag, points in found.items() if f"/level/{pooled_events}/" in tag for p in points
        ]
        assert [step for step, _, _ in level] == ends
        assert level[0][2]["level"] == {"events": pooled_events} and level[0][2]["rows"] == rows
        for i, (_, vector, _) in enumerate(level):
            span = slice(pooled_events * i, pooled_events * (i + 1))
            events_, first, previous = digest_levels.span_steps(vector[None])
            assert (events_[0], first[0], previous[0]) == (
                pooled_events,
                steps[span][0],
                pooled_events * i or -1,
            )
            pooled = digest.decode_digest(rows, vector[len(digest_levels.SPAN_FIELDS) :][None])
            for row, fields in decoded.items():
                got = {name: value[0] for name, value in pooled[row].items()}
                for name, column in fields.items():
                    values = column[span]
                    if name in digest.COUNT_FIELDS[row[0]]:
                        expected = values.sum()  # NaN when an event does not know the count
                        assert got[name] == expected or np.isnan(expected) and np.isnan(got[name])
                    elif name == "rms":
                        t = fields
                        finite = (t["count"] - t["nan"] - t["pos_inf"] - t["neg_inf"])[span]
                        expected = np.sqrt(np.sum(finite * values**2) / finite.sum())
                        assert got[name] == pytest.approx(expected, rel=2e-7)
                    else:
                        assert got[name] == np.float32(np.nanmax(values))


def test_levels_that_are_not_multiples_of_each_other_are_refused():
    with pytest.raises(ValueError, match=r"each a multiple of the one before; received \(16, 24\)"):
        digest_levels.Levels((16, 24))


def test_a_new_writer_begins_its_own_spans_and_says_which_event_came_before(tmp_path):
    write_varied(tmp_path, 20).close()  # one span of 16; 4 events no level covers
    write_varied(tmp_path, 20, first_step=21).close()
    level = [p for tag, points in written(tmp_path).items() if "/level/16/" in tag for p in points]
    spans = [digest_levels.span_steps(vector[None]) for _, vector, _ in level]
    assert [(int(e[0]), int(f[0]), int(p[0])) for e, f, p in spans] == [(16, 1, -1), (16, 21, -1)]
    # Where the digest itself is read: before the first span, the first writer's last 4 events
    # (17 to 20), after the last span.
    gaps = levels._uncovered(np.array([16, 36]), np.array([1, 21]), np.array([-1, -1]), None, None)
    assert gaps == [(-np.inf, 1), (16, 21), (36, np.inf)]


def get(client, **query):
    response = client.get(PREFIX + "/timeline", query_string=query)
    assert response.status_code == 200, response.get_data(as_text=True)
    return json.loads(response.get_data(as_text=True), parse_constant=float)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("levels")
    for run, with_levels in (("levels", True), ("fine", False)):
        # Layer 0 alone 1e6 times larger at step 1234: it raises `exploding` there.
        spike = (1234, 0, 1e6)
        synthetic.write_large_run(
            root / run, layers=3, steps=STEPS, layer_spike=spike, levels=with_levels
        )
    for run, with_levels in (("short", True), ("short_fine", False)):
        synthetic.write_large_run(root / run, layers=3, steps=300, levels=with_levels)
    return make_app(root, samples_per_plugin=WHOLE)[0]


def expected_overview(client, field, width, level):
    """The run without levels' values at every step (its `/timeline` one column a step), pooled
    into the writer's spans of `level` events (the events after the last span as they are), in
    `width` columns: `(first steps, last steps, {layer: (min, max)})`."""
    fine = get(client, run="fine", width=str(STEPS), field=field)
    spans = [(s * level, (s + 1) * level) for s in range(STEPS // level)]
    spans += [(i, i + 1) for i in range(spans[-1][1], STEPS)]
    first = np.array(fine["columns"]["first_step"])
    starts = (np.arange(width) * len(spans)) // width
    ends = np.append(starts[1:], len(spans)) - 1
    found = {}
    for row in fine["layers"]:
        values = np.array(row[field]["max"])
        # One tensor a role, every value finite and the same count at each step: the pooled RMS
        # is the root of the mean square, the pooled max the max.
        if field == "rms":
            pooled = np.array([np.sqrt(np.mean(values[a:b] ** 2)) for a, b in spans])
        else:
            pooled = np.array([values[a:b].max() for a, b in spans])
        low = np.minimum.reduceat(pooled, starts)
        high = np.maximum.reduceat(pooled, starts)
        found[row["layer"]] = (low, high)
    span_first = np.array([first[a] for a, _ in spans])
    span_last = np.array([first[b - 1] for _, b in spans])
    return span_first[starts].tolist(), span_last[ends].tolist(), found


@pytest.mark.parametrize("field", ["rms", "max_abs"])
def test_the_overview_of_a_long_run_equals_the_pooled_digest(served, field):
    body = get(served, run="levels", width="200", field=field)
    # 4,201 events: level 64 has 65 points, level 16 262 (and 9 events after them).
    assert body["level"] == 16 and body["steps"] == STEPS
    first, last, found = expected_overview(served, field, 200, 16)
    assert body["columns"] == {"first_step": first, "last_step": last}
    for row in body["layers"]:
        low, high = found[row["layer"]]
        np.testing.assert_allclose(row[field]["min"], low, rtol=1e-6)
        np.testing.assert_allclose(row[field]["max"], high, rtol=1e-6)
    spiked = next(row for row in body["layers"] if row["layer"] == "block0/pool")
    column = int(np.searchsorted(body["columns"]["first_step"], 1234, side="right")) - 1
    assert spiked["flags"]["exploding"] == [column]
    fine = get(served, run="fine", width="200", field=field)
    assert "level" not in fine
    fine_row = next(row for row in fine["layers"] if row["layer"] == "block0/pool")
    # The largest |x| is kept exactly by the levels; the flags are raised around the same step.
    if field == "max_abs":
        assert max(spiked["max_abs"]["max"]) == max(fine_row["max_abs"]["max"])
    assert len(fine_row["flags"]["exploding"]) == 1


def test_a_range_with_enough_spans_is_read_from_the_level_up_to_its_last_whole_span(served):
    body = get(served, run="levels", width="100", start="1000", end="3000")
    # Spans of 16 from step 1: those ending from 1008 to 2992 (125); 2993-3000 are in the next.
    assert body["level"] == 16 and body["steps"] == 125 * 16
    assert body["columns"]["first_step"][0] == 993 and body["columns"]["last_step"][-1] == 2992
    everything = get(served, run="levels", width="10000")
    assert everything["level"] == 1 and everything["steps"] == STEPS  # no level is wide enough


def test_a_short_window_of_a_long_run_reads_the_digest_itself(served):
    query = {"width": "200", "start": "2000", "end": "2300"}
    body = get(served, run="levels", **query)
    fine = get(served, run="fine", **query)
    assert body.pop("level") == 1
    assert body.pop("run") == "levels" and fine.pop("run") == "fine"
    body.pop("budget"), fine.pop("budget")
    assert body == fine


def test_a_short_run_with_levels_reads_as_one_without_them(served):
    for query in ({"width": "100"}, {"width": "50", "start": "20", "end": "90"}):
        body = get(served, run="short", **query)
        fine = get(served, run="short_fine", **query)
        assert "level" not in body
        assert body.pop("run") == "short" and fine.pop("run") == "short_fine"
        assert body == fine


def test_onset_reads_the_digest_whatever_the_levels(served):
    def onset(run):
        response = served.get(PREFIX + "/onset", query_string={"run": run})
        assert response.status_code == 200
        body = json.loads(response.get_data(as_text=True), parse_constant=float)
        body.pop("run")
        return body

    assert onset("levels") == onset("fine")


def test_the_optimizers_columns_of_a_level_count_the_steps_of_each_span():
    # Eight events, one train step each; the optimizer skipped the steps of events 3 and 6.
    batches = np.arange(1, 9, dtype=float)
    applied = batches - (batches >= 3) - (batches >= 6)
    series = rule_columns.LossScaleSeries(
        ("batches", "applied"), np.arange(1, 9), np.column_stack([batches, applied])
    )
    # Points of spans of 4 events, at their last steps, 4 and 8; and from step 5 on only.
    for steps, first, ran, skipped in (([4, 8], 1, [4, 4], [1, 1]), ([8], 5, [4], [1])):
        kept = levels.loss_scale_at(series, np.array(steps), first)
        found = rule_columns.optimizer_columns(kept, np.array(steps))
        assert found["batches"].tolist() == ran and found["skipped"].tolist() == skipped
