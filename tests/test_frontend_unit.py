"""Runs the frontend's unit tests (`node --test tests/frontend/`) over real API answers.

The JS tests read no hand-written JSON (issue 11, defect 1: they once used
'avg', a pooling type the server never sends). This test trains a tiny model
with the real callback, serves its logs with the real plugin over TensorBoard's
own data provider, writes the bodies of /runs, /series, /routing, /step,
/routing_map, /updates, /timeline and /onset into a folder, and hands that folder to node in
GRADVIZ_FIXTURES. A third model has the problems the training-health flags of
/step catch; a fourth has the pools whose routing maps show ties; a fifth is
logged with weights=True (each weight, its gradient and its updates).
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import limits
import numpy as np
import pytest
import small_runs
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from werkzeug import test as werkzeug_test

from tb_gradviz.board import plugin

TESTS = Path(__file__).resolve().parent / "frontend"
PREFIX = "/data/plugin/gradviz/"
BATCH = 8
STEPS_PER_EPOCH = 2
EPOCHS = 2
WEIGHTS_EPOCHS = 3


def _train(log_dir, seed, probe_nan):
    """A convolution, a max pool, an average pool and a two-input Add, logged by GradVizCallback.

    The max pool sees a convolution without ReLU (continuous values: no tied
    windows, so exactly 75 % of its input gradient is zeros). With `probe_nan`
    the probe batch holds one NaN: the convolution's output counts NaNs
    (TensorFlow's max pool then skips them).
    """
    import keras

    import tb_gradviz

    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH * STEPS_PER_EPOCH, 8, 8, 3)).astype("float32")
    y = rng.integers(0, 3, size=len(x))
    inputs = keras.Input((8, 8, 3))
    hidden = keras.layers.Conv2D(4, 3, padding="same", name="conv")(inputs)
    hidden = keras.layers.MaxPooling2D(2, name="pool")(hidden)
    hidden = keras.layers.AveragePooling2D(2, name="avg")(hidden)
    hidden = keras.layers.Flatten()(hidden)
    hidden = keras.layers.Add(name="add")(
        [keras.layers.Dense(4, name="left")(hidden), keras.layers.Dense(4, name="right")(hidden)]
    )
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(hidden))
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    probe = x[:BATCH].copy()
    if probe_nan:
        probe[0, 3, 3, 0] = np.nan
    callback = tb_gradviz.GradVizCallback(
        log_dir,
        probe_data=(probe, y[:BATCH]),
        layers=["conv", "pool", "avg", "add"],
        block_formats=True,
    )
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, callbacks=[callback], verbose=0)


def _train_vanishing(log_dir, seed):
    """A model with problems the training-health flags catch, every layer logged.

    Ten sigmoid Dense layers in a nested model ("body/sigmoid_<i>"): the
    gradient falls by orders of magnitude on its way to the input, and the
    first of them are flagged vanishing. Half the channels of "body/relu"
    have a bias of -10 after inputs in (0, 1): exactly zero for every
    example, flagged dead.
    """
    import keras

    import tb_gradviz

    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH * STEPS_PER_EPOCH, 16)).astype("float32")
    y = rng.integers(0, 3, size=len(x))
    inner = keras.Input((16,))
    hidden = inner
    for i in range(10):
        hidden = keras.layers.Dense(16, activation="sigmoid", name=f"sigmoid_{i}")(hidden)
    body = keras.Model(
        inner, keras.layers.Dense(8, activation="relu", name="relu")(hidden), name="body"
    )
    model = keras.Sequential([keras.Input((16,)), body, keras.layers.Dense(3, name="head")])
    body.get_layer("relu").bias.assign(
        np.where(np.arange(8) % 2 == 1, -10.0, 0.0).astype("float32")
    )
    model.compile(
        optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    callback = tb_gradviz.GradVizCallback(
        log_dir, probe_data=(x[:BATCH], y[:BATCH]), layers=lambda layer: True
    )
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, callbacks=[callback], verbose=0)


def _train_relu_pools(log_dir, seed):
    """Pools over ReLU zeros, logged with their routing maps ("relu").

    A ReLU convolution whose bias starts at -1, so that whole windows are
    zeros and tie; then ResNet50's stem pool (ZeroPadding2D(1), a 3x3 max pool
    with stride 2: overlapping windows) and a 1x1 convolution; a 3x3/2 max
    pool with same padding (one row and column of padding before the first
    window); a 1D max pool.
    """
    import keras

    import tb_gradviz

    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH * STEPS_PER_EPOCH, 10, 10, 3)).astype("float32")
    y = rng.integers(0, 3, size=len(x))
    inputs = keras.Input((10, 10, 3))
    hidden = keras.layers.Conv2D(
        4,
        3,
        padding="same",
        activation="relu",
        name="relu_conv",
        bias_initializer=keras.initializers.Constant(-1.0),
    )(inputs)
    hidden = keras.layers.ZeroPadding2D(1, name="stem_pad")(hidden)
    hidden = keras.layers.MaxPooling2D(3, strides=2, name="stem_pool")(hidden)
    # A convolution after it, as in ResNet50, so that every window gets an upstream gradient.
    hidden = keras.layers.Conv2D(4, 1, name="mix")(hidden)
    hidden = keras.layers.MaxPooling2D(3, strides=2, padding="same", name="same_pool")(hidden)
    hidden = keras.layers.Reshape((9, 4))(hidden)
    hidden = keras.layers.MaxPooling1D(2, name="pool_1d")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(keras.layers.Flatten()(hidden)))
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    callback = tb_gradviz.GradVizCallback(
        log_dir, probe_data=(x[:BATCH], y[:BATCH]), layers=["stem_pool", "same_pool", "pool_1d"]
    )
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, callbacks=[callback], verbose=0)


def _train_weights(log_dir, seed):
    """A small CNN logged with `weights=True`, every layer chosen ("weights").

    Conv2D (ReLU), BatchNormalization, MaxPooling2D, Flatten, Dense: two
    layers without weights among three with; three log events, so that the
    update records of the last two steps exist and the first has none.
    """
    small_runs.fit_weights_cnn(log_dir, seed, BATCH, BATCH, STEPS_PER_EPOCH, WEIGHTS_EPOCHS)


def _client(logdir):
    """The plugin over TensorBoard's Python data provider, every step kept."""
    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        tensor_size_guidance={"gradviz": 0, "histograms": 0}
    )
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    context = base_plugin.TBContext(logdir=str(logdir), data_provider=provider)
    app = application.TensorBoardWSGI([plugin.GradVizPlugin(context)], data_provider=provider)
    return werkzeug_test.Client(app)


def _dump_answers(client, folder):
    """Writes each answer's body to a file and lists them in index.json.

    Bodies are kept as the server wrote them (non-finite floats as "NaN"
    strings), so that the JS tests decode them as the tab does.
    """
    answers = []

    def get(route, **params):
        response = client.get(PREFIX + route, query_string=params)
        name = f"{len(answers):03d}_{route}.json"
        (folder / name).write_bytes(response.get_data())
        answers.append(
            {
                "route": route,
                "params": {k: str(v) for k, v in params.items()},
                "status": response.status_code,
                "file": name,
            }
        )
        return response

    runs = json.loads(get("runs").get_data())["runs"]
    for run in runs:
        get("step", run=run["run"])
        get("timeline", run=run["run"])
        get("onset", run=run["run"])
        for layer in run["layers"]:
            for tensor in layer["tensors"]:
                get("series", run=run["run"], layer=layer["layer"], tensor=tensor["tensor"])
            if layer.get("updates"):
                get("updates", run=run["run"], layer=layer["layer"])
            if layer["pooling"]:
                get("routing", run=run["run"], layer=layer["layer"])
                # The latest map (which lists the steps), then the first step's.
                first = json.loads(
                    get("routing_map", run=run["run"], layer=layer["layer"]).get_data()
                )["steps"][0]
                get("routing_map", run=run["run"], layer=layer["layer"], step=first)
        # A step between two logged ones: /step answers the latest before it.
        get("step", run=run["run"], step=max(layer["max_step"] for layer in run["layers"]) - 1)
    # A series downsampled to one column, and the records the tab then fetches step by step.
    pool = dict(run="clean", layer="pool", tensor="input_gradient")
    get("series", **pool, width=1)
    for step in (STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH):
        get("series", **pool, step=step)
    # Error answers, as the server words them.
    assert get("step", run="clean", step=-1).status_code == 404
    # The weights run at its first log event: no update record yet.
    get("step", run="weights", step=STEPS_PER_EPOCH)
    get("timeline", run="weights", field="update_ratio", role="weight")
    get("timeline", run="clean", field="flush_share")
    get("timeline", run="clean", field="block_zero_share")
    assert get("updates", run="weights", layer="pool").status_code == 404
    assert get("updates", run="clean", layer="conv").status_code == 404
    (folder / "index.json").write_text(json.dumps(answers, indent=1))


@pytest.fixture(scope="module")
def api_answers(tmp_path_factory):
    root = tmp_path_factory.mktemp("frontend_fixtures")
    _train(root / "logs" / "clean", seed=0, probe_nan=False)
    _train(root / "logs" / "nan", seed=1, probe_nan=True)
    _train_vanishing(root / "logs" / "vanishing", seed=2)
    _train_relu_pools(root / "logs" / "relu", seed=3)
    _train_weights(root / "logs" / "weights", seed=4)
    folder = root / "answers"
    folder.mkdir()
    _dump_answers(_client(root / "logs"), folder)
    return folder


def test_frontend_unit_tests_pass_under_node(api_answers):
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI"):
            pytest.fail("node is not on PATH; the frontend unit tests need Node.js 18+")
        pytest.skip("node is not on PATH")
    assert sorted(TESTS.glob("*.test.mjs")), f"no *.test.mjs under {TESTS}"
    env = dict(os.environ, GRADVIZ_FIXTURES=str(api_answers))
    result = subprocess.run(
        [node, "--test", f"{TESTS}{os.sep}"],
        capture_output=True,
        text=True,
        timeout=limits.CHILD_S,
        env=env,
    )
    summary = [
        line
        for line in result.stdout.splitlines()
        if line.startswith(("# pass", "# fail", "# skipped"))
    ]
    assert result.returncode == 0, _failures(result.stdout) + result.stderr[-2000:]
    assert summary[0].split()[-1] != "0" and "# fail 0" in summary and "# skipped 0" in summary, (
        summary
    )


def _failures(tap):
    """The failed subtests of node's TAP output, each with its details (up to its `...`)."""
    found, taking = [], False
    for line in tap.splitlines():
        if line.lstrip().startswith("not ok"):
            taking = True
        if taking:
            found.append(line)
            if line.strip() == "...":
                taking = False
    return "\n".join(found)[-6000:] or tap[-4000:]
