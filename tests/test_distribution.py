"""GradVizCallback under tf.distribute: MirroredStrategy and MultiWorkerMirroredStrategy.

Devices and clusters are fixed when TensorFlow initialises, so each run is a
process of its own (tests/distributed_fit.py); these tests assert on what it
prints and writes. Every wait is bounded.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import eventdata  # noqa: E402

from tb_gradviz.format import (
    records,  # noqa: E402
    summaries,
)

SCRIPT = os.path.join(os.path.dirname(__file__), "distributed_fit.py")
TIMEOUT = 240  # seconds; a run takes ~10-30 s on 2 cores


def script_env(**extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **extra)
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def parse_result(stdout, stderr):
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line; stderr ends with:\n{stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    out = tmp_path_factory.mktemp("mirrored")
    run = subprocess.run(
        [sys.executable, SCRIPT, "mirrored", str(out)],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return out, parse_result(run.stdout, run.stderr)


def test_mirrored_training_is_bit_identical_in_every_replica_copy(mirrored):
    out, result = mirrored
    assert result["replicas"] == 2
    identical = result["identical"]
    # Keras 3 BatchNorm updates each replica's copy of the moving statistics on
    # its own, so the copies differ; a restore through the mirrored variable
    # would write the first copy into both.
    assert identical["replica_copies_differ"]
    assert identical["same_count"] and identical["variables"] == 54
    assert identical["mismatches"] == []
    assert identical["rng_identical"]
    # The weights' gradients come from the copy the pass read: a gradient taken
    # w.r.t. another copy would be unconnected, all zeros.
    log = eventdata.load(out / "identical")
    gradient = eventdata.stats(log, "conv", "weight_gradient/kernel")
    assert (gradient["count"], gradient["zeros"], gradient["nan"]) == (3 * 3 * 3 * 4, 0, 0)
    updates = [vector for _, vector in eventdata.values(log, records.update_tag("conv", "kernel"))]
    assert len(updates) == 7 and all(
        v[records.UPDATE_NORM] > 0 for v in updates
    )  # 8 steps, 8 log events


def test_mirrored_probe_is_the_whole_batch_on_one_device(mirrored):
    out, result = mirrored
    assert result["collective_ops"] == []
    assert result["tracing_count"] == 1
    reference = np.load(out / "reference.npz")
    log = eventdata.load(out / "outside")
    for tensor in ("activation", "input_gradient", "output_gradient"):
        expected = reference[tensor]
        logged = eventdata.stats(log, "pool", tensor)
        want = records.decode_stats(summaries.stats_vector(expected))
        # Counts of the whole probe batch (8 examples), BatchNorm statistics
        # over all 8, the batch's mean loss: not one replica's half.
        assert (
            logged["count"]
            == expected.size
            == (8 * 4 * 4 * 4 if tensor != "input_gradient" else 8 * 8 * 8 * 4)
        )
        for field in ("zeros", "nan", "pos_inf", "neg_inf"):
            assert logged[field] == want[field], (tensor, field)
        # The reference runs eagerly, the probe as a graph; their kernels may
        # differ in the last bit (one activation crossed a histogram edge).
        for field in ("min", "max", "mean", "std", "sum"):
            assert logged[field] == pytest.approx(want[field], rel=1e-5, abs=1e-9), (tensor, field)
    assert eventdata.content(log, records.stats_tag("pool", "activation"))["shape"] == [8, 4, 4, 4]


def test_mirrored_probe_inside_and_outside_the_scope_log_the_same(mirrored):
    # Keras divides losses by the number of replicas only inside the scope.
    out, _ = mirrored
    outside, inside = eventdata.load(out / "outside"), eventdata.load(out / "inside")
    tags = eventdata.tensor_tags(outside)
    assert (
        tags == eventdata.tensor_tags(inside) and len(tags) == 13
    )  # 3 tensors x 3 records (histogram, stats, precision), routing, units, map, the digest
    for tag in tags:
        np.testing.assert_array_equal(
            eventdata.last(outside, tag), eventdata.last(inside, tag), err_msg=tag
        )


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.mark.slow
def test_multi_worker_only_the_chief_writes_and_training_is_unchanged(tmp_path):
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    processes = []
    try:
        for index in range(2):
            config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
            processes.append(
                subprocess.Popen(
                    [sys.executable, SCRIPT, "worker", str(tmp_path)],
                    env=script_env(TF_CONFIG=json.dumps(config)),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        outputs = [p.communicate(timeout=TIMEOUT) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (_, stderr) in zip(processes, outputs):
        assert p.returncode == 0, stderr[-3000:]
    chief, other = (parse_result(*o) for o in outputs)

    assert (chief["index"], chief["writes"], other["writes"]) == (0, True, False)
    assert chief["replicas"] == other["replicas"] == 2
    for result in (chief, other):
        assert result["mismatches"] == [] and result["rng_identical"], result
    assert chief["trainable_sha256"] == other["trainable_sha256"]

    # One event file, the chief's (its process id is in the name).
    files = os.listdir(tmp_path / "logs")
    assert len(files) == 1 and f".{chief['pid']}." in files[0], files
    log = eventdata.load(tmp_path / "logs")
    steps = [s for s, _ in eventdata.values(log, records.stats_tag("pool", "input_gradient"))]
    assert steps == list(range(1, 9))  # 2 epochs of 4 global batches of 8
    assert eventdata.stats(log, "pool", "input_gradient")["count"] == 8 * 8 * 8 * 4
