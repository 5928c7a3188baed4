"""Cost of one log event against a train step, on each Keras backend (TensorFlow, JAX, PyTorch).

Each backend runs in its own process (Keras picks its backend once, at
import). In each, one loop interleaves a train step (`train_on_batch` on the
probe batch, compiled as `fit` compiles it: a `tf.function`, a jitted JAX
step, PyTorch eager) and a log event (`GradVizCallback.log_now`: the probe
pass, the statistics, the event write), for ResNet50's pooling layers and for
all its layers. The first event (which traces the pass on TensorFlow and JAX)
is reported apart.

Examples:
  python bench/bench_backends.py                       # all three backends, pool and all
  python bench/bench_backends.py --backends jax --layers all
"""

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BACKENDS = ("tensorflow", "jax", "torch")


def measure(args):
    """Runs in a process whose KERAS_BACKEND is set: returns a row per layer choice."""
    import keras

    import tb_gradviz

    model = common.build_model(args.model, args.image_size, args.seed)
    x, y = common.batch(args.batch, args.image_size, args.seed)
    model.train_on_batch(x, y)  # compiles the train step
    rows = []
    from tb_gradviz.capture import probe, selection

    for spec, statistics in [
        (s, t) for s in args.layers.split(",") for t in args.statistics.split(",")
    ]:
        layers = None if spec == "pool" else (lambda layer: True)
        with tempfile.TemporaryDirectory() as log_dir:
            cb = tb_gradviz.GradVizCallback(log_dir, probe_data=(x, y), layers=layers)
            cb.set_model(model)
            if statistics != "default":
                chosen = selection.select_layers(model, cb.layers)
                cb._capture = probe.new_capture(model, chosen, statistics=statistics)
            first = common.seconds(cb.log_now)
            train, events = [], []
            for _ in range(args.repeats):
                before = common.seconds(lambda: model.train_on_batch(x, y))
                events.append(common.seconds(cb.log_now))
                after = common.seconds(lambda: model.train_on_batch(x, y))
                train.append((before + after) / 2)
            cb.on_train_end()
        rows.append(
            {
                "backend": keras.backend.backend(),
                "model": args.model,
                "layers": spec,
                "statistics": cb._capture.statistics,
                "n_layers": len(cb.chosen_layers),
                "tensors": sum(len(p.tensors) for p in cb._capture.plans),
                "batch": args.batch,
                "image_size": args.image_size,
                "train_step_s": common.median(train),
                "log_event_s": common.median(events),
                "ratio": common.median([e / t for e, t in zip(events, train)]),
                "first_event_s": first,
            }
        )
    return rows


COLUMNS = [
    ("backend", "backend", "{}"),
    ("model", "model", "{}"),
    ("layers", "layers", "{}"),
    ("statistics", "stats", "{}"),
    ("n_layers", "n", "{}"),
    ("tensors", "tensors", "{}"),
    ("batch", "batch", "{}"),
    ("train_step_s", "train step s", "{:.3f}"),
    ("log_event_s", "log event s", "{:.3f}"),
    ("ratio", "event/step", "{:.2f}"),
    ("first_event_s", "1st event s", "{:.1f}"),
]


def main():
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--model", choices=["cnn", "resnet50"], default="resnet50")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument(
        "--layers", default="pool,all", help="comma list of pool (the default choice) and all"
    )
    p.add_argument(
        "--statistics",
        default="default",
        help="comma list of default (host on a CPU), host, device (a device's statistics, forced "
        "on the CPU)",
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
        command = common.child_command(__file__, args) + ["--statistics", args.statistics]
        result = subprocess.run(
            command, env=dict(os.environ, KERAS_BACKEND=backend), capture_output=True, text=True
        )
        found = [line for line in result.stdout.splitlines() if line.startswith("ROWS ")]
        if result.returncode != 0 or not found:
            sys.exit(
                f"{backend}: the measurement failed\n"
                f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
            )
        rows += json.loads(found[-1][5:])
        cases = len(args.layers.split(",")) * len(args.statistics.split(","))
        common.print_table(
            f"{backend}: log event vs train step ({args.repeats} repeats, medians)",
            rows[-cases:],
            COLUMNS,
        )
    common.print_table(
        f"all backends: log event vs train step ({args.repeats} repeats, medians)", rows, COLUMNS
    )
    for row in rows:
        print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"script": "bench_backends", "args": vars(args), "rows": rows})


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
