"""`tb-gradviz demo` and `bash demo/run.sh`: what trains, what it says, what it serves."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import types
import urllib.error
import urllib.parse
import urllib.request

import limits
import numpy as np
import pytest
import synthetic
from test_cli import REPO, run_cli

from tb_gradviz import cli


def test_demo_into_a_file_fails_cleanly_before_training(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    status, out, err = run_cli("demo", "--logdir", tmp_path / "f.txt")
    assert status == 2 and "--logdir must be a directory" in err and "Traceback" not in err + out
    assert "Training into" not in out


def test_serving_on_a_port_another_server_listens_on_fails_if_given_else_falls_back(
    tmp_path, capsys
):
    # What `demo` does once its logs are written: a port given by --port that another server
    # listens on (TensorBoard's own check) fails with the serve status; TensorBoard's port,
    # the default, falls back to a free one with a message. The logs: a small run's.
    synthetic.write_run(tmp_path / "run", layers=2, steps=3)
    with socket.socket() as busy, socket.socket() as on_6006:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(cli.CommandError) as raised:
            cli.serve(str(tmp_path), "127.0.0.1", port, 1)
        assert raised.value.code == cli.EXIT_SERVE == 4
        assert str(raised.value).startswith(f"cannot serve TensorBoard on 127.0.0.1:{port}: ")
        on_6006.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            on_6006.bind(("127.0.0.1", 6006))
        except OSError:
            pytest.skip("port 6006 is taken by another program on this machine")
        on_6006.listen()
        assert cli.serve(str(tmp_path), "127.0.0.1", None, 1) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "Port 6006 is busy" in out and "serving on a free port instead" in out
    url = re.search(r"GradViz tab: http://127\.0\.0\.1:(\d+)/#gradviz", out)
    assert url and url.group(1) != "6006", out


@pytest.fixture
def no_training(monkeypatch):
    """`tb-gradviz demo` trains nothing: its models are replaced by a stub that records each call.

    For the tests of serving, which need TensorBoard, not the demo's logs.
    """
    calls = []

    def run_demo(logdir, **options):
        calls.append(logdir)
        os.makedirs(logdir, exist_ok=True)
        return {}

    stub = types.SimpleNamespace(run_demo=run_demo, DIVERGING_RUN="diverging_mlp", FAILURES=())
    monkeypatch.setitem(sys.modules, "tb_gradviz.demos", stub)
    return calls


def demo_serving(tmp_path, *options):
    return run_cli("demo", "--logdir", tmp_path / "logs", "--serve-seconds", "1", *options)


def test_demo_on_a_host_that_cannot_be_resolved_exits_4_naming_it_before_training(
    tmp_path, no_training
):
    status, out, err = demo_serving(tmp_path, "--host", "no.such.host.invalid")
    assert status == cli.EXIT_SERVE == 4, (status, out, err)
    assert err.startswith(
        "error: cannot serve TensorBoard on no.such.host.invalid: "
        "the host 'no.such.host.invalid' cannot be resolved ("
    ), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert no_training == [] and "Port 6006 is busy" not in out


def test_serving_on_a_host_that_cannot_be_resolved_raises_the_serve_status_not_system_exit(
    tmp_path,
):
    # The check before training aside, serve() itself says what failed.
    with pytest.raises(cli.CommandError) as raised:
        cli.serve(str(tmp_path), "no.such.host.invalid", None, 1)
    assert raised.value.code == cli.EXIT_SERVE
    assert "the host 'no.such.host.invalid' cannot be resolved" in str(raised.value)


def test_demo_onto_a_busy_port_that_is_not_listening_exits_4_naming_the_port(tmp_path, no_training):
    # Bound and not listening: TensorBoard's own check (a connect) passes, werkzeug's bind fails.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        status, out, err = demo_serving(tmp_path, "--port", port)
    assert status == cli.EXIT_SERVE == 4, (status, out, err)
    assert err == (
        f"error: cannot serve TensorBoard on 127.0.0.1:{port}: port {port} is already in use\n"
    )
    assert no_training == [str(tmp_path / "logs")] and "Port 6006 is busy" not in out


def test_demo_on_an_address_of_another_machine_exits_4_naming_the_address(tmp_path, no_training):
    # 192.0.2.1 (TEST-NET-1, RFC 5737) resolves, and is no address of this machine.
    status, out, err = demo_serving(tmp_path, "--host", "192.0.2.1", "--port", "0")
    assert status == cli.EXIT_SERVE == 4, (status, out, err)
    assert err == (
        "error: cannot serve TensorBoard on 192.0.2.1: "
        "'192.0.2.1' is not an address of this machine\n"
    )
    assert "Port 6006 is busy" not in out


def test_demo_falls_back_to_a_free_port_when_6006_is_bound_but_not_listening(tmp_path, no_training):
    with socket.socket() as busy:
        try:
            busy.bind(("127.0.0.1", 6006))
        except OSError:
            pytest.skip("port 6006 is taken by another program on this machine")
        status, out, err = demo_serving(tmp_path)
    assert status == 0, (out, err)
    assert "Port 6006 is busy (port 6006 is already in use); serving on a free port instead." in out
    url = re.search(r"GradViz tab: http://127\.0\.0\.1:(\d+)/#gradviz", out)
    assert url and url.group(1) != "6006", out


def test_keras_tensorboard_logs_nothing_for_maxpool_and_gradviz_logs_its_tensors(tmp_path):
    sys.path.insert(0, str(REPO / "demo"))
    try:
        import keras_tensorboard_vs_gradviz as comparison
    finally:
        sys.path.pop(0)
    table, write_grads_error = comparison.compare(str(tmp_path))
    assert "write_grads" in write_grads_error
    keras_tags, gradviz_tags = table["maxpool"]
    assert keras_tags == []
    tensors = [
        f"{role}{record}"
        for role in ("activation", "input_gradient", "output_gradient")
        for record in ("", "/precision")
    ]
    logged = (*tensors, "routing", "routing_map", "units")
    assert gradviz_tags == [f"gradviz/maxpool/{t}" for t in logged]
    assert table["conv"][0]  # Keras does log the conv's weights


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    """`bash demo/run.sh` with its defaults, serving while this module's tests read it.

    Run as a user's shell runs it, without TensorFlow's log variables set. Yields `(logs, url,
    whether 6006 was free, what it said up to the URL)`; stops the server
    afterwards.
    """
    workdir = tmp_path_factory.mktemp("main_job")
    logs = workdir / "demo_logs"
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", 6006))
            default_port_free = True
        except OSError:
            default_port_free = False
    started = time.monotonic()
    process = subprocess.Popen(
        ["bash", str(REPO / "demo" / "run.sh"), "--logdir", str(logs), "--serve-seconds", "600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=workdir,
        env={k: v for k, v in os.environ.items() if not k.startswith(("TF_CPP", "GRPC"))},
    )
    try:
        output, url = [], None
        for line in process.stdout:
            output.append(line)
            match = re.search(r"GradViz tab: (http://\S+)#gradviz", line)
            if match:
                url = match.group(1)
                break
            # A guard against a hang only: the demo's time is measured in bench/RESULTS.md.
            assert time.monotonic() - started < 900, "".join(output)
        assert url, "".join(output)
        # Keep reading, so that a full pipe never blocks the server.
        threading.Thread(target=output.extend, args=(process.stdout,), daemon=True).start()
        said = "".join(output)
        yield logs, url, default_port_free, said
    finally:
        process.kill()
        process.wait(timeout=30)


def test_readme_main_job_trains_writes_and_serves(main_job):
    """`bash demo/run.sh` with its defaults, serving bounded. How long it takes is measured in
    bench/RESULTS.md ("The nine-run demo"), not judged here: a shared machine may be slow."""
    logs, url, default_port_free, _ = main_job
    if default_port_free:
        assert url.startswith("http://127.0.0.1:6006/"), url  # TensorBoard's port by default
    deadline = time.monotonic() + limits.SERVER_START_S
    while True:
        listing = json.load(
            urllib.request.urlopen(url + "data/plugins_listing", timeout=limits.REQUEST_S)
        )
        if listing.get("gradviz", {}).get("enabled") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert listing["gradviz"]["enabled"], listing.get("gradviz")
    runs = json.load(
        urllib.request.urlopen(url + "data/plugin/gradviz/runs", timeout=limits.REQUEST_S)
    )["runs"]
    assert [r["run"] for r in runs] == [
        "cnn_averagepool",
        "cnn_maxpool",
        "diverging_mlp",
        "mixed_float16_scaled",
        "mixed_float16_unscaled",
        "plain_relu_bn",
        "plain_sigmoid",
        "resnet50",
        "transformer",
    ]
    from tb_gradviz import demos

    (resnet50,) = [r for r in runs if r["run"] == "resnet50"]
    assert [layer["layer"] for layer in resnet50["layers"]] == list(demos.RESNET50_LAYERS)
    assert os.path.isdir(logs / "resnet50")


def served_scalars(url, run, tag, steps):
    """`[(step, value)]` of a scalar as the Scalars dashboard gets it, once `steps` are loaded."""
    query = urllib.parse.urlencode({"run": run, "tag": tag})
    deadline = time.monotonic() + limits.POLL_S
    while True:
        try:
            points = json.load(
                urllib.request.urlopen(
                    f"{url}data/plugin/scalars/scalars?{query}", timeout=limits.REQUEST_S
                )
            )
        except urllib.error.HTTPError:  # not loaded yet
            points = []
        if len(points) >= steps or time.monotonic() > deadline:
            return [(step, value) for _, step, value in points]
        time.sleep(0.5)


@pytest.mark.parametrize(
    "run, steps", [("resnet50", 48), ("cnn_maxpool", 40), ("cnn_averagepool", 40)]
)
def test_demo_resnet50_and_cnns_learn_loss_falls_and_accuracy_beats_chance(main_job, run, steps):
    # From scratch with SGD(0.01, momentum 0.9), ResNet50's loss rose from 2.2 to 6.9 and its
    # accuracy stayed at chance (and the CNNs, Adam(1e-3) at batch 16, stayed near it). Each step's
    # loss and accuracy are in the run, beside its GradViz records, for the Scalars dashboard.
    _, url, _, _ = main_job
    loss = served_scalars(url, run, "train/loss", steps)
    accuracy = served_scalars(url, run, "train/accuracy", steps)
    assert [step for step, _ in loss] == [step for step, _ in accuracy] == list(range(1, steps + 1))
    quarter = steps // 4
    first_loss, last_loss = (
        np.mean([value for _, value in part]) for part in (loss[:quarter], loss[-quarter:])
    )
    last_accuracy = np.mean([value for _, value in accuracy[-quarter:]])
    # Chance is a loss of ln 4 = 1.39 and an accuracy of 0.25.
    assert last_loss < min(0.75 * first_loss, 1.0), (run, [round(value, 2) for _, value in loss])
    assert last_accuracy > 0.5, (run, [round(value, 2) for _, value in accuracy])


def test_demo_shows_a_vanishing_gradient_the_flags_catch_next_to_a_healthy_network(
    main_job, capsys
):
    # Issue 13: the main job shows the diagnosis: 20 sigmoid layers against ReLU with BatchNorm.
    logs, _, _, _ = main_job
    assert cli.main(["check", str(logs), "--run", "plain_relu_bn"]) == 0
    assert "no flag raised" in capsys.readouterr().out
    assert (
        cli.main(["check", str(logs), "--run", "plain_sigmoid", "--fail-on", "vanishing"])
        == cli.EXIT_FLAGGED
    )
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if "vanishing" in line]
    flagged = [row[0] for row in rows]
    # The gradient falls toward the input: the first layers are flagged, the last is the reference.
    assert (
        flagged[:3] == ["centre", "conv01", "conv02"]
        and "logits" not in flagged
        and "conv20" not in flagged
    )
    # As the demo says: check also flags dead ReLU channels in both small CNNs.
    for run in ("cnn_maxpool", "cnn_averagepool"):
        assert cli.main(["check", str(logs), "--run", run, "--fail-on", "dead"]) == cli.EXIT_FLAGGED
    capsys.readouterr()


@pytest.fixture(scope="module")
def main_job_check(main_job):
    """`tb-gradviz check --format json` on the main job's logdir: `(status, {run: its result})`."""
    status, out, _ = run_cli("check", main_job[0], "--format", "json")
    return status, {r["run"]: r for r in json.loads(out)["runs"]}


def test_demo_says_what_trains_and_why_lists_each_runs_layers_and_keeps_tensorflow_quiet(
    main_job, main_job_check
):
    logs, _, _, output = main_job
    from tb_gradviz import demos

    plan = demos.demo_plan()
    said = [line for line in output.splitlines() if re.match(r"\[\d+/\d+\] |\s+\S+ logged ", line)]
    # Before each run: its number, name, model and why; after it: the layers it logged.
    assert len(said) == 2 * len(plan)
    for i, (run, what, why, _) in enumerate(plan):
        assert said[2 * i] == f"[{i + 1}/{len(plan)}] {run}: {what}; {why}."
        assert said[2 * i + 1].split()[:2] == [run, "logged"]
        assert os.listdir(logs / run)
    assert said[3].split(": ", 1)[1] == "pool1, pool2, gap"  # cnn_averagepool
    # TensorFlow's C++ start-up notices are not the demo's output (stderr is in `output` too).
    assert "oneDNN" not in output and "absl::InitializeLog" not in output, output
    # The step scalars are written by tb_gradviz's own writer, beside its records.
    assert any(name.endswith(".scalars") for name in os.listdir(logs / "cnn_maxpool"))
    # What the demo says check flags is what check flags on its logs.
    assert "dead ReLU channels in the small CNNs" in output
    status, runs = main_job_check
    flags = {run: {f["flag"] for f in result["flags"]} for run, result in runs.items()}
    assert status == cli.EXIT_FLAGGED
    assert "vanishing" in flags["plain_sigmoid"] and flags["plain_relu_bn"] == set()


def test_demo_passes_its_model_steps_and_sizes_to_the_training(tmp_path, no_training, monkeypatch):
    # What each --model trains is demo_plan's (the main job trains every run); the command
    # passes each option on as given.
    options, stub = [], sys.modules["tb_gradviz.demos"]
    monkeypatch.setattr(stub, "run_demo", lambda logdir, **o: options.append(o) or {})
    for model, steps in (("cnn", 1), ("divergence", 3), ("resnet50", 2)):
        sizes = ("--image-size", 32, "--batch-size", 4, "--steps", steps, "--no-serve")
        assert demo_serving(tmp_path, "--model", model, *sizes)[0] == 0
    assert [(o["model"], o["steps"], o["image_size"], o["batch_size"]) for o in options] == [
        ("cnn", 1, 32, 4),
        ("divergence", 3, 32, 4),
        ("resnet50", 2, 32, 4),
    ]


def test_the_demo_url_opens_resnet50s_pool1_pool():
    from tb_gradviz.cli import demo

    runs = {
        "cnn_maxpool": ["conv1", "pool1"],
        "resnet50": ["resnet50/conv1_conv", "resnet50/pool1_pool", "resnet50/avg_pool"],
    }
    assert demo.focus(runs) == "&run=resnet50&layer=resnet50%2Fpool1_pool&view=layer"
    assert demo.focus({"cnn_maxpool": ["pool1"]}) == ""


def test_demo_divergence_warns_before_its_run_fails_and_its_transformer_raises_nothing(
    main_job, main_job_check
):
    # The divergence demo's two runs, as the main job trains them (in all, before ResNet50).
    _, _, _, output = main_job
    from tb_gradviz import demos

    assert [run for run, *_ in demos.demo_plan("divergence")] == [
        "transformer",
        demos.DIVERGING_RUN,
    ]
    # Read back as check reads the written logdir: every onset of each run.
    status, runs = main_job_check
    assert status == cli.EXIT_FLAGGED
    assert runs["transformer"]["flags"] == [] and runs["transformer"]["onsets"] == []
    onsets = runs[demos.DIVERGING_RUN]["onsets"]
    warnings = [o for o in onsets if o["class"] == "warning"]
    failures = [o for o in onsets if o["flag"] in demos.FAILURES]
    assert warnings and failures, onsets
    warning = min(warnings, key=lambda o: o["step"])
    failure = min(failures, key=lambda o: o["step"])
    # The warning leads by tens of steps: the float16 activations overflow 60-70 steps after it.
    assert warning["step"] + 20 <= failure["step"], (warning, failure)
    # The run stopped after the event that raised the failure (stop_on), its last logged step.
    assert runs[demos.DIVERGING_RUN]["step"] == failure["step"]
    # What the demo says at the end is what check finds.
    expected = (
        f"{demos.DIVERGING_RUN} warned before it failed: {warning['flag']} at step "
        f"{warning['step']} ({warning['layer']}, {warning['tensor']}), "
        f"{failure['step'] - warning['step']} steps before {failure['flag']} at step "
        f"{failure['step']} ({failure['layer']}, {failure['tensor']})."
    )
    assert expected in output, output
