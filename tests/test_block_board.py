"""The block formats as the board serves them: each tensor's `block_headroom` in /step and the
`block_zero_share` field of /timeline, over a real fit (block_runs.fit_spread) and a run written
before the block part (tests/data/layouts, layout 11)."""

import math
import pathlib
import shutil

import block_runs
import eventdata
import numpy as np
import pytest
from test_plugin import get_json, make_app

from tb_gradviz.format import block_headroom, blocks, records, summaries

LAYOUT11 = pathlib.Path(__file__).parent / "data" / "layouts" / "layout11-a82ce12" / "max"
SPREAD, OLDER = "spread", "layout11"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    pytest.importorskip("keras")
    root = tmp_path_factory.mktemp("block_board")
    block_runs.fit_spread(root / SPREAD)
    shutil.copytree(LAYOUT11, root / OLDER)
    return root, make_app(root)[0]


def expected_headroom(record):
    """`block_headroom.tensor_headroom` by its definition: the record's counts over its finite
    non-zero values and blocks, and survival at most 1 % to zero."""
    n = record["finite_nonzero"]
    return {
        name: {
            "to_zero": counts["to_zero"] / n,
            "subnormal": counts["subnormal"] / n,
            "saturated": counts["saturated"] / n,
            "wide_blocks": counts["wide_blocks"] / counts["blocks"],
            "relative_error": counts["relative_error"],
            "survives": counts["to_zero"] <= 0.01 * n,
        }
        for name, counts in record["block_formats"].items()
    }


def test_step_serves_each_tensors_block_shares_and_verdicts_from_its_written_record(served):
    root, client = served
    snapshot = get_json(client, "/step", run=SPREAD)
    log = eventdata.load(root / SPREAD)
    seen = 0
    for layer in snapshot["layers"]:
        for tensor, entry in layer["tensors"].items():
            written = records.decode_precision(
                eventdata.last(log, records.precision_tag(layer["layer"], tensor))
            )
            assert entry["precision"]["block_formats"] == written["block_formats"]
            assert list(entry["block_headroom"]) == list(blocks.FORMATS)
            assert entry["block_headroom"] == expected_headroom(written), (layer["layer"], tensor)
            seen += 1
    assert seen == 12
    by_layer = {layer["layer"]: layer["tensors"] for layer in snapshot["layers"]}
    # Half of each row of the spread gradient is 2**30 below the rest: MXFP8 loses it.
    spread = by_layer["spread"]["input_gradient"]
    assert spread["precision"]["finite_nonzero"] == block_runs.PROBE * block_runs.WIDTH
    assert spread["block_headroom"]["mxfp8_e4m3"]["to_zero"] == 0.5
    assert spread["block_headroom"]["mxfp8_e4m3"]["survives"] is False
    assert spread["block_headroom"]["mxfp8_e4m3"]["wide_blocks"] == 1.0
    assert by_layer["d2"]["input_gradient"]["block_headroom"]["mxfp8_e4m3"]["survives"] is True


def test_a_run_written_before_the_block_part_serves_none(served):
    _, client = served
    snapshot = get_json(client, "/step", run=OLDER)
    entries = [entry for layer in snapshot["layers"] for entry in layer["tensors"].values()]
    assert entries and all(entry["precision"] is not None for entry in entries)
    assert all(entry["precision"]["block_formats"] is None for entry in entries)
    assert all(entry["block_headroom"] is None for entry in entries)


def test_a_tensor_without_a_non_zero_value_has_shares_of_nothing():
    zeros = np.zeros((2, 40), np.float32)
    record = records.decode_precision(
        np.concatenate([summaries.precision_vector(zeros), blocks.numpy_fields(zeros)])
    )
    found = block_headroom.tensor_headroom(record)
    assert found["mxfp8_e4m3"] == {
        "to_zero": None,
        "subnormal": None,
        "saturated": None,
        "wide_blocks": 0.0,  # 4 blocks of 32 (two partial), none wide
        "relative_error": 0.0,
        "survives": None,
    }
    assert found["nvfp4"]["wide_blocks"] == 0.0
    assert block_headroom.tensor_headroom(None) is None


@pytest.mark.parametrize("role", ["output_gradient", "input_gradient"])
def test_timeline_block_zero_share_is_the_pooled_share_of_the_records(served, role):
    root, client = served
    body = get_json(client, "/timeline", run=SPREAD, field="block_zero_share", role=role)
    snapshot = get_json(client, "/step", run=SPREAD)
    assert body["field"] == "block_zero_share"
    assert body["columns"]["last_step"][-1] == snapshot["step"]
    shares = {}
    for layer, row in zip(snapshot["layers"], body["layers"]):
        assert row["layer"] == layer["layer"] and row["format"] == "mxfp8_e4m3"
        tensors = [t for t in layer["tensors"].values() if t["role"] == role]
        zeros = sum(t["precision"]["block_formats"]["mxfp8_e4m3"]["to_zero"] for t in tensors)
        total = sum(t["precision"]["finite_nonzero"] for t in tensors)
        assert row["block_zero_share"]["max"][-1] == zeros / total, layer["layer"]
        shares[layer["layer"]] = zeros / total
    # The gradient between d1 and spread (spread's input gradient, d1's output gradient)
    # loses half its values.
    assert shares[{"input_gradient": "spread", "output_gradient": "d1"}[role]] == 0.5
    older = get_json(client, "/timeline", run=OLDER, field="block_zero_share", role=role)
    assert older["layers"] and all(
        all(math.isnan(float(value)) for value in row["block_zero_share"]["max"])
        for row in older["layers"]
    )
