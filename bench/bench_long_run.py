"""A long run: what the per-event digest costs, and serving /timeline over many events.

Part 1, the digest's cost: a ResNet50-shaped event (LAYERS synthetic layers,
3 tensors each, plus routing) has its digest computed (`digest.digest_records`)
and is written with and without it (`EventLog(with_digest=...)`), interleaved.

Part 2, a long run as TensorBoard keeps it with
`--samples_per_plugin=gradviz_digest=0,gradviz=K,histograms=K`: every event's
digest, and the full records of one event in `full_every`. It is written
straight to an event file, loaded with the Python multiplexer, and /timeline
is timed cold (first request) and warm, at 1000 columns.

    python bench/bench_long_run.py --layers 176 --steps 10000 --json bench/results/long_run.json
"""

import os
import resource
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import common  # noqa: E402
import synthetic  # noqa: E402
from tensorboard.backend import application  # noqa: E402
from tensorboard.backend.event_processing import (  # noqa: E402
    data_provider,
    plugin_event_multiplexer,
)
from tensorboard.compat.proto import event_pb2  # noqa: E402
from tensorboard.plugins import base_plugin  # noqa: E402
from werkzeug import test as werkzeug_test  # noqa: E402

from tb_gradviz.board import plugin  # noqa: E402
from tb_gradviz.format import digest, events  # noqa: E402


def event_records(layers, variant, seed=0):
    rng = np.random.default_rng(seed + variant)
    result = []
    for index in range(layers):
        result += synthetic.pool_records(rng, f"block{index}/pool", index, 2, 8, 4, variant)
    return result


def digest_cost(layers, repeats):
    records = event_records(layers, 0)
    digest.digest_records(records)  # the metadata cache is warm after the first event
    compute, with_digest, without = [], [], []
    folder = tempfile.mkdtemp()
    logs = {True: events.EventLog(os.path.join(folder, "a")), False: None}
    logs[False] = events.EventLog(os.path.join(folder, "b"), with_digest=False)
    for step in range(repeats):
        compute.append(common.seconds(lambda: digest.digest_records(records)))
        with_digest.append(common.seconds(lambda s=step: logs[True].write(s, records)))
        without.append(common.seconds(lambda s=step: logs[False].write(s, records)))
    for log in logs.values():
        log.close()
    ((_, vector, _),) = digest.digest_records(records)
    return {
        "layers": layers,
        "tensors": 3 * layers,
        "digest_bytes": int(vector.nbytes),
        "digest_ms": 1e3 * common.median(compute),
        "write_with_digest_ms": 1e3 * common.median(with_digest),
        "write_without_ms": 1e3 * common.median(without),
    }


def write_long_run(logdir, layers, steps, full_every, variants=4):
    """Every event's digest, and the full records at every `full_every`-th event."""
    sets = [event_records(layers, v) for v in range(variants)]
    digests = [digest.digest_records(records) for records in sets]

    def field(records, with_metadata):
        summary = events.summary_proto(records, lambda tag: with_metadata)
        return event_pb2.Event(summary=summary).SerializeToString()

    full_first = [field(records, True) for records in sets]
    full = [field(records, False) for records in sets]
    digest_first = field(digests[0], True)
    digest_fields = [field(d, False) for d in digests]
    event_file = events.EventFile(logdir)
    start = time.time()
    seen_full = False
    for s in range(steps):
        v = s % variants
        prefix = event_pb2.Event(wall_time=start + s, step=s + 1).SerializeToString()
        body = digest_first if s == 0 else digest_fields[v]
        if s % full_every == 0:
            body += full[v] if seen_full else full_first[v]
            seen_full = True
        event_file.write(prefix + body)
    event_file.close()
    return event_file.size


def serve_timeline(root, samples):
    # TensorBoard's loader imports TensorFlow at its first load: not part of the run's cost.
    warm = tempfile.mkdtemp()
    write_long_run(os.path.join(warm, "long"), 1, 2, 1)
    plugin_event_multiplexer.EventMultiplexer().AddRunsFromDirectory(warm).Reload()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    load = time.perf_counter()
    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance=samples)
    multiplexer.AddRunsFromDirectory(root)
    multiplexer.Reload()
    load = time.perf_counter() - load
    provider = data_provider.MultiplexerDataProvider(multiplexer, root)
    gradviz = plugin.GradVizPlugin(base_plugin.TBContext(logdir=root, data_provider=provider))
    client = werkzeug_test.Client(application.TensorBoardWSGI([gradviz], data_provider=provider))
    times = []
    for _ in range(3):
        begin = time.perf_counter()
        response = client.get(
            "/data/plugin/gradviz/timeline", query_string={"run": "long", "width": 1000}
        )
        times.append(time.perf_counter() - begin)
        assert response.status_code == 200, response.get_data(as_text=True)[:300]
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "load_s": load,
        "timeline_cold_s": times[0],
        "timeline_warm_s": common.median(times[1:]),
        "timeline_bytes": len(response.get_data()),
        "peak_rss_growth_mb": rss_after - rss_before,
    }


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=176)
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--full-every", type=int, default=100)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    if args.smoke:
        args.layers, args.steps, args.full_every, args.repeats = 3, 50, 10, 3
    cost = digest_cost(args.layers, args.repeats)
    common.print_table("digest cost per event", [cost], [(k, k, "{:.4g}") for k in cost])
    root = tempfile.mkdtemp()
    begin = time.perf_counter()
    size = write_long_run(os.path.join(root, "long"), args.layers, args.steps, args.full_every)
    written = {
        "steps": args.steps,
        "full_every": args.full_every,
        "bytes": size,
        "write_s": time.perf_counter() - begin,
    }
    # Every point the file holds: the full records are already one event in `full_every`.
    samples = {"gradviz_digest": 0, "gradviz": 0, "histograms": 0}
    served = dict(written, **serve_timeline(root, samples))
    common.print_table(
        "long run, /timeline at 1000 columns (Python loader)",
        [served],
        [(k, k, "{:.4g}") for k in served],
    )
    rows = [dict(cost, part="digest"), dict(served, part="long_run")]
    for row in rows:
        print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
