"""The per-event digest: written beside the full records, equal to them, compact."""

import math

import eventdata
import numpy as np
import pytest
import synthetic

from tb_gradviz.format import blocks, digest, events, metadata, records, summaries


def tensor_records(layer, index, name, array):
    content = {"layer_index": index, "role": records.ACTIVATION, "index": 0, "shape": [None]}
    return events.tensor_records(
        layer,
        name,
        summaries.linear_histogram(array),
        summaries.stats_vector(array),
        content,
    )


def test_digest_equals_the_full_records_with_nan_inf_and_an_all_nonfinite_tensor(tmp_path):
    rng = np.random.default_rng(0)
    log = events.EventLog(tmp_path)
    for step in range(1, 4):
        values = rng.normal(size=50)
        values[:5] = 0.0
        values[7] = np.nan if step == 2 else -np.inf
        written = tensor_records("a", 0, records.ACTIVATION, values)
        written += tensor_records("b", 1, records.ACTIVATION, np.full(3, np.nan))
        written += events.units_records(
            "a",
            records.units_vector([False, True, step == 3]),
            {"layer_index": 0, "tensor": records.ACTIVATION, "channel_axis": -1},
        )
        log.write(step, written)
    log.close()
    accumulator = eventdata.load(tmp_path)
    assert eventdata.assert_digest_equals_records(accumulator) == 3
    (tag,) = eventdata.digest_tags(accumulator)
    rows = eventdata.content(accumulator, tag)["rows"]
    assert rows == [
        ["tensor", "a", "activation"],
        ["tensor", "b", "activation"],
        ["units", "a", "activation"],
    ]
    vectors = np.stack([v for _, v in eventdata.values(accumulator, tag)])
    decoded = digest.decode_digest(rows, vectors)
    a = decoded[("tensor", "a", "activation")]
    assert a["nan"].tolist() == [0, 1, 0] and a["neg_inf"].tolist() == [1, 0, 1]
    assert a["zeros"].tolist() == [5, 5, 5] and a["count"].tolist() == [50, 50, 50]
    assert np.all(np.isnan(decoded[("tensor", "b", "activation")]["rms"]))
    assert decoded[("units", "a", "activation")]["dead_channels"].tolist() == [1, 1, 2]


def test_the_digest_is_28_bytes_per_tensor_under_its_own_plugin_name():
    written = synthetic.pool_records(np.random.default_rng(0), "pool", 0)
    ((tag, vector, summary_metadata),) = digest.digest_records(written)
    assert summary_metadata.plugin_data.plugin_name == "gradviz_digest"
    assert tag.startswith("gradviz_digest/")
    assert vector.dtype == np.float32 and vector.nbytes == 3 * 28
    # Other rows, another series: a run directory shared by two selections never misreads one.
    other = synthetic.pool_records(np.random.default_rng(0), "other_pool", 0)
    assert digest.digest_records(other)[0][0] != tag
    assert digest.digest_records(written[:1]) == []  # a histogram alone makes no row


def test_a_log_without_digest_writes_none(tmp_path):
    log = events.EventLog(tmp_path, with_digest=False)
    log.write(1, synthetic.pool_records(np.random.default_rng(0), "pool", 0))
    log.close()
    assert eventdata.digest_tags(eventdata.load(tmp_path)) == []


def test_decode_digest_refuses_a_vector_of_another_length():
    rows = [["tensor", "a", "activation"], ["update", "a", "kernel"]]
    assert digest.row_offsets(rows) == ([0, 7], 9)
    with pytest.raises(ValueError, match="2 rows has 9 values; received 8"):
        digest.decode_digest(rows, np.zeros(8))


@pytest.mark.parametrize("rows", [None, [["tensor", "a"]], [["tensor", "a", 3]], "rows"])
def test_digest_metadata_without_valid_rows_is_refused(rows):
    content = metadata.create_summary_metadata(
        {"kind": "digest", "rows": rows}, plugin_name=digest.PLUGIN_NAME
    ).plugin_data.content
    with pytest.raises(ValueError, match="lacks a field"):
        metadata.parse_plugin_metadata(content)


def test_tensor_segments_are_rms_and_max_abs_of_the_finite_values():
    values = np.array([3.0, -4.0, 0.0, np.inf, np.nan])
    (segment,) = digest.tensor_segments(summaries.stats_vector(values))
    assert segment[:5].tolist() == [5, 1, 1, 1, 0]
    assert segment[5] == pytest.approx(math.sqrt(25 / 3)) and segment[6] == 4.0


def test_records_without_metadata_or_of_no_known_layout_make_no_row():
    # The plugin's tests write malformed runs through EventLog: the digest passes them over.
    good = synthetic.pool_records(np.random.default_rng(0), "pool", 0)
    (stats_tag, stats, stats_metadata) = good[1]
    malformed = [(stats_tag, stats[:5], stats_metadata), ("loose", np.zeros(3), None)]
    ((_, vector, summary_metadata),) = digest.digest_records(good + malformed)
    assert vector.size == 3 * len(digest.TENSOR_FIELDS)
    assert digest.digest_records(malformed) == []
    # No finite value: no RMS, no max |x|.
    (empty,) = digest.tensor_segments(summaries.stats_vector(np.array([np.nan, np.inf])))
    assert empty[:5].tolist() == [2, 0, 1, 1, 0] and np.isnan(empty[5:]).all()


def test_precision_rows_hold_the_as_is_float16_and_bfloat16_counts_of_each_precision_record(
    tmp_path,
):
    # 1e-9 flushes to zero in float16 (subnormal in bfloat16), 1e-6 is a float16 subnormal,
    # 1e5 overflows float16 only; 0 and NaN are not among the finite non-zero values. The NaN
    # makes the one block NaN in MXFP8 E4M3 too: none of its values counts as zero there.
    values = np.array([1e-9, 1e-9, 1e-6, 1e5, 1.0, 0.0, np.nan])
    content = {"layer_index": 0, "role": records.OUTPUT_GRADIENT, "index": 0, "shape": [None]}
    log = events.EventLog(tmp_path)
    written = tensor_records("a", 0, records.OUTPUT_GRADIENT, values)
    record = np.concatenate([summaries.precision_vector(values), blocks.numpy_fields(values)])
    written += events.precision_records("a", records.OUTPUT_GRADIENT, record, content)
    log.write(1, written)
    log.close()
    accumulator = eventdata.load(tmp_path)
    assert eventdata.assert_digest_equals_records(accumulator) == 1
    (tag,) = eventdata.digest_tags(accumulator)
    rows = eventdata.content(accumulator, tag)["rows"]
    assert rows == [["tensor", "a", "output_gradient"], ["precision", "a", "output_gradient"]]
    (vector,) = [v for _, v in eventdata.values(accumulator, tag)]
    row = {k: v[0] for k, v in digest.decode_digest(rows, vector)[tuple(rows[1])].items()}
    assert row == {
        "finite_nonzero": 5,
        "float16_to_zero": 2,
        "float16_subnormal": 1,
        "float16_overflow": 1,
        "bfloat16_to_zero": 0,
        "bfloat16_subnormal": 0,
        "bfloat16_overflow": 0,
        "mxfp8_e4m3_to_zero": 0,
    }
    assert vector.nbytes == 28 + 32
