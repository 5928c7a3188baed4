"""The cost budget on a real fit: does `budget=` keep logging's share of wall time?

A small CNN (`common.small_cnn`, TensorFlow) is trained by `--fits` repeated calls of
`fit(epochs=1)` of `--batches-per-epoch` steps, all with one `GradVizCallback(every_n_batches=1,
budget=B)`. The script times each `fit` call and each log event (`log_now`, the event's write
included) with its own clock, and reports the share of the fits' wall time spent logging: over
all fits (the first event, which compiles the probe pass, included) and over the second half of
the fits. It also reads back the budget records the callback wrote (`capture/budget.py`): the
share the budget measured and the intervals it used.

    python bench/bench_budget.py --budget 0.02 --fits 50 --json bench/results/budget.json
"""

import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def budget_records(logdir):
    """`[(step, {field: value})]` of the budget records the callback wrote."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    from tb_gradviz.capture import budget

    accumulator = event_accumulator.EventAccumulator(
        logdir, size_guidance={event_accumulator.TENSORS: 0}
    )
    accumulator.Reload()
    return [
        (e.step, dict(zip(budget.FIELDS, tensor_util.make_ndarray(e.tensor_proto).tolist())))
        for e in accumulator.Tensors(budget.TAG)
    ]


def run(args):
    import keras

    from tb_gradviz import GradVizCallback

    model = common.build_model("cnn", args.image_size, args.seed)
    x, y = common.batch(args.batch * args.batches_per_epoch, args.image_size, args.seed)
    logdir = tempfile.mkdtemp(prefix="bench_budget_")
    callback = GradVizCallback(
        logdir,
        (x[: args.batch], y[: args.batch]),
        layers=args.layers.split(",") if args.layers else None,
        every_n_batches=1,
        budget=args.budget,
    )
    event_seconds, fit_seconds, events_per_fit = [], [], []
    log_now = callback.log_now

    def timed_log_now(*log_args, **log_kwargs):
        begin = time.perf_counter()
        log_now(*log_args, **log_kwargs)
        event_seconds.append(time.perf_counter() - begin)

    callback.log_now = timed_log_now
    for _ in range(args.fits):
        before = len(event_seconds)
        begin = time.perf_counter()
        model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, callbacks=[callback])
        fit_seconds.append(time.perf_counter() - begin)
        events_per_fit.append(len(event_seconds) - before)
    steps = int(model.optimizer.iterations.numpy())
    keras.backend.clear_session()
    recorded = budget_records(logdir)
    last = recorded[-1][1]
    half = args.fits // 2
    second_half_log = sum(event_seconds[sum(events_per_fit[:half]) :])
    intervals = [int(r["interval"]) for _, r in recorded]
    return {
        "budget": args.budget,
        "fits": args.fits,
        "steps": steps,
        "log_events": len(event_seconds),
        "fits_s": sum(fit_seconds),
        "log_s": sum(event_seconds),
        "first_event_s": event_seconds[0],
        # Measured here: time in log events / wall time of the fit calls.
        "wall_share": sum(event_seconds) / sum(fit_seconds),
        "wall_share_without_first_event": sum(event_seconds[1:])
        / (sum(fit_seconds) - event_seconds[0]),
        "wall_share_second_half": second_half_log / sum(fit_seconds[half:]),
        # What the budget measured (its last record: the first event left out).
        "share_whole_fit": last["share"],
        "budget_log_s": last["log_seconds"],
        "budget_train_s": last["train_seconds"],
        "interval_last": intervals[-1],
        "interval_median": int(np.median(intervals)),
        "interval_min_after_first": min(intervals[1:] or intervals),
        "interval_max": max(intervals),
        "events_per_fit_min": min(events_per_fit),
        "events_per_fit_max": max(events_per_fit),
    }


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=0.02)
    p.add_argument("--fits", type=int, default=50, help="fit(epochs=1) calls, one callback")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--batches-per-epoch", type=int, default=100)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--layers", default="", help="comma-separated; default: the pooling layers")
    args = p.parse_args()
    if args.smoke:
        args.fits, args.batches_per_epoch, args.image_size = 2, 20, 16
    row = run(args)
    common.print_table(
        f"budget={args.budget} on a small CNN, every_n_batches=1, {args.fits} fit(epochs=1) calls",
        [row],
        [(k, k, "{:.4g}") for k in row],
    )
    print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"rows": [row]})


if __name__ == "__main__":
    main()
