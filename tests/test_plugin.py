"""Tests of the tb_gradviz TensorBoard plugin (`tb_gradviz/board/plugin.py`).

Real event files are written (synthetic runs and hand-made arrays through the
format functions), loaded by TensorBoard's own data provider and queried over
HTTP through `TensorBoardWSGI`, as TensorBoard's histogram plugin tests do.
"""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import eventdata
import limits
import numpy as np
import pytest
import synthetic
import tbserver
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from werkzeug import test as werkzeug_test

from tb_gradviz.board import plugin, routes
from tb_gradviz.format import events, metadata, records, summaries

PREFIX = "/data/plugin/gradviz"
ROUTES = ("/runs", "/series", "/routing", "/step")

_DENSE = "head/dense"
_MAX_POOL = {
    "type": "max",
    "global": False,
    "pool_size": [2, 2],
    "strides": [2, 2],
    "padding": "valid",
    "data_format": "channels_last",
}


def _reject_constant(token):
    raise ValueError(f"invalid JSON constant {token}")


def strict_json(response):
    """Parses a body as standard JSON: a bare NaN or Infinity token fails."""
    return json.loads(response.get_data(as_text=True), parse_constant=_reject_constant)


def _dense_arrays(seed):
    """Arrays of a non-pooling layer with NaN, +-Inf and exact zeros in them."""
    rng = np.random.default_rng(seed)
    activation = rng.normal(0, 1, (2, 16))
    activation[0, :3] = [np.nan, np.inf, -np.inf]
    activation[1, :4] = 0.0
    input_gradient = np.full((2, 8), np.nan)  # nothing finite at all
    output_gradient = np.full((2, 16), 0.25)  # all equal
    return {
        "activation": activation,
        "input_gradient": input_gradient,
        "output_gradient": output_gradient,
    }


def _dense_records(layer, arrays, layer_index=5):
    written = []
    for role, array in arrays.items():
        content = {
            "layer_index": layer_index,
            "layer_class": "Dense",
            "layer_dtype": "float32",
            "role": role,
            "index": 0,
            "shape": list(array.shape),
            "dtype": "float32",
            "pooling": None,
        }
        written += events.tensor_records(
            layer, role, summaries.linear_histogram(array), summaries.stats_vector(array), content
        )
    return written


def write_dense_run(logdir, steps):
    """Writes a non-pooling layer with NaN/Inf values at `steps`; returns `{step: arrays}`."""
    log = events.EventLog(logdir)
    written = {}
    try:
        for step in steps:
            written[step] = _dense_arrays(step)
            log.write(step, _dense_records(_DENSE, written[step]), wall_time=1000.0 + step)
    finally:
        log.close()
    return written


def write_foreign_run(logdir):
    """A run without tb_gradviz data: one histogram under another tag."""
    log = events.EventLog(logdir)
    try:
        log.write(
            1,
            [
                (
                    "weights/kernel",
                    summaries.linear_histogram(np.arange(10.0)),
                    metadata.create_histogram_metadata(),
                )
            ],
        )
    finally:
        log.close()


def write_malformed_run(logdir):
    """tb_gradviz metadata that is corrupt, from the future, or of a wrong layout."""
    good = dict(
        kind="tensor",
        layer_index=0,
        layer_class="Dense",
        layer_dtype="float32",
        role="activation",
        index=0,
        shape=[2],
        dtype="float32",
        pooling=None,
    )

    def raw_metadata(content_bytes):
        md = metadata.create_summary_metadata({})
        md.plugin_data.content = content_bytes
        return md

    written = [
        (
            "gradviz/junk/activation/stats",
            np.zeros(records.STATS_LENGTH),
            raw_metadata(b"\xff not json"),
        ),
        ("gradviz/list/activation/stats", np.zeros(records.STATS_LENGTH), raw_metadata(b"[1, 2]")),
        (
            "gradviz/future/activation/stats",
            np.zeros(records.STATS_LENGTH),
            raw_metadata(json.dumps(dict(good, version=99, layer="future")).encode()),
        ),
        (
            "gradviz/typo/activation/stats",
            np.zeros(records.STATS_LENGTH),
            raw_metadata(json.dumps(dict(good, version=1, layer=7)).encode()),
        ),
    ]
    # A layer whose metadata is fine but whose records have the wrong length
    # at step 1 and a NaN count at step 2; step 3 is good.
    bad_length = events.tensor_records(
        "short",
        "activation",
        summaries.linear_histogram(np.ones(2)),
        np.zeros(5),
        dict(good, layer="short"),
    )
    log = events.EventLog(logdir)
    try:
        log.write(1, written + bad_length)
        nan_count = summaries.stats_vector(np.ones(2))
        nan_count[0] = np.nan
        log.write(2, [(records.stats_tag("short", "activation"), nan_count, None)])
        log.write(
            3,
            [(records.stats_tag("short", "activation"), summaries.stats_vector(np.ones(2)), None)],
        )
    finally:
        log.close()


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """A logdir with a synthetic CNN run, a NaN/Inf dense run, a foreign run and a malformed run."""
    root = tmp_path_factory.mktemp("logs")
    synthetic.write_run(root / "cnn", layers=3, steps=6, seed=1)
    write_dense_run(root / "dense", steps=[2, 4, 6])
    write_foreign_run(root / "foreign")
    write_malformed_run(root / "malformed")
    return root


def make_app(logdir, samples_per_plugin=None, frontend_dir=None, other_plugins=()):
    """Loads `logdir` with the Python multiplexer and returns (client, multiplexer).

    The app serves GradViz and `other_plugins` (TensorBoard plugin classes,
    made with the same context).
    """
    guidance = {"gradviz": 0, "histograms": 0} if samples_per_plugin is None else samples_per_plugin
    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance=guidance)
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    context = base_plugin.TBContext(logdir=str(logdir), data_provider=provider)
    plugins = [plugin.GradVizPlugin(context, frontend_dir=frontend_dir)] + [
        cls(context) for cls in other_plugins
    ]
    app = application.TensorBoardWSGI(plugins, data_provider=provider)
    return werkzeug_test.Client(app), multiplexer


@pytest.fixture(scope="module")
def client(logdir):
    return make_app(logdir)[0]


def get_json(client, path, **query):
    response = client.get(PREFIX + path, query_string=query)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.mimetype == "application/json"
    return strict_json(response)


# Import hygiene.


def test_plugin_import_loads_neither_tensorflow_nor_keras():
    code = (
        "import sys, tb_gradviz.board.plugin\n"
        "loaded = [m for m in ('tensorflow', 'keras', 'tf_keras') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=limits.CHILD_S)


def test_entry_point_names_the_loader_which_loads_the_plugin_class():
    from importlib import metadata as importlib_metadata

    from tb_gradviz.board import loader

    entry_points = importlib_metadata.entry_points(group="tensorboard_plugins")
    (entry,) = [ep for ep in entry_points if ep.name == "gradviz"]
    assert entry.load() is loader.GradVizLoader
    context = base_plugin.TBContext(data_provider=None)
    assert type(loader.GradVizLoader().load(context)) is plugin.GradVizPlugin


# /runs


def test_runs_lists_gradviz_runs_by_name_with_layers_in_model_order(client):
    body = get_json(client, "/runs")
    assert [run["run"] for run in body["runs"]] == ["cnn", "dense", "malformed"]
    cnn = body["runs"][0]
    assert [layer["layer"] for layer in cnn["layers"]] == [
        "block0/pool",
        "block1/pool",
        "block2/pool",
    ]
    pool = cnn["layers"][1]
    assert pool["layer_index"] == 1
    assert pool["layer_class"] == "MaxPooling2D"
    assert pool["pooling"] == _MAX_POOL
    assert pool["max_step"] == 6
    assert [t["tensor"] for t in pool["tensors"]] == [
        "activation",
        "input_gradient",
        "output_gradient",
    ]
    assert pool["tensors"][1] == {
        "tensor": "input_gradient",
        "role": "input_gradient",
        "index": 0,
        "shape": [2, 8, 8, 4],
        "dtype": "float32",
    }
    (dense,) = body["runs"][1]["layers"]
    assert dense["layer"] == _DENSE
    assert dense["pooling"] is None
    assert dense["max_step"] == 6


def test_runs_skips_malformed_and_foreign_metadata(client):
    runs = {run["run"]: run for run in get_json(client, "/runs")["runs"]}
    assert "foreign" not in runs
    # Corrupt, non-object, future-version and mistyped metadata are skipped;
    # the layer with good metadata (and partly bad records) stays.
    assert [layer["layer"] for layer in runs["malformed"]["layers"]] == ["short"]


def test_skipped_newer_and_unknown_metadata_is_logged_once_per_reason(logdir, caplog):
    # Issue 11: series were skipped silently; TensorBoard's own plugins log it.
    client = make_app(logdir)[0]
    with caplog.at_level("WARNING", logger="tb_gradviz.board.catalog"):
        get_json(client, "/runs")
        get_json(client, "/runs")
    messages = sorted(
        record.getMessage()
        for record in caplog.records
        if record.name == "tb_gradviz.board.catalog"
    )
    assert len(messages) == 2, messages
    newer, unreadable = messages
    assert "a newer metadata version" in newer and "'gradviz/future/activation/stats'" in newer
    assert "version 99; this reader knows 1..1" in newer
    # Corrupt, non-object and mistyped metadata: one warning, naming the first.
    assert (
        "metadata tb_gradviz cannot read "
        "(sample: run 'malformed', tag 'gradviz/junk/activation/stats')" in unreadable
    )


def test_runs_orders_several_input_gradients_after_activation(tmp_path):
    arrays = {
        "activation": np.ones((2, 3)),
        "input_gradient_1": np.ones((2, 3)),
        "input_gradient_0": np.ones((2, 3)),
        "output_gradient": np.ones((2, 3)),
    }
    written = []
    for tensor, array in arrays.items():
        role = tensor.rsplit("_", 1)[0] if tensor.startswith("input_gradient_") else tensor
        index = int(tensor[-1]) if tensor.startswith("input_gradient_") else 0
        content = {
            "layer_index": 0,
            "layer_class": "Add",
            "layer_dtype": "float32",
            "role": role,
            "index": index,
            "shape": [2, 3],
            "dtype": "float32",
            "pooling": None,
        }
        written += events.tensor_records(
            "add", tensor, summaries.linear_histogram(array), summaries.stats_vector(array), content
        )
    log = events.EventLog(tmp_path / "run")
    log.write(1, written)
    log.close()
    client, _ = make_app(tmp_path)
    (layer,) = get_json(client, "/runs")["runs"][0]["layers"]
    assert [t["tensor"] for t in layer["tensors"]] == [
        "activation",
        "input_gradient_0",
        "input_gradient_1",
        "output_gradient",
    ]


# /series


def test_series_matches_the_numpy_reference_exactly(client):
    written = {step: _dense_arrays(step) for step in (2, 4, 6)}
    body = get_json(client, "/series", run="dense", layer=_DENSE, tensor="activation")
    assert body["steps"] == [2, 4, 6]
    assert body["wall_times"] == [1002.0, 1004.0, 1006.0]
    assert (body["role"], body["shape"], body["dtype"]) == ("activation", [2, 16], "float32")
    for i, step in enumerate((2, 4, 6)):
        expected = records.decode_stats(summaries.stats_vector(written[step]["activation"]))
        for name in records.STATS_COUNT_FIELDS:
            assert body["stats"][name][i] == int(expected[name])
            assert isinstance(body["stats"][name][i], int)
        for name in ("min", "max", "mean", "std", "sum"):
            assert body["stats"][name][i] == expected[name]
        assert body["log"]["negative"][i] == expected["log_counts"]["negative"]
        assert body["log"]["positive"][i] == expected["log_counts"]["positive"]
        histogram = summaries.linear_histogram(written[step]["activation"])
        assert body["histogram"]["counts"][i] == histogram[:, 2].astype(int).tolist()
        assert body["histogram"]["low"][i] == histogram[0, 0]
        assert body["histogram"]["high"][i] == histogram[-1, 1]
    assert body["stats"]["nan"] == [1, 1, 1]
    assert body["stats"]["pos_inf"] == [1, 1, 1]
    assert body["stats"]["zeros"] == [4, 4, 4]
    assert body["histogram"]["buckets"] == 30
    assert body["log"]["edges"] == records.LOG_EDGES.tolist()
    assert len(body["log"]["edges"]) + 1 == len(body["log"]["positive"][0]) == 38


def test_series_of_all_nan_tensor_is_valid_json_with_nan_strings(client):
    body = get_json(client, "/series", run="dense", layer=_DENSE, tensor="input_gradient")
    assert body["stats"]["nan"] == [16, 16, 16]
    assert body["stats"]["count"] == [16, 16, 16]
    for name in ("min", "max", "mean", "std", "sum"):
        assert body["stats"][name] == ["NaN", "NaN", "NaN"]
    assert body["histogram"]["counts"][0] == [0] * 30
    assert body["log"]["positive"][0] == [0] * 38


def test_series_of_constant_tensor_counts_everything_in_the_last_bucket(client):
    body = get_json(client, "/series", run="dense", layer=_DENSE, tensor="output_gradient")
    assert body["histogram"]["counts"][0] == [0] * 29 + [32]
    assert body["histogram"]["low"][0] == body["histogram"]["high"][0] == 0.25
    assert body["stats"]["std"][0] == 0.0
    # 0.25 lies in [10**-1, 10**-0.5): bin index of edge 10**-0.5 in the positive half.
    assert (
        body["log"]["positive"][0][int(np.searchsorted(records.LOG_EDGES, 0.25, side="right"))]
        == 32
    )


def test_series_of_synthetic_pool_counts_its_routing_zeros(client):
    body = get_json(client, "/series", run="cnn", layer="block2/pool", tensor="input_gradient")
    assert body["steps"] == [1, 2, 3, 4, 5, 6]
    assert body["stats"]["count"] == [2 * 8 * 8 * 4] * 6
    # One position of four receives each window's gradient.
    assert body["stats"]["zeros"] == [2 * 8 * 8 * 4 * 3 // 4] * 6


def test_series_leaves_out_records_with_a_wrong_layout(client):
    body = get_json(client, "/series", run="malformed", layer="short", tensor="activation")
    assert body["steps"] == [3]
    assert body["stats"]["count"] == [2]
    # The histogram of step 1 exists, but step 1 is not a stats step.
    assert body["histogram"]["counts"] == [None]
    assert body["histogram"]["low"] == [None]


def test_series_serves_every_step_the_provider_holds(tmp_path):
    synthetic.write_run(tmp_path / "long", layers=1, steps=40)
    client, _ = make_app(tmp_path)
    body = get_json(client, "/series", run="long", layer="block0/pool", tensor="activation")
    assert body["steps"] == list(range(1, 41))
    assert None not in body["histogram"]["counts"]


def test_series_shows_new_steps_after_a_reload(tmp_path):
    synthetic.write_run(tmp_path / "run", layers=2, steps=3)
    client, multiplexer = make_app(tmp_path)
    query = dict(run="run", layer="block1/pool", tensor="activation")
    get_json(client, "/runs")  # lists, and remembers, every series of the run
    assert get_json(client, "/series", **query)["steps"] == [1, 2, 3]
    assert get_json(client, "/step", run="run")["step"] == 3
    assert get_json(client, "/routing", run="run", layer="block1/pool")["steps"] == [1, 2, 3]
    # A second fit() continues the steps in a new event file.
    time.sleep(0.01)
    synthetic.write_run(tmp_path / "run", layers=2, steps=2, first_step=4, seed=5)
    multiplexer.Reload()
    assert get_json(client, "/series", **query)["steps"] == [1, 2, 3, 4, 5]
    assert get_json(client, "/step", run="run")["step"] == 5
    assert get_json(client, "/routing", run="run", layer="block1/pool")["steps"] == [1, 2, 3, 4, 5]


def test_series_with_histograms_downsampled_separately_has_null_steps(tmp_path):
    synthetic.write_run(tmp_path / "run", layers=1, steps=20)
    client, _ = make_app(tmp_path, samples_per_plugin={"gradviz": 0, "histograms": 5})
    body = get_json(client, "/series", run="run", layer="block0/pool", tensor="activation")
    assert body["steps"] == list(range(1, 21))
    present = [count is not None for count in body["histogram"]["counts"]]
    assert sum(present) == 5
    assert present[-1]  # the last step is always kept
    assert [low is not None for low in body["histogram"]["low"]] == present


# /routing


def test_routing_of_a_pool_layer(client, logdir):
    body = get_json(client, "/routing", run="cnn", layer="block0/pool")
    assert body["pooling"] == _MAX_POOL
    assert body["steps"] == [1, 2, 3, 4, 5, 6]
    # What the file holds, read by TensorBoard's own event reader.
    written = [
        row
        for _, row in eventdata.values(
            eventdata.load(logdir / "cnn"), records.routing_tag("block0/pool")
        )
    ]
    for i, name in enumerate(records.ROUTING_FIELDS):
        assert body[name] == [row[i] for row in written], name
    assert all(isinstance(n, int) for n in body["input_positions"] + body["tied_windows"])
    assert body["input_positions"] == [512] * 6 and body["windows"] == [128] * 6
    assert sum(body["tied_windows"]) > 0  # ReLU zeros tie whole windows
    np.testing.assert_allclose(body["input_gradient_sum"], body["output_gradient_sum"], rtol=1e-5)


def test_routing_of_average_pool_serves_nan_tied_windows(tmp_path):
    pooling = dict(_MAX_POOL, type="average")
    written = events.routing_records(
        "avg",
        np.array([16, 16, 4, np.nan, 0.5, 0.5, 0.75]),
        {
            "layer_index": 0,
            "layer_class": "AveragePooling2D",
            "layer_dtype": "float32",
            "pooling": pooling,
        },
    )
    written += _dense_records("avg", {"activation": np.ones((1, 2, 2, 1))}, layer_index=0)
    log = events.EventLog(tmp_path / "run")
    log.write(7, written)
    log.close()
    client, _ = make_app(tmp_path)
    body = get_json(client, "/routing", run="run", layer="avg")
    assert body["tied_windows"] == ["NaN"]
    assert body["windows"] == [4]
    assert body["output_gradient_abs_sum"] == [0.75]
    assert body["pooling"]["type"] == "average"
    step = get_json(client, "/step", run="run")
    assert step["layers"][0]["routing"]["tied_windows"] == "NaN"


def test_routing_records_without_abs_sum_are_served_with_nan(tmp_path):
    # Version-1 records written before `output_gradient_abs_sum` existed.
    written = events.routing_records(
        "pool",
        np.array([16, 4, 4, 0, 0.5, 0.5]),
        {
            "layer_index": 0,
            "layer_class": "MaxPooling2D",
            "layer_dtype": "float32",
            "pooling": _MAX_POOL,
        },
    )
    written += _dense_records("pool", {"activation": np.ones((1, 2, 2, 1))}, layer_index=0)
    log = events.EventLog(tmp_path / "run")
    log.write(3, written)
    log.write(4, [(records.routing_tag("pool"), np.array([16, 4, 4]), None)])  # too short: left out
    log.close()
    client, _ = make_app(tmp_path)
    body = get_json(client, "/routing", run="run", layer="pool")
    assert body["steps"] == [3]
    assert body["routed_positions"] == [4]
    assert body["output_gradient_abs_sum"] == ["NaN"]
    assert body["mass"]["conserved"] == [None]  # nothing to judge against


def test_cli_and_tab_judge_mass_conservation_alike(tmp_path):
    # The CLI once judged against Σ|grad| with 1e-5, the tab against n·RMS with 1e-3. The server
    # decides once (summaries.mass_conservation); /routing, /step and the CLI say the same.
    from tb_gradviz import cli

    content = {"layer_index": 0, "layer_class": "MaxPooling2D", "pooling": _MAX_POOL}
    cases = {  # run -> (layer dtype, input sum, output sum, Σ|output gradient|), expected verdict
        "rounding": (("float32", 2.0 + 1e-6, 2.0, 4.0), True),  # 2.5e-7 of Σ|grad|
        "lost": (
            ("float32", 2.0 + 2e-3, 2.0, 4.0),
            False,
        ),  # 5e-4: kept by the old tab, not by the old CLI
        "float16_rounding": (("float16", 2.0 + 2e-3, 2.0, 4.0), True),  # within float16's rounding
    }
    for run, ((dtype, input_sum, output_sum, abs_sum), _) in cases.items():
        written = events.routing_records(
            "pool",
            np.array([16, 4, 4, 0, input_sum, output_sum, abs_sum]),
            dict(content, layer_dtype=dtype),
        )
        written += _dense_records("pool", {"input_gradient": np.ones((1, 4, 4, 1))}, layer_index=0)
        log = events.EventLog(tmp_path / run)
        log.write(7, written)
        log.close()
    client, _ = make_app(tmp_path)
    layers = {r["run"]: r["layers"] for r in get_json(client, "/runs")["runs"]}
    for run, (_, conserved) in cases.items():
        routing = get_json(client, "/routing", run=run, layer="pool")
        assert routing["mass"]["conserved"] == [conserved], run
        snapshot = get_json(client, "/step", run=run)
        assert snapshot["layers"][0]["routing"]["mass"]["conserved"] is conserved, run
        assert snapshot["layers"][0]["routing"]["mass"] == {
            k: v[0] for k, v in routing["mass"].items()
        }, run
        (row,) = cli.summary_rows(snapshot, layers[run])
        assert row[cli.SUMMARY_COLUMNS.index("mass")] == (
            "kept" if conserved else "off by 0.002"
        ), (run, row)


def test_routing_of_a_layer_that_is_not_a_pool_is_404(client):
    response = client.get(PREFIX + "/routing", query_string={"run": "dense", "layer": _DENSE})
    assert response.status_code == 404


# /step


def test_step_without_step_gives_each_layers_last_step(client):
    body = get_json(client, "/step", run="cnn")
    assert body["step"] == 6
    assert body["log_edges"] == records.LOG_EDGES.tolist()
    assert [layer["layer"] for layer in body["layers"]] == [
        "block0/pool",
        "block1/pool",
        "block2/pool",
    ]
    layer = body["layers"][0]
    assert layer["step"] == 6
    assert list(layer["tensors"]) == ["activation", "input_gradient", "output_gradient"]
    assert layer["tensors"]["input_gradient"]["stats"]["count"] == 512
    assert layer["tensors"]["input_gradient"]["stats"]["zeros"] == 384
    assert len(layer["tensors"]["activation"]["log"]["negative"]) == 38
    assert layer["routing"]["windows"] == 128
    assert layer["routing"]["step"] == 6


def test_step_takes_the_latest_step_at_or_before(client):
    series = get_json(client, "/series", run="dense", layer=_DENSE, tensor="activation")
    for asked, expected in [(2, 2), (3, 2), (5, 4), (6, 6), (10**6, 6), (2**70, 6)]:
        body = get_json(client, "/step", run="dense", step=str(asked))
        assert body["step"] == expected
        (layer,) = body["layers"]
        assert layer["routing"] is None
        stats = layer["tensors"]["activation"]["stats"]
        row = series["steps"].index(expected)
        assert stats["count"] == series["stats"]["count"][row]
        assert stats["mean"] == series["stats"]["mean"][row]
        assert layer["tensors"]["activation"]["log"]["positive"] == series["log"]["positive"][row]


@pytest.mark.parametrize("step", ["1", "0", "-5", str(-(2**70))])
def test_step_before_the_first_logged_step_is_404(client, step):
    response = client.get(PREFIX + "/step", query_string={"run": "dense", "step": step})
    assert response.status_code == 404


def test_step_with_layers_logged_at_different_steps(tmp_path):
    log = events.EventLog(tmp_path / "run")
    for step in range(1, 6):
        written = _dense_records("every", _dense_arrays(step), layer_index=0)
        if step % 2 == 0:
            written += _dense_records("even", _dense_arrays(step), layer_index=1)
        log.write(step, written)
    log.close()
    client, _ = make_app(tmp_path)
    body = get_json(client, "/step", run="run", step="3")
    assert [(layer["layer"], layer["step"]) for layer in body["layers"]] == [
        ("every", 3),
        ("even", 2),
    ]
    assert body["step"] == 3
    # Before the first step of "even", only "every" is shown.
    body = get_json(client, "/step", run="run", step="1")
    assert [layer["layer"] for layer in body["layers"]] == ["every"]


# Errors


@pytest.mark.parametrize(
    "route, query",
    [
        ("/series", {}),
        ("/series", {"run": "dense", "layer": _DENSE}),
        ("/series", {"run": "dense", "tensor": "activation"}),
        (
            "/series",
            [("run", "dense"), ("run", "cnn"), ("layer", _DENSE), ("tensor", "activation")],
        ),
        ("/routing", {"layer": "block0/pool"}),
        ("/routing", [("run", "cnn"), ("layer", "block0/pool"), ("layer", "block1/pool")]),
        ("/step", {}),
        ("/step", {"run": "dense", "step": "abc"}),
        ("/step", {"run": "dense", "step": ""}),
        ("/step", {"run": "dense", "step": "1.5"}),
        ("/step", {"run": "dense", "step": "1e3"}),
        ("/step", {"run": "dense", "step": " 4"}),
        ("/step", {"run": "dense", "step": "1_0"}),
        ("/step", {"run": "dense", "step": "\u0664"}),  # an Arabic-Indic four
        ("/step", {"run": "dense", "step": "9" * 5000}),
        ("/step", [("run", "dense"), ("step", "2"), ("step", "4")]),
    ],
)
def test_malformed_query_is_400(client, route, query):
    response = client.get(PREFIX + route, query_string=query)
    assert response.status_code == 400, response.get_data(as_text=True)


@pytest.mark.parametrize(
    "route, query",
    [
        ("/series", {"run": "nope", "layer": _DENSE, "tensor": "activation"}),
        ("/series", {"run": "dense", "layer": "nope", "tensor": "activation"}),
        ("/series", {"run": "dense", "layer": _DENSE, "tensor": "nope"}),
        ("/series", {"run": "dense", "layer": _DENSE, "tensor": "activation/stats"}),
        ("/series", {"run": "foreign", "layer": "weights", "tensor": "kernel"}),
        ("/series", {"run": "malformed", "layer": "future", "tensor": "activation"}),
        ("/series", {"run": "malformed", "layer": "junk", "tensor": "activation"}),
        ("/series", {"run": "cnn", "layer": "block0", "tensor": "pool/activation"}),
        ("/routing", {"run": "nope", "layer": "block0/pool"}),
        ("/routing", {"run": "cnn", "layer": "nope"}),
        ("/step", {"run": "nope"}),
        ("/step", {"run": "foreign"}),
        ("/step", {"run": ""}),
        ("/step", {"run": "\u00e9\u6f22\U0001f600"}),
    ],
)
def test_unknown_name_is_404(client, route, query):
    response = client.get(PREFIX + route, query_string=query)
    assert response.status_code == 404, response.get_data(as_text=True)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
@pytest.mark.parametrize("route", ROUTES + ("/static/index.js",))
def test_other_methods_are_405(client, route, method):
    response = client.open(PREFIX + route, method=method, query_string={"run": "cnn"})
    assert response.status_code == 405
    assert response.headers["Allow"] == "GET, HEAD"


def test_head_is_answered_without_body(client):
    response = client.head(PREFIX + "/runs")
    assert response.status_code == 200
    assert response.get_data() == b""


_QUERY_KEYS = st.sampled_from(["run", "layer", "tensor", "step", "x", "", "run[]", "RUN"])
_QUERY_VALUES = st.one_of(
    st.sampled_from(
        [
            "cnn",
            "dense",
            "malformed",
            "foreign",
            "block0/pool",
            _DENSE,
            "activation",
            "input_gradient",
            "short",
            "3",
            "-1",
            "0",
            "99999999999999999999999",
            "NaN",
            "inf",
            "..",
            "%00",
            "",
        ]
    ),
    st.text(max_size=30),
    st.integers(min_value=-(2**80), max_value=2**80).map(str),
)


@settings(
    max_examples=1200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(
    route=st.sampled_from(ROUTES + ("/static/", "/static/index.js", "/")),
    method=st.sampled_from(["GET", "GET", "GET", "HEAD", "POST", "DELETE"]),
    query=st.lists(st.tuples(_QUERY_KEYS, _QUERY_VALUES), max_size=5),
)
def test_fuzzed_requests_never_fail_with_500(client, route, method, query):
    response = client.open(PREFIX + route, method=method, query_string=query)
    assert response.status_code in (200, 400, 404, 405), (
        route,
        method,
        query,
        response.status_code,
    )
    if response.status_code == 200 and response.mimetype == "application/json" and method == "GET":
        strict_json(response)


# Static files


@pytest.fixture(scope="module")
def frontend(tmp_path_factory):
    """A frontend folder with the file types served, plus a secret next to it and a symlink out."""
    root = tmp_path_factory.mktemp("site")
    folder = root / "frontend"
    (folder / "vendor").mkdir(parents=True)
    (folder / "index.js").write_text("export function render() {}\n")
    (folder / "model.js").write_text("export const x = 1;\n")
    (folder / "vendor" / "lib.js").write_text("export default 2;\n")
    (folder / "style.css").write_text("body {}\n")
    (folder / "icon.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>\n")
    (folder / "page.html").write_text("<p>hi</p>\n")
    (folder / "notes.txt").write_text("not served\n")
    (folder / ".hidden.js").write_text("hidden\n")
    (root / "secret.js").write_text("SECRET\n")
    (folder / "escape.js").symlink_to(root / "secret.js")
    (folder / "vendor" / "up").symlink_to(root)
    (folder / "linked.js").symlink_to(folder / "model.js")  # inside: fine
    return folder


@pytest.fixture(scope="module")
def static_client(logdir, frontend):
    return make_app(logdir, frontend_dir=str(frontend))[0]


@pytest.mark.parametrize(
    "path, mimetype",
    [
        ("index.js", "text/javascript"),
        ("model.js", "text/javascript"),
        ("vendor/lib.js", "text/javascript"),
        ("linked.js", "text/javascript"),
        ("style.css", "text/css"),
    ],
)
def test_static_files_are_served_with_their_type(static_client, frontend, path, mimetype):
    response = static_client.get(PREFIX + "/static/" + path)
    assert response.status_code == 200
    assert response.mimetype == mimetype
    assert response.get_data() == (frontend / path).read_bytes()


@pytest.mark.parametrize("path", ["icon.svg", "page.html", "notes.txt"])
def test_only_the_types_the_frontend_ships_are_served(static_client, path):
    # The tab is ES modules and a stylesheet: no other type is served, even from the folder.
    assert static_client.get(PREFIX + "/static/" + path).status_code == 404


_TRAVERSALS = [
    "",
    "/",
    "..",
    "../secret.js",
    "../../secret.js",
    "./index.js",
    "vendor/../index.js",
    "vendor/./lib.js",
    "//etc/passwd",
    "/etc/passwd",
    "%2e%2e/secret.js",
    "%2E%2E/secret.js",
    "%252e%252e/secret.js",
    "..%2fsecret.js",
    "..%2Fsecret.js",
    "vendor%2f..%2f..%2fsecret.js",
    "..\\secret.js",
    "vendor\\lib.js",
    "..%5csecret.js",
    "%5c..%5csecret.js",
    "index.js%00.png",
    "index.js\x00",
    "%00",
    "C:/Windows/win.ini",
    "c:%5cwindows%5cwin.ini",
    "escape.js",
    "vendor/up/secret.js",
    ".hidden.js",
    "notes.txt",
    "missing.js",
    "vendor",
    "vendor/",
    "index.js/",
    "index.js/.",
    "....//secret.js",
    "..;/secret.js",
    "%c0%ae%c0%ae/secret.js",
    "\u2025/secret.js",
    "~/secret.js",
    "vendor//lib.js",
    "index.js::$DATA",
    "a" * 600 + ".js",
]


@pytest.mark.parametrize("path", _TRAVERSALS)
def test_static_path_guard_refuses_traversal(static_client, path):
    response = static_client.get(PREFIX + "/static/" + path)
    assert response.status_code == 404, path
    assert b"SECRET" not in response.get_data()


def test_static_path_guard_refuses_traversal_in_raw_paths(static_client):
    # werkzeug's client normalises nothing when the path is given raw.
    for raw in [
        "/static/../../../secret.js",
        "/static/vendor/../../secret.js",
        "/static/%2e%2e%2fsecret.js",
    ]:
        response = static_client.get(PREFIX + raw)
        assert response.status_code == 404, raw
        assert b"SECRET" not in response.get_data()


def test_default_frontend_folder_is_the_frontend_package():
    folder = routes.frontend_dir()
    assert folder is not None and os.path.basename(os.path.normpath(folder)) == "frontend"


def test_frontend_metadata_points_at_the_static_module(client):
    body = strict_json(client.get("/data/plugins_listing"))
    assert body["gradviz"]["tab_name"] == "GradViz"
    assert body["gradviz"]["loading_mechanism"] == {
        "type": "IFRAME",
        "module_path": PREFIX + "/static/index.js",
    }


# Activity


def test_tab_is_active_with_gradviz_data(client):
    assert strict_json(client.get("/data/plugins_listing"))["gradviz"]["enabled"] is True


def test_tab_is_inactive_without_gradviz_data(tmp_path):
    write_foreign_run(tmp_path / "foreign")
    client, _ = make_app(tmp_path)
    assert strict_json(client.get("/data/plugins_listing"))["gradviz"]["enabled"] is False
    assert get_json(client, "/runs") == {"runs": []}


def test_tab_is_inactive_on_an_empty_logdir(tmp_path):
    client, _ = make_app(tmp_path)
    assert strict_json(client.get("/data/plugins_listing"))["gradviz"]["enabled"] is False


# A real TensorBoard process, with each loader.


def _get(url):
    with urllib.request.urlopen(url, timeout=limits.REQUEST_S) as response:
        return response.status, response.headers.get_content_type(), response.read()


@pytest.mark.slow
@pytest.mark.parametrize("load_fast", ["false", "true"])
def test_real_tensorboard_serves_the_plugin(tmp_path, load_fast):
    synthetic.write_run(tmp_path / "logs" / "cnn", layers=2, steps=30)

    def runs_listed(url):
        return bool(tbserver.get_json(url + PREFIX + "/runs")["runs"])

    extra = [f"--load_fast={load_fast}", "--reload_interval=1"]
    with tbserver.running_tensorboard(
        tmp_path / "logs", tmp_path / "tensorboard.log", runs_listed, extra
    ) as base:
        body = tbserver.get_json(base + PREFIX + "/runs")
        assert [layer["layer"] for layer in body["runs"][0]["layers"]] == [
            "block0/pool",
            "block1/pool",
        ]
        query = "?run=cnn&layer=block1%2Fpool&tensor=input_gradient"
        series = json.loads(
            _get(base + PREFIX + "/series" + query)[2], parse_constant=_reject_constant
        )
        assert series["steps"] == list(range(1, 31))
        assert None not in series["histogram"]["counts"]
        assert series["stats"]["count"] == [512] * 30
        step = json.loads(_get(base + PREFIX + "/step?run=cnn&step=12")[2])
        assert step["step"] == 12
        try:
            _get(base + PREFIX + "/series?run=cnn")
            pytest.fail("a missing argument must be 400")
        except urllib.error.HTTPError as e:
            assert e.code == 400
