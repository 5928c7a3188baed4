"""/timeline's `flush_share`: the share of a role's non-zero values that flush to zero, per step.

The written values' expected shares come from casting them with ml_dtypes
(what TensorFlow and JAX use for float16 and bfloat16), not from the
record's boundaries.
"""

import json
import math

import ml_dtypes
import numpy as np
import pytest
from test_plugin import PREFIX, make_app

from tb_gradviz.format import events, summaries

WHOLE = {"gradviz": 0, "histograms": 0, "gradviz_digest": 0}
STEPS = 6
# layer: (dtype it computes in, its tensors' names, whether it has precision records)
LAYERS = {
    "dense": ("float32", ("output_gradient", "input_gradient_0", "input_gradient_1"), True),
    "conv": ("bfloat16", ("output_gradient",), True),
    "older": ("float32", ("output_gradient",), False),
}
FORMATS = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def values_at(layer, tensor, step):
    """Magnitudes spread over float16's subnormal range and below bfloat16's normal range."""
    rng = np.random.default_rng([list(LAYERS).index(layer), len(tensor), step])
    exponents = (
        rng.uniform(-30 + 2 * step, -8, 200) if layer != "conv" else rng.uniform(-140, -100, 200)
    )
    values = np.exp2(exponents) * rng.choice([-1.0, 1.0], 200)
    values[:10] = 0.0
    if step == 3 and layer == "dense":
        values[10] = np.nan  # not finite: not counted
    return values.astype(np.float32)


def flushed_by_cast(values, name):
    """`(flushed, finite non-zero)`: the values a cast to `name` turns into 0 or a subnormal."""
    kept = values[np.isfinite(values) & (values != 0)].astype(np.float64)
    cast = kept.astype(FORMATS[name]).astype(np.float64)
    smallest_normal = float(ml_dtypes.finfo(FORMATS[name]).smallest_normal)
    return int(np.count_nonzero(np.abs(cast) < smallest_normal)), kept.size


def write(logdir):
    log = events.EventLog(logdir, with_digest=True)
    for step in range(1, STEPS + 1):
        written = []
        for index, (layer, (dtype, tensors, precision)) in enumerate(LAYERS.items()):
            for i, tensor in enumerate(tensors):
                role = tensor.rsplit("_", 1)[0] if tensor[-1].isdigit() else tensor
                values = values_at(layer, tensor, step)
                content = {
                    "layer_index": index,
                    "role": role,
                    "index": i,
                    "layer_dtype": dtype,
                    "shape": [values.size],
                }
                written += events.tensor_records(
                    layer,
                    tensor,
                    summaries.linear_histogram(values),
                    summaries.stats_vector(values),
                    content,
                )
                if precision:
                    written += events.precision_records(
                        layer, tensor, summaries.precision_vector(values), content
                    )
        log.write(step, written)
    log.close()


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("timeline_flush")
    write(root / "run")
    return make_app(root, samples_per_plugin=WHOLE)[0]


def get(client, **query):
    response = client.get(PREFIX + "/timeline", query_string=dict({"run": "run"}, **query))
    text = response.get_data(as_text=True)
    if response.status_code != 200:
        return response.status_code, text
    return response.status_code, json.loads(text, parse_constant=float)


def expected(layer, role, name, step):
    counts = [
        flushed_by_cast(values_at(layer, tensor, step), name)
        for tensor in LAYERS[layer][1]
        if tensor == role or tensor.startswith(role + "_")
    ]
    return sum(f for f, _ in counts) / sum(n for _, n in counts)


@pytest.mark.parametrize("role", ["output_gradient", "input_gradient"])
def test_flush_share_is_what_a_cast_flushes_in_the_layers_format(client, role):
    status, body = get(client, field="flush_share", role=role, width=STEPS)
    assert status == 200 and body["field"] == "flush_share" and body["role"] == role
    assert body["columns"]["first_step"] == list(range(1, STEPS + 1))
    layers = {entry["layer"]: entry for entry in body["layers"]}
    assert [layers[name]["format"] for name in LAYERS] == ["float16", "bfloat16", "float16"]
    # The float32 layer in float16; its two input gradients pooled.
    shares = layers["dense"]["flush_share"]
    want = [expected("dense", role, "float16", step) for step in range(1, STEPS + 1)]
    assert shares["min"] == shares["max"] == want
    assert 0 < min(want) < max(want) < 1  # the range moves up with the step
    if role == "output_gradient":
        # The bfloat16 layer in bfloat16: values from 2**-140 to 2**-100 straddle its normal range.
        shares = layers["conv"]["flush_share"]
        want = [expected("conv", role, "bfloat16", step) for step in range(1, STEPS + 1)]
        assert shares["min"] == shares["max"] == want and min(want) > 0
    # No precision record (a run written before it), or no tensor of the role: no value, not 0.
    assert all(math.isnan(float(v)) for v in layers["older"]["flush_share"]["max"])
    if role == "input_gradient":
        assert all(math.isnan(float(v)) for v in layers["conv"]["flush_share"]["max"])


def test_flush_share_columns_keep_the_smallest_and_largest_step(client):
    status, body = get(client, field="flush_share", width=2)
    assert status == 200
    dense = next(entry for entry in body["layers"] if entry["layer"] == "dense")
    per_step = [expected("dense", "output_gradient", "float16", s) for s in range(1, STEPS + 1)]
    assert dense["flush_share"]["min"] == [min(per_step[:3]), min(per_step[3:])]
    assert dense["flush_share"]["max"] == [max(per_step[:3]), max(per_step[3:])]


def test_other_fields_carry_no_format_and_a_bad_field_names_flush_share(client):
    status, body = get(client, field="zero_share")
    assert status == 200 and all("format" not in entry for entry in body["layers"])
    status, text = get(client, field="flush")
    assert status == 400 and "flush_share" in text and "'flush'" in text


def test_step_serves_the_flush_share_the_timeline_shows_from_one_definition(client):
    # The page reads /step's `flush_share`: the server's one share, the same as /timeline's.
    timelines = {
        role: {
            entry["layer"]: entry
            for entry in get(client, field="flush_share", role=role, width=STEPS)[1]["layers"]
        }
        for role in ("output_gradient", "input_gradient")
    }
    for step in range(1, STEPS + 1):
        response = client.get(PREFIX + "/step", query_string={"run": "run", "step": step})
        body = json.loads(response.get_data(as_text=True), parse_constant=float)
        layers = {layer["layer"]: layer for layer in body["layers"]}
        assert set(layers["dense"]["flush_share"]) == {"input_gradient", "output_gradient"}
        assert layers["older"]["flush_share"] == {"output_gradient": None}
        for layer, role in [
            ("dense", "output_gradient"),
            ("dense", "input_gradient"),
            ("conv", "output_gradient"),
        ]:
            name = LAYERS[layer][0] if LAYERS[layer][0] == "bfloat16" else "float16"
            counts = [
                flushed_by_cast(values_at(layer, tensor, step), name)
                for tensor in LAYERS[layer][1]
                if tensor == role or tensor.startswith(role + "_")
            ]
            flushed, total = sum(f for f, _ in counts), sum(n for _, n in counts)
            assert layers[layer]["flush_share"][role] == {
                "share": flushed / total,
                "format": name,
                "computes": name == "bfloat16",
                "flushed": flushed,
                "total": total,
            }, (step, layer, role)
            assert timelines[role][layer]["flush_share"]["max"][step - 1] == flushed / total
            assert timelines[role][layer]["format"] == name
