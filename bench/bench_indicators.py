"""What judging the flags and the warnings adds to a log event of a real fit.

At each log event the callback judges what it recorded once
(`judgement.Judge`): the flags always (the full-records keeper reads them,
to keep the full records of an onset), and with `stop_on=` the warnings
too (`format/leading.py`, the leading indicators), over the events of the
last `leading.HISTORY` steps, whose series the judge keeps as they come
(`format/history.py`). Judging them is what this measures.

Per model (ResNet50 `weights=None` at `--image-size`, batch `--batch`, and
the demo's small CNN, `demos.small_cnn("max")`, at 32 px, batch 64), with
`--layers` (all: every layer), one `GradVizCallback(stop_on=<a callable
that never stops>)`. The window is first filled with `--history` events'
digests, `leading.HISTORY / --history` steps apart (the first event's
records at the steps before: the rows a fit that logs every step holds,
`every_n_batches=1`, at 200; `every_n_batches=10` at 20). Then each repeat
trains one step (`train_on_batch`) and logs two events, with `stop_on`
judging and without, in alternating order (A, B, B, A, ...); the event
without is judged after it, outside its time, so that the window holds
every event as in a fit. The extra is the median over repeats of
with/without - 1. The judging is also timed where it runs (wall and
the process's CPU time): the judge with the warnings in the event with
`stop_on`, split into its warnings (the history's column written,
`History.append`, and the last event judged over it, `History.warnings`,
or, where the judge builds the columns of every event held anew,
`judgement._warnings`), its flags (`judgement._flags`) and the columns
they read (`rule_columns.build`); and the judge of the flags alone that
the event without `stop_on` runs (`keeper_flags`).
Each share is the median over repeats of that time over the event's time
without `stop_on`.

With `--weights`, `weights=True`: each weight's gradient is judged too,
and its update ratio (the update rules), from the second event on.

Examples:
  python bench/bench_indicators.py --model resnet50 --layers all --repeats 7
  python bench/bench_indicators.py --model resnet50 --layers all --repeats 7 --weights
  python bench/bench_indicators.py --model cnn --layers all --repeats 15
  python bench/bench_indicators.py --model resnet50 --layers all --history 10 --repeats 7
"""

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (sets TF_CPP_MIN_LOG_LEVEL before TensorFlow loads)
import numpy as np  # noqa: E402


def timed(fn, *args):
    """`(result, wall s, process CPU s)` of `fn(*args)`."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args)
    return result, time.perf_counter() - wall, time.process_time() - cpu


class Timings:
    """Wraps a function so that each call's wall and CPU time are appended to `calls`."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, *args, **kwargs):
        result, wall, cpu = timed(lambda: self.fn(*args, **kwargs))
        self.calls.append((wall, cpu))
        return result


def build(args):
    """`(compiled model, x, y)` of `--model`."""
    import keras

    if args.model == "resnet50":
        model = common.build_model("resnet50", args.image_size, args.seed)
        x, y = common.batch(args.batch, args.image_size, args.seed)
        return model, x, y
    from tb_gradviz import demos

    keras.utils.set_random_seed(args.seed)
    model = demos.small_cnn("max")
    model.compile(
        keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    x, y = demos.pattern_images(args.batch, 32, args.seed)
    return model, x, y


def measure(args):
    from bench_log_event import layer_spec

    import tb_gradviz
    from tb_gradviz.capture import stop_on as stop_on_module
    from tb_gradviz.format import digest, judgement, leading, rule_columns

    model, x, y = build(args)
    model.train_on_batch(x, y)
    layers, n_layers = layer_spec(model, args.layers)
    callback = tb_gradviz.GradVizCallback(
        tempfile.mkdtemp(),
        probe_data=(x, y),
        layers=layers,
        stop_on=lambda raised: False,
        weights=args.weights,
    )
    callback.set_model(model)
    judging, stopping = callback._judge, callback._stop_on  # flags and warnings (stop_on=)
    # What the callback holds without stop_on=: a judge of the flags alone, for the keeper.
    idle, idle_stop = judgement.Judge(warnings=False), stop_on_module.StopOn((), None)
    judge = Timings(judging.judge)
    judging.judge = judge
    keeper_judge = Timings(idle.judge)
    idle.judge = keeper_judge
    anew_part = Timings(judgement._warnings)
    flags_part = Timings(judgement._flags)
    judgement._warnings, judgement._flags = anew_part, flags_part
    history = judging._history
    append_part, rules_part = Timings(history.append), Timings(history.warnings)
    history.append, history.warnings = append_part, rules_part
    columns_part = Timings(rule_columns.build)
    rule_columns.build = columns_part
    timed_parts = (judge, anew_part, append_part, rules_part, flags_part, columns_part)
    records = []
    keeper_writes = callback._keeper.writes

    def keeping(step, event_records, judged, wall_time=None):
        event_records = list(event_records)
        records.append(event_records)
        return keeper_writes(step, event_records, judged, wall_time)

    callback._keeper.writes = keeping

    load_before = os.getloadavg()
    spacing = max(1, leading.HISTORY // args.history)  # every_n_batches
    callback._judge, callback._stop_on = idle, idle_stop
    callback.log_now(step=0)  # traces
    for earlier in range(1, args.history):  # the window's earlier events
        judging.judge(earlier * spacing, records[0])
    step, rows = args.history * spacing, []
    for repeat in range(args.repeats):
        model.train_on_batch(x, y)
        order = (True, False) if repeat % 2 == 0 else (False, True)
        events = {}
        for with_judging in order:
            callback._judge, callback._stop_on = (
                (judging, stopping) if with_judging else (idle, idle_stop)
            )
            calls = [len(t.calls) for t in timed_parts]
            _, wall, cpu = timed(callback.log_now, step)
            events[with_judging] = (wall, cpu)
            if with_judging:
                assert len(judge.calls) == calls[0] + 1
                # Each part's calls in this event, summed: (wall, CPU).
                parts = [
                    np.sum(t.calls[n:], axis=0) if len(t.calls) > n else (0.0, 0.0)
                    for t, n in zip(timed_parts, calls)
                ]
                held = len(judging._events)
                from_history = len(rules_part.calls) > calls[3]
            else:  # outside the timed event: the window holds every event, as in a fit
                judging.judge(step, records[-1])
                keeper = keeper_judge.calls[-1]
            step += spacing
        rows.append((*events[True], *events[False], *np.ravel(parts), *keeper, held, from_history))
    callback.on_train_end()
    (
        with_wall,
        with_cpu,
        without_wall,
        without_cpu,
        judge_wall,
        judge_cpu,
        anew_wall,
        anew_cpu,
        append_wall,
        append_cpu,
        rules_wall,
        rules_cpu,
        flags_wall,
        flags_cpu,
        columns_wall,
        columns_cpu,
        keeper_wall,
        keeper_cpu,
        held,
        from_history,
    ) = (np.array(column) for column in zip(*rows))
    warnings_wall = anew_wall + append_wall + rules_wall
    warnings_cpu = anew_cpu + append_cpu + rules_cpu
    digest_rows = len(digest.digest_records(records[-1])[0][1])

    def share(part, whole):
        return float(np.median(part / whole))

    return {
        "model": args.model,
        "image_size": args.image_size if args.model == "resnet50" else 32,
        "batch": args.batch,
        "layers": args.layers,
        "weights": args.weights,
        "n_layers": n_layers,
        "digest_values": digest_rows,
        "history_events": int(np.median(held)),
        "events_judged_from_history": int(np.sum(from_history)),
        "repeats": args.repeats,
        "event_without_wall_s": float(np.median(without_wall)),
        "event_with_wall_s": float(np.median(with_wall)),
        "event_without_cpu_s": float(np.median(without_cpu)),
        "judge_wall_s": float(np.median(judge_wall)),
        "judge_cpu_s": float(np.median(judge_cpu)),
        "warnings_wall_s": float(np.median(warnings_wall)),
        "warnings_cpu_s": float(np.median(warnings_cpu)),
        "append_wall_s": float(np.median(append_wall)),
        "rules_wall_s": float(np.median(rules_wall)),
        "rules_cpu_s": float(np.median(rules_cpu)),
        "flags_wall_s": float(np.median(flags_wall)),
        "columns_wall_s": float(np.median(columns_wall)),
        "keeper_flags_wall_s": float(np.median(keeper_wall)),
        "extra_ab_wall": float(np.median(with_wall / without_wall - 1)),
        "extra_ab_cpu": float(np.median(with_cpu / without_cpu - 1)),
        "judge_share_wall": share(judge_wall, without_wall),
        "judge_share_cpu": share(judge_cpu, without_cpu),
        "warnings_share_wall": share(warnings_wall, without_wall),
        "warnings_share_cpu": share(warnings_cpu, without_cpu),
        "append_share_wall": share(append_wall, without_wall),
        "rules_share_wall": share(rules_wall, without_wall),
        "rules_share_cpu": share(rules_cpu, without_cpu),
        "flags_share_wall": share(flags_wall, without_wall),
        "columns_share_wall": share(columns_wall, without_wall),
        "keeper_flags_share_wall": share(keeper_wall, without_wall),
        "load_before": [round(v, 2) for v in load_before],
        "load_after": [round(v, 2) for v in os.getloadavg()],
    }


def main():
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--model", choices=["resnet50", "cnn"], default="resnet50")
    p.add_argument("--layers", default="all", help="pool, all or a count (bench_log_event's)")
    p.add_argument("--image-size", type=int, default=64, help="ResNet50's input size")
    p.add_argument("--batch", type=int, default=None, help="default: 16 ResNet50, 64 the CNN")
    p.add_argument(
        "--history",
        type=int,
        default=200,
        help="events the judge holds: 200 (every_n_batches=1) or 20 (every 10 steps)",
    )
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument(
        "--weights", action="store_true", help="weights=True: their gradients and update ratios"
    )
    args = p.parse_args()
    if args.batch is None:
        args.batch = 16 if args.model == "resnet50" else 64
    if args.smoke:
        args.image_size, args.batch, args.history, args.repeats = 32, 2, 5, 2
    row = measure(args)
    print("RESULT", {k: (round(v, 5) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"script": "bench_indicators", "args": vars(args), "rows": [row]})


if __name__ == "__main__":
    main()
