"""Damaged event files next to good runs, served by a real `tensorboard` with each loader.

A truncated file (training killed mid-write), a record whose data fails its
CRC (a flipped bit on disk) and garbage bytes must not stop the plugin from
serving the other runs. What each loader serves of the damaged run itself is
pinned here and described in docs/API.md ("Damaged event files").
"""

import pathlib
import struct
import time
import urllib.parse

import limits
import pytest
import synthetic
from tbserver import get_json, running_tensorboard
from tensorboard.compat.proto import event_pb2

pytestmark = pytest.mark.slow

PREFIX = "/data/plugin/gradviz"
STEPS = 8
LAYERS = 2
# Every damaged run is cut or corrupted at the record of this step.
DAMAGED_STEP = 5


def _record_offsets(path):
    """Start offsets of the TFRecords of an event file (the first is the file_version event)."""
    data = pathlib.Path(path).read_bytes()
    offsets, position = [], 0
    while position < len(data):
        offsets.append(position)
        (length,) = struct.unpack("<Q", data[position : position + 8])
        position += 8 + 4 + length + 4
    assert position == len(data)
    return offsets


def _step_record(path, step):
    """`(start, end)` of the record that holds `step`'s records (its digest record follows it)."""
    data = pathlib.Path(path).read_bytes()
    offsets = _record_offsets(path) + [len(data)]
    for start, end in zip(offsets[1:], offsets[2:]):
        event = event_pb2.Event.FromString(data[start + 12 : end - 4])
        tags = [value.tag for value in event.summary.value]
        if event.step == step and any(not t.startswith("gradviz_digest") for t in tags):
            return start, end
    raise AssertionError(f"no record of step {step} in {path}")


def _event_file(run_dir):
    (path,) = pathlib.Path(run_dir).glob("events.out.tfevents.*")
    return path


def _write_damaged_logdir(logdir):
    for run in ("good_a", "good_b"):
        synthetic.write_run(logdir / run, layers=LAYERS, steps=STEPS, seed=len(run))
    synthetic.write_run(logdir / "truncated", layers=LAYERS, steps=STEPS)
    truncated = _event_file(logdir / "truncated")
    whole = truncated.read_bytes()
    start, end = _step_record(truncated, DAMAGED_STEP)
    # Cut in the middle of step 5's data: a writer killed mid-record.
    truncated.write_bytes(whole[: (start + end) // 2])

    synthetic.write_run(logdir / "bad_crc", layers=LAYERS, steps=STEPS)
    path = _event_file(logdir / "bad_crc")
    start, end = _step_record(path, DAMAGED_STEP)
    data = bytearray(path.read_bytes())
    # One flipped bit inside step 5's tensor bytes: the length and its CRC
    # are intact, the data CRC fails.
    data[(start + end) // 2] ^= 0x01
    path.write_bytes(bytes(data))

    synthetic.write_run(logdir / "garbage_tail", layers=LAYERS, steps=DAMAGED_STEP - 1)
    path = _event_file(logdir / "garbage_tail")
    # Seeded garbage after four good records: a length field that is not one.
    rng_bytes = bytes((i * 197 + 13) % 256 for i in range(4096))
    path.write_bytes(path.read_bytes() + rng_bytes)

    # A run whose only file is garbage, named like an event file.
    (logdir / "garbage_only").mkdir()
    (logdir / "garbage_only" / "events.out.tfevents.1700000000.host.1.0.gradviz").write_bytes(
        rng_bytes
    )
    return truncated, whole


def _steps(url, run):
    query = urllib.parse.urlencode({"run": run, "layer": "block1/pool", "tensor": "input_gradient"})
    return get_json(f"{url}{PREFIX}/series?{query}")["steps"]


def _served(url):
    """`{run: steps of one series}` for every run `/runs` lists."""
    runs = get_json(f"{url}{PREFIX}/runs")["runs"]
    return {entry["run"]: _steps(url, entry["run"]) for entry in runs}


# Both loaders read a file record by record and serve every event before
# the damage, and nothing after it in that file (the Rust data server logs a
# warning naming the file and the checksum; the Python loader stops quietly).
EXPECTED = {
    "good_a": list(range(1, STEPS + 1)),
    "good_b": list(range(1, STEPS + 1)),
    "truncated": list(range(1, DAMAGED_STEP)),
    "bad_crc": list(range(1, DAMAGED_STEP)),
    "garbage_tail": list(range(1, DAMAGED_STEP)),
}


@pytest.mark.parametrize("load_fast", ["false", "true"])
def test_damaged_event_files_do_not_stop_the_other_runs(tmp_path, load_fast):
    logdir = tmp_path / "logs"
    whole = _write_damaged_logdir(logdir)

    def good_runs_loaded(url):
        served = _served(url)
        return all(served.get(run) == list(range(1, STEPS + 1)) for run in ("good_a", "good_b"))

    extra = [f"--load_fast={load_fast}", "--reload_interval=1"]
    with running_tensorboard(logdir, tmp_path / "tensorboard.log", good_runs_loaded, extra) as url:
        # Two more reload cycles: nothing more arrives, nothing is lost.
        time.sleep(2.5)
        expected = dict(EXPECTED)
        if load_fast == "true":
            # The Rust data server checks each record's length CRC, not its
            # data CRC: a flipped bit in a tensor's bytes is served as read.
            expected["bad_crc"] = list(range(1, STEPS + 1))
        assert _served(url) == expected
        # The grid of a damaged run works too, at its last good step.
        assert get_json(f"{url}{PREFIX}/step?run=truncated")["step"] == DAMAGED_STEP - 1
        assert get_json(f"{url}{PREFIX}/step?run=good_a&step=3")["step"] == 3

        # A file cut mid-record is also what a writer still writing leaves:
        # once the record is whole, both loaders go on from where they stopped.
        path, whole = whole
        with open(path, "ab") as stream:
            stream.write(whole[path.stat().st_size :])
        deadline = time.monotonic() + limits.POLL_S
        while _steps(url, "truncated") != list(range(1, STEPS + 1)):
            assert time.monotonic() < deadline, (
                f"truncated run after completion: {_steps(url, 'truncated')}"
            )
            time.sleep(0.5)


@pytest.mark.parametrize("load_fast", ["false", "true"])
def test_steps_appended_to_an_open_event_file_are_served_after_a_reload(tmp_path, load_fast):
    """TensorBoard reading while training writes: the same file grows, the plugin follows."""
    import numpy as np

    from tb_gradviz.format import events

    logdir = tmp_path / "logs"
    rng = np.random.default_rng(0)
    log = events.EventLog(logdir / "training")
    first, more = 4, 6
    try:
        for step in range(1, first + 1):
            log.write(step, synthetic.pool_records(rng, "block1/pool", 0, step=step))

        def first_steps_served(url):
            return _steps(url, "training") == list(range(1, first + 1))

        extra = [f"--load_fast={load_fast}", "--reload_interval=1"]
        with running_tensorboard(
            logdir, tmp_path / "tensorboard.log", first_steps_served, extra
        ) as url:
            for step in range(first + 1, first + more + 1):
                log.write(step, synthetic.pool_records(rng, "block1/pool", 0, step=step))
            expected = list(range(1, first + more + 1))
            deadline = time.monotonic() + limits.POLL_S
            while _steps(url, "training") != expected:
                assert time.monotonic() < deadline, (
                    f"steps after appending: {_steps(url, 'training')}"
                )
                time.sleep(0.5)
            assert get_json(f"{url}{PREFIX}/step?run=training")["step"] == first + more
            query = urllib.parse.urlencode({"run": "training", "layer": "block1/pool"})
            assert get_json(f"{url}{PREFIX}/routing?{query}")["steps"] == expected
            # Only one file: the steps came from the file that was open all along.
            assert len(list((logdir / "training").glob("events.out.tfevents.*"))) == 1
    finally:
        log.close()
