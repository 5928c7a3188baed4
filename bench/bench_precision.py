"""Cost of the precision record per log event: the host statistics with and without it.

Each repeat runs one log event of the callback (`GradVizCallback.log_now`:
probe pass, statistics, records, event write) on `--model` with `--layers`,
and times, on the very tensors that event summarised, the host statistics
(`kernels.summaries`) with the precision record (what the event computes)
and without it, interleaved, in alternating order. The extra per event is
the difference of the two over the event's time without the record (the
event's time minus that difference). Wall time and the process's CPU time
(all its threads: on a shared machine, others' load stretches the first,
not the second). Medians over `--repeats` and the figures of the minima;
the load average before and after.

`--statistics device` measures the device statistics instead
(`device_statistics`, on the Keras backend of KERAS_BACKEND, here on the
CPU): two probe passes of the same layers, one whose statistics count the
precision record and one whose do not (`precision=False`), each run whole
(`LayerCapture.run`: the pass, the statistics, the records), interleaved in
alternating order; the extra is the ratio of the two, less one.

Examples:
  python bench/bench_precision.py --model resnet50 --layers pool --repeats 9
  python bench/bench_precision.py --model resnet50 --layers all --repeats 7
  python bench/bench_precision.py --layers all --dtype-policy mixed_float16 --repeats 5
  KERAS_BACKEND=jax python bench/bench_precision.py --statistics device --layers all --repeats 5
"""

import functools
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (sets TF_CPP_MIN_LOG_LEVEL before TensorFlow loads)
import numpy as np  # noqa: E402
from bench_log_event import layer_spec  # noqa: E402

import tb_gradviz  # noqa: E402
from tb_gradviz.capture import device_statistics, kernels, probe, selection  # noqa: E402


def measure(args):
    import keras

    # Under mixed_float16 compile wraps the optimizer in a LossScaleOptimizer: the gradients are
    # float16, summarised divided by the loss scale, as a mixed precision run's are.
    keras.config.set_dtype_policy(args.dtype_policy)
    model = common.build_model(args.model, args.image_size, args.seed)
    x, y = common.batch(args.batch, args.image_size, args.seed)
    model.train_on_batch(x, y)
    layers, n_layers = layer_spec(model, args.layers)
    callback = tb_gradviz.GradVizCallback(tempfile.mkdtemp(), probe_data=(x, y), layers=layers)
    callback.set_model(model)
    original = kernels.summaries
    seen = []

    def recording(items, *rest, **kwargs):
        items = list(items)
        seen.append(items)
        return original(items, *rest, **kwargs)

    kernels.summaries = recording
    load_before = os.getloadavg()
    try:
        callback.log_now()  # traces
        rows = []  # per repeat: (wall, cpu) of the event, with the record, without
        for repeat in range(args.repeats):
            seen.clear()
            event = timed(callback.log_now)
            items = [item for call in seen for item in call]
            with_ = functools.partial(original, items, precision=True)
            without = functools.partial(original, items, precision=False)
            if repeat % 2:
                without_t, with_t = timed(without), timed(with_)
            else:
                with_t, without_t = timed(with_), timed(without)
            rows.append((*event, *with_t, *without_t))
    finally:
        kernels.summaries = original
    wall_event, cpu_event, wall_with, cpu_with, wall_without, cpu_without = (
        np.array(column) for column in zip(*rows)
    )
    row = {
        "model": args.model,
        "layers": args.layers,
        "n_layers": n_layers,
        "tensors": len(items),
        "tensors_divided": sum(divisor is not None for _, divisor in items),
        "values": int(sum(np.size(v) for v, _ in items)),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    for clock, event, with_, without in (
        ("wall", wall_event, wall_with, wall_without),
        ("cpu", cpu_event, cpu_with, cpu_without),
    ):
        extra = (with_ - without) / (event - (with_ - without))
        row.update(
            {
                f"{clock}_event_s": float(np.median(event)),
                f"{clock}_statistics_with_s": float(np.median(with_)),
                f"{clock}_statistics_without_s": float(np.median(without)),
                f"{clock}_min_statistics_with_s": float(with_.min()),
                f"{clock}_min_statistics_without_s": float(without.min()),
                f"{clock}_statistics_ratio": float(np.median(with_ / without)),
                f"{clock}_extra_per_event": float(np.median(extra)),
                f"{clock}_extra_per_event_of_minima": float(
                    (with_.min() - without.min()) / (event.min() - (with_.min() - without.min()))
                ),
            }
        )
    return row


def timed(fn):
    """Runs `fn()` once; returns its wall time and the process's CPU time, in seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure_device(args):
    """The device statistics' cost of the record: two probe passes, with and without it."""
    import keras

    model = common.build_model(args.model, args.image_size, args.seed)
    x, y = common.batch(args.batch, args.image_size, args.seed)
    model.train_on_batch(x, y)
    layers, n_layers = layer_spec(model, args.layers)
    chosen = selection.select_layers(model, layers)
    original = device_statistics.chunk_statistics
    without_record = functools.partial(original, precision=False)

    def run(capture, precision):
        # Looked up when each backend traces (JAX, TensorFlow) or calls (PyTorch) it.
        device_statistics.chunk_statistics = original if precision else without_record
        try:
            return capture.run(x, y)
        finally:
            device_statistics.chunk_statistics = original

    captures = {
        precision: probe.new_capture(model, chosen, statistics="device") for precision in (1, 0)
    }
    for precision, capture in captures.items():
        records, _ = run(capture, precision)  # traces
        kinds = [tag.rsplit("/", 1)[1] for tag, _, _ in records]
        assert ("precision" in kinds) == bool(precision), kinds
    load_before = os.getloadavg()
    rows = []
    for repeat in range(args.repeats):
        order = (1, 0) if repeat % 2 == 0 else (0, 1)
        times = {p: timed(functools.partial(run, captures[p], p)) for p in order}
        rows.append((*times[1], *times[0]))
    with_, with_cpu, without, without_cpu = (np.array(column) for column in zip(*rows))
    return {
        "backend": keras.backend.backend(),
        "statistics": "device",
        "model": args.model,
        "layers": args.layers,
        "n_layers": n_layers,
        "tensors": sum(len(plan.tensors) for plan in captures[1].plans),
        "pass_with_s": float(np.median(with_)),
        "pass_without_s": float(np.median(without)),
        "min_pass_with_s": float(with_.min()),
        "min_pass_without_s": float(without.min()),
        "extra_per_event": float(np.median(with_ / without - 1)),
        "extra_per_event_of_minima": float(with_.min() / without.min() - 1),
        "extra_per_event_cpu": float(np.median(with_cpu / without_cpu - 1)),
        "load_before": [round(v, 2) for v in load_before],
        "load_after": [round(v, 2) for v in os.getloadavg()],
    }


def main():
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--model", choices=["cnn", "resnet50"], default="resnet50")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument(
        "--layers", default="pool", help="pool, all, or a number of evenly spaced layers"
    )
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument(
        "--dtype-policy",
        choices=["float32", "mixed_float16"],
        default="float32",
        help="the Keras dtype policy of the model (host statistics)",
    )
    p.add_argument(
        "--statistics",
        choices=["host", "device"],
        default="host",
        help="host: the host kernels' cost of the record; device: the device statistics'",
    )
    args = p.parse_args()
    if args.smoke:
        args.model, args.image_size, args.batch, args.layers, args.repeats = "cnn", 16, 4, "all", 2
    row = (measure_device if args.statistics == "device" else measure)(args)
    print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"script": "bench_precision", "args": vars(args), "rows": [row]})


if __name__ == "__main__":
    main()
