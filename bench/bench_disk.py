"""Bytes on disk per tensor per log event, and for a 100- and a 10,000-event run.

Runs the real callback (`log_now` after each train step) for N events and
reads the event file's size after every event: the first event carries
each tag's metadata (written once per file), later ones only values, so the
growth per later event is exact and a 100-event run is
`first + 99 * growth`. Compared with Keras' own TensorBoard callback for
scale: its weight histograms of the same model, per epoch.

The callback runs with `full_records=0`, so that its events alternate
between events with full records (0, 2, 5, ...) and events with the digest
only; each event is told apart by what it holds, read back from the file.
A 10,000-event run under the default schedule (`full_records=100`) is then
projected: the first event, the other events the schedule keeps at the full
size, the rest at the digest-only size; "with onsets" adds two full events
per flag (a flag's onset and the event before), the most flags can add.

Examples:
  python bench/bench_disk.py --model resnet50 --layers pool
  python bench/bench_disk.py --model resnet50 --layers all --events 5
"""

import glob
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import keras  # noqa: E402
import summary_variants  # noqa: E402

import tb_gradviz  # noqa: E402
from tb_gradviz.format import digest, full_records, health  # noqa: E402

PROJECTED_EVENTS = 10_000


def event_sizes(log_dir):
    """`[(bytes, full)]` of each log event in the run's files, in order: its TFRecord's size and
    whether it holds full records (a value of another plugin than the digest's)."""
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.compat.proto import event_pb2

    found = []
    for path in sorted(glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))):
        for raw in event_file_loader.RawEventFileLoader(path).Load():
            event = event_pb2.Event.FromString(raw)
            if not event.HasField("summary"):
                continue
            tags = [value.tag for value in event.summary.value]
            full = any(not tag.startswith(digest.TAG_PREFIX + "/") for tag in tags)
            found.append((len(raw) + 16, full))  # 16: the TFRecord's length and checksums
    return found


def event_file_size(log_dir):
    return sum(
        os.path.getsize(p) for p in glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))
    )


def measure(args, layers, log_root):
    model = common.build_model(args.model, args.image_size, args.seed)
    x, y = common.batch(args.batch, args.image_size, args.seed)
    log_dir = os.path.join(log_root, f"gradviz_{layers}")
    callback = tb_gradviz.GradVizCallback(
        log_dir,
        probe_data=(x, y),
        layers=None if layers == "pool" else (lambda layer: True),
        full_records=0,
    )
    callback.set_model(model)
    sizes = [0]
    for _ in range(args.events):
        model.train_on_batch(x, y)
        callback.log_now()
        sizes.append(event_file_size(log_dir))
    callback.on_train_end()
    events = event_sizes(log_dir)
    # Later events with full records, and events with the digest only.
    growth = [size for size, full in events[1:] if full]
    digest_only = [size for size, full in events if not full]
    tensors = sum(len(plan.tensors) for plan in callback._capture.plans)
    routing = sum(plan.has_routing for plan in callback._capture.plans)
    per_event = common.median(growth)
    # An onset at each event would leave none (then NaN).
    digest_only = digest_only or [float("nan")]
    per_digest = common.median(digest_only)
    kept = sum(
        full_records.scheduled(i, full_records.DEFAULT_FIRST) for i in range(PROJECTED_EVENTS)
    )
    projected = sizes[1] + (kept - 1) * per_event + (PROJECTED_EVENTS - kept) * per_digest
    onsets = 2 * len(health.FLAGS) * (per_event - per_digest)
    # The routing record (7 values) is small; it is counted with the tensors of its layer.
    return {
        "model": args.model,
        "layers": layers,
        "n_layers": len(callback.chosen_layers),
        "tensors": tensors,
        "routing_records": routing,
        "events": args.events,
        "first_event_bytes": sizes[1],
        "bytes_per_event": per_event,
        "growth_min": min(growth),
        "growth_max": max(growth),
        "bytes_per_tensor_per_event": per_event / tensors,
        "first_event_bytes_per_tensor": sizes[1] / tensors,
        "run_100_events_mb": (sizes[1] + 99 * per_event) / 1e6,
        "digest_event_bytes": per_digest,
        "digest_min": min(digest_only),
        "digest_max": max(digest_only),
        "full_events_of_10000": kept,
        "run_10000_events_mb": projected / 1e6,
        "run_10000_events_with_onsets_mb": (projected + onsets) / 1e6,
        "run_10000_events_all_full_mb": (sizes[1] + (PROJECTED_EVENTS - 1) * per_event) / 1e6,
    }


def keras_tensorboard(args, log_root):
    """Keras' TensorBoard(histogram_freq=1) on the same model: bytes per epoch, for scale."""
    model = common.build_model(args.model, args.image_size, args.seed)
    x, y = common.batch(args.batch, args.image_size, args.seed)
    log_dir = os.path.join(log_root, "keras_tb")
    callback = keras.callbacks.TensorBoard(
        log_dir, histogram_freq=1, write_graph=False, update_freq="epoch"
    )
    sizes = []
    for epoch in range(3):
        model.fit(
            x,
            y,
            batch_size=args.batch,
            epochs=epoch + 1,
            initial_epoch=epoch,
            verbose=0,
            callbacks=[callback],
        )
        sizes.append(
            sum(os.path.getsize(p) for p in glob.glob(os.path.join(log_dir, "train", "events.*")))
        )
    return sizes[2] - sizes[1]


def main():
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--model", choices=["cnn", "resnet50"], default="resnet50")
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--layers", default="pool,all", help="comma list of pool, all")
    p.add_argument("--events", type=int, default=6)
    p.add_argument(
        "--summary",
        default="current",
        choices=sorted(summary_variants.VARIANTS),
        help="the records are identical for current and fast; fast traces and runs sooner",
    )
    args = p.parse_args()
    if args.smoke:
        args.model, args.image_size, args.batch, args.events, args.layers = "cnn", 16, 4, 4, "all"
    args.image_size = args.image_size or (64 if args.model == "resnet50" else 32)
    summary_variants.use(args.summary)
    with tempfile.TemporaryDirectory() as log_root:
        rows = [measure(args, layers, log_root) for layers in args.layers.split(",")]
        keras_bytes = keras_tensorboard(args, log_root)
    for row in rows:
        row["keras_tensorboard_bytes_per_epoch"] = keras_bytes
    common.print_table(
        f"bytes on disk ({args.events} events each; growth after the first is exact per event)",
        rows,
        [
            ("model", "model", "{}"),
            ("layers", "layers", "{}"),
            ("n_layers", "n", "{}"),
            ("tensors", "tensors", "{}"),
            ("first_event_bytes", "1st event B", "{:,}"),
            ("bytes_per_event", "per event B", "{:,.0f}"),
            ("bytes_per_tensor_per_event", "B/tensor/event", "{:,.0f}"),
            ("first_event_bytes_per_tensor", "1st B/tensor", "{:,.0f}"),
            ("run_100_events_mb", "100 events MB", "{:.2f}"),
            ("digest_event_bytes", "digest-only event B", "{:,.0f}"),
            ("run_10000_events_all_full_mb", "10k all full MB", "{:,.0f}"),
            ("run_10000_events_mb", "10k default MB", "{:,.1f}"),
            ("run_10000_events_with_onsets_mb", "+ onsets MB", "{:,.1f}"),
            ("keras_tensorboard_bytes_per_epoch", "Keras TB hist B/epoch", "{:,}"),
        ],
    )
    for row in rows:
        print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"script": "bench_disk", "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
