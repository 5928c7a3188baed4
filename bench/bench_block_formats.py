"""Cost of the host block record (`block_counts.block_records`, all six formats of a tensor).

Two measurements:

* `--part kernel`: ns per value of `block_records` on one float32 tensor of
  `--values` values (gradient-like: normal values over 12 decades, 30 %
  zeros), against one read of the tensor (the largest magnitude, a vectorized
  pass) and against the kernel at `--before` (a git revision of
  tb_gradviz/capture/block_counts.py, loaded from `git show`), interleaved in
  alternating order; the process's CPU time and wall time, medians and minima.
* `--part event`: ResNet50 (`--image-size`, `--batch`, TensorFlow on the CPU)
  with `--layers` (pool or all). Each repeat runs two log events of the
  callback (`log_now`), in alternating order: one as it is, one without the
  block part (the capture's `block_formats` off), and times
  `block_records` over the very tensors the event summarised (taken from
  `kernels.summaries`, as `bench_precision` does), once on this thread and
  once on threads (largest first, one per CPU, as `assemble` runs it). The
  extra per event, through the callback: the event with the block part over
  the event without, less one; directly: the block records' CPU time on this
  thread over the event's without them. `bench_full_event.py` measures the
  block part inside the host pass.

Examples:
  python bench/bench_block_formats.py --part kernel --repeats 7
  python bench/bench_block_formats.py --part event --layers pool --repeats 9
  python bench/bench_block_formats.py --part event --layers all --repeats 5
"""

import concurrent.futures
import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (sets TF_CPP_MIN_LOG_LEVEL before TensorFlow loads)
import numba  # noqa: E402
import numpy as np  # noqa: E402

from tb_gradviz.capture import block_counts  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(fn):
    """Runs `fn()` once; returns its wall time and the process's CPU time, in seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


@numba.njit(nogil=True, cache=True)
def one_read(values):
    """The largest magnitude's bits: one vectorized read of the tensor, the floor of any pass."""
    bits = values.view(np.int32)
    top = np.int32(0)
    for i in range(bits.size):
        top = max(top, bits[i] & np.int32(0x7FFFFFFF))
    return top


def kernel_at(revision):
    """`block_counts` as it was at `revision`, imported from `git show` into a temporary file."""
    source = subprocess.run(
        ["git", "show", f"{revision}:tb_gradviz/capture/block_counts.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = os.path.join(tempfile.mkdtemp(), f"block_counts_{revision}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(f"block_counts_{revision}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gradient_like(size, seed):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(size) * np.exp(rng.uniform(-14, 14, size))
    values[rng.random(size) < 0.3] = 0
    return values.astype(np.float32).reshape(-1, 4096 if size % 4096 == 0 else 32)


def measure_kernel(args):
    values = gradient_like(args.values, args.seed)
    before = kernel_at(args.before)
    cases = {
        "one_read": lambda: one_read(values.reshape(-1)),
        "after": lambda: block_counts.block_records(values),
        "before": lambda: before.block_records(values),
    }
    for fn in cases.values():  # compiles
        fn()
    counted = ("to_zero", "subnormal", "saturated", "wide_blocks", "nonfinite_blocks")
    for name, record in block_counts.block_records(values).items():
        old = before.block_record(values, name)
        assert all(record[k] == old[k] for k in counted), (name, record, old)
    times = {name: [] for name in cases}
    for repeat in range(args.repeats):
        order = list(cases) if repeat % 2 == 0 else list(reversed(cases))
        for name in order:
            times[name].append(timed(cases[name]))
    row = {"values": int(values.size), "before": args.before}
    for name, rows in times.items():
        wall, cpu = (np.array(column) * 1e9 / values.size for column in zip(*rows))
        row[f"{name}_cpu_ns"] = float(np.median(cpu))
        row[f"{name}_wall_ns"] = float(np.median(wall))
        row[f"{name}_min_cpu_ns"] = float(cpu.min())
    row["after_over_one_read"] = row["after_cpu_ns"] / row["one_read_cpu_ns"]
    row["before_over_after"] = row["before_cpu_ns"] / row["after_cpu_ns"]
    return row


def serially(arrays):
    for array in arrays:
        block_counts.block_records(array)


def in_threads(arrays):
    """`block_records` of each array on one thread per CPU, largest first, as capture runs the
    host kernels (`kernels._in_threads`)."""
    workers = min(len(arrays), len(os.sched_getaffinity(0)))
    order = sorted(arrays, key=lambda a: -a.size)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(block_counts.block_records, order))


def measure_event(args):
    from bench_log_event import layer_spec

    import tb_gradviz
    from tb_gradviz.capture import kernels

    model = common.build_model("resnet50", args.image_size, args.seed)
    x, y = common.batch(args.batch, args.image_size, args.seed)
    model.train_on_batch(x, y)
    layers, n_layers = layer_spec(model, args.layers)
    callback = tb_gradviz.GradVizCallback(tempfile.mkdtemp(), probe_data=(x, y), layers=layers)
    callback.set_model(model)
    wired = True
    original_summaries = kernels.summaries
    seen = []

    def recording(items, *rest, **kwargs):
        items = list(items)
        seen.append(items)
        return original_summaries(items, *rest, **kwargs)

    def event(with_blocks):
        callback._capture.block_formats = with_blocks
        return timed(callback.log_now)

    kernels.summaries = recording
    load_before = os.getloadavg()
    rows = []
    try:
        callback.log_now()  # traces
        for repeat in range(args.repeats):
            seen.clear()
            order = (True, False) if repeat % 2 == 0 else (False, True)
            times = {with_blocks: event(with_blocks) for with_blocks in order}
            arrays = [np.asarray(v) for v, _ in seen[0]]
            serial = functools.partial(serially, arrays)
            threaded = functools.partial(in_threads, arrays)
            if repeat % 2:
                threads, serial = timed(threaded), timed(serial)
            else:
                serial, threads = timed(serial), timed(threaded)
            rows.append((*times[True], *times[False], *serial, *threads))
    finally:
        kernels.summaries = original_summaries
    (
        with_wall,
        with_cpu,
        without_wall,
        without_cpu,
        serial_wall,
        serial_cpu,
        threads_wall,
        threads_cpu,
    ) = (np.array(column) for column in zip(*rows))
    values = int(sum(a.size for a in arrays))
    row = {
        "model": "resnet50",
        "image_size": args.image_size,
        "batch": args.batch,
        "layers": args.layers,
        "n_layers": n_layers,
        "tensors": len(arrays),
        "values": values,
        "wired": wired,
        "event_without_cpu_s": float(np.median(without_cpu)),
        "event_without_wall_s": float(np.median(without_wall)),
        "blocks_serial_cpu_s": float(np.median(serial_cpu)),
        "blocks_serial_wall_s": float(np.median(serial_wall)),
        "blocks_threads_cpu_s": float(np.median(threads_cpu)),
        "blocks_threads_wall_s": float(np.median(threads_wall)),
        "ns_per_value_cpu": float(np.median(serial_cpu) / values * 1e9),
        "extra_direct_cpu": float(np.median(serial_cpu / without_cpu)),
        "extra_direct_cpu_of_minima": float(serial_cpu.min() / without_cpu.min()),
        "load_before": [round(v, 2) for v in load_before],
        "load_after": [round(v, 2) for v in os.getloadavg()],
    }
    if wired:
        row.update(
            {
                "event_with_cpu_s": float(np.median(with_cpu)),
                "event_with_wall_s": float(np.median(with_wall)),
                "extra_callback_cpu": float(np.median(with_cpu / without_cpu - 1)),
                "extra_callback_wall": float(np.median(with_wall / without_wall - 1)),
                "extra_callback_cpu_of_minima": float(with_cpu.min() / without_cpu.min() - 1),
            }
        )
    return row


def main():
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--part", choices=["kernel", "event"], default="kernel")
    p.add_argument("--values", type=int, default=1 << 22, help="the kernel part's tensor size")
    p.add_argument("--before", default="e12aa94", help="git revision of the kernel before")
    p.add_argument("--layers", default="pool", help="pool or all (the event part)")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    if args.smoke:
        args.values, args.image_size, args.batch, args.repeats = 1 << 14, 32, 2, 2
    row = (measure_kernel if args.part == "kernel" else measure_event)(args)
    print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(
        args.json, {"script": "bench_block_formats", "args": vars(args), "rows": [row]}
    )


if __name__ == "__main__":
    main()
