"""Latency and memory of the GradViz plugin in a real TensorBoard, for both loaders.

Writes (or reuses) a synthetic logdir of L layers x S steps (`synthetic`,
real format, numpy only), then for each loader (`--load_fast=false`: the
Python multiplexer; `--load_fast=true`: the Rust data server) starts
`tensorboard` on 127.0.0.1 with `--samples_per_plugin=gradviz=0,histograms=0`
and measures:

- start -> ready: until /data/plugins_listing enables gradviz and /runs
  lists every layer up to its last step (all data loaded);
- start -> first layer view: the requests the frontend makes for a layer
  view (/runs, /series x3, /routing, /step), issued as soon as the plugin is
  enabled and repeated until they return the full data;
- in headless Chromium (Debian chromium, playwright), on the ready server:
  page.goto -> the layer view rendered (three panels at the last step) and
  -> the layer grid rendered;
- each route's latency, p50 and p95, cold (first request of each tag, the
  plugin's decoded-series cache empty) and warm (the same requests again);
- peak RSS of tensorboard plus its children (the Rust data server), sampled
  every 50 ms over the whole run.

Example:
  python bench/bench_plugin.py --layers 50 --steps 500
"""

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The synthetic logdirs are a test helper, not part of the installed package.
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)
import common  # noqa: E402
import synthetic  # noqa: E402

RUN = "synthetic"
TENSORS = ("activation", "input_gradient", "output_gradient")


def write_logdir(root, layers, steps, seed):
    """Writes the synthetic run once per (layers, steps, seed); returns the logdir."""
    logdir = pathlib.Path(root) / f"gradviz_{layers}x{steps}_seed{seed}"
    done = logdir / "COMPLETE"
    if not done.exists():
        start = time.perf_counter()
        synthetic.write_run(logdir / RUN, layers=layers, steps=steps, seed=seed)
        done.write_text("")
        print(
            f"wrote {layers} layers x {steps} steps to {logdir} "
            f"in {time.perf_counter() - start:.1f} s"
        )
    return logdir


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=60):
    """GETs a URL; returns (seconds, status, body bytes)."""
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        body, status = error.read(), error.code
    return time.perf_counter() - start, status, body


class RssSampler(threading.Thread):
    """Samples the RSS of a process tree every 50 ms; keeps the peak of the sum, and the
    process's own (without its children) as last sampled. `since_mark_kb` is the peak of the sum
    since the last `mark()` (since the start before one)."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak_kb, self.peak_children_kb, self.main_kb = pid, 0, 0, 0
        self.since_mark_kb = 0
        self._done = threading.Event()

    def mark(self):
        """Begins a new `since_mark_kb` at the current RSS."""
        kids = common.children(self.pid)
        self.since_mark_kb = (common.rss_kb(self.pid) or 0) + sum(
            common.rss_kb(k) or 0 for k in kids
        )

    def run(self):
        while not self._done.is_set():
            kids = common.children(self.pid)
            main = self.main_kb = common.rss_kb(self.pid) or 0
            kid_kb = sum(common.rss_kb(k) or 0 for k in kids)
            self.peak_kb = max(self.peak_kb, main + kid_kb)
            self.since_mark_kb = max(self.since_mark_kb, main + kid_kb)
            self.peak_children_kb = max(self.peak_children_kb, kid_kb)
            self._done.wait(0.05)

    def stop(self):
        self._done.set()
        self.join()


@contextlib.contextmanager
def tensorboard(logdir, load_fast, log_path):
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "tensorboard.main",
        "--logdir",
        str(logdir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--samples_per_plugin",
        "gradviz=0,histograms=0",
        f"--load_fast={load_fast}",
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        )
    sampler = RssSampler(process.pid)
    sampler.start()
    try:
        yield f"http://127.0.0.1:{port}", process, sampler, time.perf_counter()
    finally:
        sampler.stop()
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def route(base, name, **params):
    query = urllib.parse.urlencode(params)
    return f"{base}/data/plugin/gradviz/{name}" + (f"?{query}" if query else "")


def layer_view_urls(base, layer):
    """The requests the frontend makes to show one layer (frontend/index.js)."""
    return (
        [route(base, "runs")]
        + [route(base, "series", run=RUN, layer=layer, tensor=t) for t in TENSORS]
        + [route(base, "routing", run=RUN, layer=layer), route(base, "step", run=RUN)]
    )


def wait_until(predicate, process, log_path, timeout):
    deadline = time.perf_counter() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"tensorboard exited with {process.returncode}:\n"
                f"{pathlib.Path(log_path).read_text()}"
            )
        with contextlib.suppress(OSError, ValueError):
            if predicate():
                return time.perf_counter()
        if time.perf_counter() > deadline:
            raise RuntimeError(
                f"not ready within {timeout} s:\n{pathlib.Path(log_path).read_text()[-3000:]}"
            )
        time.sleep(0.05)


def enabled(base):
    _, status, body = get(f"{base}/data/plugins_listing", timeout=5)
    return status == 200 and json.loads(body).get("gradviz", {}).get("enabled")


def complete_view(base, layer, steps):
    """Fetches a layer view; true when every request answered 200 with all `steps` steps."""
    bodies = []
    for url in layer_view_urls(base, layer):
        _, status, body = get(url)
        if status != 200:
            return False
        bodies.append(json.loads(body))
    runs, *series, routing, step = bodies
    layers = runs["runs"][0]["layers"] if runs["runs"] else []
    return (
        len(layers) > 0
        and layers[0]["max_step"] == steps
        and all(len(s["steps"]) == steps for s in series)
        and len(routing["steps"]) == steps
        and step["step"] == steps
    )


def all_loaded(base, layers, steps):
    _, status, body = get(route(base, "runs"))
    runs = json.loads(body)["runs"] if status == 200 else []
    return (
        bool(runs)
        and len(runs[0]["layers"]) == layers
        and all(layer["max_step"] == steps for layer in runs[0]["layers"])
    )


def browser_view(base, steps, timeout_s):
    """Seconds from page.goto to the layer view rendered, and to the layer grid (its section
    opened once the layer view is drawn) rendered."""
    with common.chromium_page(1600, 1000, timeout_s) as (page, _):
        start = time.perf_counter()
        page.goto(f"{base}/#gradviz")
        frame = page.frame_locator(common.PLUGIN_FRAME)
        common.wait_drawn(frame, common.browser.PANELS, step=steps)
        view = time.perf_counter() - start
        # The grid is in the tab's "Across layers" section, which loads when shown.
        frame.get_by_role("tab", name="Across layers").click()
        common.wait_drawn(frame, common.browser.GRID, step=steps)
        grid = time.perf_counter() - start
    return view, grid


def latencies(urls, repeats=1):
    times = []
    for _ in range(repeats):
        for url in urls:
            seconds, status, _ = get(url)
            if status != 200:
                raise RuntimeError(f"{url}: HTTP {status}")
            times.append(seconds)
    return times


def measure_loader(args, logdir, load_fast, layer_names, workdir):
    log_path = pathlib.Path(workdir) / f"tensorboard_{load_fast}.log"
    row = {
        "loader": "python (--load_fast=false)"
        if load_fast == "false"
        else "rust (--load_fast=true)"
    }
    with tensorboard(logdir, load_fast, log_path) as (base, process, sampler, started):
        t_enabled = wait_until(lambda: enabled(base), process, log_path, args.timeout)
        # What a user opening the tab at once sees: keep asking for the first
        # layer's view until it is complete.
        t_view = wait_until(
            lambda: complete_view(base, layer_names[0], args.steps), process, log_path, args.timeout
        )
        t_ready = wait_until(
            lambda: all_loaded(base, args.layers, args.steps), process, log_path, args.timeout
        )
        row.update(
            start_to_enabled_s=t_enabled - started,
            start_to_first_view_s=t_view - started,
            start_to_all_loaded_s=t_ready - started,
        )
        if args.browser:
            row["browser_layer_view_s"], row["browser_grid_s"] = browser_view(
                base, args.steps, args.timeout
            )
        # Cold: each tag's first request (the browser above read only layer 0; skip it).
        others = layer_names[1:]
        series_urls = [
            route(base, "series", run=RUN, layer=layer, tensor=t)
            for layer in others
            for t in TENSORS
        ]
        routing_urls = [route(base, "routing", run=RUN, layer=layer) for layer in others]
        step_urls = [route(base, "step", run=RUN, step=s) for s in (args.steps, args.steps // 2, 1)]
        routes = {
            "runs": [route(base, "runs")],
            "series": series_urls,
            "routing": routing_urls,
            "step": step_urls,
        }
        for name, urls in routes.items():
            cold = latencies(urls)
            warm = latencies(urls, repeats=max(1, args.warm_requests // len(urls)))
            for kind, times in (("cold", cold), ("warm", warm)):
                row[f"{name}_{kind}_p50_ms"] = common.percentile(times, 50) * 1e3
                row[f"{name}_{kind}_p95_ms"] = common.percentile(times, 95) * 1e3
                row[f"{name}_{kind}_n"] = len(times)
        # One whole layer view (all its requests, in the frontend's order), warm.
        view_times = [
            sum(latencies(layer_view_urls(base, layer))) for layer in others[: args.views]
        ]
        row["layer_view_requests_warm_p50_ms"] = common.percentile(view_times, 50) * 1e3
        _, _, body = get(route(base, "step", run=RUN))
        row["step_body_kb"] = len(body) / 1024
        _, _, body = get(series_urls[0])
        row["series_body_kb"] = len(body) / 1024
        row["peak_rss_mb"] = sampler.peak_kb / 1024
        row["peak_rss_children_mb"] = sampler.peak_children_kb / 1024
    return row


COLUMNS_START = [
    ("loader", "loader", "{}"),
    ("start_to_enabled_s", "enabled s", "{:.1f}"),
    ("start_to_first_view_s", "1st view (HTTP) s", "{:.1f}"),
    ("start_to_all_loaded_s", "all loaded s", "{:.1f}"),
    ("browser_layer_view_s", "browser view s", "{:.2f}"),
    ("browser_grid_s", "browser grid s", "{:.2f}"),
    ("layer_view_requests_warm_p50_ms", "view reqs ms", "{:.0f}"),
    ("peak_rss_mb", "peak RSS MB", "{:.0f}"),
    ("peak_rss_children_mb", "of which children", "{:.0f}"),
]


def main():
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=50)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--loaders", default="false,true", help="--load_fast values to measure")
    p.add_argument(
        "--cache",
        default=os.path.join(tempfile.gettempdir(), "tb_gradviz_bench"),
        help="where the synthetic logdir is written once and reused",
    )
    p.add_argument(
        "--warm-requests", type=int, default=150, help="about this many warm requests per route"
    )
    p.add_argument("--views", type=int, default=10, help="whole layer views timed")
    p.add_argument("--no-browser", dest="browser", action="store_false")
    p.add_argument("--timeout", type=float, default=300)
    args = p.parse_args()
    if args.smoke:
        args.layers, args.steps, args.warm_requests, args.views = 3, 5, 6, 2
    logdir = write_logdir(args.cache, args.layers, args.steps, args.seed)
    layer_names = [f"block{i}/pool" for i in range(args.layers)]
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for load_fast in args.loaders.split(","):
            rows.append(measure_loader(args, logdir, load_fast, layer_names, workdir))
    title = f"TensorBoard with {args.layers} layers x {args.steps} steps"
    common.print_table(f"{title}: start-up, first view, memory", rows, COLUMNS_START)
    route_rows = []
    for row in rows:
        for name in ("runs", "series", "routing", "step"):
            for kind in ("cold", "warm"):
                route_rows.append(
                    {
                        "loader": row["loader"],
                        "route": f"/{name}",
                        "cache": kind,
                        "p50": row[f"{name}_{kind}_p50_ms"],
                        "p95": row[f"{name}_{kind}_p95_ms"],
                        "n": row[f"{name}_{kind}_n"],
                    }
                )
    common.print_table(
        f"{title}: route latency, ms",
        route_rows,
        [
            ("loader", "loader", "{}"),
            ("route", "route", "{}"),
            ("cache", "cache", "{}"),
            ("p50", "p50 ms", "{:.1f}"),
            ("p95", "p95 ms", "{:.1f}"),
            ("n", "requests", "{}"),
        ],
    )
    common.report("bench_plugin", args, rows)


if __name__ == "__main__":
    main()
