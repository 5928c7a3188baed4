"""Cost of one tb_gradviz log event, against a compiled train step and a hand-written baseline.

For each case (model, chosen layers, probe batch), one loop interleaves:
a compiled train step (`train_on_batch` on the probe batch), one log event
of the callback per summary variant (`GradVizCallback.log_now`: the compiled
probe pass, the statistics, the event write),
and the baseline a user would write by hand: per chosen layer, an eager
`GradientTape` over a probe model `keras.Model(model.inputs, [layer.input,
layer.output, model.outputs])` and `np.histogram` of `.numpy()` copies of
the activation and both gradients. The baseline runs on a sample of the
chosen layers when there are many (its cost is one pass per layer, so it is
scaled by layers / sample; `baseline_layers_timed` says how many ran).

Examples:
  python bench/bench_log_event.py --model resnet50 --layers pool
  python bench/bench_log_event.py --model resnet50 --layers all --summary current,device,null
  python bench/bench_log_event.py --model resnet50 --scaling layers
  python bench/bench_log_event.py --model resnet50 --scaling batch
"""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (sets TF_CPP_MIN_LOG_LEVEL before TensorFlow loads)
import keras  # noqa: E402
import numpy as np  # noqa: E402
import summary_variants  # noqa: E402
import tensorflow as tf  # noqa: E402

import tb_gradviz  # noqa: E402
from tb_gradviz.capture import selection  # noqa: E402


def layer_spec(model, spec):
    """Returns (callback `layers=` argument, number of layers) for "pool", "all" or a count."""
    paths = [path for path, _ in selection.walk_layers(model)]
    if spec == "pool":
        return None, len(selection.select_layers(model, None))
    if spec == "all":
        return (lambda layer: True), len(paths)
    count = int(spec)
    if not 1 <= count <= len(paths):
        raise ValueError(f"--layers must be pool, all or 1..{len(paths)}; received {spec!r}")
    # Evenly spaced through the model, so the mix of small and large tensors is typical.
    chosen = [paths[int(i)] for i in np.linspace(0, len(paths) - 1, count).round()]
    return sorted(set(chosen), key=paths.index), count


class HandWrittenBaseline:
    """One eager forward+backward per layer, numpy histograms of host copies."""

    def __init__(self, model, layers, sample):
        self.model = model
        self.loss = model.loss
        step = max(1, len(layers) // sample) if sample else 1
        self.timed = layers[::step][:sample] if sample else layers
        self.scale = len(layers) / len(self.timed)
        self.probes = [
            keras.Model(
                model.inputs,
                [keras.tree.flatten(layer.input), keras.tree.flatten(layer.output), model.outputs],
            )
            for layer in self.timed
        ]

    def __call__(self, x, y):
        x = tf.convert_to_tensor(x)
        for probe in self.probes:
            with tf.GradientTape() as tape:
                tape.watch(x)
                inputs, outputs, predictions = probe(x, training=True)
                loss = self.loss(y, predictions[0])
            gradients = tape.gradient(loss, inputs + outputs)
            for t in outputs + gradients:
                np.histogram(t.numpy(), bins=30)


def chosen_layers(model, spec):
    chosen = selection.select_layers(model, selection.check_layer_spec(spec))
    return [c.layer for c in chosen]


def measure_case(args, model_name, spec, batch_size, variants, log_root):
    """Measures one case; returns a result row per variant."""
    model = common.build_model(model_name, args.image_size, args.seed)
    x, y = common.batch(batch_size, args.image_size, args.seed)
    layers_arg, n_layers = layer_spec(model, spec)
    model.train_on_batch(x, y)  # traces the train step

    callbacks, trace_s = {}, {}
    for name in variants:
        summary_variants.use(name)  # the variant is picked up when the pass is traced
        cb = tb_gradviz.GradVizCallback(
            os.path.join(log_root, f"{model_name}_{spec}_{batch_size}_{name}"),
            probe_data=(x, y),
            layers=layers_arg,
        )
        cb.set_model(model)
        trace_s[name] = common.seconds(cb.log_now)  # first event: trace + compile + run
        callbacks[name] = cb
    summary_variants.use("current")
    baseline = None
    if args.baseline_sample != 0:
        baseline = HandWrittenBaseline(
            model, chosen_layers(model, layers_arg), args.baseline_sample
        )
        baseline(x, y)  # warm-up (eager kernels, probe models)

    train, logs, base = [], {name: [] for name in variants}, []
    for _ in range(args.repeats):
        # Interleaved: each log event sits between two train steps of the same repeat.
        before = common.seconds(lambda: model.train_on_batch(x, y))
        for name, cb in callbacks.items():
            logs[name].append(common.seconds(cb.log_now))
        if baseline is not None:
            base.append(common.seconds(lambda: baseline(x, y)) * baseline.scale)
        after = common.seconds(lambda: model.train_on_batch(x, y))
        train.append((before + after) / 2)
    for cb in callbacks.values():
        cb.on_train_end()

    rows = []
    for name in variants:
        row = {
            "model": model_name,
            "layers": spec,
            "n_layers": n_layers,
            "batch": batch_size,
            "summary": name,
            "tensors": sum(len(p.tensors) for p in callbacks[name]._capture.plans),
            "train_step_s": common.median(train),
            "log_event_s": common.median(logs[name]),
            "ratio": common.median([log / t for log, t in zip(logs[name], train)]),
            "first_event_s": trace_s[name],
        }
        if base:
            row.update(
                baseline_s=common.median(base),
                baseline_ratio=common.median([b / t for b, t in zip(base, train)]),
                baseline_layers_timed=len(baseline.timed),
                speedup_vs_baseline=common.median([b / log for b, log in zip(base, logs[name])]),
            )
        rows.append(row)
    return rows


COLUMNS = [
    ("model", "model", "{}"),
    ("layers", "layers", "{}"),
    ("n_layers", "n", "{}"),
    ("tensors", "tensors", "{}"),
    ("batch", "batch", "{}"),
    ("summary", "summary", "{}"),
    ("train_step_s", "train step s", "{:.3f}"),
    ("log_event_s", "log event s", "{:.3f}"),
    ("ratio", "event/step", "{:.2f}"),
    ("first_event_s", "1st event s", "{:.1f}"),
    ("baseline_s", "baseline s", "{:.2f}"),
    ("baseline_ratio", "baseline/step", "{:.1f}"),
    ("baseline_layers_timed", "bl timed", "{}"),
    ("speedup_vs_baseline", "speedup", "{:.1f}x"),
]


def main():
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--model", choices=["cnn", "resnet50"], default="resnet50")
    p.add_argument("--image-size", type=int, default=None, help="default: 64 (resnet50), 32 (cnn)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument(
        "--layers",
        default="pool",
        help="pool (default choice), all, or a number of evenly spaced layers",
    )
    p.add_argument(
        "--summary", default="current", help=f"comma list of {sorted(summary_variants.VARIANTS)}"
    )
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument(
        "--baseline-sample",
        type=int,
        default=16,
        help="time the hand-written baseline on at most this many layers and scale "
        "(0: no baseline)",
    )
    p.add_argument(
        "--scaling",
        choices=["layers", "batch"],
        help="sweep layer count (1, 10, 50, all) or batch (4..32)",
    )
    args = p.parse_args()
    if args.smoke:
        args.model, args.image_size, args.batch, args.repeats, args.baseline_sample = (
            "cnn",
            16,
            4,
            2,
            2,
        )
    args.image_size = args.image_size or (64 if args.model == "resnet50" else 32)
    variants = args.summary.split(",")
    for name in variants:
        if name not in summary_variants.VARIANTS:
            p.error(
                f"--summary: unknown variant {name!r}; known: {sorted(summary_variants.VARIANTS)}"
            )
        if name != "null":
            summary_variants.check_exact(name)  # a faster variant must give the same records

    if args.scaling == "layers":
        cases = [
            (n, args.batch) for n in (["1", "3", "all"] if args.smoke else ["1", "10", "50", "all"])
        ]
    elif args.scaling == "batch":
        cases = [(args.layers, b) for b in ([2, 4] if args.smoke else [4, 8, 16, 32])]
    else:
        cases = [(args.layers, args.batch)]
    rows = []
    with tempfile.TemporaryDirectory() as log_root:
        for spec, batch_size in cases:
            rows += measure_case(args, args.model, spec, batch_size, variants, log_root)
            common.print_table(
                f"log event vs train step ({args.repeats} repeats, medians)",
                rows[-len(variants) :],
                COLUMNS,
            )
    common.print_table(
        f"all cases: log event vs train step ({args.repeats} repeats, medians)", rows, COLUMNS
    )
    for row in rows:
        print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(
        args.json,
        {"script": "bench_log_event", "args": {k: v for k, v in vars(args).items()}, "rows": rows},
    )


if __name__ == "__main__":
    main()
