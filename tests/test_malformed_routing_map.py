"""A routing map whose rows hold NaN where counts belong is refused as malformed, never a 500."""

import json

import eventdata
import numpy as np
import pytest

from tb_gradviz.format import events, records, routing_map

keras = pytest.importorskip("keras")


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """A max pool's routing maps at steps 3 and 7, then malformed ones at 9, 11 and 13."""
    from tb_gradviz import GradVizCallback

    root = tmp_path_factory.mktemp("malformed_map")
    model = keras.Sequential(
        [
            keras.Input((4, 4, 2)),
            keras.layers.MaxPooling2D(name="pool"),
            keras.layers.Flatten(),
            keras.layers.Dense(2, name="head"),
        ]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).normal(size=(2, 4, 4, 2)).astype("float32")
    callback = GradVizCallback(root / "run", (x, np.arange(2) % 2), layers=["pool", "head"])
    callback.set_model(model)
    for step in (3, 7):
        callback.log_now(step=step)
    callback.on_train_end()

    log = eventdata.load(root / "run")
    tag = records.routing_map_tag("pool")
    content = eventdata.content(log, tag)
    good = eventdata.last(log, tag).astype(np.float32)
    cells = content["crop"]["height"] * content["crop"]["width"]
    count = content["windows"]["rows"] * content["windows"]["cols"]
    nan_channel, nan_winner, bad_tied = good.copy(), good.copy(), good.copy()
    nan_channel[1, 0] = np.nan
    nan_winner[0, 1 + 2 * cells] = np.nan
    bad_tied[0, 1 + 2 * cells + count] = 0.5
    writer = events.EventLog(root / "run")
    try:
        for step, array in ((9, nan_channel), (11, nan_winner), (13, bad_tied)):
            content_without_kind = {k: v for k, v in content.items() if k not in ("kind", "layer")}
            writer.write(step, events.routing_map_records("pool", array, content_without_kind))
    finally:
        writer.close()
    return root, good, content


def test_routing_map_with_nan_channel_cells_is_refused_as_malformed_not_a_500(logdir):
    from test_plugin import PREFIX, make_app

    root, good, content = logdir
    client, _ = make_app(root)
    response = client.get(PREFIX + "/routing_map", query_string={"run": "run", "layer": "pool"})
    assert response.status_code == 200, response.get_data(as_text=True)
    body = json.loads(response.get_data(as_text=True))
    # The malformed records are left out as a whole, like a malformed row of another layout.
    assert body["steps"] == [3, 7] and body["step"] == 7
    assert body["channels"] == [routing_map.decode(row, content) for row in good]
    for step in (9, 11, 13, 20):
        response = client.get(
            PREFIX + "/routing_map", query_string={"run": "run", "layer": "pool", "step": step}
        )
        assert response.status_code == 200
        assert json.loads(response.get_data(as_text=True))["step"] == 7


def test_valid_rows_names_what_a_routing_map_row_must_hold(logdir):
    _, good, content = logdir
    assert routing_map.valid_rows(good, content).tolist() == [True] * len(good)
    bad = good.copy()
    bad[0, 0] = -1.0  # a channel index below 0
    bad[1, 0] = 1.5  # not a whole channel index
    assert routing_map.valid_rows(bad, content).tolist() == [False, False]
