"""The cost budget on a real fit: does `budget=` keep logging's share of training time?

A small CNN (`common.small_cnn`) is fitted with `GradVizCallback(every_n_batches=1,
budget=B)` for `--steps` train steps. The callback records, at each log event, the
interval it used and the share of time it measured (`capture/budget.py`); this
script reads those records back and reports the last one (the share over the
whole fit), the share over the second half of the fit (after the interval has
settled), and the intervals used.

    python bench/bench_budget.py --budget 0.02 --steps 3000 --json bench/results/budget.json
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
    epochs = max(1, args.steps // args.batches_per_epoch)
    begin = time.perf_counter()
    model.fit(x, y, batch_size=args.batch, epochs=epochs, verbose=0, callbacks=[callback])
    fit_seconds = time.perf_counter() - begin
    keras.backend.clear_session()
    recorded = budget_records(logdir)
    last, (mid_step, mid) = recorded[-1][1], recorded[len(recorded) // 2]
    log = last["log_seconds"] - mid["log_seconds"]
    train = last["train_seconds"] - mid["train_seconds"]
    intervals = [int(r["interval"]) for _, r in recorded]
    return {
        "budget": args.budget,
        "steps": int(model.optimizer.iterations.numpy()),
        "log_events": len(recorded) + 1,  # the first event, which compiles the pass, is unmeasured
        "fit_s": fit_seconds,
        "share_whole_fit": last["share"],
        "share_second_half": log / (log + train) if log + train > 0 else float("nan"),
        "second_half_from_step": mid_step,
        "interval_last": intervals[-1],
        "interval_median": int(np.median(intervals)),
        "interval_max": max(intervals),
        "log_s": last["log_seconds"],
        "train_s": last["train_seconds"],
    }


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=0.02)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--batches-per-epoch", type=int, default=100)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--layers", default="", help="comma-separated; default: the pooling layers")
    args = p.parse_args()
    if args.smoke:
        args.steps, args.batches_per_epoch, args.image_size = 40, 20, 16
    row = run(args)
    common.print_table(
        f"budget={args.budget} on a small CNN, every_n_batches=1",
        [row],
        [(k, k, "{:.4g}") for k in row],
    )
    print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"rows": [row]})


if __name__ == "__main__":
    main()
