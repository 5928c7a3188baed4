"""The plugin's answers for a run logged with `weights=True`: /runs, /step and /updates.

The run is written record by record with known values (as `weights.Updates`
and the capture backends write them), so each served number is checked
exactly; tests/test_weights.py checks the values the callback records.
"""

import math

import numpy as np
import pytest
from test_plugin import PREFIX, get_json, make_app

from tb_gradviz.format import events, records, summaries

CONTENT = {
    "layer_index": 0,
    "layer_class": "Conv2D",
    "layer_dtype": "float32",
    "pooling": None,
    "backend": "torch",
}
# weight -> (values, gradient); the update records at steps 2 and 4:
# (weight_norm, update_norm, interval)
WEIGHTS = {
    "kernel": (np.arange(-6.0, 6.0).reshape(3, 4), np.linspace(-1e-3, 2e-3, 12).reshape(3, 4)),
    "bias": (np.zeros(4), np.array([0.0, 1e-4, -1e-4, 0.0])),
}
UPDATES = {
    2: {"kernel": (20.0, 0.02, 2), "bias": (0.0, 0.0, 2)},
    4: {"kernel": (20.5, 0.041, 2), "bias": (0.01, 0.003, 2)},
}


def tensor_records(layer, name, role, index, values, weight=None):
    layer_index = {"conv": 0, "pool": 1}[layer]
    content = dict(
        CONTENT,
        layer_index=layer_index,
        role=role,
        index=index,
        shape=list(values.shape),
        dtype="float32",
    )
    if weight is not None:
        content["weight"] = weight
    if role in records.GRADIENT_ROLES:
        content["loss_scaled"] = False
    return events.tensor_records(
        layer, name, summaries.linear_histogram(values), summaries.stats_vector(values), content
    )


def write_weights_run(logdir):
    log = events.EventLog(logdir)
    try:
        for step in (0, 2, 4):
            written = []
            for layer in ("conv", "pool"):
                for role in records.TENSOR_ROLES:
                    written += tensor_records(layer, role, role, 0, np.full((2, 3), step + 1.0))
            for role in records.WEIGHT_ROLES:
                for index, (weight, arrays) in enumerate(WEIGHTS.items()):
                    values = arrays[0] if role == records.WEIGHT else arrays[1]
                    written += tensor_records(
                        "conv",
                        records.weight_tensor_name(role, weight),
                        role,
                        index,
                        values,
                        weight,
                    )
            for weight, (norm, update, interval) in UPDATES.get(step, {}).items():
                update_content = dict(
                    CONTENT,
                    weight=weight,
                    tensor=records.weight_tensor_name(records.WEIGHT, weight),
                )
                written += events.update_records(
                    "conv", weight, summaries.update_vector(norm, update, interval), update_content
                )
            log.write(step, written)
    finally:
        log.close()


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    write_weights_run(root / "weights")
    return make_app(root)[0]


def test_runs_lists_each_layers_weights_and_update_records(client):
    (run,) = get_json(client, "/runs")["runs"]
    conv, pool = run["layers"]
    assert (conv["weights"], conv["updates"]) == (["kernel", "bias"], ["kernel", "bias"])
    assert (pool["weights"], pool["updates"]) == ([], [])
    assert [(t["tensor"], t["role"], t.get("weight")) for t in conv["tensors"]] == [
        ("activation", "activation", None),
        ("input_gradient", "input_gradient", None),
        ("output_gradient", "output_gradient", None),
        ("weight/kernel", "weight", "kernel"),
        ("weight/bias", "weight", "bias"),
        ("weight_gradient/kernel", "weight_gradient", "kernel"),
        ("weight_gradient/bias", "weight_gradient", "bias"),
    ]


def test_updates_serves_each_weights_records_over_steps(client):
    body = get_json(client, "/updates", run="weights", layer="conv")
    assert (body["run"], body["layer"]) == ("weights", "conv")
    kernel, bias = body["weights"]
    assert kernel == {
        "weight": "kernel",
        "steps": [2, 4],
        "weight_norm": [20.0, 20.5],
        "update_norm": [0.02, 0.041],
        "update_ratio": [0.02 / 20.0, 0.041 / 20.5],
        "interval": [2, 2],
        "size": ["usual", "usual"],  # 5e-4 and 1e-3 per step
    }
    assert bias["weight"] == "bias"
    assert (
        bias["update_ratio"][0] == "NaN"
    )  # a zero weight that did not move (TensorBoard writes NaN so)
    assert bias["update_ratio"][1] == 0.003 / 0.01
    assert bias["size"] == [None, "big"]  # 0.15 per step


def test_series_of_a_weight_gradient_is_the_numpy_reference(client):
    body = get_json(client, "/series", run="weights", layer="conv", tensor="weight_gradient/kernel")
    expected = records.decode_stats(summaries.stats_vector(WEIGHTS["kernel"][1]))
    assert body["role"] == "weight_gradient" and body["steps"] == [0, 2, 4]
    for name in records.STATS_FIELDS:
        assert body["stats"][name] == [expected[name]] * 3


def test_step_gives_each_weights_update_and_the_layers_ratio(client):
    conv, pool = get_json(client, "/step", run="weights")["layers"]
    assert conv["updates"]["kernel"] == {
        "weight_norm": 20.5,
        "update_norm": 0.041,
        "update_ratio": 0.041 / 20.5,
        "interval": 2,
        "size": "usual",
        "step": 4,
    }
    assert conv["update_ratio"] == pytest.approx(
        math.hypot(0.041, 0.003) / math.hypot(20.5, 0.01), rel=1e-15
    )
    assert conv["update_size"] == "usual"
    kernel = WEIGHTS["kernel"][1]
    assert conv["flow"]["weight_gradient"]["rms"] == pytest.approx(
        math.sqrt((np.sum(kernel**2) + np.sum(WEIGHTS["bias"][1] ** 2)) / 16), rel=1e-12
    )
    assert conv["flow"]["weight"]["zero_fraction"] == (1 + 4) / 16  # kernel holds one 0, bias four
    assert (pool["updates"], pool["update_ratio"], pool["update_size"]) == ({}, None, None)
    assert "weight" not in pool["flow"]
    # Before the first update record: the layer's weights are there, no update yet.
    conv_at_0 = get_json(client, "/step", run="weights", step=1)["layers"][0]
    assert (conv_at_0["updates"], conv_at_0["update_ratio"]) == ({}, None)


@pytest.mark.parametrize(
    "query, status",
    [
        ({"run": "weights", "layer": "pool"}, 404),  # no trainable weights
        ({"run": "weights", "layer": "nope"}, 404),
        ({"run": "nope", "layer": "conv"}, 404),
        ({"run": "weights"}, 400),
        ({"layer": "conv"}, 400),
        ([("run", "weights"), ("layer", "conv"), ("layer", "pool")], 400),
    ],
)
def test_updates_answers_bad_requests_with_their_status(client, query, status):
    response = client.get(PREFIX + "/updates", query_string=query)
    assert response.status_code == status, response.get_data(as_text=True)


def test_updates_answers_other_methods_with_405(client):
    response = client.open(
        PREFIX + "/updates", method="POST", query_string={"run": "weights", "layer": "conv"}
    )
    assert (response.status_code, response.headers["Allow"]) == (405, "GET, HEAD")
