"""Write speed of the event writer: a local folder, a file:// URL and an S3 store on 127.0.0.1.

Writes synthetic log events of the sizes the callback writes (`--layers 2`
pooling layers, ~9.4 KB an event like ResNet50's two pools; `--layers 176`,
~0.8 MB like all of ResNet50) through `events.EventLog`, as the callback
does, and times on the training thread:

- `write_ms`: one `EventLog.write` (framing, CRC, local write and flush; for
  a remote run also handing the file to the upload thread);
- `visible_ms` (remote only): from the start of a write until the store
  holds it, when each write waits for its upload (the training thread never
  does; this is the delay a reader sees);
- `close_ms`: `EventLog.close` at the end (a remote run waits there for the
  uploads still to do);
- `uploaded_per_event_kb`: bytes put to the store per event, when events
  come back to back (requests for one file coalesce while an upload runs)
  and when each waits for its upload (`..._visible_...`: every event re-puts
  the current file whole, up to `events.ROTATE_EVENTS` / `ROTATE_BYTES`).

The S3 store is moto's server, in a process of its own, on a loopback port:
its times are the local machine's HTTP and moto's, not a cloud store's network. Targets are
interleaved (local, file, s3, local, ...) and medians reported. Run it
against another checkout's package (`PYTHONPATH=that/checkout`) to time that
writer: one from before remote log directories gets the local target only.

Examples:
  python bench/bench_remote.py --layers 2,176 --events 30 --repeats 3
  PYTHONPATH=/tmp/before python bench/bench_remote.py --layers 2,176 --events 30 --repeats 3
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The synthetic logdirs are a test helper, not part of the installed package.
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)
import common  # noqa: E402
import numpy as np  # noqa: E402
import synthetic  # noqa: E402

import tb_gradviz  # noqa: E402
from tb_gradviz.format import events  # noqa: E402

# A writer from before remote log directories has no storage layer (and would
# write "s3://..." into a local folder named "s3:"): time its local target only.
REMOTE = hasattr(events, "storage")


def event_records(layers, seed):
    """One log event's records: `layers` 2x2 max pools of 2x8x8x4 (3 tensors + routing each)."""
    rng = np.random.default_rng(seed)
    return [r for i in range(layers) for r in synthetic.pool_records(rng, f"block{i}/pool", i)]


def s3_endpoint():
    """Starts moto's S3 server on 127.0.0.1 in its own process and makes the bucket.

    Returns `(endpoint, process)`, or `(None, None)` without moto. In its own
    process, the server's work does not hold this process's GIL, as a real
    store's would not.
    """
    try:
        import boto3
        import moto.server  # noqa: F401
    except ImportError:
        return None, None
    for name, value in {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        os.environ[name] = value
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.environ["S3_ENDPOINT"] = os.environ["AWS_ENDPOINT_URL"] = endpoint
    client = boto3.client("s3", endpoint_url=endpoint)
    deadline = time.monotonic() + 60
    while True:
        try:
            client.create_bucket(Bucket="bench")
            return endpoint, process
        except Exception:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise
            time.sleep(0.2)


def run_once(target, log_dir, records, n_events, wait_for_store):
    log = events.EventLog(log_dir)
    uploader = getattr(log, "_uploader", None)
    uploaded = [0]
    if uploader is not None:
        put = log.location.layer.write

        def counting_put(url, data):
            put(url, data)
            uploaded[0] += len(data)

        log.location.layer.write = counting_put
    write_s, visible_s = [], []
    for step in range(1, n_events + 1):
        start = time.perf_counter()
        log.write(step, records)
        write_s.append(time.perf_counter() - start)
        if wait_for_store and uploader is not None:
            while uploader.pending_steps():
                time.sleep(0.0005)
            visible_s.append(time.perf_counter() - start)
    start = time.perf_counter()
    missing = log.close()
    close_s = time.perf_counter() - start
    assert not missing, f"{target}: events not in the store: {missing}"
    return write_s, visible_s, close_s, uploaded[0]


def measure(args, layers, endpoint, root):
    records = event_records(layers, args.seed)
    # Local first, always: its file size gives the bytes of an event.
    targets = ["local"] + [
        t for t in args.targets.split(",") if REMOTE and (t == "file_url" or endpoint and t == "s3")
    ]
    samples = {
        t: {
            "write": [],
            "visible": [],
            "close": [],
            "uploaded": [],
            "uploaded_visible": [],
            "bytes": 0,
        }
        for t in targets
    }
    for repeat in range(args.repeats):
        for target in targets:
            name = f"{layers}_{repeat}"
            log_dir = {
                "local": os.path.join(root, "local", name),
                "file_url": "file://" + os.path.join(root, "file_url", name),
                "s3": f"s3://bench/{name}",
            }[target]
            write_s, _, close_s, uploaded = run_once(target, log_dir, records, args.events, False)
            samples[target]["write"] += write_s
            samples[target]["close"].append(close_s)
            samples[target]["uploaded"].append(uploaded)
            if target == "s3":
                _, visible_s, _, uploaded = run_once(
                    target, f"s3://bench/{name}_visible", records, args.events, True
                )
                samples[target]["visible"] += visible_s
                samples[target]["uploaded_visible"].append(uploaded)
            if target == "local":
                folder = os.path.join(root, "local", name)
                samples[target]["bytes"] = sum(
                    os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
                )
    rows = []
    bytes_per_run = samples["local"]["bytes"]
    for target in targets:
        s = samples[target]
        row = {
            "target": target,
            "layers": layers,
            "events": args.events,
            "repeats": args.repeats,
            "event_kb": bytes_per_run / args.events / 1e3,
            "write_ms": 1e3 * common.median(s["write"]),
            "write_p95_ms": 1e3 * common.percentile(s["write"], 95),
            "write_mb_s": bytes_per_run / args.events / common.median(s["write"]) / 1e6,
            "close_ms": 1e3 * common.median(s["close"]),
            "visible_ms": 1e3 * common.median(s["visible"]) if s["visible"] else None,
            "uploaded_per_event_kb": common.median(s["uploaded"]) / args.events / 1e3
            if target == "s3"
            else None,
            "uploaded_visible_per_event_kb": (
                common.median(s["uploaded_visible"]) / args.events / 1e3 if target == "s3" else None
            ),
        }
        rows.append(row)
    return rows


def main():
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument(
        "--layers",
        default="2,176",
        help="comma list of layer counts per event (3 tensors + routing each)",
    )
    p.add_argument("--events", type=int, default=30, help="log events per run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--targets",
        default="file_url,s3",
        help="comma list of file_url, s3 (local is always timed)",
    )
    args = p.parse_args()
    if args.smoke:
        args.layers, args.events, args.repeats = "2", 5, 1
    endpoint, server = s3_endpoint() if REMOTE and "s3" in args.targets.split(",") else (None, None)
    root = tempfile.mkdtemp(prefix="bench_remote-")
    try:
        rows = [
            row
            for layers in map(int, args.layers.split(","))
            for row in measure(args, layers, endpoint, root)
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    writer = "with remote log dirs" if REMOTE else "before remote log dirs"
    common.print_table(
        f"event writer, {writer}: {tb_gradviz.__file__}",
        rows,
        [
            ("target", "target", "{}"),
            ("layers", "layers", "{}"),
            ("event_kb", "event KB", "{:,.1f}"),
            ("write_ms", "write ms", "{:.2f}"),
            ("write_p95_ms", "p95 ms", "{:.2f}"),
            ("write_mb_s", "MB/s", "{:,.0f}"),
            ("visible_ms", "in store ms", "{:.1f}"),
            ("close_ms", "close ms", "{:.1f}"),
            ("uploaded_per_event_kb", "put KB/event", "{:,.0f}"),
            ("uploaded_visible_per_event_kb", "put KB/event, waiting", "{:,.0f}"),
        ],
    )
    for row in rows:
        print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(
        args.json, {"script": "bench_remote", "args": vars(args), "writer": writer, "rows": rows}
    )


if __name__ == "__main__":
    main()
