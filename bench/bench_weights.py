"""Extra cost of `weights=True` (issue 14) against a train step, on each Keras backend.

Each backend runs in its own process (Keras picks its backend once, at
import). In each, for ResNet50's pooling layers and for all its layers, two
callbacks watch the same model, one with `weights=False` and one with
`weights=True`, and one loop interleaves a train step (`train_on_batch` on
the probe batch, compiled as `fit` compiles it) with a log event of each
(`GradVizCallback.log_now`), the order of the two events alternating. The
extra cost is `(event with weights - event without) / train step`, the
median of the per-repeat ratios. The first event of each (which traces the
pass on TensorFlow and JAX) is reported apart.

Each event is also taken apart, by timing wrappers around what `log_now`
calls (the callback itself runs unchanged): the host statistics
(`assemble.host_summaries`), the update records (`weights.Updates.records`),
the event write (`EventLog.write`); the rest of `log_now` is the probe pass
(forward, backward, and on TensorFlow and JAX the copy of its outputs) and
the assembly of records. The bytes held are the host copies `Updates` keeps
of the recorded weights. The second event of each, which gives the first
update records (and loads their numba kernel), is left out of the medians too.

Examples:
  python bench/bench_weights.py                        # all three backends, pool and all
  python bench/bench_weights.py --backends tensorflow --layers all
"""

import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BACKENDS = ("tensorflow", "jax", "torch")
PARTS = ("statistics", "updates", "write")


class Timed:
    """A callback whose `log_now` also reports where its time went (`PARTS`, and `pass`)."""

    def __init__(self, callback, spent):
        self.callback, self.spent = callback, spent
        callback._log.write = common.timed(callback._log.write, spent, "write")

    def log_now(self):
        for part in self.spent:
            self.spent[part] = 0.0
        if self.callback._updates is not None and not hasattr(self.callback._updates, "timed"):
            updates = self.callback._updates
            updates.records, updates.timed = (
                common.timed(updates.records, self.spent, "updates"),
                True,
            )
        total = common.seconds(self.callback.log_now)
        parts = dict(self.spent)
        parts["pass"] = total - sum(parts.values())
        return total, parts


def measure(args):
    """Runs in a process whose KERAS_BACKEND is set: returns a row per layer choice."""
    import keras

    import tb_gradviz
    from tb_gradviz.capture import assemble

    spent = {part: 0.0 for part in PARTS}
    assemble.host_summaries = common.timed(assemble.host_summaries, spent, "statistics")

    model = common.build_model(args.model, args.image_size, args.seed)
    x, y = common.batch(args.batch, args.image_size, args.seed)
    model.train_on_batch(x, y)  # compiles the train step
    rows = []
    for spec in args.layers.split(","):
        layers = None if spec == "pool" else (lambda layer: True)
        with tempfile.TemporaryDirectory() as log_dir:
            callbacks = {}
            for weights in (False, True):
                cb = tb_gradviz.GradVizCallback(
                    os.path.join(log_dir, str(weights)),
                    probe_data=(x, y),
                    layers=layers,
                    weights=weights,
                )
                cb.set_model(model)
                callbacks[weights] = Timed(cb, spent)
            first = {weights: callbacks[weights].log_now()[0] for weights in (False, True)}
            model.train_on_batch(x, y)
            # The update records start at the second event, which also loads (or
            # compiles) their kernel.
            second = {weights: callbacks[weights].log_now()[0] for weights in (False, True)}
            updates = callbacks[True].callback._updates
            held = sum(copy.nbytes for _, _, copy in updates._previous.values())
            train, events, parts = [], {False: [], True: []}, {False: [], True: []}
            for repeat in range(args.repeats):
                steps = [common.seconds(lambda: model.train_on_batch(x, y))]
                for weights in (False, True) if repeat % 2 == 0 else (True, False):
                    total, split = callbacks[weights].log_now()
                    events[weights].append(total)
                    parts[weights].append(split)
                    steps.append(common.seconds(lambda: model.train_on_batch(x, y)))
                train.append(sum(steps) / len(steps))
            for weights in (False, True):
                callbacks[weights].callback.on_train_end()
        on, off = callbacks[True].callback, callbacks[False].callback
        row = {
            "backend": keras.backend.backend(),
            "model": args.model,
            "layers": spec,
            "n_layers": len(on.chosen_layers),
            "tensors_without": sum(len(p.tensors) for p in off._capture.plans),
            "tensors_with": sum(len(p.tensors) for p in on._capture.plans),
            "weights": sum(len(p.weights) for p in on._capture.plans),
            "weight_values": sum(
                math.prod(v.shape) for p in on._capture.plans for _, v in p.weights
            ),
            "update_bytes_held": held,
            "batch": args.batch,
            "image_size": args.image_size,
            "train_step_s": common.median(train),
            "event_without_s": common.median(events[False]),
            "event_with_s": common.median(events[True]),
            "ratio_without": common.median([e / t for e, t in zip(events[False], train)]),
            "ratio_with": common.median([e / t for e, t in zip(events[True], train)]),
            "extra_ratio": common.median(
                [(w - o) / t for w, o, t in zip(events[True], events[False], train)]
            ),
            "first_event_without_s": first[False],
            "first_event_with_s": first[True],
            "second_event_without_s": second[False],
            "second_event_with_s": second[True],
        }
        for part in PARTS + ("pass",):
            for weights, label in ((False, "without"), (True, "with")):
                row[f"{part}_{label}_s"] = common.median([p[part] for p in parts[weights]])
            row[f"{part}_extra_ratio"] = common.median(
                [(w[part] - o[part]) / t for w, o, t in zip(parts[True], parts[False], train)]
            )
        rows.append(row)
    return rows


COLUMNS = [
    ("backend", "backend", "{}"),
    ("layers", "layers", "{}"),
    ("n_layers", "n", "{}"),
    ("weights", "weights", "{}"),
    ("tensors_with", "tensors", "{}"),
    ("train_step_s", "step s", "{:.3f}"),
    ("event_without_s", "event s", "{:.3f}"),
    ("event_with_s", "+weights s", "{:.3f}"),
    ("ratio_without", "event/step", "{:.2f}"),
    ("ratio_with", "+weights/step", "{:.2f}"),
    ("extra_ratio", "extra/step", "{:.2f}"),
    ("first_event_without_s", "1st s", "{:.1f}"),
    ("first_event_with_s", "1st +w s", "{:.1f}"),
    ("update_bytes_held", "held MB", "{:.1f}"),
]
PART_COLUMNS = (
    [("backend", "backend", "{}"), ("layers", "layers", "{}")]
    + [
        (f"{part}_{label}_s", f"{part} {label} s", "{:.3f}")
        for part in ("pass",) + PARTS
        for label in ("without", "with")
    ]
    + [(f"{part}_extra_ratio", f"{part} extra/step", "{:.2f}") for part in ("pass",) + PARTS]
)


def main():
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--model", choices=["cnn", "resnet50"], default="resnet50")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument(
        "--layers", default="pool,all", help="comma list of pool (the default choice) and all"
    )
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--child", action="store_true", help=argparse_hidden())
    args = p.parse_args()
    if args.smoke:
        args.model, args.image_size, args.batch, args.repeats = "cnn", 16, 4, 2
    if args.child:
        print("ROWS " + json.dumps(measure(args)))
        return
    rows = []
    for backend in args.backends.split(","):
        if backend not in BACKENDS:
            p.error(f"--backends: unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
        command = common.child_command(__file__, args)
        result = subprocess.run(
            command, env=dict(os.environ, KERAS_BACKEND=backend), capture_output=True, text=True
        )
        found = [line for line in result.stdout.splitlines() if line.startswith("ROWS ")]
        if result.returncode != 0 or not found:
            sys.exit(
                f"{backend}: the measurement failed\n"
                f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
            )
        new = json.loads(found[-1][5:])
        rows += new
        common.print_table(
            f"{backend}: weights=True vs without, against a train step "
            f"({args.repeats} repeats, medians)",
            [dict(r, update_bytes_held=r["update_bytes_held"] / 1e6) for r in new],
            COLUMNS,
        )
    common.print_table(
        f"all backends: weights=True vs without ({args.repeats} repeats, medians)",
        [dict(r, update_bytes_held=r["update_bytes_held"] / 1e6) for r in rows],
        COLUMNS,
    )
    common.print_table(
        "where the time goes (medians per event; pass = log_now less the parts)", rows, PART_COLUMNS
    )
    for row in rows:
        print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"script": "bench_weights", "args": vars(args), "rows": rows})


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
