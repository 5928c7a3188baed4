"""Today's readers on event files of every earlier record layout (issue 11, defect 3).

The files under tests/data/layouts were written by the commits that had
those layouts (tests/data/layouts/make.sh): the plugin and the CLI must
serve them, with NaN or a default for what they lack, the values as written.
Layouts 6 and later were written by a fit that logs a conv layer with
weights=True, so their weights, update records, digest and precision
records are in the files; layouts 10 and 11 with a LossScaleOptimizer, so
their loss-scale records (layout 10's without the batch count) are too.
Layout 11's precision records are the last without the block part.
"""

import json
import math
import pathlib

import eventdata
import numpy as np
import pytest
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from werkzeug import test as werkzeug_test

from tb_gradviz import cli
from tb_gradviz.board import plugin
from tb_gradviz.format import health, records

LAYOUTS = pathlib.Path(__file__).parent / "data" / "layouts"
# In the layouts' order (layout10 after layout9).
LAYOUT_DIRS = sorted(LAYOUTS.glob("layout*"), key=lambda path: int(path.name[6:].split("-")[0]))
PREFIX = "/data/plugin/gradviz"
# The first layout that wrote each (docs/FORMAT.md's layout table).
WEIGHTS_SINCE, DIGEST_SINCE, PRECISION_SINCE, DIGEST_PRECISION_SINCE = 6, 7, 8, 9
# The layout kept that trained with a LossScaleOptimizer whose record lacks the batch count.
LOSS_SCALE = 10
# The first layout whose loss-scale record counts the batches.
BATCHES_SINCE = 11


def number(layout):
    """A layout folder's number: 6 for `layout6-64c3ecc`."""
    return int(layout.name.removeprefix("layout").split("-")[0])


def weights_of(layout, layer):
    """The weights make.sh's fit logged for a layer of a layout: the conv layer's since layout 6."""
    return ["kernel", "bias"] if number(layout) >= WEIGHTS_SINCE and layer == "conv" else []


def test_every_layout_has_its_files():
    assert [path.name for path in LAYOUT_DIRS] == [
        "layout1-babdf2f",
        "layout2-ea6cf0b",
        "layout3-394d555",
        "layout4-a4aadd0",
        "layout5-88cce65",
        "layout6-64c3ecc",
        "layout7-0e16de2",
        "layout8-7c73bbe",
        "layout9-be377b1",
        "layout10-feeef3d",
        "layout11-a82ce12",
    ]


def client_for(logdir):
    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        tensor_size_guidance={"gradviz": 0, "histograms": 0}
    )
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    gradviz = plugin.GradVizPlugin(
        base_plugin.TBContext(logdir=str(logdir), data_provider=provider)
    )
    return werkzeug_test.Client(application.TensorBoardWSGI([gradviz], data_provider=provider))


def get(client, route, **query):
    response = client.get(PREFIX + route, query_string=query)
    assert response.status_code == 200, response.get_data(as_text=True)
    return json.loads(response.get_data(as_text=True), parse_constant=float)


def same(served, written):
    """Served JSON values against the written float64 ones (NaN equal to NaN)."""
    np.testing.assert_array_equal(
        np.asarray(served, dtype=np.float64), np.asarray(written, dtype=np.float64)
    )


def check_routing(client, accumulator, run, layer):
    """Asserts that `/routing` serves a layer's routing records as written."""
    routing = get(client, "/routing", run=run, layer=layer)
    written = [row for _, row in eventdata.values(accumulator, records.routing_tag(layer))]
    for i, name in enumerate(records.ROUTING_FIELDS):
        expected = [row[i] if i < len(row) else math.nan for row in written]
        same(routing[name], expected)
    short = len(written[0]) < len(records.ROUTING_FIELDS)
    # Without output_gradient_abs_sum there is nothing to judge the mass against.
    assert routing["mass"]["conserved"] == (
        [None] * len(written) if short else [True] * len(written)
    )


@pytest.mark.parametrize("layout", LAYOUT_DIRS, ids=lambda path: path.name)
def test_plugin_serves_every_earlier_layout_as_written(layout):
    client = client_for(layout)
    runs = get(client, "/runs")["runs"]
    assert [run["run"] for run in runs] == sorted(path.name for path in layout.iterdir())
    for run in runs:
        accumulator = eventdata.load(layout / run["run"])
        assert {layer["layer"] for layer in run["layers"]} == set(eventdata.layers(accumulator))
        for layer in run["layers"]:
            # Every layout before backends existed was written by TensorFlow.
            assert layer["backend"] == "tensorflow"
            # Before weights=True, and for a layer without weights: no weights, no updates.
            weights = weights_of(layout, layer["layer"])
            assert (layer["weights"], layer["updates"]) == (weights, weights)
            for tensor in layer["tensors"]:
                body = get(
                    client, "/series", run=run["run"], layer=layer["layer"], tensor=tensor["tensor"]
                )
                written = eventdata.values(
                    accumulator, records.stats_tag(layer["layer"], tensor["tensor"])
                )
                assert body["steps"] == [step for step, _ in written]
                columns = records.stats_columns(np.stack([row for _, row in written]))
                for name in records.STATS_FIELDS:
                    same(body["stats"][name], columns[name])
                assert body["histogram"]["counts"][-1] is not None
            # Routing records: of the pooling layers (not of layout 6's conv layer).
            assert (layer["layer"] == "conv") == (
                records.routing_tag(layer["layer"]) not in eventdata.tensor_tags(accumulator)
            )
            if layer["layer"] != "conv":
                check_routing(client, accumulator, run["run"], layer["layer"])
            step = get(client, "/step", run=run["run"])
            assert [entry["layer"] for entry in step["layers"]] == eventdata.layers(accumulator)
            for entry in step["layers"]:
                weights = weights_of(layout, entry["layer"])
                assert list(entry["updates"]) == weights
                assert (entry["update_ratio"] is None) == (not weights)
                for name, tensor in entry["tensors"].items():
                    # Before the precision record: null, and no underflow or overflow flag.
                    if number(layout) < PRECISION_SINCE:
                        assert tensor["precision"] is None
                        continue
                    tag = records.precision_tag(entry["layer"], name)
                    written = eventdata.values(accumulator, tag)[-1]
                    assert tensor["step"] == written[0]
                    assert tensor["precision"] == records.decode_precision(written[1])
                    # Every layout kept precedes the block part of the precision record.
                    assert len(written[1]) == records.PRECISION_CAST_LENGTH
                    assert tensor["precision"]["block_formats"] is None
            if number(layout) < PRECISION_SINCE:
                assert not any(
                    flag["flag"] in ("underflow", "overflow")
                    for entry in step["layers"]
                    for flag in entry["flags"]
                )


@pytest.mark.parametrize(
    "layout",
    [path for path in LAYOUT_DIRS if number(path) >= WEIGHTS_SINCE],
    ids=lambda path: path.name,
)
def test_plugin_serves_the_update_records_as_written(layout):
    client = client_for(layout)
    accumulator = eventdata.load(layout / "max")
    body = get(client, "/updates", run="max", layer="conv")
    assert [weight["weight"] for weight in body["weights"]] == ["kernel", "bias"]
    for weight in body["weights"]:
        written = eventdata.values(accumulator, records.update_tag("conv", weight["weight"]))
        # The first log event has no previous weights: the first update is at the second.
        assert weight["steps"] == [step for step, _ in written] == [2]
        columns = records.update_columns(np.stack([row for _, row in written]))
        for name in ("weight_norm", "update_norm", "update_ratio", "interval"):
            same(weight[name], columns[name])


@pytest.mark.parametrize(
    "layout",
    [path for path in LAYOUT_DIRS if number(path) >= DIGEST_SINCE],
    ids=lambda path: path.name,
)
def test_the_digest_of_every_layout_equals_its_full_records(layout):
    accumulator = eventdata.load(layout / "max")
    (tag,) = eventdata.digest_tags(accumulator)
    kinds = {kind for kind, _, _ in eventdata.content(accumulator, tag)["rows"]}
    # The precision rows came a layout after the precision records.
    assert ("precision" in kinds) == (number(layout) >= DIGEST_PRECISION_SINCE)
    if number(layout) == DIGEST_PRECISION_SINCE - 1:
        return
    assert eventdata.assert_digest_equals_records(accumulator) == 2


def test_timeline_reads_the_digest_of_every_layout_that_has_one():
    for layout in LAYOUT_DIRS:
        client = client_for(layout)
        for run in sorted(path.name for path in layout.iterdir()):
            response = client.get(PREFIX + "/timeline", query_string={"run": run})
            if number(layout) < DIGEST_SINCE:
                assert response.status_code == 404, layout.name
                assert "has no digest" in response.get_data(as_text=True)
                continue
            accumulator = eventdata.load(layout / run)
            for role in records.ROLES[:3]:
                for field in ("rms", "max_abs"):
                    body = get(client, "/timeline", run=run, role=role, field=field)
                    assert body["columns"]["first_step"] == body["columns"]["last_step"] == [1, 2]
                    for row in body["layers"]:
                        columns = records.stats_columns(
                            np.stack(
                                [
                                    row
                                    for _, row in eventdata.values(
                                        accumulator, records.stats_tag(row["layer"], role)
                                    )
                                ]
                            )
                        )
                        # The digest holds float32: the full record's value, so rounded.
                        expected = (
                            np.sqrt(columns["mean"] ** 2 + columns["std"] ** 2)
                            if field == "rms"
                            else np.fmax(np.abs(columns["min"]), np.abs(columns["max"]))
                        )
                        np.testing.assert_allclose(row[field]["min"], expected, rtol=1e-6)
                        assert row[field]["min"] == row[field]["max"]
                        assert row["flags"] == {flag: [] for flag in health.FLAGS}
            body = get(client, "/timeline", run=run, field="update_ratio")
            ratios = {row["layer"]: row["update_ratio"]["max"] for row in body["layers"]}
            kernel, bias = (
                eventdata.values(accumulator, records.update_tag("conv", weight))[-1][1]
                for weight in ("kernel", "bias")
            )
            # The layer's ratio is its weights' largest; none at the first event. (NaN is
            # served as the string "NaN", as TensorBoard writes it.)
            assert ratios["conv"][0] == ratios["pool"][1] == "NaN"
            np.testing.assert_allclose(
                ratios["conv"][1],
                max(kernel[records.UPDATE_RATIO], bias[records.UPDATE_RATIO]),
                rtol=1e-6,
            )
            assert body["budget"] is None


@pytest.mark.parametrize("layout", LAYOUT_DIRS, ids=lambda path: path.name)
def test_cli_summarises_checks_and_exports_every_earlier_layout(layout, capsys):
    runs = sorted(path.name for path in layout.iterdir())
    assert cli.main(["summary", str(layout)]) == 0
    summary = capsys.readouterr()
    assert "Traceback" not in summary.err
    assert all(f"run {run}  (step 2)" in summary.out for run in runs)
    assert ("weight updates" in summary.out) == (number(layout) >= WEIGHTS_SINCE)
    assert ("\nprecision" in summary.out) == (number(layout) >= PRECISION_SINCE)

    assert cli.main(["check", str(layout), "--format", "json"]) == 0
    checked = json.loads(capsys.readouterr().out)
    assert checked["status"] == 0
    assert checked["runs"] == [
        {
            "run": run,
            "step": 2,
            # The numpy writer of layout 1 named its layers block<i>/pool.
            "reference_layer": "block1/pool" if number(layout) == 1 else "pool",
            # The units record (dead channels) came with layout 5.
            "units_recorded": number(layout) >= 5,
            "flags": [],
            "onsets": [],
            # Layouts 10 and 11's LossScaleOptimizer (from 16) skipped no step; layout 10's
            # record does not count the batches, so the skips are read from the scale's halvings.
            "loss_scale": None
            if number(layout) < LOSS_SCALE
            else {
                "skipped": 0,
                "exact": True,
                "first_scale": 16.0,
                "last_scale": 16.0,
                "step": 2,
                "batches": None if number(layout) < BATCHES_SINCE else 2,
            },
        }
        for run in runs
    ]

    assert cli.main(["export", str(layout), "--format", "json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    client = client_for(layout)
    for run in get(client, "/runs")["runs"]:
        served = [
            (run["run"], layer["layer"], tensor["tensor"])
            for layer in run["layers"]
            for tensor in layer["tensors"]
        ]
        series = [entry for entry in exported["series"] if entry["run"] == run["run"]]
        assert [(e["run"], e["layer"], e["tensor"]) for e in series] == served
        for entry in series:
            body = get(
                client, "/series", run=run["run"], layer=entry["layer"], tensor=entry["tensor"]
            )
            assert entry["steps"] == body["steps"]
            for name in records.STATS_FIELDS:
                same(entry["stats"][name], body["stats"][name])
    updates = [(entry["run"], entry["layer"]) for entry in exported.get("updates", [])]
    assert updates == ([("max", "conv")] if number(layout) >= WEIGHTS_SINCE else [])
