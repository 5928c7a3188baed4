"""The `tb-gradviz` command on real logs: summary, export, check, and their errors."""

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import eventdata
import limits
import numpy as np
import pytest

from tb_gradviz import cli
from tb_gradviz.format import health, records

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """Two runs of a small CNN, logged by the real callback at steps 2 and 4."""
    keras = pytest.importorskip("keras")
    from tb_gradviz import GradVizCallback

    root = tmp_path_factory.mktemp("cli_logs")
    for run, pool in (("max", keras.layers.MaxPooling2D), ("avg", keras.layers.AveragePooling2D)):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((8, 8, 2)),
                keras.layers.Conv2D(3, 3, padding="same", name="conv"),
                pool(2, name="pool"),
                keras.layers.Flatten(),
                keras.layers.Dense(2, name="dense"),
            ]
        )
        model.compile("sgd", "mse")
        rng = np.random.default_rng(0)
        x, y = (
            rng.normal(size=(8, 8, 8, 2)).astype("float32"),
            rng.normal(size=(8, 2)).astype("float32"),
        )
        model.fit(
            x,
            y,
            batch_size=4,
            epochs=2,
            verbose=0,
            callbacks=[GradVizCallback(root / run, (x[:4], y[:4]))],
        )
    return root


def run_cli(*args):
    """Runs `main` in-process; returns (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        status = cli.main([str(a) for a in args])
    finally:
        sys.stdout, sys.stderr = old
    return status, out.getvalue(), err.getvalue()


def table_rows(text, run):
    """The rows of one run's summary table as dicts."""
    block = text.split(f"run {run}  ")[1].split("\n\n")[0].splitlines()
    header = re.split(r"\s{2,}", block[1].strip())
    starts = [block[1].index(h) for h in header]
    rows = []
    for line in block[3:]:
        cells = [line[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]
        rows.append(dict(zip(header, cells)))
    return rows


def test_summary_shows_the_two_tensors_of_each_pool_at_the_last_step(logdir):
    status, out, err = run_cli("summary", logdir)
    assert (status, err) == (0, "")
    assert "run max  (step 4)" in out and "run avg  (step 4)" in out
    rows = {(r["layer"], r["tensor"]): r for r in table_rows(out, "max")}
    assert set(rows) == {("pool", t) for t in records.TENSOR_ROLES}
    gradient = rows[("pool", "input_gradient")]
    assert gradient["shape"] == "4x8x8x3" and rows[("pool", "activation")]["shape"] == "4x4x4x3"
    assert (
        gradient["zeros %"] == "75.00"
        and gradient["routed %"] == "25.00"
        and gradient["max routed %"] == "25.00"
    )
    assert gradient["mass"] == "kept" and gradient["tied"] == "0" and gradient["nan"] == "0"
    average = {(r["layer"], r["tensor"]): r for r in table_rows(out, "avg")}[
        ("pool", "input_gradient")
    ]
    assert (
        average["zeros %"] == "0.00" and average["routed %"] == "100.00" and average["tied"] == "-"
    )


def test_summary_at_a_chosen_step_and_run(logdir):
    status, out, _ = run_cli("summary", logdir, "--run", "max", "--step", "3")
    assert status == 0
    assert "run max  (step 2)" in out and "run avg" not in out
    status, _, err = run_cli("summary", logdir, "--step", "1")
    assert status == cli.EXIT_USAGE == 2 and "no run has a step <= 1" in err


def test_export_csv_matches_the_event_files(logdir, tmp_path):
    target = tmp_path / "out.csv"
    status, _, err = run_cli("export", logdir, "--output", target)
    assert (status, err) == (0, "")
    rows = list(csv.DictReader(target.open()))
    assert len(rows) == 2 * 3 * 2  # runs x tensors x steps
    assert list(rows[0]) == cli.csv_header()
    row = next(
        r for r in rows if (r["run"], r["tensor"], r["step"]) == ("max", "input_gradient", "4")
    )
    expected = eventdata.stats(eventdata.load(logdir / "max"), "pool", "input_gradient")
    assert (
        int(row["count"]) == expected["count"] == 768
        and int(row["zeros"]) == expected["zeros"] == 576
    )
    assert float(row["sum"]) == expected["sum"]
    assert [int(row[f"pos_mag_{i}"]) for i in range(records.MAGNITUDE_BINS)] == expected[
        "log_counts"
    ]["positive"]
    histogram = eventdata.histogram(eventdata.load(logdir / "max"), "pool", "input_gradient")
    assert [int(row[f"hist_{i}"]) for i in range(records.HISTOGRAM_BUCKETS)] == histogram[
        :, 2
    ].astype(int).tolist()
    assert int(row["routed_positions"]) == 192 and int(row["windows"]) == 192


def strict_json(text):
    """`json.loads` that refuses the bare NaN, Infinity and -Infinity that JSON does not allow."""

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_export_json_is_strict_json_with_nan_written_as_the_http_api_writes_it(logdir):
    status, out, _ = run_cli("export", logdir, "--format", "json", "--run", "avg")
    assert status == 0
    data = strict_json(out)
    assert data["format_version"] == 1
    assert [(s["run"], s["layer"], s["tensor"], s["steps"]) for s in data["series"]] == [
        ("avg", "pool", t, [2, 4]) for t in records.TENSOR_ROLES
    ]
    # An average pool has no tied windows: NaN, written "NaN" as /routing writes it.
    assert data["series"][1]["routing"]["tied_windows"] == ["NaN", "NaN"]
    assert float(data["series"][1]["routing"]["tied_windows"][0]) != 0  # float("NaN") reads it
    node = subprocess.run(
        [
            "node",
            "-e",
            "let s='';process.stdin.on('data',d=>s+=d).on('end',()=>"
            "console.log(Number(JSON.parse(s).series[1].routing.tied_windows[0])))",
        ],
        input=out,
        capture_output=True,
        text=True,
        timeout=limits.CHILD_S,
    )
    assert (node.returncode, node.stdout.strip()) == (0, "NaN"), node.stderr


@pytest.fixture(scope="module")
def weights_logdir(tmp_path_factory):
    """A small CNN logged with weights=True at steps 2, 4 and 6, and its final weights by layer."""
    keras = pytest.importorskip("keras")
    from tb_gradviz import GradVizCallback

    root = tmp_path_factory.mktemp("cli_weights")
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 2)),
            keras.layers.Conv2D(3, 3, padding="same", name="conv"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.MaxPooling2D(2, name="pool"),
            keras.layers.Flatten(),
            keras.layers.Dense(2, name="dense"),
        ]
    )
    model.compile("adam", "mse")
    rng = np.random.default_rng(0)
    x, y = (
        rng.normal(size=(8, 8, 8, 2)).astype("float32"),
        rng.normal(size=(8, 2)).astype("float32"),
    )
    callback = GradVizCallback(
        root / "cnn", (x[:4], y[:4]), layers=["conv", "bn", "pool", "dense"], weights=True
    )
    model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[callback])
    final = {
        layer.name: {v.name: np.array(v.numpy(), dtype=np.float64) for v in layer.trainable_weights}
        for layer in model.layers
    }
    return root, final


WEIGHTS = {"conv": ["kernel", "bias"], "bn": ["gamma", "beta"], "dense": ["kernel", "bias"]}


def logged_updates(logdir, layer, weight):
    """`[(step, {field: value})]` of a weight's update records, as the event files hold them."""
    return [
        (step, dict(zip(records.UPDATE_FIELDS, vector.tolist())))
        for step, vector in eventdata.values(
            eventdata.load(logdir), records.update_tag(layer, weight)
        )
    ]


def test_summary_of_a_weights_run_lists_weight_tensors_and_the_update_ratios_at_the_step(
    weights_logdir,
):
    root, final = weights_logdir
    status, out, err = run_cli("summary", root, "--details")  # every weight's row
    assert (status, err) == (0, "")
    assert "run cnn  (step 6)" in out
    rows = {(r["layer"], r["tensor"]): r for r in table_rows(out, "cnn")}
    for layer, weights in WEIGHTS.items():
        for weight in weights:
            shape = "x".join(map(str, final[layer][weight].shape))
            assert (
                rows[(layer, f"weight/{weight}")]["shape"]
                == rows[(layer, f"weight_gradient/{weight}")]["shape"]
                == shape
            )
            assert rows[(layer, f"weight/{weight}")]["step"] == "6"
    assert not [tensor for layer, tensor in rows if layer == "pool" and tensor.startswith("weight")]

    block = out.split("weight updates  ")[1].split("\n\n")[0].splitlines()
    header = re.split(r"\s{2,}", block[1].strip())
    assert header == list(cli.UPDATE_COLUMNS)
    starts = [block[1].index(h) for h in header]
    updates = [
        dict(zip(header, [line[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]))
        for line in block[3:]
    ]
    assert [(u["layer"], u["weight"]) for u in updates] == [
        (layer, weight)
        for layer, weights in WEIGHTS.items()
        for weight in [cli.LAYER_UPDATE, *weights]
    ]
    for u in updates:
        assert (u["step"], u["interval"]) == ("6", "2")
        if u["weight"] == cli.LAYER_UPDATE:
            logged = [
                logged_updates(root / "cnn", u["layer"], w)[-1][1] for w in WEIGHTS[u["layer"]]
            ]
            # The layer's weights as one vector: |all updates| / |all weights|.
            combined = np.sqrt(sum(v["update_norm"] ** 2 for v in logged)) / np.sqrt(
                sum(v["weight_norm"] ** 2 for v in logged)
            )
            assert u["update ratio"] == f"{combined:.3e}" and (
                u["weight norm"],
                u["update norm"],
            ) == ("", "")
            assert u["size"] == (health.update_size(combined, 2) or "-")
            continue
        step, logged = logged_updates(root / "cnn", u["layer"], u["weight"])[-1]
        assert step == 6
        assert (
            u["weight norm"]
            == f"{logged['weight_norm']:.3e}"
            == f"{np.linalg.norm(final[u['layer']][u['weight']]):.3e}"
        )
        assert (
            u["update norm"] == f"{logged['update_norm']:.3e}"
            and u["update ratio"] == f"{logged['update_ratio']:.3e}"
        )
        assert 0 < logged["update_ratio"] < 1
        assert u["size"] == health.update_size(
            logged["update_ratio"], logged["interval"]
        )  # the server's verdict


def test_summary_of_a_weights_run_at_its_first_event_has_no_update_table(weights_logdir):
    # The first log event has nothing to compare with: weight tensors, no update records.
    root, _ = weights_logdir
    status, out, _ = run_cli("summary", root, "--step", "3")
    assert status == 0 and "run cnn  (step 2)" in out
    assert ("conv", "weight/kernel") in {(r["layer"], r["tensor"]) for r in table_rows(out, "cnn")}
    assert "weight updates" not in out


def test_a_run_without_weights_exports_and_summarises_as_before(logdir, tmp_path):
    status, out, _ = run_cli("summary", logdir)
    assert status == 0 and "weight updates" not in out
    assert run_cli("export", logdir, "--output", tmp_path / "out.csv")[0] == 0
    assert (
        next(csv.reader((tmp_path / "out.csv").open()))
        == cli.csv_header()
        == cli.csv_header(updates=False)
    )
    assert not set(records.UPDATE_FIELDS) & set(cli.csv_header())
    status, out, _ = run_cli("export", logdir, "--format", "json")
    assert set(strict_json(out)) == {"format_version", "series", "routing_maps"}


def test_export_csv_of_a_weights_run_puts_each_update_on_its_weight_row(weights_logdir, tmp_path):
    root, final = weights_logdir
    target = tmp_path / "out.csv"
    status, _, err = run_cli("export", root, "--output", target)
    assert (status, err) == (0, "")
    rows = list(csv.DictReader(target.open()))
    assert (
        list(rows[0])
        == cli.csv_header(updates=True)
        == cli.csv_header() + list(records.UPDATE_FIELDS)
    )
    # Tensors: 3 per layer, and 2 per weight of conv, bn and dense; 3 steps each.
    assert len(rows) == (4 * 3 + 2 * 6) * 3
    log = eventdata.load(root / "cnn")
    for layer, weights in WEIGHTS.items():
        for weight in weights:
            by_step = {
                r["step"]: r
                for r in rows
                if (r["layer"], r["tensor"]) == (layer, f"weight/{weight}")
            }
            assert sorted(by_step) == ["2", "4", "6"] and by_step["2"]["role"] == "weight"
            assert all(
                by_step["2"][name] == "" for name in records.UPDATE_FIELDS
            )  # the first event
            for step, logged in logged_updates(root / "cnn", layer, weight):
                row = by_step[str(step)]
                assert {name: float(row[name]) for name in records.UPDATE_FIELDS} == logged
                assert logged["interval"] == 2
            stats = eventdata.stats(log, layer, f"weight/{weight}")
            assert (
                float(by_step["6"]["sum"])
                == stats["sum"]
                == pytest.approx(final[layer][weight].sum(), rel=1e-6, abs=1e-9)
            )
            assert int(by_step["6"]["count"]) == final[layer][weight].size
    others = [r for r in rows if r["role"] != "weight"]
    assert others and all(r[name] == "" for r in others for name in records.UPDATE_FIELDS)


def test_export_json_of_a_weights_run_has_the_update_series_of_each_layer(weights_logdir):
    root, _ = weights_logdir
    status, out, _ = run_cli("export", root, "--format", "json")
    assert status == 0
    data = strict_json(out)
    assert [
        (u["run"], u["layer"], [w["weight"] for w in u["weights"]]) for u in data["updates"]
    ] == [("cnn", layer, weights) for layer, weights in WEIGHTS.items()]
    for body in data["updates"]:
        assert body["steps"] == [4, 6]
        logged = {w: logged_updates(root / "cnn", body["layer"], w) for w in WEIGHTS[body["layer"]]}
        for w in body["weights"]:
            assert w["steps"] == [step for step, _ in logged[w["weight"]]] == [4, 6]
            for name in records.UPDATE_FIELDS:
                assert w[name] == [v[name] for _, v in logged[w["weight"]]]
        for i in range(2):
            updates = [v[i][1] for v in logged.values()]
            combined = np.sqrt(sum(v["update_norm"] ** 2 for v in updates)) / np.sqrt(
                sum(v["weight_norm"] ** 2 for v in updates)
            )
            assert body["update_ratio"][i] == pytest.approx(combined, rel=1e-15)
    weight_series = [s for s in data["series"] if s["role"] in records.WEIGHT_ROLES]
    assert {(s["layer"], s["tensor"], s["weight"]) for s in weight_series} == {
        (layer, f"{role}/{weight}", weight)
        for layer, weights in WEIGHTS.items()
        for weight in weights
        for role in records.WEIGHT_ROLES
    }
    assert all("weight" not in s for s in data["series"] if s["role"] not in records.WEIGHT_ROLES)


@pytest.mark.parametrize(
    "args, status, message",
    [
        (["summary", "/no/such/dir"], 2, "logdir '/no/such/dir' does not exist"),
        (
            ["summary", "{logdir}", "--run", "nope"],
            2,
            "no run 'nope' with tb_gradviz data; runs are: avg, max",
        ),
        (
            ["check", "{logdir}", "--run", "nope"],
            2,
            "no run 'nope' with tb_gradviz data; runs are: avg, max",
        ),
        (["check", "/no/such/dir"], 2, "logdir '/no/such/dir' does not exist"),
        (["check", "{logdir}", "--format", "xml"], 2, "invalid choice: 'xml'"),
        (["summary", "{logdir}", "--step", "-1"], 2, "expected an integer >= 0; received '-1'"),
        (["summary", "{logdir}", "--step", "x"], 2, "received 'x'"),
        (["export", "{logdir}", "--format", "xml"], 2, "invalid choice: 'xml'"),
        (
            ["export", "{logdir}", "--output", "/no/such/dir/out.csv"],
            3,
            "cannot write --output '/no/such/dir/out.csv': folder '/no/such/dir' does not exist",
        ),
        (
            ["export", "{logdir}", "--output", "{logdir}"],
            3,
            "--output must be a file path; received '{logdir}', which is a folder",
        ),
        (["export", "{logdir}", "--output", "/proc/version"], 3, "cannot write --output"),
        (["demo", "--steps", "0"], 2, "expected a positive integer; received '0'"),
        (["demo", "--image-size", "16"], 2, "expected an integer >= 32"),
        (["demo", "--port", "70000"], 2, "a port number 0-65535; received '70000'"),
        (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
        ([], 2, "required: COMMAND"),
    ],
)
def test_bad_arguments_give_a_message_and_a_status(logdir, args, status, message):
    code, out, err = run_cli(*[a.format(logdir=logdir) for a in args])
    assert code == status
    assert message.format(logdir=logdir) in err and "Traceback" not in err + out


def test_a_file_an_empty_folder_and_a_foreign_logdir(tmp_path):
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    assert run_cli("summary", a_file)[0] == 2
    (tmp_path / "empty").mkdir()
    status, _, err = run_cli("export", tmp_path / "empty")
    assert status == 2 and "no tb_gradviz data" in err
    status, _, err = run_cli("check", tmp_path / "empty")
    assert status == 2 and "no tb_gradviz data" in err
    # A logdir of Keras' own TensorBoard callback: real events, none of ours.
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(tmp_path / "foreign" / "train"))
    writer.add_event(
        event_pb2.Event(
            step=1,
            summary=summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag="loss", simple_value=1.0)]
            ),
        )
    )
    writer.close()
    status, _, err = run_cli("summary", tmp_path / "foreign")
    assert status == 2 and "no tb_gradviz data" in err


def test_summary_and_export_do_not_import_tensorflow(logdir):
    code = (
        "import sys; from tb_gradviz import cli; "
        f"assert cli.main(['summary', {str(logdir)!r}]) == 0; "
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules, 'imported TF'"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, timeout=limits.CHILD_S
    )


@pytest.mark.parametrize("command", ["summary", "export", "check"])
def test_an_unreachable_store_is_a_usage_status_not_a_flag(command):
    # A store that does not answer is "no data" (2), never "flags raised" (1).
    env = dict(os.environ, AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y")
    env.update(AWS_DEFAULT_REGION="us-east-1", AWS_MAX_ATTEMPTS="1")
    env.update(AWS_ENDPOINT_URL="http://127.0.0.1:9", S3_ENDPOINT="http://127.0.0.1:9")
    done = subprocess.run(
        [sys.executable, "-m", "tb_gradviz.cli", command, "s3://bucket/logs"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=limits.CHILD_S,
    )
    assert done.returncode == cli.EXIT_USAGE == 2, done.stderr
    assert done.stderr.startswith("error: cannot read logdir 's3://bucket/logs': ")
    assert "Traceback" not in done.stderr


def test_check_says_which_run_it_cannot_judge_instead_of_a_traceback(logdir, tmp_path):
    # A run whose only stats record is malformed (a NaN count): listed, but no step to judge.
    import shutil

    from tb_gradviz.format import events, summaries

    root = tmp_path / "logs"
    shutil.copytree(logdir / "max", root / "max")
    values = np.arange(6.0)
    stats = summaries.stats_vector(values)
    stats[records.STATS_FIELDS.index("count")] = np.nan
    content = dict(layer_index=0, layer_class="Dense", layer_dtype="float32", role="activation")
    content.update(index=0, shape=[6], dtype="float32", pooling=None)
    log = events.EventLog(root / "broken")
    try:
        log.write(
            1,
            events.tensor_records(
                "dense", "activation", summaries.linear_histogram(values), stats, content
            ),
        )
    finally:
        log.close()
    status, out, err = run_cli("check", root)
    assert status == cli.EXIT_USAGE and "Traceback" not in err
    assert "run broken: Not found: run 'broken' has no logged step" in out
    assert "run max  (step 4" in out
    assert "no data to judge in run(s) broken" in err
    status, out, _ = run_cli("check", root, "--format", "json")
    runs = {r["run"]: r for r in strict_json(out)["runs"]}
    assert status == strict_json(out)["status"] == cli.EXIT_USAGE
    assert set(runs["broken"]) == {"run", "error"} and runs["max"]["step"] == 4


def test_the_reader_checksums_records_in_c_and_still_refuses_a_corrupt_one(logdir, tmp_path):
    import shutil

    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow

    data = bytes(range(256)) * 3
    python_crc = pywrap_tensorflow.crc_finalize(
        pywrap_tensorflow.crc_update(pywrap_tensorflow.CRC_INIT, data)
    )
    cli.open_logdir(str(logdir))
    assert pywrap_tensorflow.crc32c(data) == python_crc
    assert pywrap_tensorflow.crc32c(b"123456789") == 0xE3069283  # CRC-32C's check value
    shutil.copytree(logdir / "max", tmp_path / "max")
    (event_file,) = [p for p in (tmp_path / "max").iterdir() if ".tfevents." in p.name]
    content = bytearray(event_file.read_bytes())
    content[-40] ^= 0xFF  # inside the last event (step 4)
    event_file.write_bytes(bytes(content))
    status, out, _ = run_cli("summary", tmp_path)
    assert status == 0 and "run max  (step 2)" in out  # the corrupt step-4 event is refused


def test_cli_md_lists_the_flags_check_judges_and_fails_on_by_default_as_the_code_does():
    check = (REPO / "docs" / "CLI.md").read_text().split("## `check`", 1)[1]
    listed = re.search(r"\(\[health\.md\]\(health\.md\);\s*(.*?)\)", check, re.S).group(1)
    assert re.findall(r"`(\w+)`", listed) == list(health.FLAGS)
    example = json.loads(re.search(r"```json\n(.*?)```", check, re.S).group(1))
    default = cli.build_parser().parse_args(["check", "logs"]).fail_on
    assert example["fail_on"] == default == list(health.DEFAULT_FAIL_ON)
    # Every flag but what a run in another format would meet fails the check by default.
    assert [flag for flag in health.FLAGS if flag not in default] == ["block_underflow"]
