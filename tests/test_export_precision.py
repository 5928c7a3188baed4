"""`tb-gradviz export` carries each tensor's precision record: CSV columns and a JSON object."""

import csv
import pathlib

import eventdata
import numpy as np
import pytest
from test_cli import run_cli, strict_json

from tb_gradviz import cli
from tb_gradviz.cli import export
from tb_gradviz.format import blocks, precision, records

OLD_LAYOUT = pathlib.Path(__file__).parent / "data" / "layouts" / "layout5-88cce65"


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """A small CNN logged by the real callback at steps 2 and 4, with precision records."""
    keras = pytest.importorskip("keras")
    from tb_gradviz import GradVizCallback

    root = tmp_path_factory.mktemp("export_precision")
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 2)),
            keras.layers.Conv2D(3, 3, padding="same", name="conv"),
            keras.layers.MaxPooling2D(2, name="pool"),
            keras.layers.Flatten(),
            keras.layers.Dense(2, name="dense"),
        ]
    )
    model.compile("sgd", "mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 8, 8, 2)).astype("float32")
    # Tiny targets and inputs: the gradients then reach float16's subnormal range.
    y = (1e-4 * rng.normal(size=(8, 2))).astype("float32")
    callback = GradVizCallback(root / "cnn", (x[:4], y[:4]), layers=["pool"])
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[callback])
    return root


def written_records(logdir, layer, tensor):
    """`{step: decoded precision record}` as the event file holds them."""
    log = eventdata.load(logdir / "cnn")
    return {
        step: records.decode_precision(row)
        for step, row in eventdata.values(log, records.precision_tag(layer, tensor))
    }


def test_precision_columns_are_named_by_format_setting_and_count():
    columns = export.PRECISION_COLUMNS
    assert columns[:9] == (
        "precision.finite_nonzero",
        "precision.float16.scale_exponent",
        "precision.float16.as_is.to_zero",
        "precision.float16.as_is.subnormal",
        "precision.float16.as_is.overflow",
        "precision.float16.scaled.to_zero",
        "precision.float16.scaled.subnormal",
        "precision.float16.scaled.overflow",
        "precision.bfloat16.scale_exponent",
    )
    assert len(columns) == 1 + len(precision.FORMATS) * 7 + 34 == records.PRECISION_LENGTH
    # The block part: one column per field of the record, `/` as `.`.
    assert columns[records.PRECISION_CAST_LENGTH :] == tuple(
        "precision." + field.replace("/", ".") for field in records.PRECISION_FIELDS[29:]
    )
    assert columns[29:31] == (
        "precision.block.mxfp8_e4m3.to_zero",
        "precision.block.mxfp8_e4m3.subnormal",
    )
    assert columns[-1] == "precision.block.nonfinite_blocks.16"
    header = cli.csv_header()
    start = header.index("pos_mag_0") + records.MAGNITUDE_BINS
    assert header[start:] == list(columns) == cli.csv_header(updates=True)[start:-4]


def test_export_csv_has_each_tensors_precision_record_as_written(logdir, tmp_path):
    target = tmp_path / "out.csv"
    status, _, err = run_cli("export", logdir, "--output", target)
    assert (status, err) == (0, "")
    rows = list(csv.DictReader(target.open()))
    assert list(rows[0]) == cli.csv_header()
    assert [(r["tensor"], r["step"]) for r in rows] == [
        (t, s) for t in records.TENSOR_ROLES for s in ("2", "4")
    ]
    for row in rows:
        record = written_records(logdir, "pool", row["tensor"])[int(row["step"])]
        assert int(row["precision.finite_nonzero"]) == record["finite_nonzero"]
        for name in precision.FORMATS:
            entry = record["formats"][name]
            assert int(row[f"precision.{name}.scale_exponent"]) == entry["scale_exponent"]
            for setting in precision.SETTINGS:
                for count in precision.COUNTS:
                    cell = row[f"precision.{name}.{setting}.{count}"]
                    assert int(cell) == entry[setting][count]
        # The block part, as the record holds it (the host path writes it).
        written = dict(zip(records.PRECISION_FIELDS, written_vector(logdir, row)))
        for field in records.PRECISION_FIELDS[records.PRECISION_CAST_LENGTH :]:
            assert float(row["precision." + field.replace("/", ".")]) == written[field], field
    # The max pool's input gradient: 4x8x8x3 values, three of each four windows' zero.
    gradient = next(r for r in rows if (r["tensor"], r["step"]) == ("input_gradient", "4"))
    assert int(gradient["count"]) == 768 and int(gradient["zeros"]) == 576
    assert int(gradient["precision.finite_nonzero"]) == 192
    # The tiny targets put some of the gradient below float16's normal range, none in bfloat16's.
    assert int(gradient["precision.float16.as_is.subnormal"]) > 0
    assert int(gradient["precision.bfloat16.as_is.subnormal"]) == 0


def written_vector(logdir, row):
    """The precision record an exported CSV row is of, as the event file holds it."""
    log = eventdata.load(logdir / "cnn")
    tag = records.precision_tag(row["layer"], row["tensor"])
    return dict(eventdata.values(log, tag))[int(row["step"])]


def test_export_json_has_each_tensors_precision_record_at_each_step(logdir):
    status, out, _ = run_cli("export", logdir, "--format", "json")
    assert status == 0
    series = strict_json(out)["series"]
    assert [s["tensor"] for s in series] == list(records.TENSOR_ROLES)
    for entry in series:
        written = written_records(logdir, "pool", entry["tensor"])
        assert entry["steps"] == [2, 4] == sorted(written)
        assert entry["precision"] == [written[2], written[4]]
        assert set(entry["precision"][1]["formats"]) == set(precision.FORMATS)
        assert list(entry["precision"][1]["block_formats"]) == list(blocks.FORMATS)


def test_export_of_a_layout_without_precision_records_leaves_them_blank(tmp_path):
    target = tmp_path / "out.csv"
    status, _, err = run_cli("export", OLD_LAYOUT, "--output", target)
    assert (status, err) == (0, "")
    rows = list(csv.DictReader(target.open()))
    assert rows and list(rows[0]) == cli.csv_header()
    assert all(row[column] == "" for row in rows for column in export.PRECISION_COLUMNS)
    assert all(row["count"] != "" for row in rows)
    status, out, _ = run_cli("export", OLD_LAYOUT, "--format", "json")
    series = strict_json(out)["series"]
    assert series and all(s["precision"] == [None] * len(s["steps"]) for s in series)


def test_precision_impl_reads_a_runs_records_and_names_an_unknown_run(logdir):
    from tensorboard import errors

    gradviz, ctx, experiment = cli.open_logdir(str(logdir))
    body = gradviz.precision_impl(ctx, experiment, "cnn")
    assert list(body["layers"]) == ["pool"]
    assert sorted(body["layers"]["pool"]) == sorted(records.TENSOR_ROLES)
    activation = body["layers"]["pool"]["activation"]
    assert activation["steps"] == [2, 4]
    assert activation["precision"] == [
        written_records(logdir, "pool", "activation")[s] for s in (2, 4)
    ]
    with pytest.raises(errors.NotFoundError, match="'other'"):
        gradviz.precision_impl(ctx, experiment, "other")
