"""ResNet50's pooling layers logged in a real `fit` at `every_n_batches=10`, then served.

`keras.applications.ResNet50(weights=None)` at 64 x 64 x 3, 10 classes, Adam
(`common.build_model`), trains `--steps` steps at batch 16 on generated data
(fixed seed) twice, each time freshly built, in the `--order` asked: without
the callback (the baseline) and with `GradVizCallback(run, probe,
every_n_batches=10)` and every other argument at its default (its layers: the
pooling layers, `pool1_pool` and `avg_pool`; `full_records=100`; block
formats on). Then:
- fit wall time with and without, their ratio, steps/s (over the whole fit, and
  after the first step, which compiles the train step); the callback's own
  measure of its log events' time and share (`budget.Budget`, kept without a
  budget too), taken inside the one fit, so a load that changes between
  the two fits does not move it;
- log events and full-record events in the files, bytes on disk;
- `tb-gradviz check --format json`: exit, time, the flags and warnings raised;
- a plain `tensorboard --logdir` (no flags): `/runs`, `/onset`, `/timeline`
  cold then warm, `/step` at the middle logged step (its full records or not).

`--order with-only` trains only the fit with the callback (its logdir,
`check` and the served run; no ratio): what the warnings raise on it.

    python bench/bench_resnet_fit.py --steps 1000 --json bench/results/resnet_fit.json
    python bench/bench_resnet_fit.py --order with-only --logdir DIR --json J
"""

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_disk  # noqa: E402
import bench_real_fit  # noqa: E402
import common  # noqa: E402
import tbserver  # noqa: E402  (bench_real_fit put tests/ on the path)

IMAGE_SIZE, BATCH, SAMPLES, EVERY = 64, 16, 1600, 10


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def fit(args, callbacks):
    """Builds ResNet50 afresh and trains it `args.steps` steps.

    Returns `(seconds, seconds after the first step ended, steps)`.
    """
    import keras
    import numpy as np

    keras.backend.clear_session()
    model = common.build_model("resnet50", IMAGE_SIZE, args.seed)
    x, y = common.batch(SAMPLES, IMAGE_SIZE, args.seed)
    per_epoch = min(args.steps, SAMPLES // BATCH)
    first = []
    mark = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: first or first.append(time.perf_counter())
    )
    start = time.perf_counter()
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=-(-args.steps // per_epoch),
        steps_per_epoch=per_epoch,
        verbose=0,
        callbacks=[mark, *callbacks(x, y)],
    )
    end = time.perf_counter()
    return end - start, end - first[0], int(np.asarray(model.optimizer.iterations))


def raised(entries):
    """`[(flag, class, step, layer, tensor)]` of `/onset`-style onset entries."""
    return [[e.get(k) for k in ("flag", "class", "step", "layer", "tensor")] for e in entries]


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument(
        "--order",
        choices=("without-first", "with-first", "with-only"),
        default="without-first",
        help="which fit runs first: the baseline (default) or the one with the callback; "
        "with-only: the fit with the callback alone",
    )
    p.add_argument("--logdir", help="where the run is written (default: a temporary folder)")
    args = p.parse_args()
    if args.smoke:
        args.steps = 30

    import keras

    import tb_gradviz

    logdir = args.logdir or tempfile.mkdtemp(prefix="resnet_fit_")
    run = os.path.join(logdir, "resnet50")
    result = {"backend": keras.backend.backend(), "loadavg_start": loadavg()}

    chosen = []

    def with_callback(x, y):
        callback = tb_gradviz.GradVizCallback(run, (x[:BATCH], y[:BATCH]), every_n_batches=EVERY)
        chosen.append(callback)
        return [callback]

    steps = {}
    sides = {
        "without-first": ("without", "with"),
        "with-first": ("with", "without"),
        "with-only": ("with",),
    }[args.order]
    for side in sides:
        timed = fit(args, with_callback if side == "with" else lambda x, y: [])
        result[f"fit_{side}_s"], result[f"after_first_{side}_s"], steps[side] = timed
        print(result, flush=True)
    assert steps["with"] == steps.get("without", steps["with"]), steps
    result["steps"] = steps["with"]
    # The callback's own measure: its log events' wall time and the training time between them.
    budget = chosen[0]._budget
    result["callback_log_s"], result["callback_train_s"] = budget.log_seconds, budget.train_seconds
    result["callback_log_share"] = budget.share
    result["logged_layers"] = [plan.chosen.path for plan in chosen[0]._capture.plans]
    for side in sides:
        result[f"steps_per_s_{side}"] = result["steps"] / result[f"fit_{side}_s"]
        after = result[f"after_first_{side}_s"]
        result[f"steps_per_s_after_first_{side}"] = (result["steps"] - 1) / after
    if "without" in sides:
        result["overhead_ratio"] = result["fit_with_s"] / result["fit_without_s"]
        result["overhead_ratio_after_first"] = (
            result["after_first_with_s"] / result["after_first_without_s"]
        )
    sizes = bench_disk.event_sizes(run)
    result["log_events"] = len(sizes)
    result["full_record_events"] = sum(full for _, full in sizes)
    result["disk_bytes"] = bench_real_fit.disk_bytes(run)
    result["bytes_per_event"] = result["disk_bytes"] / max(len(sizes), 1)
    result["loadavg_after_fits"] = loadavg()
    print(result, flush=True)

    checked, result["check_s"], result["check_exit"] = bench_real_fit.check_json(logdir)
    result["check_raised"] = raised(
        [e for r in checked.get("runs", [checked]) for e in r.get("onset", r).get("onsets", [])]
    )
    print(result, flush=True)

    timed = bench_real_fit.timed_json
    with tbserver.running_tensorboard(logdir, os.path.join(logdir, "tb.log"), samples=()) as url:
        base = f"{url}/data/plugin/gradviz"
        runs, result["runs_s"] = timed(f"{base}/runs")
        result["runs"] = [
            (r["run"], [layer["layer"] for layer in r["layers"]]) for r in runs["runs"]
        ]
        onset, result["onset_s"] = timed(f"{base}/onset?run=resnet50")
        result["onset_steps_judged"] = onset["steps"]
        result["onset_raised"] = raised(onset["onsets"])
        for when in ("cold", "warm"):
            body, result[f"timeline_{when}_s"] = timed(f"{base}/timeline?run=resnet50")
        result["timeline_rows"] = len(body["layers"])
        result["timeline_columns"] = len(body["columns"]["first_step"])
        middle = EVERY * max(1, result["steps"] // EVERY // 2)
        snapshot, result["step_s"] = timed(f"{base}/step?run=resnet50&step={middle}")
        result["step_asked"] = middle
        # A tensor's full records are those of its latest step <= the asked one.
        result["full_records_at_step"] = {
            f"{layer['layer']}/{name}": tensor.get("step") == middle
            for layer in snapshot["layers"]
            for name, tensor in layer["tensors"].items()
        }
    result["loadavg_end"] = loadavg()
    print(json.dumps(result, indent=1, default=str), flush=True)
    print("RESULT " + json.dumps(result, default=str))
    common.write_json(args.json, {"args": vars(args), "rows": [result]})


if __name__ == "__main__":
    main()
