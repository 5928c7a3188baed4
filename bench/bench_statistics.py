"""Where a log event's time goes: the statistics kernels, the checksums, and one event taken apart.

Three parts, each a row:

- `kernels`: one 16x34x34x64 float32 tensor (ReLU-like, 1.2 M values):
  `records`' numpy definition, the one-value-at-a-time numba kernel
  (`kernels._summary`, what float64, loss-scaled and non-finite values use)
  and the float32 kernel (`kernels.summary`), best of `--repeats`; and the
  kernels' first compile with an empty numba cache (in a subprocess).
- `crc`: TFRecord checksums per MB, TensorBoard's pure-Python
  `masked_crc32c` against `events.masked_crc32c` (google-crc32c).
- `event`: one log event of `--model` with `--layers` chosen, taken apart:
  the compiled pass, `np.asarray` of its outputs, the statistics on one
  thread and on all, the records and the event write; with the number of
  summarised items, of values, and the bytes they hold at once.

Examples:
  python bench/bench_statistics.py --json bench/results/statistics.json
  python bench/bench_statistics.py --model resnet50 --layers all
"""

import functools
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (sets TF_CPP_MIN_LOG_LEVEL before TensorFlow loads)
import numpy as np  # noqa: E402

from tb_gradviz.capture import kernels  # noqa: E402
from tb_gradviz.format import events, records, summaries  # noqa: E402

_COMPILE_SNIPPET = """
import time
import numpy as np
from tb_gradviz.capture import kernels
start = time.perf_counter()
kernels.summary(np.ones(10, np.float32))
middle = time.perf_counter()
kernels.summary(np.ones(10))
kernels.summary(np.ones(10, np.float32), 2.0)
print(middle - start, time.perf_counter() - middle)
"""


def best(fn, repeats):
    fn()
    return min(common.seconds(fn) for _ in range(repeats))


def compile_seconds(cache_dir):
    """`(float32 kernel, the others)` first-call seconds in a fresh process.

    numba's cache is in `cache_dir`.
    """
    output = subprocess.run(
        [sys.executable, "-c", _COMPILE_SNIPPET],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, NUMBA_CACHE_DIR=cache_dir),
    ).stdout
    return [float(v) for v in output.split()]


def kernels_row(args):
    rng = np.random.default_rng(args.seed)
    shape = (2, 8, 8, 4) if args.smoke else (16, 34, 34, 64)
    values = np.maximum(rng.standard_normal(shape), 0).astype(np.float32)
    flat = values.reshape(-1)
    one_at_a_time = lambda: kernels._summary(  # noqa: E731
        flat, 1.0, records.HISTOGRAM_BUCKETS, kernels._OCTAVE_BIN, kernels._OCTAVE_EDGE
    )
    with tempfile.TemporaryDirectory() as cache:
        cold = compile_seconds(cache)
        warm = compile_seconds(cache)
    return {
        "part": "kernels",
        "values": values.size,
        "numpy_ms": best(
            lambda: (summaries.linear_histogram(values), summaries.stats_vector(values)),
            args.repeats,
        )
        * 1e3,
        "one_value_kernel_ms": best(one_at_a_time, args.repeats) * 1e3,
        "float32_kernel_ms": best(lambda: kernels.summary(values), args.repeats) * 1e3,
        "compile_float32_s": cold[0],
        "compile_others_s": cold[1],
        "cached_load_float32_s": warm[0],
    }


def crc_row(args):
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    data = np.random.default_rng(args.seed).bytes(64 << 10 if args.smoke else 1 << 20)
    megabytes = len(data) / (1 << 20)
    assert masked_crc32c(data) == events.masked_crc32c(data)
    return {
        "part": "crc",
        "bytes": len(data),
        "tensorboard_ms_per_mb": best(lambda: masked_crc32c(data), 1 if args.smoke else 3)
        * 1e3
        / megabytes,
        "google_crc32c_ms_per_mb": best(lambda: events.masked_crc32c(data), args.repeats)
        * 1e3
        / megabytes,
    }


def event_row(args):
    from bench_log_event import layer_spec  # the same layer choices as the log-event bench

    from tb_gradviz.capture import probe, selection

    model = common.build_model(args.model, args.image_size, args.seed)
    x, y = common.batch(args.batch, args.image_size, args.seed)
    model.train_on_batch(x, y)
    layers, n_layers = layer_spec(model, args.layers)
    pass_ = probe.new_capture(model, selection.select_layers(model, layers))
    log = events.EventLog(tempfile.mkdtemp())
    pass_.run(x, y)  # traces
    rows = []
    for _ in range(args.repeats):
        step = common.seconds(lambda: model.train_on_batch(x, y))
        with model.distribute_strategy.scope():
            outputs, pass_s = timed(lambda: pass_._probe(x, y, None))
        arrays, asarray_s = timed(functools.partial(_to_numpy, outputs["values"]))
        items = [(values, None) for values in arrays]
        one_thread_s = common.seconds(functools.partial(kernels.summaries, items, workers=1))
        all_threads_s = common.seconds(functools.partial(kernels.summaries, items))
        written, run_s = timed(lambda: pass_.run(x, y)[0])
        write_s = common.seconds(functools.partial(log.write, len(rows), written))
        rows.append(
            dict(
                train_step_s=step,
                pass_s=pass_s,
                asarray_s=asarray_s,
                one_thread_s=one_thread_s,
                all_threads_s=all_threads_s,
                run_s=run_s,
                write_s=write_s,
            )
        )
    log.close()
    row = {
        "part": "event",
        "model": args.model,
        "layers": args.layers,
        "n_layers": n_layers,
        "batch": args.batch,
        "items": len(items),
        "values": int(sum(v.size for v, _ in items)),
        "bytes_held": int(sum(v.nbytes for v, _ in items)),
    }
    for key in rows[0]:
        row[key] = common.median([r[key] for r in rows])
    return row


def _to_numpy(tensors):
    return [np.asarray(t) for t in tensors]


def timed(fn):
    """`(fn(), seconds)`."""
    values = []
    seconds = common.seconds(lambda: values.append(fn()))
    return values[0], seconds


def main():
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--model", choices=["cnn", "resnet50"], default="resnet50")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--layers", default="all", help="pool, all, or a number of evenly spaced layers")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    if args.smoke:
        args.model, args.image_size, args.batch, args.layers, args.repeats = "cnn", 16, 4, "all", 2
    rows = [kernels_row(args), crc_row(args), event_row(args)]
    for row in rows:
        print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"script": "bench_statistics", "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
