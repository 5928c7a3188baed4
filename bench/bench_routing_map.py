"""What the routing map costs: bytes per event and time added to a pooling-layer log event.

Two callbacks on the same model and probe batch, pooling layers chosen, one
with `routing_map=True` (the default) and one without; their log events are
timed interleaved, and the bytes of the routing-map records of one event are
counted as serialized. Results: bench/RESULTS.md, section 7.

    python bench/bench_routing_map.py --model resnet50 --image-size 64 --batch 16 --repeats 12
"""

import functools
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def _record_seconds(probe, x, repeats):
    """Median time of `routing_map.record` over the mapped layers, on slices like the pass's."""
    import numpy as np

    from tb_gradviz.format import routing_map

    settings, times = probe.map_settings, []
    mapped = [plan for plan in probe.plans if plan.map_cut is not None]
    rng = np.random.default_rng(0)
    slices = []
    for plan in mapped:
        input_shape = next(t.shape for t in plan.tensors if t.role == "input_gradient")[1:]
        output_shape = next(t.shape for t in plan.tensors if t.role == "output_gradient")[1:]
        x_slice = np.maximum(rng.normal(size=input_shape), 0).astype(np.float32)
        slices.append((x_slice, rng.normal(size=input_shape), rng.normal(size=output_shape)))
    for _ in range(repeats):
        times.append(
            common.seconds(
                lambda: [
                    routing_map.record(plan.pooling, *s, plan.map_cut, settings)
                    for plan, s in zip(mapped, slices)
                ]
            )
        )
    return common.median(times)


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--model", choices=("cnn", "resnet50"), default="resnet50")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=12)
    args = p.parse_args()
    if args.smoke:
        args.model, args.image_size, args.batch, args.repeats = "cnn", 32, 4, 2

    from tb_gradviz import GradVizCallback
    from tb_gradviz.format import events

    model = common.build_model(args.model, args.image_size, args.seed)
    x, y = common.batch(args.batch, args.image_size, args.seed)
    with tempfile.TemporaryDirectory() as logdir:
        callbacks = {
            mapped: GradVizCallback(os.path.join(logdir, str(mapped)), (x, y), routing_map=mapped)
            for mapped in (True, False)
        }
        for callback in callbacks.values():
            callback.set_model(model)
            callback.log_now(step=0)  # traces and compiles
        times = {True: [], False: []}
        for repeat in range(args.repeats):
            for mapped, callback in callbacks.items():
                log = functools.partial(callback.log_now, step=repeat + 1)
                times[mapped].append(common.seconds(log))
        written, _ = callbacks[True]._capture.run(x, y)
        # The host work the map adds, alone: choosing channels, cropping, finding winners.
        record_s = _record_seconds(callbacks[True]._capture, x, args.repeats)
        maps = [(tag, array, md) for tag, array, md in written if tag.endswith("/routing_map")]
        map_bytes = {
            tag: len(events.summary_proto([(tag, array, md)], lambda t: False).SerializeToString())
            for tag, array, md in maps
        }
        event_bytes = len(events.summary_proto(written, lambda t: False).SerializeToString())
        for callback in callbacks.values():
            callback.on_train_end()
    ratios = [a / b for a, b in zip(times[True], times[False])]
    rows = [
        {"what": "log event, routing_map=False (s)", "value": common.median(times[False])},
        {"what": "log event, routing_map=True (s)", "value": common.median(times[True])},
        {"what": "median ratio (with / without)", "value": common.median(ratios)},
        {"what": "routing_map.record, all mapped layers (s)", "value": record_s},
        {"what": "routing-map bytes per event, all layers", "value": sum(map_bytes.values())},
        {"what": "all record bytes per event", "value": event_bytes},
    ] + [{"what": f"  {tag}", "value": size} for tag, size in map_bytes.items()]
    common.print_table(
        f"{args.model} {args.image_size}px batch {args.batch}, pooling layers, "
        f"{args.repeats} repeats",
        rows,
        [("what", "what", "{}"), ("value", "value", "{:.4g}")],
    )
    assert all(size <= 64 * 1024 + 512 for size in map_bytes.values()), map_bytes
    row = {
        "log_event_s": common.median(times[False]),
        "log_event_with_map_s": common.median(times[True]),
        "ratio": common.median(ratios),
        "record_s": record_s,
        "map_bytes": sum(map_bytes.values()),
        "largest_map_bytes": max(map_bytes.values()),
        "event_bytes": event_bytes,
    }
    print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(
        args.json,
        {
            "script": "bench_routing_map",
            "args": vars(args),
            "rows": [row],
            "times": {str(k): v for k, v in times.items()},
            "ratios": ratios,
            "map_bytes": map_bytes,
        },
    )


if __name__ == "__main__":
    main()
