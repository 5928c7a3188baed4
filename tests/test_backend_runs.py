"""One model, one probe batch, logged on TensorFlow, JAX and PyTorch: three runs the tab compares.

Each backend runs in its own process (Keras picks its backend once, at
import), with the same weights set from numpy. The records must agree to
float32 rounding and the plugin must serve the three runs side by side,
each with its backend.
"""

import os
import subprocess
import sys

import eventdata
import numpy as np
import pytest
from test_plugin import get_json, make_app

from tb_gradviz.format import digest, records

pytestmark = pytest.mark.slow

BACKENDS = ("tensorflow", "jax", "torch")

SCRIPT = """
import sys, numpy as np, keras, tb_gradviz
L = keras.layers
model = keras.Sequential([keras.Input((8, 8, 3)), L.Conv2D(4, 3, padding="same", name="conv"),
                          L.ReLU(name="relu"), L.MaxPooling2D(name="pool"), L.Flatten(name="flat"),
                          L.Dense(2, name="dense")])
rng = np.random.default_rng(0)
model.set_weights([rng.normal(size=w.shape).astype("float32") * 0.3 for w in model.get_weights()])
model.compile(keras.optimizers.SGD(0.0), "mse")
x, y = rng.normal(size=(4, 8, 8, 3)).astype("float32"), rng.normal(size=(4, 2)).astype("float32")
callback = tb_gradviz.GradVizCallback(sys.argv[1], (x, y), layers=["conv", "relu", "pool"])
callback.set_model(model)
callback.log_now(step=3)
callback.on_train_end()
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("backends")
    for backend in BACKENDS:
        env = dict(os.environ, KERAS_BACKEND=backend)
        result = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(logdir / backend)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, f"{backend}:\n{result.stderr[-3000:]}"
    return logdir


def test_the_three_backends_write_the_same_records(runs):
    logs = {backend: eventdata.load(runs / backend) for backend in BACKENDS}
    tags = eventdata.tensor_tags(logs["tensorflow"])
    assert all(eventdata.tensor_tags(log) == tags for log in logs.values())
    for tag in tags:
        reference = eventdata.last(logs["tensorflow"], tag)
        for backend in ("jax", "torch"):
            values = eventdata.last(logs[backend], tag)
            if tag.endswith("/stats"):
                counts = slice(records.STAT_COUNT, records.STAT_NEG_INF + 1)
                floats = slice(records.STAT_MIN, records.STAT_SUM + 1)
                # Counts are exact; the float statistics agree to float32 rounding of the pass.
                np.testing.assert_array_equal(
                    values[counts], reference[counts], err_msg=f"{backend} {tag}"
                )
                np.testing.assert_allclose(
                    values[floats],
                    reference[floats],
                    rtol=1e-4,
                    atol=1e-6,
                    err_msg=f"{backend} {tag}",
                )
            elif tag.startswith(digest.TAG_PREFIX):
                # The digest's counts are exact, its RMS and max |x| those of the stats.
                np.testing.assert_allclose(
                    values, reference, rtol=1e-4, atol=1e-6, err_msg=f"{backend} {tag}"
                )
            elif tag.endswith("/routing"):
                counts, sums = slice(None, records.ROUTING_SUMS.start), records.ROUTING_SUMS
                np.testing.assert_array_equal(
                    values[counts], reference[counts], err_msg=f"{backend} {tag}"
                )
                np.testing.assert_allclose(
                    values[sums], reference[sums], rtol=1e-4, atol=1e-6, err_msg=f"{backend} {tag}"
                )
    content = {
        b: eventdata.content(logs[b], records.stats_tag("pool", "input_gradient")) for b in BACKENDS
    }
    assert [(c["backend"], c["device"]) for c in content.values()] == [(b, "cpu") for b in BACKENDS]


def test_the_tab_lists_the_three_runs_with_their_backends(runs):
    client, _ = make_app(runs)
    body = get_json(client, "/runs")
    assert [run["run"] for run in body["runs"]] == sorted(BACKENDS)
    for run in body["runs"]:
        assert [layer["layer"] for layer in run["layers"]] == ["conv", "relu", "pool"]
        assert {layer["backend"] for layer in run["layers"]} == {run["run"]}
        assert {layer["device"] for layer in run["layers"]} == {"cpu"}
    # The compare grid's snapshot of each run: the same counts on every backend.
    snapshots = {}
    for backend in BACKENDS:
        body = get_json(client, "/step", run=backend, step=3)
        assert body["step"] == 3
        pool = next(layer for layer in body["layers"] if layer["layer"] == "pool")
        snapshots[backend] = (
            {
                name: (t["stats"]["count"], t["stats"]["zeros"])
                for name, t in pool["tensors"].items()
            },
            (
                pool["routing"]["input_positions"],
                pool["routing"]["routed_positions"],
                pool["routing"]["windows"],
            ),
        )
    assert snapshots["tensorflow"][1] == (4 * 8 * 8 * 4, 4 * 4 * 4 * 4, 4 * 4 * 4 * 4)
    assert snapshots["jax"] == snapshots["torch"] == snapshots["tensorflow"]
