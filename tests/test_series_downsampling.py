"""`/series` over many steps: at most `width` columns, each keeping its extremes.

A hand-written series of 25 steps with a one-step spike at step 17 is served
through TensorBoard's own data provider (and, for the HTTP statuses, a real
`tensorboard` process with the Rust data server): the columns' bounds, each
stat's min and max and each magnitude bin's largest count are checked value
by value against the numpy definition of the records.
"""

import json
import urllib.error
import urllib.request

import eventdata
import limits
import numpy as np
import pytest
import synthetic
import tbserver
from tensorboard import context
from test_plugin import PREFIX, make_app

from tb_gradviz.board import series, timeline
from tb_gradviz.format import events, records, summaries

STEPS = 25
SPIKE = 17
LAYER, TENSOR = "a", records.OUTPUT_GRADIENT


def values_at(step):
    """The tensor at `step`: `[s, -s, 0, 2s]`, a million times larger at `SPIKE`."""
    values = np.array([step, -step, 0.0, 2.0 * step])
    return values * 1e6 if step == SPIKE else values


def write(logdir):
    log = events.EventLog(logdir)
    for step in range(1, STEPS + 1):
        values = values_at(step)
        content = {"layer_index": 0, "role": TENSOR, "index": 0, "shape": [4]}
        log.write(
            step,
            events.tensor_records(
                LAYER,
                TENSOR,
                summaries.linear_histogram(values),
                summaries.stats_vector(values),
                content,
            ),
        )
    log.close()


def get(client, **query):
    response = client.get(
        PREFIX + "/series", query_string=dict(run="run", layer=LAYER, tensor=TENSOR, **query)
    )
    text = response.get_data(as_text=True)
    return response.status_code, json.loads(text, parse_constant=float) if text[:1] == "{" else text


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("series")
    write(root / "run")
    return root


@pytest.fixture(scope="module")
def client(logdir):
    return make_app(logdir)[0]


def test_column_starts_share_steps_equally():
    assert series.column_starts(10, 4).tolist() == [0, 2, 5, 7]
    assert series.column_starts(3, 10).tolist() == [0, 1, 2]
    assert series.column_starts(10_000, 800)[-1] == 9987


def test_a_one_step_spike_stays_in_the_envelope_of_its_column(client):
    status, body = get(client, width="5")
    assert status == 200
    assert body["downsampled"] is True
    assert body["steps"] == list(range(1, STEPS + 1))  # the slider's stops
    assert body["columns"] == {"first_step": [1, 6, 11, 16, 21], "last_step": [5, 10, 15, 20, 25]}
    assert body["stats"]["max"] == {"min": [2, 12, 22, 32, 42], "max": [10, 20, 30, 34e6, 50]}
    assert body["stats"]["min"] == {
        "min": [-5, -10, -15, -17e6, -25],
        "max": [-1, -6, -11, -16, -21],
    }
    assert body["stats"]["zeros"] == {"min": [1] * 5, "max": [1] * 5}
    assert body["histogram"] is None
    # Each bin's largest count over the column's steps, from the records' numpy definition.
    vectors = np.array([summaries.stats_vector(values_at(s)) for s in range(1, STEPS + 1)])
    for sign, bins in (("negative", records.NEGATIVE_BINS), ("positive", records.POSITIVE_BINS)):
        expected = [
            vectors[start : start + 5, bins].max(axis=0).tolist() for start in range(0, 25, 5)
        ]
        assert body["log"][sign] == expected
    # The spike's two positive values (17e6, 34e6) fill the last bin (>= 1e6), in their column only.
    assert [column[-1] for column in body["log"]["positive"]] == [0, 0, 0, 2, 0]
    assert body["log"]["edges"] == records.LOG_EDGES.tolist()


def test_series_at_or_below_its_width_is_sent_whole(client):
    status, whole = get(client, width=str(STEPS))
    assert status == 200 and whole["downsampled"] is False
    assert whole["steps"] == list(range(1, STEPS + 1))
    assert whole["stats"]["max"][SPIKE - 1] == 34e6
    assert len(whole["log"]["positive"]) == STEPS and len(whole["histogram"]["counts"]) == STEPS
    assert get(client)[1] == whole  # the default width (1000) is above 25 steps
    status, body = get(client, width=str(STEPS - 1))
    assert status == 200 and body["downsampled"] is True
    assert len(body["columns"]["first_step"]) == STEPS - 1
    # 25 steps in 24 columns: the last column holds two steps.
    assert body["columns"]["last_step"][-2:] == [23, 25]


def test_one_column_holds_every_step(client):
    status, body = get(client, width="1")
    assert status == 200
    assert body["columns"] == {"first_step": [1], "last_step": [STEPS]}
    assert body["stats"]["max"] == {"min": [2], "max": [34e6]}


def test_step_serves_the_record_at_the_latest_step_at_or_before_it(client):
    status, body = get(client, step=str(SPIKE))
    assert status == 200 and body["downsampled"] is False
    assert body["steps"] == [SPIKE] and body["stats"]["max"] == [34e6]
    assert len(body["histogram"]["counts"]) == 1 and body["histogram"]["counts"][0] is not None
    assert get(client, step="1000", width="1")[1]["steps"] == [STEPS]
    status, text = get(client, step="0")
    assert status == 404 and "no step <= 0" in text


@pytest.mark.parametrize("width", ["0", "-3", "10001", "1.5", "abc", ""])
def test_a_bad_width_is_a_400_naming_what_is_allowed(client, width):
    status, text = get(client, width=width)
    assert status == 400
    assert f"width must be a whole number from 1 to {timeline.MAX_WIDTH}" in text
    assert f"received {width!r}" in text


def test_a_long_series_is_downsampled_by_default(tmp_path):
    synthetic.write_large_run(tmp_path / "long", layers=1, steps=1_200)
    client = make_app(tmp_path)[0]
    response = client.get(
        PREFIX + "/series", query_string=dict(run="long", layer="block0/pool", tensor="activation")
    )
    body = json.loads(response.get_data(as_text=True), parse_constant=float)
    assert body["downsampled"] is True and len(body["steps"]) == 1_200
    assert len(body["columns"]["first_step"]) == timeline.DEFAULT_WIDTH
    assert body["columns"]["last_step"][-1] == 1_200


def test_widths_through_a_real_tensorboard(logdir, tmp_path):
    """The Rust data server and TensorBoard's own error handling: 200, then 400 with its message."""
    with tbserver.running_tensorboard(logdir, tmp_path / "tensorboard.log") as url:
        query = f"{url}{PREFIX}/series?run=run&layer={LAYER}&tensor={TENSOR}"
        body = tbserver.get_json(f"{query}&width=5")
        assert body["columns"]["last_step"] == [5, 10, 15, 20, 25]
        assert body["stats"]["max"]["max"][3] == 34e6
        with pytest.raises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(f"{query}&width=0", timeout=limits.REQUEST_S)
        assert raised.value.code == 400
        message = raised.value.read().decode()
        assert f"width must be a whole number from 1 to {timeline.MAX_WIDTH}" in message
        assert "received '0'" in message


def test_routing_at_a_step_is_the_latest_record_at_or_before_it(tmp_path):
    synthetic.write_run(tmp_path / "run", layers=1, steps=5)
    client = make_app(tmp_path)[0]

    def routing(**query):
        response = client.get(
            PREFIX + "/routing", query_string=dict(run="run", layer="block0/pool", **query)
        )
        text = response.get_data(as_text=True)
        status = response.status_code
        return status, json.loads(text, parse_constant=float) if status == 200 else text

    status, whole = routing()
    assert status == 200 and whole["steps"] == [1, 2, 3, 4, 5]
    status, one = routing(step="3")
    assert status == 200 and one["steps"] == [3]
    for field in ("input_positions", "routed_positions", "input_gradient_sum"):
        assert one[field] == [whole[field][2]]
    assert one["mass"] == {key: [values[2]] for key, values in whole["mass"].items()}
    assert routing(step="99")[1]["steps"] == [5]
    status, text = routing(step="0")
    assert status == 404 and "no routing record at a step <= 0" in text
    assert routing(step="x")[0] == 400


def test_a_downsampled_series_reads_no_histogram(logdir):
    gradviz, provider = eventdata.plugin_over(logdir)
    stats = ("gradviz", [records.stats_tag(LAYER, TENSOR)])
    histograms = ("histograms", [records.histogram_tag(LAYER, TENSOR)])

    def body(**query):
        return gradviz.series_impl(context.RequestContext(), "", "run", LAYER, TENSOR, **query)

    downsampled = body(width=STEPS - 1)
    assert downsampled["downsampled"] is True and downsampled["histogram"] is None
    assert provider.reads == [stats]  # the histograms, which it does not send, are not read
    assert body(width=5)["histogram"] is None and provider.reads == [stats]  # the stats cached
    whole = body(width=STEPS)
    assert provider.reads == [stats, histograms]
    assert (
        whole["histogram"]["counts"][SPIKE - 1]
        == summaries.linear_histogram(values_at(SPIKE))[:, 2].astype(int).tolist()
    )
    one = body(step=SPIKE, width=1)
    assert one["histogram"]["counts"] == [whole["histogram"]["counts"][SPIKE - 1]]
    assert provider.reads == [stats, histograms]


def test_a_step_at_or_after_the_last_reads_each_series_last_point_alone(logdir):
    gradviz, provider = eventdata.plugin_over(logdir)
    body = gradviz.series_impl(context.RequestContext(), "", "run", LAYER, TENSOR, step=STEPS + 5)
    assert body["steps"] == [STEPS] and body["stats"]["max"] == [2 * STEPS]
    assert body["histogram"]["counts"] == [
        summaries.linear_histogram(values_at(STEPS))[:, 2].astype(int).tolist()
    ]
    assert sorted(provider.reads) == [
        ("gradviz", [records.stats_tag(LAYER, TENSOR)]),
        ("histograms", [records.histogram_tag(LAYER, TENSOR)]),
    ]
    # Each read as its last point (downsample 1), not every step of it.
    assert [key[4] for key in gradviz._caches.series.keys_by_use()] == [1, 1]
