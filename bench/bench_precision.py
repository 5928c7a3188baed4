"""Cost of the precision record per log event: the host statistics with and without it.

Each repeat runs one log event of the callback (`GradVizCallback.log_now`:
probe pass, statistics, records, event write) on `--model` with `--layers`,
and times, on the very tensors that event summarised, the host statistics
(`kernels.summaries`) with the precision record (what the event computes)
and without it, interleaved. The extra per event is the difference of the
two over the event's time without the record (the event's time minus that
difference). Medians and minima over `--repeats`.

Examples:
  python bench/bench_precision.py --model resnet50 --layers pool --repeats 9
  python bench/bench_precision.py --model resnet50 --layers all --repeats 7
"""

import functools
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (sets TF_CPP_MIN_LOG_LEVEL before TensorFlow loads)
import numpy as np  # noqa: E402
from bench_log_event import layer_spec  # noqa: E402

import tb_gradviz  # noqa: E402
from tb_gradviz.capture import kernels  # noqa: E402


def measure(args):
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
    try:
        callback.log_now()  # traces
        rows = []
        for _ in range(args.repeats):
            seen.clear()
            event_s = common.seconds(callback.log_now)
            items = [item for call in seen for item in call]
            with_s = common.seconds(functools.partial(original, items, precision=True))
            without_s = common.seconds(functools.partial(original, items, precision=False))
            rows.append((event_s, with_s, without_s))
    finally:
        kernels.summaries = original
    event, with_, without = (np.array(column) for column in zip(*rows))
    extra = (with_ - without) / (event - (with_ - without))
    return {
        "model": args.model,
        "layers": args.layers,
        "n_layers": n_layers,
        "tensors": len(items),
        "values": int(sum(np.size(v) for v, _ in items)),
        "event_s": float(np.median(event)),
        "statistics_with_s": float(np.median(with_)),
        "statistics_without_s": float(np.median(without)),
        "min_statistics_with_s": float(with_.min()),
        "min_statistics_without_s": float(without.min()),
        "extra_per_event": float(np.median(extra)),
        "extra_per_event_of_minima": float(
            (with_.min() - without.min()) / (event.min() - (with_.min() - without.min()))
        ),
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
    args = p.parse_args()
    if args.smoke:
        args.model, args.image_size, args.batch, args.layers, args.repeats = "cnn", 16, 4, "all", 2
    row = measure(args)
    print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"script": "bench_precision", "args": vars(args), "rows": [row]})


if __name__ == "__main__":
    main()
