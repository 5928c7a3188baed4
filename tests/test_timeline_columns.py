"""`/timeline`, `/onset` and `/step` read one set of columns: the same rows in model order and the
same flags at every step, on a real run written by two fits with different `layers=` (two digest
series, whose tags' order is not the model's)."""

import json

import pytest
import test_onset
from test_plugin import PREFIX, make_app

from tb_gradviz.format import health

keras = pytest.importorskip("keras")

WHOLE = {"gradviz": 0, "histograms": 0, "gradviz_digest": 0}
STEPS_PER_FIT = 4


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from tb_gradviz import GradVizCallback

    logdir = tmp_path_factory.mktemp("two_fits") / "run"
    scale = test_onset.Scale(name="scale")
    model, x, y = test_onset.middle_layer_network(
        scale, examples=4 * STEPS_PER_FIT, names=("p", "q")
    )
    # The gradient reaching p's output is 1e-6 of q's input gradient: p vanishes against q.
    scale.factor.assign(1e-6)
    for layers in (["q"], ["p", "q"]):
        logged = GradVizCallback(logdir, (x[:8], y[:8]), layers=layers, every_n_batches=1)
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[logged])
    return make_app(logdir.parent, samples_per_plugin=WHOLE)[0]


def get(client, route, **query):
    response = client.get(PREFIX + route, query_string=dict(query, run="run"))
    assert response.status_code == 200, response.get_data(as_text=True)
    return json.loads(response.get_data(as_text=True), parse_constant=float)


def test_timeline_of_a_run_written_by_two_fits_with_different_layers_flags_as_step_and_onset(
    client,
):
    steps = 2 * STEPS_PER_FIT
    timeline = get(client, "/timeline", width=steps)
    assert timeline["columns"]["first_step"] == list(range(1, steps + 1))
    last = get(client, "/step")
    # Model order, not the digest tags' order; p is logged by the second fit only.
    assert [row["layer"] for row in timeline["layers"]] == ["p", "q"]
    assert [layer["layer"] for layer in last["layers"]] == ["p", "q"]
    assert last["health"]["reference_layer"] == "q"
    # At every step, a row's flags are the flags /step raises there.
    rows = {row["layer"]: row["flags"] for row in timeline["layers"]}
    for column, step in enumerate(range(1, steps + 1)):
        at = {
            layer["layer"]: {f["flag"] for f in layer["flags"]}
            for layer in get(client, "/step", step=step)["layers"]
        }
        for layer, flags in rows.items():
            raised = {flag for flag in health.FLAGS if column in flags[flag]}
            assert raised == at.get(layer, set()), (step, layer)
    # p vanishes at every step it is logged, against q; nothing explodes.
    assert rows["p"]["vanishing"] == list(range(STEPS_PER_FIT, steps))
    assert rows["q"]["exploding"] == rows["p"]["exploding"] == []
    # /onset: each flag from the first column any row raised it, at a row that raised it there.
    onsets = get(client, "/onset")["onsets"]
    assert [o["flag"] for o in onsets] == [
        flag for flag in health.FLAGS if any(row[flag] for row in rows.values())
    ]
    for onset in onsets:
        first = min(column for row in rows.values() for column in row[onset["flag"]])
        assert onset["step"] == first + 1
        assert first in rows[onset["layer"]][onset["flag"]]
    assert (onsets[0]["flag"], onsets[0]["layer"]) == ("vanishing", "p")
