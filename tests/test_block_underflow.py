"""The `block_underflow` flag: over 1 % of a gradient's non-zero values become zero in MXFP8 E4M3.

By hand over columns (exact shares at and past the threshold), in the digest (its one count, and
earlier digests without it), and on a real fit whose gradient gets a 2**30 spread within each
block at a known step: /step, /onset, check and the digest agree on where it began."""

import json

import eventdata
import numpy as np
import pytest
import test_onset
from test_cli import run_cli, strict_json
from test_flags_from_digest import assert_the_digest_judges_as_the_records

from tb_gradviz.format import block_headroom, blocks, digest, events, health, records, summaries

keras = pytest.importorskip("keras")


def columns(role_shares):
    """One layer's `health` columns at one step: per tensor `(role, finite_nonzero, zeros)`."""
    tensors, precision = {}, {}
    for name, (role, n, zeros) in role_shares.items():
        tensors[name] = dict(
            {field: np.array([float(n)]) for field in ("count", "zeros", "nan", "pos_inf")},
            neg_inf=np.array([0.0]),
            rms=np.array([1.0]),
            max_abs=np.array([1.0]),
            role=role,
        )
        precision[name] = {field: np.array([0.0]) for field in digest.PRECISION_FIELDS}
        precision[name]["finite_nonzero"][0] = n
        precision[name][digest.BLOCK_FIELD][0] = zeros
    return {
        "layer": "d",
        "layer_index": 0,
        "layer_dtype": "float32",
        "tensors": tensors,
        "units": None,
        "precision": precision,
        "formats": {},
        "updates": {},
    }


def test_the_rule_raises_past_one_percent_of_a_gradients_non_zero_values():
    layer = columns(
        {
            "activation": (records.ACTIVATION, 100, 90),  # not a gradient: not judged
            "input_gradient": (records.INPUT_GRADIENT, 300, 4),  # 1.33 %
            "output_gradient": (records.OUTPUT_GRADIENT, 300, 3),  # exactly 1 %: not over
            "weight_gradient/kernel": (records.WEIGHT_GRADIENT, 1000, 11),  # 1.1 %
        }
    )
    found = health.verdicts([layer])
    assert found["block_underflow"].tolist() == [[True]]
    (entry,) = [e for e in health.flag_entries([layer], found, 0, 0) if e["flag"] != "nonfinite"]
    # The backward pass computes the weight's gradient before the input gradient.
    assert entry == {
        "flag": "block_underflow",
        "detail": "weight_gradient/kernel: 1.1% of 1000 non-zero values become zero in MXFP8 "
        "E4M3 (11); input_gradient: 1.3% of 300 non-zero values become zero in MXFP8 E4M3 (4)",
        "tensor": "weight_gradient/kernel",
        "tensors": ["weight_gradient/kernel", "input_gradient"],
    }
    quiet = columns(
        {
            "output_gradient": (records.OUTPUT_GRADIENT, 300, 3),
            "input_gradient": (records.INPUT_GRADIENT, 0, 0),  # no non-zero value
            "weight_gradient/bias": (records.WEIGHT_GRADIENT, 10, np.nan),  # no block part
        }
    )
    assert health.verdicts([quiet])["block_underflow"].tolist() == [[False]]
    assert "block_underflow" in health.FLAGS and "block_underflow" not in health.DEFAULT_FAIL_ON
    assert health.rules()["block_underflow"].startswith("over 1% of a gradient's non-zero values")


def test_the_digests_precision_row_holds_the_mxfp8_e4m3_zeros(tmp_path):
    # One block: MXFP8 E4M3's scale 2**(-10 - 8) turns 2**-40 and 2**-30 into zero.
    values = np.array([[2.0**-40, 2.0**-30, 2.0**-20, 2.0**-10, 0.0]], np.float32)
    record = np.concatenate([summaries.precision_vector(values), blocks.numpy_fields(values)])
    content = {"layer_index": 0, "role": records.OUTPUT_GRADIENT, "index": 0, "shape": [1, 5]}
    histogram = summaries.linear_histogram(values.astype(np.float64))
    stats = summaries.stats_vector(values.astype(np.float64))
    written = events.tensor_records("a", records.OUTPUT_GRADIENT, histogram, stats, content)
    written += events.precision_records("a", records.OUTPUT_GRADIENT, record, content)
    (_, vector, _) = digest.digest_records(written)[0]
    rows = [["tensor", "a", "output_gradient"], ["precision", "a", "output_gradient"]]
    row = digest.decode_digest(rows, vector)[("precision", "a", "output_gradient")]
    assert row["finite_nonzero"][0] == 4 and row[digest.BLOCK_FIELD][0] == 2
    assert digest.PRECISION_FIELDS[-1] == digest.BLOCK_FIELD == "mxfp8_e4m3_to_zero"
    assert vector.nbytes == 4 * (7 + 8)
    share = block_headroom.shares(records.decode_precision(record), "mxfp8_e4m3")
    assert share == {"to_zero": 0.5, "saturated": 0.0}


def test_an_earlier_digest_reads_with_nan_for_the_block_count():
    rows = [
        ["tensor", "a", "output_gradient"],
        ["precision", "a", "output_gradient"],
        ["units", "a", "activation"],
        ["precision", "a", "activation"],
    ]
    earlier = np.arange(7 + 7 + 2 + 7, dtype=np.float32)
    decoded = digest.decode_digest(rows, earlier)
    first = decoded[("precision", "a", "output_gradient")]
    assert [first[f][0] for f in digest.PRECISION_FIELDS] == [
        *range(7, 14),
        pytest.approx(np.nan, nan_ok=True),
    ]
    assert decoded[("units", "a", "activation")]["dead_channels"][0] == 15
    last = decoded[("precision", "a", "activation")]
    assert last["finite_nonzero"][0] == 16 and np.isnan(last[digest.BLOCK_FIELD][0])
    layout = digest.DigestLayout(rows)
    upgraded = layout.upgrade(earlier)
    assert upgraded.shape == layout.shape == (7 + 8 + 2 + 8,)
    assert np.isnan(upgraded[[14, 24]]).all()
    np.testing.assert_array_equal(np.delete(upgraded, [14, 24]), earlier)
    # The NaN count is not a malformed row; a negative one is.
    today = np.nan_to_num(upgraded, nan=1.0)
    negative = today.copy()
    negative[14] = -1
    assert layout.valid_rows(np.stack([upgraded, today, negative])).tolist() == [True, True, False]
    assert layout.upgrade(np.zeros(24)) is None
    with pytest.raises(ValueError, match="a digest of 4 rows has 25 values; received 24"):
        digest.decode_digest(rows, np.zeros(24))


class Spread(keras.layers.Layer):
    """Multiplies each channel by a non-trainable factor that `test_onset.SetFactorAt` changes."""

    def build(self, input_shape):
        self.factor = self.add_weight(
            shape=(input_shape[-1],), initializer="ones", trainable=False, name="factor"
        )

    def call(self, x):
        return x * self.factor


@pytest.fixture(scope="module")
def spread_run(tmp_path_factory):
    """`test_onset`'s network with a `Spread` after d1 whose odd channels are multiplied by
    2**-30 from step FAULT_STEP on: the gradient it passes back holds, in its one block of 8,
    four values 2**30 times below the others, which MXFP8 E4M3 turns to zero."""
    from tb_gradviz import GradVizCallback

    logdir = tmp_path_factory.mktemp("block_underflow")
    spread = Spread(name="spread")
    model, x, y = test_onset.middle_layer_network(spread)
    factor = np.where(np.arange(8) % 2, 2.0**-30, 1.0).astype("float32")
    callbacks = [
        test_onset.SetFactorAt(spread, test_onset.FAULT_STEP, factor),
        GradVizCallback(
            logdir,
            (x[:8], y[:8]),
            layers=["d1", "spread", "d2"],
            every_n_batches=1,
            block_formats=True,
        ),
    ]
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=callbacks)
    return logdir


def test_block_underflow_begins_where_the_spread_gradient_is_computed(spread_run):
    raised = assert_the_digest_judges_as_the_records(spread_run, ".")
    fault = test_onset.FAULT_STEP
    assert raised == {"block_underflow": set(range(fault, test_onset.STEPS + 1))}
    log = eventdata.load(spread_run)
    for tensor in ("input_gradient",):
        record = records.decode_precision(
            eventdata.last(log, records.precision_tag("spread", tensor))
        )
        # 8 probe rows of 8 channels: each row one block, half of it 2**30 below the rest.
        assert record["finite_nonzero"] == 64
        assert record["block_formats"]["mxfp8_e4m3"]["to_zero"] == 32
        assert record["block_formats"]["mxfp8_e4m3"]["wide_blocks"] == 8

    # Not among check's default --fail-on: listed, not failing; named, it fails.
    status, out, err = run_cli("check", spread_run, "--format", "json")
    result = strict_json(out)["runs"][0]
    assert status == 0
    flagged = {(f["layer"], f["flag"], f["tensor"], f["fails"]) for f in result["flags"]}
    assert flagged == {
        ("spread", "block_underflow", "input_gradient", False),
        ("d1", "block_underflow", "output_gradient", False),
    }
    (onset,) = result["onsets"]
    assert (onset["flag"], onset["step"], onset["layer"], onset["tensor"]) == (
        "block_underflow",
        fault,
        "spread",
        "input_gradient",
    )
    assert onset["persists"] and not onset["fails"]
    status, out, _ = run_cli(
        "check", spread_run, "--fail-on", "block_underflow", "--format", "json"
    )
    assert status == 1
    assert json.loads(out)["fail_on"] == ["block_underflow"]
