"""Today's readers on event files of every earlier record layout (issue 11, defect 3).

The files under tests/data/layouts were written by the commits that had
those layouts (tests/data/layouts/make.sh): the plugin and the CLI must
serve them, with NaN or a default for what they lack, the values as written.
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
from tb_gradviz.format import records

LAYOUTS = pathlib.Path(__file__).parent / "data" / "layouts"
LAYOUT_DIRS = sorted(LAYOUTS.glob("layout*"))
PREFIX = "/data/plugin/gradviz"


def test_every_layout_has_its_files():
    assert [path.name for path in LAYOUT_DIRS] == [
        "layout1-babdf2f",
        "layout2-ea6cf0b",
        "layout3-394d555",
        "layout4-a4aadd0",
        "layout5-88cce65",
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
            # Every layout before weights=True: no weights, no update records.
            assert (layer["weights"], layer["updates"]) == ([], [])
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
            routing = get(client, "/routing", run=run["run"], layer=layer["layer"])
            written = [
                row for _, row in eventdata.values(accumulator, records.routing_tag(layer["layer"]))
            ]
            for i, name in enumerate(records.ROUTING_FIELDS):
                expected = [row[i] if i < len(row) else math.nan for row in written]
                same(routing[name], expected)
            short = len(written[0]) < len(records.ROUTING_FIELDS)
            # Without output_gradient_abs_sum there is nothing to judge the mass against.
            assert routing["mass"]["conserved"] == (
                [None] * len(written) if short else [True] * len(written)
            )
            step = get(client, "/step", run=run["run"])
            assert [entry["layer"] for entry in step["layers"]] == eventdata.layers(accumulator)
            assert all(
                entry["updates"] == {} and entry["update_ratio"] is None for entry in step["layers"]
            )
            # Every layout before the precision record: each tensor's record is null, no
            # underflow or overflow flag.
            assert all(
                tensor["precision"] is None
                for entry in step["layers"]
                for tensor in entry["tensors"].values()
            )
            assert not any(
                flag["flag"] in ("underflow", "overflow")
                for entry in step["layers"]
                for flag in entry["flags"]
            )


@pytest.mark.parametrize("layout", LAYOUT_DIRS, ids=lambda path: path.name)
def test_cli_summarises_and_exports_every_earlier_layout(layout, capsys):
    assert cli.main(["summary", str(layout)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert cli.main(["export", str(layout), "--format", "json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported
