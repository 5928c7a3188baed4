"""The judge's columns of one event, built once per layout (`rule_columns.OneEvent`), are
`rule_columns.build`'s of each event, and so are the flags judged on them, over events whose
values and finite values change; the flow of every layer at once is each layer's."""

import numpy as np
import synthetic

from tb_gradviz.format import (
    blocks,
    digest,
    events,
    flow,
    health,
    judgement,
    records,
    rule_columns,
    summaries,
)

LAYERS = 4


def _events():
    """The tensor records of four synthetic pooling layers, and digest vectors of eight events
    over them: new values each, some with a tensor's row missing (its count NaN), a NaN RMS, or
    a non-finite count of values."""
    rng = np.random.default_rng(0)
    written = []
    for i in range(LAYERS):
        name = f"block{i}/pool"
        written += synthetic.pool_records(rng, name, i, gradient_scale=10.0**-i)
        # A precision record (with its block part): a row an earlier digest layout is shorter in.
        values = rng.standard_normal(64) * 10.0**-i
        record = np.concatenate([summaries.precision_vector(values), blocks.numpy_fields(values)])
        content = {"layer_index": i, "role": records.OUTPUT_GRADIENT, "index": 0, "shape": [64]}
        written += events.precision_records(name, records.OUTPUT_GRADIENT, record, content)
    ((_, vector, summary_metadata),) = digest.digest_records(written)
    rows = judgement._parsed(summary_metadata.plugin_data.content)["rows"]
    offsets, _ = digest.row_offsets(rows)
    where = {
        (kind, layer, name, field): offset + digest.FIELDS[kind].index(field)
        for (kind, layer, name), offset in zip(rows, offsets)
        for field in digest.FIELDS[kind]
    }
    gradient = (digest.TENSOR, "block1/pool", records.OUTPUT_GRADIENT)
    vectors = []
    for event in range(8):
        v = np.array(vector, np.float64)
        v[[i for key, i in where.items() if key[3] in ("rms", "max_abs")]] *= 2.0 ** (event - 3)
        if event in (2, 3):
            v[where[(*gradient, "count")]] = np.nan  # the row has no value at this event
        if event == 5:
            v[where[(*gradient, "rms")]] = np.nan
        if event == 6:
            v[where[(*gradient, "nan")]] = 3  # a non-finite value: the nonfinite flag
        vectors.append(v)
    return written, summary_metadata, vectors


def _assert_same(found, want):
    if isinstance(want, dict):
        assert found.keys() == want.keys()
        for key in want:
            _assert_same(found[key], want[key])
    elif isinstance(want, np.ndarray):
        np.testing.assert_array_equal(found, want)
    else:
        assert found == want


def test_one_events_columns_and_flags_are_builds_of_each_event():
    written, summary_metadata, vectors = _events()
    judge = judgement.Judge()
    judge.judge(1, written)  # the layers' roles and dtypes
    content = summary_metadata.plugin_data.content
    rows = judgement._parsed(content)["rows"]
    one = rule_columns.OneEvent()
    flags = []
    for step, vector in enumerate(vectors, start=2):
        series = rule_columns.DigestSeries(rows, np.array([step]), vector[None])
        want = rule_columns.build(judge._layers, [series])
        found = one.build((content, 0), judge._layers, series)
        np.testing.assert_array_equal(found.steps, want.steps)
        assert len(found.layers) == len(want.layers) == LAYERS
        for layer, wanted in zip(found.layers, want.layers):
            _assert_same(layer, wanted)
        _assert_same(health.verdicts(found.layers), health.verdicts(want.layers))
        flags.append(judgement._flags(step, want))
    assert [any(f["flag"] == "nonfinite" for f in found) for found in flags] == [False] * 6 + [
        True,
        False,
    ]
    # The judge itself, given these digests as the in-step events: each event's flags.
    raised = [judge.judge(step, [("d", v, summary_metadata)]) for step, v in enumerate(vectors, 2)]
    assert [j.raised for j in raised] == flags


def test_one_events_columns_of_an_earlier_layouts_digests_are_builds_of_each():
    written, summary_metadata, vectors = _events()
    judge = judgement.Judge()
    judge.judge(1, written)
    content = summary_metadata.plugin_data.content
    rows = judgement._parsed(content)["rows"]
    _, targets = digest._earlier_sources(tuple(tuple(row) for row in rows))
    one = rule_columns.OneEvent()
    for step, vector in enumerate(vectors[:2], start=2):
        series = rule_columns.DigestSeries(rows, np.array([step]), vector[targets][None])
        want = rule_columns.build(judge._layers, [series])
        for layer, wanted in zip(
            one.build((content, 0), judge._layers, series).layers, want.layers
        ):
            _assert_same(layer, wanted)


def test_the_flow_of_every_layer_at_once_is_each_layers():
    rng = np.random.default_rng(1)
    steps = 5

    def tensor(role):
        count = rng.integers(0, 50, steps).astype(float)
        nan = np.minimum(count, rng.integers(0, 3, steps))
        return {
            "role": role,
            "count": count,
            "nan": nan,
            "pos_inf": np.zeros(steps),
            "neg_inf": np.where(rng.random(steps) < 0.2, count - nan, 0.0),
            "rms": rng.random(steps),
            "max_abs": rng.random(steps) * 3,
            "zeros": np.minimum(count, rng.integers(0, 5, steps)),
        }

    roles = (records.ACTIVATION, records.OUTPUT_GRADIENT, records.INPUT_GRADIENT)
    layers = [
        {f"t{j}": tensor(roles[(i + j) % 3]) for j in range(i % 4)}  # 0 to 3 tensors a layer
        for i in range(9)
    ]
    for role in roles:
        together = flow.layers_role_columns(layers, role)
        for i, tensors in enumerate(layers):
            chosen = [t for t in tensors.values() if t["role"] == role]
            if not chosen:
                assert all(np.isnan(column[i]).all() for column in together.values())
                continue
            finite = [t["count"] - t["nan"] - t["pos_inf"] - t["neg_inf"] for t in chosen]
            total = sum(np.where(f > 0, f, 0) for f in finite)
            squares = sum(np.where(f > 0, f * t["rms"] ** 2, 0) for f, t in zip(finite, chosen))
            with np.errstate(invalid="ignore", divide="ignore"):
                rms = np.where(total > 0, np.sqrt(squares / total), np.nan)
            largest = np.fmax.reduce(
                [np.where(f > 0, t["max_abs"], np.nan) for f, t in zip(finite, chosen)]
            )
            np.testing.assert_allclose(together["rms"][i], rms, rtol=1e-15)
            np.testing.assert_array_equal(together["max_abs"][i], largest)
            _assert_same(flow.role_columns(tensors, role), {k: v[i] for k, v in together.items()})
