"""No size cliff: a long run's digest in parts, served by a plain `tensorboard --logdir`.

Writes `--layers` synthetic max pools x `--steps` events (`bench_long_run.write_long_run`,
each tensor with its precision record, so that one event's digest has the rows of a real
run's: 31.7 KB at 176 layers, all ResNet50 layers' ~34 KB), the digest in parts as the
callback writes it (layout 13), full records at one event in `--full-every`. Serves it with
`tensorboard --logdir ROOT` and no other flag (the Rust data server, `--load_fast=true` by
default) and measures: the RSS of TensorBoard and its data server after the load and at
their peak, `/timeline?width=1000` (the depth x time view) cold and warm, a zoom to 1,000
steps (`start`, `end`) cold and warm, and with `--onset` `/onset`. With `--whole`, the same
run written with its digest under one tag (before layout 13) is served too: its `/timeline`
asks for the whole series in one `read_tensors` answer, which TensorBoard refuses past 256 MB.

    nice -n 10 python bench/bench_no_cliff.py --layers 176 --steps 30000 \
        --json bench/results/no_cliff.json
"""

import gzip
import json
import os
import pathlib
import re
import sys
import tempfile
import time
import urllib.error

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_long_run  # noqa: E402
import common  # noqa: E402
import grpc  # noqa: E402
from tensorboard.data.proto import data_provider_pb2  # noqa: E402

from tb_gradviz.format import digest, digest_parts  # noqa: E402

# The largest gRPC message TensorBoard's client of its data server accepts.
GRPC_LIMIT_BYTES = 256 << 20
NO_FLAGS = ()


def digest_bytes(layers):
    """The bytes of one event's digest of `layers` layers (as `write_long_run` writes them)."""
    records = bench_long_run.event_records(layers, 0, precision=True)
    ((_, vector, _),) = digest.digest_records(records)
    return int(vector.nbytes)


def timed(url):
    """`(seconds, status, parsed body or None)` of a GET as a browser asks it (gzip accepted)."""
    begin = time.perf_counter()
    try:
        seconds, status, body, headers = bench_long_run._gzipped_get(url)
    except urllib.error.HTTPError as e:  # a 500: its text says why
        return time.perf_counter() - begin, e.code, e.read().decode(errors="replace")
    if headers.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return seconds, status, json.loads(body, parse_constant=float)


def answer_sizes(root, steps):
    """`{tag: bytes of its read_tensors answer, or the data server's refusal}` of each digest
    tag of the run at `root/long`, asked of TensorBoard's Rust data server as the plugin asks
    (one tag a request, every point), through TensorBoard's own 256 MB client."""
    from tensorboard.data import server_ingester
    from tensorboard.util import grpc_util

    ingester = server_ingester.SubprocessServerDataIngester(
        server_ingester.get_server_binary(),
        root,
        reload_interval=0,  # load once
        channel_creds_type=grpc_util.ChannelCredsType.LOCAL,
        samples_per_plugin={digest.PLUGIN_NAME: 0},
    )
    ingester.start()
    stub = ingester.data_provider._stub
    found = {}
    deadline = time.perf_counter() + 1800
    while not found or max(found.values()) < steps:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"the data server did not load {root} within 30 minutes")
        time.sleep(2)
        listed = data_provider_pb2.ListTensorsRequest(experiment_id="")
        listed.plugin_filter.plugin_name = digest.PLUGIN_NAME
        for run in stub.ListTensors(listed).runs:
            found = {tag.tag_name: tag.metadata.max_step for tag in run.tags}
    sizes = {}
    for tag in sorted(t for t in found if t.count("/") >= 1 and not t.endswith("/budget")):
        request = data_provider_pb2.ReadTensorsRequest(experiment_id="")
        request.plugin_filter.plugin_name = digest.PLUGIN_NAME
        request.run_tag_filter.tags.names.append(tag)
        request.downsample.num_points = 10**8
        try:
            sizes[tag] = stub.ReadTensors(request).ByteSize()
        except grpc.RpcError as e:
            sizes[tag] = f"{e.code().name}: {e.details()}"
    return sizes


def serve(root, steps, full_every, zoom, log_path, onset):
    """The figures of one run served by `tensorboard --logdir root`, no other flag."""
    with bench_long_run.running_tensorboard(
        root, steps, full_every, samples=NO_FLAGS, log_path=log_path
    ) as (base, load_s, sampler, rss_mb):
        result = {"load_s": load_s, "rss_after_load_mb": rss_mb()}
        url = f"{base}/data/plugin/gradviz/timeline?run=long&width=1000"
        cold, status, body = timed(url)
        result.update(timeline_status=status, timeline_cold_s=cold)
        if status != 200:
            log = pathlib.Path(log_path).read_text(errors="replace")
            refused = re.findall(r"[^\n]*(?:larger than max|RESOURCE_EXHAUSTED)[^\n]*", log)
            result["refusal"] = (refused[-1] if refused else str(body))[:300]
            result["peak_rss_mb"] = sampler.peak_kb / 1024
            return result
        result["timeline_steps"] = body["steps"]
        result["timeline_warm_s"] = common.median([timed(url)[0] for _ in range(3)])
        first, last = zoom
        zoomed = f"{url}&start={first}&end={last}"
        cold, status, body = timed(zoomed)
        assert status == 200 and body["steps"] == last - first + 1, (status, body and body["steps"])
        result["zoom_steps"] = body["steps"]
        result["zoom_cold_s"] = cold
        result["zoom_warm_s"] = common.median([timed(zoomed)[0] for _ in range(3)])
        # Another range of the same size, not asked before: what a second drag costs.
        first, last = first // 2, first // 2 + (last - first)
        result["zoom_other_s"] = timed(f"{url}&start={first}&end={last}")[0]
        if onset:
            result["onset_s"], status, body = timed(f"{base}/data/plugin/gradviz/onset?run=long")
            assert status == 200 and body["steps"] == steps, status
        result["rss_after_views_mb"] = rss_mb()
        result["peak_rss_mb"] = sampler.peak_kb / 1024
        result["peak_data_server_rss_mb"] = sampler.peak_children_kb / 1024
        return result


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=176)
    p.add_argument("--steps", type=int, default=30000)
    p.add_argument("--full-every", type=int, default=100)
    p.add_argument("--whole", action="store_true", help="also the run with its digest whole")
    p.add_argument("--onset", action="store_true", help="also time /onset (it judges warnings too)")
    p.add_argument("--logdir", help="where the runs are written (kept), or read if already there")
    args = p.parse_args()
    if args.smoke:
        args.layers, args.steps, args.full_every = 3, 60, 10
    root = args.logdir or tempfile.mkdtemp()
    event_bytes = digest_bytes(args.layers)
    per_part = digest_parts.events_per_part(event_bytes)
    facts = {
        "layers": args.layers,
        "steps": args.steps,
        "digest_bytes_per_event": event_bytes,
        "digest_series_bytes": event_bytes * args.steps,
        "events_per_part": per_part,
        "parts": -(-args.steps // per_part),
        "part_bytes": per_part * event_bytes,
        "grpc_limit_bytes": GRPC_LIMIT_BYTES,
    }
    zoom = (args.steps // 2, args.steps // 2 + min(1000, args.steps // 2) - 1)
    rows = []
    for name, in_parts in (("parts", True), ("whole", False))[: 2 if args.whole else 1]:
        folder = os.path.join(root, name)
        path = os.path.join(folder, "long")
        written = {"run": name}
        if not os.path.isdir(path):
            begin = time.perf_counter()
            written["bytes"] = bench_long_run.write_long_run(
                path, args.layers, args.steps, args.full_every, precision=True, in_parts=in_parts
            )
            written["write_s"] = time.perf_counter() - begin
        sizes = answer_sizes(folder, args.steps)
        refused = [size for size in sizes.values() if isinstance(size, str)]
        answered = [size for size in sizes.values() if not isinstance(size, str)]
        written.update(
            answers=len(sizes),
            largest_answer_bytes=max(answered, default=None),
            refused_answer=refused[0][:200] if refused else None,
        )
        log_path = os.path.join(tempfile.mkdtemp(), f"tensorboard_{name}.log")
        row = dict(
            facts,
            **written,
            **serve(folder, args.steps, args.full_every, zoom, log_path, args.onset),
        )
        common.print_table(
            f"{name}: {args.layers} layers x {args.steps} events, tensorboard --logdir, no flags",
            [row],
            [(k, k, "{}" if isinstance(v, str) else "{:.4g}") for k, v in row.items()],
        )
        rows.append(row)
    for row in rows:
        print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
