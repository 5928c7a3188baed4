"""A long run: what the per-event digest costs, and serving /timeline over many events.

Part 1, the digest's cost: a ResNet50-shaped event (LAYERS synthetic layers,
3 tensors each, plus routing) has its digest computed (`digest.digest_records`)
and is written with and without it (`EventLog(with_digest=...)`), interleaved.

Part 2, a long run as TensorBoard keeps it with
`--samples_per_plugin=gradviz_digest=0,gradviz=K,histograms=K`: every event's
digest, and the full records of one event in `full_every`. It is written
straight to an event file, loaded with the Python multiplexer, and /timeline
is timed cold (first request) and warm, at 1000 columns.

Part 3 (`--parts ...,tensorboard`): the same run served by `tensorboard` as
README says for a long run (the default loader, the Rust data server, and
`--samples_per_plugin=gradviz_digest=0,gradviz=200,histograms=200`): the
peak and settled RSS of TensorBoard and its data server, and /timeline
through HTTP (gzip accepted, as a browser asks) cold, warm and for another
field. `--logdir` keeps the written run for another invocation. `--precision` gives each tensor
its precision record (a real run's digest rows), `--no-levels` writes the digest without its
coarser levels (before layout 15), `--plain` starts `tensorboard --logdir` with no other flag.

    python bench/bench_long_run.py --layers 176 --steps 10000 --json bench/results/long_run.json
    python bench/bench_long_run.py --parts tensorboard --logdir /tmp/long_run \
        --json bench/results/long_run_tensorboard.json
"""

import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request

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
from tb_gradviz.format import digest, events, records, summaries  # noqa: E402


def event_records(layers, variant, seed=0, precision=False):
    """One event's records of `layers` synthetic max pools; with `precision`, each tensor's
    precision record too, so that the digest has the rows of a real run's (~192 bytes a layer:
    all ResNet50 layers' digest is ~34 KB)."""
    rng = np.random.default_rng(seed + variant)
    result = []
    for index in range(layers):
        name = f"block{index}/pool"
        result += synthetic.pool_records(rng, name, index, 2, 8, 4, variant)
        for role in records.TENSOR_ROLES if precision else ():
            vector = summaries.precision_vector(rng.normal(0, 1e-3, 256))
            content = {"layer_index": index, "role": role, "index": 0, "dtype": "float32"}
            result += events.precision_records(name, role, vector, content)
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


def write_long_run(
    logdir, layers, steps, full_every, variants=4, precision=False, in_parts=True, levels=True
):
    """Every event's digest, and the full records at every `full_every`-th event; the digest in
    parts as the callback writes it, or (`in_parts=False`) under one tag, as before layout 13;
    with its coarser levels (layout 15) unless `levels` is False."""
    sets = [event_records(layers, v, precision=precision) for v in range(variants)]
    digests = [digest.digest_records(records) for records in sets]

    def field(records, with_metadata):
        summary = events.summary_proto(records, lambda tag: with_metadata)
        return event_pb2.Event(summary=summary).SerializeToString()

    full_first = [field(records, True) for records in sets]
    full = [field(records, False) for records in sets]
    # Each event's digest in its part, as the callback writes it (layout 13).
    digest_field = synthetic.DigestFields(in_parts, levels=levels)
    event_file = events.EventFile(logdir)
    start = time.time()
    seen_full = False
    for s in range(steps):
        v = s % variants
        prefix = event_pb2.Event(wall_time=start + s, step=s + 1).SerializeToString()
        body = digest_field(s + 1, digests[v][0])
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


# README's command for a long run: the digest whole, a sample of the full records.
README_SAMPLES = "gradviz_digest=0,gradviz=200,histograms=200"


def _gzipped_get(url):
    """GETs a URL as a browser does (gzip accepted); returns (seconds, status, bytes sent)."""
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
    begin = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        body = response.read()
        return time.perf_counter() - begin, response.status, body, response.headers


@contextlib.contextmanager
def running_tensorboard(
    root, steps, full_every, samples=(f"--samples_per_plugin={README_SAMPLES}",), log_path=None
):
    """Starts `tensorboard` on `root` with `samples` (README_SAMPLES; `()` for no flags) and
    waits until the run is loaded.

    Yields `(base URL, load seconds, RSS sampler, rss_mb())`: the sampler keeps
    the peak RSS of TensorBoard and its children, `rss_mb()` gives the current one.
    """
    import bench_plugin

    log_path = log_path or os.path.join(tempfile.mkdtemp(), "tensorboard.log")
    port = bench_plugin.free_port()
    command = [
        sys.executable,
        "-m",
        "tensorboard.main",
        "--logdir",
        root,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *samples,
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    sampler = bench_plugin.RssSampler(process.pid)
    sampler.start()
    base = f"http://127.0.0.1:{port}"
    last_full = ((steps - 1) // full_every) * full_every + 1

    def loaded():
        # The full records of the last event that has them are listed: the
        # loader has read the file up to there.
        _, status, body = bench_plugin.get(f"{base}/data/plugin/gradviz/runs", timeout=30)
        layers = json.loads(body)["runs"][0]["layers"] if status == 200 else []
        return bool(layers) and all(layer["max_step"] == last_full for layer in layers)

    def rss_mb():
        kids = common.children(process.pid)
        return ((common.rss_kb(process.pid) or 0) + sum(common.rss_kb(k) or 0 for k in kids)) / 1024

    try:
        started = time.perf_counter()
        bench_plugin.wait_until(lambda: bench_plugin.enabled(base), process, log_path, 300)
        bench_plugin.wait_until(loaded, process, log_path, 1800)
        load_s = time.perf_counter() - started
        # The loader goes on to the file's end: wait until the RSS holds still.
        previous = -1.0
        while abs(rss_mb() - previous) > 5:
            previous = rss_mb()
            time.sleep(3)
        yield base, load_s, sampler, rss_mb
    finally:
        sampler.stop()
        process.terminate()
        process.wait(timeout=30)


def serve_tensorboard(root, steps, full_every, plain=False):
    """RSS of `tensorboard` serving `root` (README's flags, or none when `plain`), and /timeline
    through HTTP (`running_tensorboard`)."""
    import gzip

    flags = () if plain else (f"--samples_per_plugin={README_SAMPLES}",)
    with running_tensorboard(root, steps, full_every, flags) as (base, load_s, sampler, rss_mb):
        rss_loaded, tensorboard_loaded = rss_mb(), sampler.main_kb / 1024
        peak_loading_kb = sampler.peak_kb
        sampler.mark()
        url = f"{base}/data/plugin/gradviz/timeline?run=long&width=1000"
        cold, status, cold_body, headers = _gzipped_get(url)
        assert status == 200 and headers.get("Content-Encoding") == "gzip"
        body = json.loads(gzip.decompress(cold_body), parse_constant=float)
        warm = [_gzipped_get(url)[0] for _ in range(3)]
        other_field = _gzipped_get(url + "&field=zero_share")[0]
        peak_views_kb = sampler.peak_kb
        peak_views_only_kb = sampler.since_mark_kb
        # A zoom of 1,000 steps in the middle, another, then the first again.
        middle = steps // 2
        other = max(1, min(middle + 3000, steps - 999))  # within a short (--smoke) run too
        zooms = [f"{url}&start={a}&end={a + 999}" for a in (middle, other, middle)]
        zoom_s = [_gzipped_get(zoom)[0] for zoom in zooms]
        return {
            "loader": "rust data server (default)",
            "samples_per_plugin": "" if plain else README_SAMPLES,
            "timeline_level": body.get("level"),
            "load_s": load_s,
            "rss_after_load_mb": rss_loaded,
            "tensorboard_rss_after_load_mb": tensorboard_loaded,
            "timeline_steps": body["steps"],
            "timeline_cold_s": cold,
            "timeline_warm_s": common.median(warm),
            "timeline_other_field_s": other_field,
            "zoom_first_s": zoom_s[0],
            "zoom_another_s": zoom_s[1],
            "zoom_first_again_s": zoom_s[2],
            "timeline_gzip_bytes": len(cold_body),
            "rss_after_timeline_mb": rss_mb(),
            "peak_rss_before_zoom_mb": peak_views_kb / 1024,
            "peak_rss_loading_mb": peak_loading_kb / 1024,
            "peak_rss_views_mb": peak_views_only_kb / 1024,
            "peak_rss_mb": sampler.peak_kb / 1024,
            "peak_data_server_rss_mb": sampler.peak_children_kb / 1024,
        }


def written_run(args):
    """Writes the long run (once, when `--logdir` already holds it); returns (root, facts)."""
    root = args.logdir or tempfile.mkdtemp()
    path = os.path.join(root, "long")
    if args.logdir and os.path.isdir(path):
        size = sum(entry.stat().st_size for entry in os.scandir(path))
        return root, {
            "steps": args.steps,
            "full_every": args.full_every,
            "bytes": size,
            "reused": True,
        }
    begin = time.perf_counter()
    size = write_long_run(
        path, args.layers, args.steps, args.full_every, precision=args.precision, levels=args.levels
    )
    return root, {
        "steps": args.steps,
        "full_every": args.full_every,
        "precision": args.precision,
        "levels": args.levels,
        "bytes": size,
        "write_s": time.perf_counter() - begin,
    }


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=176)
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--full-every", type=int, default=100)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument(
        "--parts",
        default="digest,python",
        help="comma-separated, of digest (its cost), python (/timeline in process, Python "
        "loader), tensorboard (a tensorboard process, Rust data server)",
    )
    p.add_argument("--logdir", help="where the long run is written, or read if already there")
    p.add_argument(
        "--precision", action="store_true", help="each tensor's precision record too (~31.7 KB)"
    )
    p.add_argument(
        "--no-levels",
        dest="levels",
        action="store_false",
        help="write the digest without its coarser levels (as before layout 15)",
    )
    p.add_argument("--plain", action="store_true", help="`tensorboard --logdir` with no other flag")
    args = p.parse_args()
    if args.smoke:
        args.layers, args.steps, args.full_every, args.repeats = 3, 50, 10, 3
    parts = args.parts.split(",")
    rows = []
    if "digest" in parts:
        cost = digest_cost(args.layers, args.repeats)
        common.print_table("digest cost per event", [cost], [(k, k, "{:.4g}") for k in cost])
        rows.append(dict(cost, part="digest"))
    if "python" in parts or "tensorboard" in parts:
        root, written = written_run(args)
    if "python" in parts:
        # Every point the file holds: the full records are already one event in `full_every`.
        samples = {"gradviz_digest": 0, "gradviz": 0, "histograms": 0}
        served = dict(written, **serve_timeline(root, samples))
        common.print_table(
            "long run, /timeline at 1000 columns (Python loader)",
            [served],
            [(k, k, "{:.4g}") for k in served],
        )
        rows.append(dict(served, part="long_run"))
    if "tensorboard" in parts:
        served = dict(written, **serve_tensorboard(root, args.steps, args.full_every, args.plain))
        common.print_table(
            "long run served by tensorboard (README's command), /timeline at 1000 columns",
            [served],
            [(k, k, "{:.4g}" if not isinstance(v, str) else "{}") for k, v in served.items()],
        )
        rows.append(dict(served, part="tensorboard"))
    for row in rows:
        print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
