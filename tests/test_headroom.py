"""The underflow and overflow flags (board/headroom.py) from precision records."""

import eventdata
import numpy as np
import pytest
import synthetic
import test_plugin

from tb_gradviz.board import headroom
from tb_gradviz.format import records, summaries


def layer_of(layer_dtype, **tensors):
    """A `/step` layer whose tensors (`name=(role, values)`) hold the records of `values`."""
    return {
        "layer": "dense",
        "layer_dtype": layer_dtype,
        "tensors": {
            name: {
                "role": role,
                "precision": records.decode_precision(summaries.precision_vector(values)),
            }
            for name, (role, values) in tensors.items()
        },
    }


# 1000 non-zero float16-representable values, `subnormal` of them below float16's normal range.
def gradient(subnormal):
    values = np.full(1000, 1e-2, np.float32)
    values[:subnormal] = np.float32(np.float16(1e-6))
    return values


def test_underflow_is_raised_above_the_share_only():
    share = headroom.UNDERFLOW_SHARE
    at_share = int(share * 1000)
    assert (
        headroom.flags(layer_of("float16", output_gradient=("output_gradient", gradient(at_share))))
        == []
    )
    flags = headroom.flags(
        layer_of("float16", output_gradient=("output_gradient", gradient(at_share + 1)))
    )
    assert [f["flag"] for f in flags] == ["underflow"]
    assert flags[0]["tensor"] == "output_gradient"
    assert (
        "1.1% of 1000 non-zero values underflow in float16 (0 to zero, 11 subnormal)"
        in (flags[0]["detail"])
    )


def test_flushed_values_count_as_underflow():
    values = gradient(0)
    values[:20] = 1e-9  # below half float16's smallest subnormal: flushes to zero
    flags = headroom.flags(layer_of("float16", input_gradient=("input_gradient", values)))
    assert "(20 to zero, 0 subnormal)" in flags[0]["detail"]


def test_only_gradients_of_float16_or_bfloat16_layers_are_judged():
    tiny = gradient(500)
    assert headroom.flags(layer_of("float32", output_gradient=("output_gradient", tiny))) == []
    assert headroom.flags(layer_of("float16", activation=("activation", tiny))) == []
    assert headroom.flags(layer_of(None, output_gradient=("output_gradient", tiny))) == []
    # 1e-6 is a normal bfloat16 number.
    assert headroom.flags(layer_of("bfloat16", output_gradient=("output_gradient", tiny))) == []


def test_overflow_is_raised_on_any_value_past_the_format():
    values = gradient(0)
    values[0] = 65520.0  # rounds to Inf in float16 (65504 is the largest)
    flags = headroom.flags(
        layer_of("float16", **{"weight_gradient/kernel": ("weight_gradient", values)})
    )
    assert [(f["flag"], f["tensor"]) for f in flags] == [("overflow", "weight_gradient/kernel")]
    values[0] = 65504.0
    assert (
        headroom.flags(
            layer_of("float16", **{"weight_gradient/kernel": ("weight_gradient", values)})
        )
        == []
    )


def test_a_tensor_without_a_precision_record_is_not_judged():
    layer = layer_of("float16", output_gradient=("output_gradient", gradient(500)))
    layer["tensors"]["output_gradient"]["precision"] = None
    assert headroom.flags(layer) == []


def test_shares_of_an_empty_tensor_are_nan():
    record = records.decode_precision(summaries.precision_vector(np.zeros(4, np.float32)))
    assert all(np.isnan(v) for v in headroom.shares(record, "float16").values())


@pytest.fixture(scope="module")
def mixed_logdir(tmp_path_factory):
    """The demo's mixed_float16 CNN with Keras' dynamic loss scale and with none, shortened."""
    pytest.importorskip("keras")
    from tb_gradviz import demos

    logdir = tmp_path_factory.mktemp("mixed")
    for run, scale in (("scaled", None), ("unscaled", 1.0)):
        demos.train_mixed_cnn(logdir / run, scale, steps=5, log_every=5, verbose=0)
    return logdir


@pytest.mark.slow
def test_underflow_flag_raised_on_the_unscaled_mixed_float16_demo_not_on_the_scaled_one(
    mixed_logdir,
):
    client = test_plugin.make_app(mixed_logdir)[0]
    flagged = {}
    for run in ("scaled", "unscaled"):
        body = test_plugin.get_json(client, "/step", run=run)
        assert "underflow" in body["health"]["rules"]
        flagged[run] = [
            layer["layer"]
            for layer in body["layers"]
            if any(f["flag"] == "underflow" for f in layer["flags"])
        ]
        for layer in body["layers"]:
            assert layer["layer_dtype"] == "float16"
            for tensor in layer["tensors"].values():
                assert tensor["precision"]["finite_nonzero"] > 0
    assert flagged["scaled"] == []
    assert {"conv1", "conv2", "pool1", "pool2"} <= set(flagged["unscaled"])


@pytest.mark.slow
def test_step_serves_the_precision_record_as_written(mixed_logdir):
    client = test_plugin.make_app(mixed_logdir)[0]
    body = test_plugin.get_json(client, "/step", run="unscaled")
    log = eventdata.load(mixed_logdir / "unscaled")
    for layer in body["layers"]:
        for name, tensor in layer["tensors"].items():
            tag = records.precision_tag(layer["layer"], name)
            assert tensor["precision"] == records.decode_precision(eventdata.last(log, tag))


def test_a_run_without_precision_records_serves_null(tmp_path):
    synthetic.write_run(tmp_path / "old", layers=2, steps=2)
    body = test_plugin.get_json(test_plugin.make_app(tmp_path)[0], "/step", run="old")
    tensors = [t for layer in body["layers"] for t in layer["tensors"].values()]
    assert tensors and all(t["precision"] is None for t in tensors)


@pytest.mark.slow
def test_check_fails_on_underflow_for_the_unscaled_run_only(mixed_logdir, capsys):
    from tb_gradviz import cli

    assert cli.main(["check", str(mixed_logdir / "scaled"), "--fail-on", "underflow,overflow"]) == 0
    capsys.readouterr()
    assert (
        cli.main(["check", str(mixed_logdir / "unscaled"), "--fail-on", "underflow,overflow"]) == 1
    )
    assert "underflow" in capsys.readouterr().out


@pytest.mark.slow
def test_summary_prints_the_precision_table_from_step(mixed_logdir, capsys):
    from tb_gradviz import cli
    from tb_gradviz.cli import precision as cli_precision

    body = test_plugin.get_json(test_plugin.make_app(mixed_logdir)[0], "/step", run="unscaled")
    capsys.readouterr()
    assert cli.main(["summary", str(mixed_logdir / "unscaled")]) == 0
    out = capsys.readouterr().out
    assert "precision  (% of the non-zero values" in out
    record = body["layers"][0]["tensors"]["output_gradient"]["precision"]
    counts = record["formats"]["float16"]["as_is"]
    expected = "/".join(
        f"{100.0 * counts[key] / record['finite_nonzero']:.2f}"
        for key in ("to_zero", "subnormal", "overflow")
    )
    assert cli_precision.cell(record, "float16", "as_is") == expected
    line = next(
        line
        for line in out.splitlines()
        if line.startswith(body["layers"][0]["layer"] + " ")
        and " output_gradient " in line
        and expected in line
    )
    assert str(record["finite_nonzero"]) in line
