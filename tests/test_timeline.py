"""The depth x time route, `/timeline`: every layer over every logged step, from the digest."""

import gzip
import json
import math

import numpy as np
import pytest
import synthetic
from test_plugin import PREFIX, make_app

from tb_gradviz import cli
from tb_gradviz.board import timeline
from tb_gradviz.capture import budget
from tb_gradviz.format import events, health, records, summaries

WHOLE = {"gradviz": 0, "histograms": 0, "gradviz_digest": 0}
LAYERS = ("a", "b", "c")
STEPS = 100


def gradient(rng, layer, step):
    """The output gradient of `layer` at `step`: RMS ~1e-3, a spike and a NaN at known places."""
    values = rng.normal(0, 1e-3, 64)
    if layer == "b" and step == 37:
        values *= 1e6  # exploding at one step of 100
    if layer == "a" and step >= 60:
        values[3] = np.nan  # non-finite from step 60 on
    return values


def write(logdir, with_digest=True):
    rng = np.random.default_rng(0)
    log = events.EventLog(logdir, with_digest=with_digest)
    for step in range(1, STEPS + 1):
        written = []
        for index, layer in enumerate(LAYERS):
            values = gradient(rng, layer, step)
            content = {"layer_index": index, "role": records.OUTPUT_GRADIENT, "index": 0}
            written += events.tensor_records(
                layer,
                records.OUTPUT_GRADIENT,
                summaries.linear_histogram(values),
                summaries.stats_vector(values),
                dict(content, shape=[64]),
            )
        log.write(step, written)
    log.close()


def get(client, **query):
    response = client.get(PREFIX + "/timeline", query_string=query)
    text = response.get_data(as_text=True)
    if response.status_code != 200:
        return response.status_code, text
    return response.status_code, json.loads(text, parse_constant=float)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("timeline")
    write(root / "run")
    write(root / "old", with_digest=False)
    return make_app(root, samples_per_plugin=WHOLE)[0]


def test_a_one_step_spike_and_a_nan_stay_visible_in_ten_columns(client):
    status, body = get(client, run="run", width="10")
    assert status == 200
    assert body["steps"] == STEPS and body["field"] == "rms"
    assert body["columns"]["first_step"] == list(range(1, STEPS, 10))
    assert body["columns"]["last_step"] == list(range(10, STEPS + 1, 10))
    by_layer = {row["layer"]: row for row in body["layers"]}
    assert list(by_layer) == list(LAYERS)  # model order
    spike = by_layer["b"]["rms"]
    assert spike["max"][3] > 100 * spike["max"][2]  # step 37 is in the fourth column
    assert spike["min"][3] < 2e-3  # the column's other steps
    assert by_layer["b"]["flags"]["exploding"] == [3]
    assert by_layer["a"]["flags"]["nonfinite"] == [5, 6, 7, 8, 9]  # steps 60..100
    assert by_layer["c"]["flags"] == {flag: [] for flag in health.FLAGS}


def test_the_envelope_equals_the_full_records_at_full_width(client):
    _, body = get(client, run="run", width="1000", field="max_abs")
    assert body["columns"]["first_step"] == body["columns"]["last_step"] == list(range(1, 101))
    rng = np.random.default_rng(0)
    expected = {layer: [] for layer in LAYERS}
    for step in range(1, STEPS + 1):
        for layer in LAYERS:
            stats = records.decode_stats(summaries.stats_vector(gradient(rng, layer, step)))
            expected[layer].append(max(abs(stats["min"]), abs(stats["max"])))
    for row in body["layers"]:
        assert row["max_abs"]["min"] == row["max_abs"]["max"]
        np.testing.assert_allclose(row["max_abs"]["max"], expected[row["layer"]], rtol=1e-7)


def test_a_run_without_digest_is_a_404_and_bad_arguments_are_400(client):
    status, body = get(client, run="old")
    assert status == 404 and "run 'old' has no digest" in body
    for query, message in (
        ({"width": "0"}, "width must be a whole number from 1 to 10000; received '0'"),
        ({"width": "x"}, "received 'x'"),
        ({"field": "mean"}, "field must be one of rms, max_abs, zero_share, update_ratio"),
        ({"role": "gradient"}, "role must be one of activation"),
    ):
        status, body = get(client, run="run", **query)
        assert status == 400 and message in body, body


def test_a_step_range_comes_back_at_one_column_per_step_with_the_flags_of_the_whole_run(client):
    status, whole = get(client, run="run", width="1000")
    status, body = get(client, run="run", width="1000", start="30", end="45")
    assert status == 200
    assert (body["start"], body["end"], body["steps"]) == (30, 45, 16)
    assert whole["start"] is None and whole["end"] is None
    assert body["columns"]["first_step"] == body["columns"]["last_step"] == list(range(30, 46))
    by_layer = {row["layer"]: row for row in body["layers"]}
    assert list(by_layer) == list(LAYERS)
    assert by_layer["b"]["flags"]["exploding"] == [37 - 30]
    assert by_layer["a"]["flags"]["nonfinite"] == []  # from step 60 on: after the range
    # Each cell is the whole run's cell of that step.
    for row, whole_row in zip(body["layers"], whole["layers"]):
        assert row["rms"]["max"] == whole_row["rms"]["max"][29:45]
    # Only a start, or only an end: the range runs to the run's last step, or from its first.
    _, tail = get(client, run="run", start="91", width="3")
    assert tail["steps"] == 10 and tail["columns"]["first_step"] == [91, 94, 97]
    assert tail["layers"][0]["flags"]["nonfinite"] == [0, 1, 2]
    _, head = get(client, run="run", end="5")
    assert head["columns"]["last_step"] == [1, 2, 3, 4, 5]
    # Between two logged steps, at none.
    status, text = get(client, run="run", start="101", end="200")
    assert status == 404 and "run 'run' has no logged step from step 101 to step 200" in text
    status, text = get(client, run="run", start="45", end="30")
    assert status == 400 and "start must be at most end; received start=45, end=30" in text


def test_ten_thousand_steps_come_back_as_the_width_asked(tmp_path):
    synthetic.write_large_run(tmp_path / "long", layers=3, steps=10_000, variants=4)
    client = make_app(tmp_path, samples_per_plugin=WHOLE)[0]
    status, body = get(client, run="long", width="800", role="input_gradient")
    assert status == 200 and body["steps"] == 10_000
    assert len(body["columns"]["first_step"]) == 800
    for row in body["layers"]:
        assert len(row["rms"]["min"]) == len(row["rms"]["max"]) == 800
        assert all(math.isfinite(v) for v in row["rms"]["max"])


def test_the_cost_budget_record_is_served_with_the_timeline_and_summarised(tmp_path, capsys):
    clock = type("Clock", (), {"now": 0.0, "__call__": lambda self: self.now})()
    spent = budget.Budget(0.02, clock=clock)
    log = events.EventLog(tmp_path / "budgeted")
    for step in (1, 2, 3):
        clock.now += 1.0
        spent.passed(1)
        spent.log_started()
        clock.now += 0.5
        spent.log_ended()
        values = np.linspace(-1, 1, 16)
        written = events.tensor_records(
            "a",
            records.OUTPUT_GRADIENT,
            summaries.linear_histogram(values),
            summaries.stats_vector(values),
            {"layer_index": 0, "role": records.OUTPUT_GRADIENT, "index": 0, "shape": [16]},
        )
        log.write(step, written + spent.records())
    log.close()
    write(tmp_path / "plain")
    client = make_app(tmp_path, samples_per_plugin=WHOLE)[0]
    _, body = get(client, run="budgeted")
    assert body["budget"] == {
        "budget": 0.02,
        "asked_interval": 1,
        "interval": spent.interval,
        "share": pytest.approx(1 / 3),
        "log_seconds": 1.0,
        "train_seconds": 2.0,
        "step": 3,
    }
    assert spent.interval > 1  # logging took a third of the time: the interval stretched
    assert get(client, run="plain")[1]["budget"] is None
    # tb-gradviz summary says it too.
    assert cli.main(["summary", str(tmp_path), "--run", "budgeted"]) == 0
    out = capsys.readouterr().out
    assert (
        f"logging budget 2 %: every {spent.interval} (asked: every 1), logging took 33.3 % "
        "of training time (at step 3)"
    ) in out


def test_the_body_is_built_once_per_version_of_the_digest_and_served_gzipped(tmp_path, monkeypatch):
    # /timeline over a long run spent most of a warm request rebuilding and
    # re-encoding the same body; it is built again only when the digest has
    # new points, or for other arguments.
    write(tmp_path / "run")
    client, multiplexer = make_app(tmp_path, samples_per_plugin=WHOLE)
    built = []
    body_of = timeline.timeline_body
    monkeypatch.setattr(
        timeline, "timeline_body", lambda *args: built.append(args[2:]) or body_of(*args)
    )
    first = client.get(PREFIX + "/timeline", query_string={"run": "run"})
    again = client.get(PREFIX + "/timeline", query_string={"run": "run"})
    assert first.status_code == again.status_code == 200
    assert again.get_data() == first.get_data()
    assert json.loads(first.get_data(as_text=True))["steps"] == STEPS
    assert len(built) == 1
    # A client that accepts gzip gets the same JSON gzipped.
    zipped = client.get(
        PREFIX + "/timeline", query_string={"run": "run"}, headers={"Accept-Encoding": "gzip"}
    )
    assert zipped.headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(zipped.get_data()) == first.get_data()
    assert len(built) == 1
    _, zero_share = get(client, run="run", field="zero_share")
    assert zero_share["field"] == "zero_share" and len(built) == 2
    # New points: the body is built again.
    write(tmp_path / "run")
    multiplexer.Reload()
    assert get(client, run="run")[0] == 200
    assert len(built) == 3
