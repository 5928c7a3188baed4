"""Overhead of GradVizCallback on `fit` at its default frequency (one log event per epoch).

Fits one epoch with the callback, then one without, alternately, on the same
model and data, and reports the median of the per-pair ratios. The first fit
of each kind (tracing the train step, and for the callback tracing its probe
pass) is run before the timed pairs and reported on its own. The time spent
in the callback's log events during the timed fits is also reported, as a
share of the fit: on a noisy machine the pair ratios can swing by more than
the overhead being measured, that share cannot.

Examples:
  python bench/bench_fit.py --model cnn --steps 300
  python bench/bench_fit.py --model resnet50 --steps 60 --repeats 3
"""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import summary_variants  # noqa: E402

import tb_gradviz  # noqa: E402


def main():
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--model", choices=["cnn", "resnet50"], default="cnn")
    p.add_argument("--image-size", type=int, default=None, help="default: 64 (resnet50), 32 (cnn)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=300, help="steps per epoch")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--layers", default="pool", help="pool (the default choice) or all")
    p.add_argument("--summary", default="current", choices=sorted(summary_variants.VARIANTS))
    args = p.parse_args()
    if args.smoke:
        args.model, args.image_size, args.batch, args.steps, args.repeats = "cnn", 16, 8, 5, 2
    args.image_size = args.image_size or (64 if args.model == "resnet50" else 32)
    summary_variants.use(args.summary)

    model = common.build_model(args.model, args.image_size, args.seed)
    x, y = common.batch(args.batch * args.steps, args.image_size, args.seed)
    with tempfile.TemporaryDirectory() as log_dir:
        callback = tb_gradviz.GradVizCallback(
            log_dir,
            probe_data=(x[: args.batch], y[: args.batch]),
            layers=None if args.layers == "pool" else (lambda layer: True),
        )
        event_seconds = []
        log_now = callback.log_now
        callback.log_now = lambda: event_seconds.append(common.seconds(log_now))

        def fit(callbacks):
            model.fit(
                x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0, callbacks=callbacks
            )

        first_without = common.seconds(lambda: fit([]))
        first_with = common.seconds(lambda: fit([callback]))
        del event_seconds[:]
        pairs = []
        for i in range(args.repeats):
            # Alternate which goes first, so a drift in machine load does not favour one side.
            if i % 2:
                without = common.seconds(lambda: fit([]))
                with_cb = common.seconds(lambda: fit([callback]))
            else:
                with_cb = common.seconds(lambda: fit([callback]))
                without = common.seconds(lambda: fit([]))
            pairs.append((with_cb, without))
    ratios = [w / wo for w, wo in pairs]
    row = {
        "model": args.model,
        "layers": args.layers,
        "summary": args.summary,
        "steps_per_epoch": args.steps,
        "batch": args.batch,
        "fit_with_s": common.median([w for w, _ in pairs]),
        "fit_without_s": common.median([wo for _, wo in pairs]),
        "overhead_pct": (common.median(ratios) - 1) * 100,
        "overhead_pct_min": (min(ratios) - 1) * 100,
        "overhead_pct_max": (max(ratios) - 1) * 100,
        "first_fit_without_s": first_without,
        "first_fit_with_s": first_with,
        "log_events": len(event_seconds),
        "log_event_s": common.median(event_seconds),
        "log_event_share_pct": sum(event_seconds) / sum(w for w, _ in pairs) * 100,
    }
    common.print_table(
        f"fit, one epoch, callback at its default frequency ({args.repeats} pairs, medians)",
        [row],
        [
            ("model", "model", "{}"),
            ("layers", "layers", "{}"),
            ("steps_per_epoch", "steps", "{}"),
            ("batch", "batch", "{}"),
            ("fit_without_s", "without s", "{:.2f}"),
            ("fit_with_s", "with s", "{:.2f}"),
            ("overhead_pct", "overhead %", "{:+.2f}"),
            ("overhead_pct_min", "min %", "{:+.2f}"),
            ("overhead_pct_max", "max %", "{:+.2f}"),
            ("first_fit_without_s", "1st without s", "{:.1f}"),
            ("first_fit_with_s", "1st with s", "{:.1f}"),
            ("log_event_s", "event s", "{:.3f}"),
            ("log_event_share_pct", "events % of fit", "{:.2f}"),
        ],
    )
    print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"script": "bench_fit", "args": vars(args), "rows": [row]})


if __name__ == "__main__":
    main()
