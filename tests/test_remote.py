"""Remote and URL log directories: an S3 server on 127.0.0.1, `file://` URLs, a store that fails.

The S3 server is moto's (a real HTTP server in this process, on a loopback
port); the callback writes `s3://` through TensorBoard's own file layer,
`tb-gradviz export` and a real TensorBoard read it back, and the values
are compared with a local run of the same fit.
"""

import contextlib
import importlib.util
import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import time

import eventdata
import limits
import numpy as np
import pytest
import synthetic

from tb_gradviz.format import events, storage, upload

REPO = pathlib.Path(__file__).resolve().parent.parent
PREFIX = "/data/plugin/gradviz"


@contextlib.contextmanager
def s3_server(port=0):
    """An S3 server (moto) on 127.0.0.1; yields its endpoint URL."""
    pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield server, f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """Credentials and settings that keep boto3 off every network but the loopback server."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        # One attempt per upload: a store that is down fails at once, not after boto3's retries.
        "AWS_MAX_ATTEMPTS": "1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    # Whatever has no endpoint of its own goes to a closed loopback port, never out.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("S3_ENDPOINT", "http://127.0.0.1:9")


@pytest.fixture
def s3(aws_env, monkeypatch):
    """(server, endpoint, client): a fresh S3 server that TensorBoard's `S3_ENDPOINT` points at."""
    import boto3

    with s3_server() as (server, endpoint):
        monkeypatch.setenv("S3_ENDPOINT", endpoint)
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        yield server, endpoint, boto3.client("s3", endpoint_url=endpoint)


@pytest.fixture
def fast_retries(monkeypatch):
    monkeypatch.setattr(upload, "RETRY_FIRST_S", 0.1)
    monkeypatch.setattr(upload, "RETRY_MAX_S", 0.2)


def keys(client, bucket, prefix=""):
    return sorted(
        o["Key"] for o in client.list_objects(Bucket=bucket, Prefix=prefix).get("Contents", [])
    )


def tiny_fit(callbacks, steps=6, seed=0):
    """Fits a conv + max-pool model for `steps` steps of 4 examples."""
    keras = pytest.importorskip("keras")
    keras.utils.set_random_seed(seed)
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
    rng = np.random.default_rng(seed)
    x, y = (
        rng.normal(size=(4 * steps, 8, 8, 2)).astype("float32"),
        rng.normal(size=(4 * steps, 2)).astype("float32"),
    )
    history = model.fit(
        x, y, batch_size=4, epochs=1, verbose=0, shuffle=False, callbacks=callbacks(x[:4], y[:4])
    )
    return history


def callback(log_dir, x, y, **kwargs):
    from tb_gradviz import GradVizCallback

    return GradVizCallback(log_dir, (x, y), layers=["conv", "pool"], every_n_batches=1, **kwargs)


def export(logdir):
    """`tb-gradviz export LOGDIR --format json` in a fresh process, as a user runs it."""
    result = subprocess.run(
        [sys.executable, "-m", "tb_gradviz.cli", "export", str(logdir), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=limits.CHILD_S,
        cwd=REPO,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["series"]


def without_wall_times(series):
    """Series as JSON text (NaN compares equal), keyed by (run, layer, tensor).

    Wall times are left out: each logger stamps its own.
    """
    return {
        (s["run"], s["layer"], s["tensor"]): json.dumps(dict(s, wall_times=None), sort_keys=True)
        for s in series
    }


# Locations: parsed only, never the network.


def test_local_paths_and_file_urls_are_local_folders(tmp_path):
    assert storage.location(tmp_path / "run").local_path == str(tmp_path / "run")
    assert storage.location(f"file://{tmp_path}/run").local_path == f"{tmp_path}/run"
    assert storage.location(f"file://localhost{tmp_path}/a%20b").local_path == f"{tmp_path}/a b"
    remote = storage.location("s3://bucket/exp/run/")
    assert remote.is_remote and remote.url == "s3://bucket/exp/run"
    assert remote.join("events.x") == "s3://bucket/exp/run/events.x"


@pytest.mark.parametrize(
    "log_dir, message",
    [
        (
            "file://somehost/run",
            "is not a local path: a file:// URL names one as file:///absolute/path",
        ),
        ("s3:///run", "names no bucket or host: expected s3://BUCKET/path"),
        ("s3:/bucket/run", "looks like a URL that lost a slash"),
        (
            pathlib.PurePosixPath("gs://bucket/run"),
            "'gs:/bucket/run' looks like a URL that lost a slash",
        ),
        ("simplecache::s3://bucket/run", "a chained fsspec URL"),
        (
            "s3://bucket/",
            "'s3://bucket/' is a bucket's root, which TensorBoard's s3:// reader cannot list",
        ),
        ("nosuchprotocol://bucket/run", "no installed file layer writes nosuchprotocol:// URLs"),
    ],
)
def test_bad_log_dir_urls_say_what_was_received(log_dir, message):
    x, y = np.zeros((2, 8, 8, 2), "float32"), np.zeros((2, 2), "float32")
    from tb_gradviz import GradVizCallback

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        GradVizCallback(log_dir, (x, y))


def test_a_remote_log_dir_is_checked_without_the_network(aws_env, monkeypatch):
    # Nothing listens on port 9 (discard), and the first upload is where a
    # store's errors show; creating the callback must not wait on it.
    monkeypatch.setenv("S3_ENDPOINT", "http://127.0.0.1:9")
    x, y = np.zeros((2, 8, 8, 2), "float32"), np.zeros((2, 2), "float32")
    from tb_gradviz import GradVizCallback

    started = time.monotonic()
    callback = GradVizCallback("s3://bucket/run", (x, y))
    assert time.monotonic() - started < 5
    assert callback.log_dir == "s3://bucket/run"
    assert callback._log.close() == []  # nothing fired: nothing written, nothing spooled


def test_file_url_log_dir_writes_the_local_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny_fit(lambda x, y: [callback(f"file://{tmp_path}/logs/run", x, y)], steps=3)
    assert len(list((tmp_path / "logs" / "run").glob("events.out.tfevents.*"))) == 1
    assert not (tmp_path / "file:").exists()
    from tb_gradviz import cli

    assert cli.main(["summary", f"file://{tmp_path}/logs"]) == 0
    assert [s["steps"] for s in export(f"file://{tmp_path}/logs")] == [[1, 2, 3]] * 6


# Objects: how events reach a store that has no append.


def test_remote_files_are_uploaded_whole_and_rotated(tmp_path, monkeypatch):
    """Through fsspec (its in-process memory store): every object is a whole event file.

    Each object carries its own metadata.
    """
    fsspec = pytest.importorskip("fsspec")
    monkeypatch.setattr(events, "ROTATE_EVENTS", 4)
    rng = np.random.default_rng(0)
    remote, local = (
        events.EventLog("memory://bucket/run"),
        events.EventLog(tmp_path / "local" / "run"),
    )
    for step in range(1, 11):
        records = synthetic.pool_records(rng, "pool", 0, step=step)
        remote.write(step, records, wall_time=1000.0 + step)
        local.write(step, records, wall_time=1000.0 + step)
    assert remote.close() == [] and local.close() == []
    memory = fsspec.filesystem("memory")
    names = sorted(memory.ls("/bucket/run", detail=False))
    assert len(names) == 3  # 4 + 4 + 2 events
    read_back = tmp_path / "read_back"
    (read_back / "together").mkdir(parents=True)
    steps = []
    for i, name in enumerate(names):
        # Each object alone: the metadata of every tag is in it.
        alone = read_back / "alone" / str(i)
        alone.mkdir(parents=True)
        (alone / os.path.basename(name)).write_bytes(memory.cat(name))
        accumulator = eventdata.load(alone)
        assert eventdata.content(accumulator, "gradviz/pool/routing")["kind"] == "routing"
        steps += [step for step, _ in eventdata.values(accumulator, "gradviz/pool/routing")]
        shutil.copy(alone / os.path.basename(name), read_back / "together")
    assert steps == list(range(1, 11))
    together, expected = (
        eventdata.load(read_back / "together"),
        eventdata.load(tmp_path / "local" / "run"),
    )
    assert eventdata.tensor_tags(together) == eventdata.tensor_tags(expected)
    for tag in eventdata.tensor_tags(expected):
        for (s1, a1), (s2, a2) in zip(
            eventdata.values(together, tag), eventdata.values(expected, tag), strict=True
        ):
            assert s1 == s2
            np.testing.assert_array_equal(a1, a2)
    assert not os.path.exists(remote._uploader.spool_dir)  # uploaded: the spool folder is gone


# A real S3 server on 127.0.0.1.


@pytest.mark.slow
def test_fit_logged_to_s3_reads_back_as_the_local_run(s3, tmp_path, monkeypatch):
    server, endpoint, client = s3
    client.create_bucket(Bucket="gradviz-runs")
    monkeypatch.setattr(events, "ROTATE_EVENTS", 4)  # 7 events: two objects, the first one final
    tiny_fit(
        lambda x, y: [
            callback("s3://gradviz-runs/exp/run", x, y),
            callback(tmp_path / "local" / "run", x, y),
        ],
        steps=7,
    )
    objects = keys(client, "gradviz-runs")
    assert len(objects) == 2 and all(k.startswith("exp/run/events.out.tfevents.") for k in objects)

    remote, local = export("s3://gradviz-runs/exp"), export(tmp_path / "local")
    assert [s["steps"] for s in remote] == [list(range(1, 8))] * 6
    assert without_wall_times(remote) == without_wall_times(local)

    # A real TensorBoard on the bucket. TensorFlow 2.6+'s tf.io.gfile has no
    # s3://, so TensorBoard reads s3:// through its own boto3 layer, which it
    # uses where TensorFlow is not installed: hide it from that process.
    from tbserver import get_json, running_tensorboard

    hidden = tmp_path / "no_tensorflow" / "tensorflow"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text(
        "raise ImportError('hidden: TensorBoard as installed without TensorFlow')\n"
    )
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join(filter(None, [str(hidden.parent), os.environ.get("PYTHONPATH")])),
    )

    def all_steps_loaded(url):
        runs = get_json(f"{url}{PREFIX}/runs")["runs"]
        return [r["run"] for r in runs] == ["run"] and {
            layer["max_step"] for layer in runs[0]["layers"]
        } == {7}

    with running_tensorboard(
        "s3://gradviz-runs/exp",
        tmp_path / "tensorboard.log",
        all_steps_loaded,
        timeout=limits.SERVER_START_S,
    ) as url:
        expected = {(s["layer"], s["tensor"]): s for s in local}
        for tensor in ("activation", "input_gradient", "output_gradient"):
            served = get_json(f"{url}{PREFIX}/series?run=run&layer=pool&tensor={tensor}")
            want = expected[("pool", tensor)]
            assert served["steps"] == want["steps"] == list(range(1, 8))
            for part in ("stats", "histogram", "log"):
                assert json.dumps(served[part], sort_keys=True) == json.dumps(
                    want[part], sort_keys=True
                ), part
        routing = get_json(f"{url}{PREFIX}/routing?run=run&layer=pool")
        want = expected[("pool", "activation")]["routing"]
        assert routing["steps"] == want["steps"] == list(range(1, 8))
        assert routing["routed_positions"] == want["routed_positions"]


@pytest.mark.slow
def test_a_missing_bucket_keeps_the_events_locally_and_uploads_them_once_it_exists(
    s3, tmp_path, caplog, fast_retries
):
    server, endpoint, client = s3
    caplog.set_level(logging.WARNING, logger="tb_gradviz.format.upload")
    history = tiny_fit(lambda x, y: [callback("s3://not-yet-made/run", x, y)], steps=4)
    assert len(history.history["loss"]) == 1  # training went on

    warnings = [r.getMessage() for r in caplog.records if r.name == "tb_gradviz.format.upload"]
    failures = [m for m in warnings if "cannot write to s3://not-yet-made/run" in m]
    assert len(failures) == 1, warnings  # said once, not at every retry
    assert "NoSuchBucket" in failures[0] and "Training goes on" in failures[0]
    (kept,) = [m for m in warnings if "are not in s3://not-yet-made/run" in m]
    assert "4 log event(s) (steps 1, 2, 3, 4)" in kept
    spool = pathlib.Path(kept.split("They are kept in ")[1].split(",")[0])
    # What is kept locally is a whole run: the CLI reads it.
    assert [s["steps"] for s in export(spool)] == [[1, 2, 3, 4]] * 6
    kept_bytes = {p.name: p.read_bytes() for p in spool.iterdir()}

    client.create_bucket(Bucket="not-yet-made")  # the background retry finds it
    deadline = time.monotonic() + limits.POLL_S
    while keys(client, "not-yet-made") != [f"run/{name}" for name in sorted(kept_bytes)]:
        assert time.monotonic() < deadline, keys(client, "not-yet-made")
        time.sleep(0.2)
    for name, data in kept_bytes.items():
        assert client.get_object(Bucket="not-yet-made", Key=f"run/{name}")["Body"].read() == data
    deadline = time.monotonic() + limits.POLL_S
    while spool.exists() and any(spool.iterdir()):
        assert time.monotonic() < deadline, "uploaded files stay in the spool folder"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_store_that_goes_away_mid_fit_gets_the_events_when_it_is_back(
    aws_env, tmp_path, caplog, monkeypatch, fast_retries
):
    keras = pytest.importorskip("keras")
    import boto3

    caplog.set_level(logging.WARNING, logger="tb_gradviz.format.upload")
    with s3_server() as (server, endpoint):
        port = int(endpoint.rsplit(":", 1)[1])
        # boto3's own endpoint variable this time (TensorBoard's S3_ENDPOINT unset).
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.delenv("S3_ENDPOINT", raising=False)
        boto3.client("s3").create_bucket(Bucket="flaky")
        restarted = []

        def outage(batch, logs):
            if batch == 1:  # after the step-1 event: the store goes away
                server.stop()
            if batch == 4:  # three events later it is back, on the same port, with the same bucket
                restarted.append(contextlib.ExitStack())
                restarted[0].enter_context(s3_server(port))

        try:
            tiny_fit(
                lambda x, y: [
                    keras.callbacks.LambdaCallback(on_train_batch_begin=outage),
                    callback("s3://flaky/exp/run", x, y),
                    callback(tmp_path / "local" / "run", x, y),
                ],
                steps=7,
            )
            # The writer closed at train end once everything was up.
            assert len(keys(boto3.client("s3"), "flaky")) == 1
            warnings = [
                r.getMessage() for r in caplog.records if r.name == "tb_gradviz.format.upload"
            ]
            assert sum("cannot write to s3://flaky/exp/run" in m for m in warnings) == 1, warnings
            assert any("answers again" in m for m in warnings), warnings
            assert not any("are not in" in m for m in warnings), warnings
            remote, local = export("s3://flaky/exp"), export(tmp_path / "local")
            assert [s["steps"] for s in remote] == [list(range(1, 8))] * 6
            assert without_wall_times(remote) == without_wall_times(local)
        finally:
            for stack in restarted:
                stack.close()


JAX_FIT = """
import os, sys
os.environ["KERAS_BACKEND"] = "jax"
sys.modules["tensorflow"] = None  # as if TensorFlow were not installed: any import of it fails
import keras, numpy as np
from tb_gradviz import GradVizCallback
keras.utils.set_random_seed(0)
L = keras.layers
model = keras.Sequential([keras.Input((8, 8, 2)), L.Conv2D(3, 3, padding="same"),
                          L.MaxPooling2D(2, name="pool"), L.Flatten(), L.Dense(2)])
model.compile("sgd", "mse")
x, y = np.ones((12, 8, 8, 2), "float32"), np.ones((12, 2), "float32")
callback = GradVizCallback(sys.argv[1], (x[:4], y[:4]), every_n_batches=1)
model.fit(x, y, batch_size=4, verbose=0, callbacks=[callback])
"""


@pytest.mark.slow
def test_jax_writes_s3_where_tensorflow_is_not_installed(s3, tmp_path):
    pytest.importorskip("jax")
    server, endpoint, client = s3
    client.create_bucket(Bucket="jax-runs")
    result = subprocess.run(
        [sys.executable, "-c", JAX_FIT, "s3://jax-runs/exp/run"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(keys(client, "jax-runs", "exp/run/")) == 1
    assert [s["steps"] for s in export("s3://jax-runs/exp")] == [[1, 2, 3]] * 3


@pytest.mark.slow
def test_write_speed_bench_runs(tmp_path):
    out = tmp_path / "out.json"
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_remote.py"), "--smoke", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=limits.CHILD_S,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [row["target"] for row in rows] == ["local", "file_url", "s3"]
    assert all(row["write_ms"] > 0 for row in rows) and rows[2]["uploaded_per_event_kb"] > 0


def test_with_tensorflow_imported_its_gfile_writes_the_schemes_it_knows(tmp_path):
    pytest.importorskip("tensorflow")
    assert (
        storage.location("gs://bucket/run").layer.name == "tf.io.gfile"
    )  # as Keras' TensorBoard writes gs://
    assert (
        storage.location("s3://bucket/run").layer.name == "tensorboard gfile"
    )  # TensorFlow 2.6+ has no s3://
    # Each upload replaces the object (here through TensorFlow's own file:// scheme).
    url = f"file://{tmp_path}/object"
    layer = storage.file_layer(url, "file")
    layer.write(url, b"the first, longer version")
    layer.write(url, b"the second")
    assert (tmp_path / "object").read_bytes() == b"the second"


def test_gs_without_tensorflow_or_gcsfs_names_what_to_install(monkeypatch):
    pytest.importorskip("fsspec")
    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed")
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # as on JAX or PyTorch without TensorFlow
    with pytest.raises(
        ValueError,
        match=r"'gs://bucket/run' cannot be written here: .*gcsfs.*\(the remote extra\)",
    ):
        storage.location("gs://bucket/run")


WRITER = """
import os, signal, sys
import numpy as np
from tb_gradviz.format import events
import synthetic
log = events.EventLog(sys.argv[1])
rng = np.random.default_rng(0)
for step in (1, 2, 3):
    log.write(step, synthetic.pool_records(rng, "pool", 0, step=step))
print(log._uploader.spool_dir, flush=True)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
# else: exit without closing the writer, as a fit interrupted before train end does
"""


def run_writer(log_dir, how):
    result = subprocess.run(
        [sys.executable, "-c", WRITER, log_dir, how],
        capture_output=True,
        text=True,
        timeout=limits.CHILD_S,
        cwd=REPO / "tests",  # where `synthetic` lies
    )
    return result, pathlib.Path(result.stdout.strip())


def test_a_writer_never_closed_uploads_its_last_events_at_exit(s3):
    server, endpoint, client = s3
    client.create_bucket(Bucket="at-exit")
    result, spool = run_writer("s3://at-exit/exp/run", "exit")
    assert result.returncode == 0, result.stderr
    assert len(keys(client, "at-exit", "exp/run/")) == 1
    assert [s["steps"] for s in export("s3://at-exit/exp")] == [[1, 2, 3]] * 3
    assert not spool.exists()  # all up: nothing left behind


def test_a_killed_process_leaves_the_events_the_store_lacks_in_the_spool_folder(aws_env):
    # The store is unreachable (a closed loopback port), then the process is killed.
    result, spool = run_writer("s3://unreachable/run", "kill")
    assert result.returncode == -9
    assert [s["steps"] for s in export(spool)] == [[1, 2, 3]] * 3
    shutil.rmtree(spool)
