"""Cost of a full log event with and without the block part, against a train step.

`--part host` (TensorFlow on the CPU, the host kernels): ResNet50
(`--image-size`, `--batch`) with `--layers` (pool or all). Each repeat runs,
in alternating order: a train step (`train_on_batch` of the probe batch), a
log event (`log_now`) with the block part and one without
(`block_formats=False`), and, over the very tensors the event summarised,
the host pass three ways: the statistics and casts' counts alone, with the
block part inside the same pass (`kernels.summaries(..., block_formats=True)`,
what capture runs), and with the block part in a pass of its own after them
(`assemble.block_fields`, what capture ran before). Medians of wall and of
the process's CPU time, and the medians of the per-repeat ratios.

`--part compile` (KERAS_BACKEND jax or tensorflow): the device statistics
of the chosen layers' tensors (activation, both gradients, of the real
shapes: a pool of random values tiled), with and without the block part,
compiled as `--programs` says: `grouped`, one program per distinct chunk of
the packed tensors (`device_programs.GroupPrograms`, what the passes run),
or `one` program over every group. Seconds to trace, compile and run once
(wall, and the process's CPU time; less a later call's CPU time: the compile
alone), the programs traced, the median seconds (wall, CPU) per event after,
and the host pass over the same values (`kernels.summaries`,
what capture runs on a CPU) in the same process, with its ratio.

Examples:
  python bench/bench_full_event.py --part host --layers pool --repeats 9
  python bench/bench_full_event.py --part host --layers all --repeats 5
  KERAS_BACKEND=jax python bench/bench_full_event.py --part compile --layers all
  python bench/bench_full_event.py --part compile --layers all --programs grouped,one
"""

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (sets TF_CPP_MIN_LOG_LEVEL before TensorFlow loads)
import numpy as np  # noqa: E402


def timed(fn):
    """Runs `fn()` once; returns its wall time and the process's CPU time, in seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def event_tensors(args):
    """`(model, x, y, callback, items)`: a callback over `--layers` that has logged once, and
    the `(values, divisor)` its host pass summarised."""
    from bench_log_event import layer_spec

    import tb_gradviz
    from tb_gradviz.capture import kernels

    model = common.build_model("resnet50", args.image_size, args.seed)
    x, y = common.batch(args.batch, args.image_size, args.seed)
    model.train_on_batch(x, y)
    layers, _ = layer_spec(model, args.layers)
    callback = tb_gradviz.GradVizCallback(tempfile.mkdtemp(), probe_data=(x, y), layers=layers)
    callback.set_model(model)
    original, seen = kernels.summaries, []

    def recording(items, *rest, **kwargs):
        items = list(items)
        seen.append(items)
        return original(items, *rest, **kwargs)

    kernels.summaries = recording
    try:
        callback.log_now()  # traces the probe pass
    finally:
        kernels.summaries = original
    return model, x, y, callback, seen[0]


def measure_host(args):
    from tb_gradviz.capture import assemble, kernels

    model, x, y, callback, items = event_tensors(args)
    arrays = [values for values, _ in items]

    def event(block_formats):
        def run():
            callback._capture.block_formats = block_formats
            callback.log_now()

        return run

    cases = {
        "train": lambda: model.train_on_batch(x, y),
        "event_blocks": event(True),
        "event_casts": event(False),
        "host_casts": lambda: kernels.summaries(items, precision=True),
        "host_fused": lambda: kernels.summaries(items, precision=True, block_formats=True),
        "host_apart": lambda: (
            kernels.summaries(items, precision=True),
            assemble.block_fields(arrays),
        ),
    }
    for fn in cases.values():  # compiles
        fn()
    load_before = os.getloadavg()
    times = {name: [] for name in cases}
    for repeat in range(args.repeats):
        order = list(cases) if repeat % 2 == 0 else list(reversed(cases))
        for name in order:
            times[name].append(timed(cases[name]))
    wall = {name: np.array([t[0] for t in rows]) for name, rows in times.items()}
    cpu = {name: np.array([t[1] for t in rows]) for name, rows in times.items()}
    fused_part = cpu["host_fused"] - cpu["host_casts"]
    row = {
        "layers": args.layers,
        "image_size": args.image_size,
        "batch": args.batch,
        "tensors": len(arrays),
        "values": int(sum(np.size(a) for a in arrays)),
        "repeats": args.repeats,
    }
    for name in cases:
        row[f"{name}_wall_s"] = float(np.median(wall[name]))
        row[f"{name}_cpu_s"] = float(np.median(cpu[name]))
    row.update(
        {
            "event_blocks_over_train": float(np.median(wall["event_blocks"] / wall["train"])),
            "event_casts_over_train": float(np.median(wall["event_casts"] / wall["train"])),
            "event_added_wall": float(np.median(wall["event_blocks"] / wall["event_casts"] - 1)),
            "event_added_cpu": float(np.median(cpu["event_blocks"] / cpu["event_casts"] - 1)),
            "fused_added_of_event_cpu": float(
                np.median((cpu["host_fused"] - cpu["host_casts"]) / cpu["event_casts"])
            ),
            "apart_added_of_event_cpu": float(
                np.median((cpu["host_apart"] - cpu["host_casts"]) / cpu["event_casts"])
            ),
            "fused_over_apart_block_part_cpu": float(
                np.median(fused_part / (cpu["host_apart"] - cpu["host_casts"]))
            ),
            "load_before": [round(v, 2) for v in load_before],
            "load_after": [round(v, 2) for v in os.getloadavg()],
        }
    )
    return row


def main():
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--part", choices=["host", "compile"], default="host")
    p.add_argument("--layers", default="pool", help="pool or all")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--programs",
        default="grouped",
        help="compile: grouped (one program per distinct group), one (one over every group)",
    )
    args = p.parse_args()
    if args.smoke:
        args.image_size, args.batch, args.repeats = 32, 2, 2
        args.layers = "pool" if args.part == "compile" else args.layers
    row = measure_host(args) if args.part == "host" else measure_compile(args)
    print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"script": "bench_full_event", "args": vars(args), "rows": [row]})


def measure_compile(args):
    import functools
    import inspect

    import keras
    from bench_device_blocks import _backend_functions, layer_shapes

    from tb_gradviz.capture import device_statistics

    try:
        from tb_gradviz.capture.device_programs import GroupPrograms
    except ImportError:  # an earlier commit (PYTHONPATH=<its worktree>), for before and after
        GroupPrograms = device_statistics.GroupPrograms
    packing = {"compile_packing": False}
    if "compile_packing" not in inspect.signature(GroupPrograms).parameters:
        packing = {}

    backend = keras.backend.backend()
    model = common.build_model("resnet50", args.image_size, args.seed)
    shapes = [s for _, layer in layer_shapes(model, args.layers, args.batch) for s in layer]
    rng = np.random.default_rng(args.seed)
    pool = (rng.standard_normal(1 << 22) * np.exp(rng.uniform(-8, 8, 1 << 22))).astype("float32")
    arrays = [np.resize(pool, s) for s in shapes]
    tensors = [keras.ops.convert_to_tensor(a) for a in arrays]
    widths = [s[-1] for s in shapes]
    keys = [(int(np.prod(s)), "float32", False, w) for s, w in zip(shapes, widths)]
    groups = device_statistics.chunks(keys)
    scaled = [False] * len(tensors)
    sync, one_program = _backend_functions(backend)
    if backend == "jax":
        import jax

        compile = functools.partial(GroupPrograms, jax.jit)
        mode = device_statistics.mode_for(jax.devices()[0].platform)

        def divisor():
            return jax.numpy.float64(1.0)

        def context():
            return jax.enable_x64(True)

        def outer(run):
            return run
    else:
        import contextlib

        import tensorflow as tf

        from tb_gradviz.capture.backends import tf_statistics

        compile = functools.partial(GroupPrograms, tf_statistics._compile, **packing)
        gpu = bool(tf.config.list_physical_devices("GPU"))
        mode = device_statistics.mode_for("gpu" if gpu else "cpu")

        def divisor():
            return tf.constant(1.0, tf.float64)

        context = contextlib.nullcontext

        def outer(run):  # the pass's own tf.function, as it calls the statistics
            return tf.function(run, autograph=False)

    def grouped(block_widths):
        programs = compile(mode)

        def run(tensors):
            with context():
                return programs(groups, scaled, tensors, divisor(), block_widths)

        return outer(run), programs

    row = {
        "backend": backend,
        "layers": args.layers,
        "image_size": args.image_size,
        "batch": args.batch,
        "tensors": len(tensors),
        "groups": len(groups),
        "load_before": [round(v, 2) for v in os.getloadavg()],
    }
    for programs_kind in args.programs.split(","):
        for name, block_widths in (("blocks", widths), ("casts", None)):
            if programs_kind == "grouped":
                fn, programs = grouped(block_widths)
            else:
                fn, programs = one_program(groups, scaled, block_widths), None
            label = f"{programs_kind}_{name}"
            once = functools.partial(lambda f: sync(f(tensors)), fn)
            row[f"{label}_compile_s"], row[f"{label}_compile_cpu_s"] = timed(once)
            after = [timed(once) for _ in range(args.repeats)]
            row[f"{label}_event_s"] = float(np.median([wall for wall, _ in after]))
            row[f"{label}_event_cpu_s"] = float(np.median([cpu for _, cpu in after]))
            # The first call less a later one: what tracing and compiling took.
            row[f"{label}_compile_only_cpu_s"] = (
                row[f"{label}_compile_cpu_s"] - row[f"{label}_event_cpu_s"]
            )
            if programs is not None:
                row[f"{label}_programs"] = len(programs.programs)
                row[f"{label}_traces"] = programs.traces
                row[f"{label}_pack_traces"] = getattr(programs, "pack_traces", 0)
            host = _host_event(arrays, block_formats=block_widths is not None)
            row[f"{label}_host_event_s"] = float(
                np.median([common.seconds(host) for _ in range(args.repeats)])
            )
            row[f"{label}_event_over_host"] = row[f"{label}_event_s"] / row[f"{label}_host_event_s"]
            print(label, {k: v for k, v in row.items() if k.startswith(label)}, flush=True)
    row["load_after"] = [round(v, 2) for v in os.getloadavg()]
    return row


def _host_event(arrays, block_formats):
    """The host pass over `arrays` (`kernels.summaries`, as capture runs it on a CPU), compiled."""
    from tb_gradviz.capture import kernels

    items = [(a, None) for a in arrays]

    def run():
        kernels.summaries(items, precision=True, block_formats=block_formats)

    run()
    return run


if __name__ == "__main__":
    main()
