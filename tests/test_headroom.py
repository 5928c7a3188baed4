"""The underflow and overflow flags (format/headroom.py) from precision records."""

import eventdata
import numpy as np
import pytest
import synthetic
import test_plugin

from tb_gradviz.format import headroom, records, summaries


def layer_of(layer_dtype, **tensors):
    """A `/step` layer whose tensors (`name=(role, values)` or `(role, values, dtype)`, the
    tensor's dtype the layer's by default) hold the records of `values`, each with its format."""
    layer = {"layer": "dense", "layer_dtype": layer_dtype, "tensors": {}}
    for name, (role, values, *dtype) in tensors.items():
        content = {"role": role, "dtype": dtype[0] if dtype else layer_dtype}
        if role in records.WEIGHT_ROLES:
            content["compute_dtype"] = layer_dtype
        stats = records.decode_stats(summaries.stats_vector(values))
        layer["tensors"][name] = {
            "role": role,
            "format": headroom.cast_format(content, layer_dtype),
            "stats": {k: stats[k] for k in ("count", "pos_inf", "neg_inf")},
            "precision": records.decode_precision(summaries.precision_vector(values)),
        }
    return layer


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
    # A float32 kernel gradient of a layer that computes with the kernel in float16.
    values = gradient(0)
    values[0] = 65520.0  # rounds to Inf in float16 (65504 is the largest)
    kernel = {"weight_gradient/kernel": ("weight_gradient", values, "float32")}
    flags = headroom.flags(layer_of("float16", **kernel))
    assert [(f["flag"], f["tensor"]) for f in flags] == [("overflow", "weight_gradient/kernel")]
    assert flags[0]["detail"] == (
        "weight_gradient/kernel: 1 of 1000 values overflow float16 (1 finite past 65504)"
    )
    values[0] = 65504.0
    assert headroom.flags(layer_of("float16", **kernel)) == []


def test_overflow_flag_raised_on_the_inf_a_float16_gradient_holds():
    # A float16 gradient that overflowed holds ±Inf, no finite value past float16's largest:
    # the flag once read the finite ones only, and left such a gradient to `nonfinite`.
    values = gradient(0).astype(np.float16)
    values[:3] = [np.inf, -np.inf, np.inf]
    flags = headroom.flags(layer_of("float16", output_gradient=("output_gradient", values)))
    assert [(f["flag"], f["tensor"], f["detail"]) for f in flags] == [
        (
            "overflow",
            "output_gradient",
            "output_gradient: 3 of 1000 values overflow float16 (3 ±Inf)",
        )
    ]


def test_overflow_flag_not_raised_on_a_float32_gradient_that_is_never_cast():
    # BatchNormalization under mixed_float16: a float16 layer that computes with gamma in
    # float32. Its gamma gradient at a large loss scale is far past float16's largest, and
    # nothing casts it.
    values = gradient(0)
    values[:5] = 3e5
    layer = layer_of("float16", **{"weight_gradient/gamma": ("weight_gradient", values, "float32")})
    content = {"role": "weight_gradient", "dtype": "float32", "compute_dtype": "float32"}
    layer["tensors"]["weight_gradient/gamma"]["format"] = headroom.cast_format(content, "float16")
    assert headroom.flags(layer) == []
    # Nor a float32 layer's, nor a float16 layer's activation, nor a tensor without a format.
    inf = gradient(0)
    inf[0] = np.inf
    assert headroom.flags(layer_of("float32", output_gradient=("output_gradient", inf))) == []
    assert headroom.flags(layer_of("float16", activation=("activation", inf))) == []
    layer = layer_of("float16", output_gradient=("output_gradient", inf))
    del layer["tensors"]["output_gradient"]["format"]
    assert headroom.flags(layer) == []


@pytest.mark.parametrize(
    "content, layer_dtype, expected",
    [
        # A float16 or bfloat16 tensor is held in its own format, whatever its layer.
        ({"role": "output_gradient", "dtype": "float16"}, "float16", "float16"),
        ({"role": "input_gradient", "dtype": "bfloat16"}, "float32", "bfloat16"),
        # A float32 tensor of a layer that computes in float16 is cast to it ...
        ({"role": "input_gradient", "dtype": "float32"}, "float16", "float16"),
        ({"role": "output_gradient", "dtype": "float32"}, "float32", None),
        # ... a weight's when the layer computes with the weight in float16 (a Dense kernel),
        (
            {"role": "weight_gradient", "dtype": "float32", "compute_dtype": "float16"},
            "float16",
            "float16",
        ),
        # not BatchNormalization's gamma, which it computes with in float32,
        (
            {"role": "weight_gradient", "dtype": "float32", "compute_dtype": "float32"},
            "float16",
            None,
        ),
        # and not a weight of a run written before `compute_dtype` (it does not say).
        ({"role": "weight_gradient", "dtype": "float32"}, "float16", None),
        ({"role": "weight", "dtype": "float32"}, "mixed_float16", None),
    ],
)
def test_cast_format(content, layer_dtype, expected):
    assert headroom.cast_format(content, layer_dtype) == expected


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
