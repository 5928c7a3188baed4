"""`tb-gradviz check` and `/step` on a long run whose digest is whole and full records a sample.

The run is bench_long_run's: LAYERS synthetic max-pool layers (3 tensors and a
routing record each) over STEPS log events, every event's digest and the full
records of one event in `full_every`. `check` (text, then `--format json`) runs
as a child process under `/usr/bin/time -v` (wall time, peak RSS); `/step` is
timed in this process through the plugin, over the logdir loaded as `check`
loads it: at an early step cold (its first request), the same step again
(warm), and a step change (the next logged step).

    python bench/bench_check.py --layers 176 --steps 10000 --json bench/results/check.json
"""

import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_long_run  # noqa: E402
import common  # noqa: E402


def timed_check(logdir, *extra):
    """Runs `tb-gradviz check LOGDIR *extra` under `/usr/bin/time -v`."""
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "tb_gradviz.cli", "check", logdir]
    result = subprocess.run([*command, *extra], capture_output=True, text=True)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", result.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr)
    if wall is None or rss is None:
        raise RuntimeError(f"check failed: {result.stderr[-2000:]}")
    parts = [float(p) for p in wall.group(1).split(":")]
    seconds = sum(p * 60**i for i, p in enumerate(reversed(parts)))
    # CPU time (user + system) says what the wall time owes to the machine's other work.
    cpu = sum(
        float(re.search(rf"{kind} time \(seconds\): (\S+)", result.stderr).group(1))
        for kind in ("User", "System")
    )
    return {
        "wall_s": seconds,
        "cpu_s": cpu,
        "peak_rss_mb": int(rss.group(1)) / 1024,
        "status": result.returncode,
    }


def step_times(logdir, run, early):
    from tb_gradviz.cli.logs import open_logdir

    begin = time.perf_counter()
    gradviz, ctx, experiment = open_logdir(logdir)
    load = time.perf_counter() - begin
    times = {}
    for name, step in (("cold", early), ("warm", early), ("change", early + 1)):
        begin = time.perf_counter()
        body = gradviz.step_impl(ctx, experiment, run, step)
        times[f"step_{name}_s"] = time.perf_counter() - begin
    times["load_s"] = load
    times["step_layers"] = len(body["layers"])
    return times


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=176)
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--full-every", type=int, default=100)
    p.add_argument("--early-step", type=int, default=5)
    args = p.parse_args()
    if args.smoke:
        args.layers, args.steps, args.full_every = 3, 50, 10
    root = tempfile.mkdtemp()
    size = bench_long_run.write_long_run(
        os.path.join(root, "long"), args.layers, args.steps, args.full_every
    )
    rows = [
        dict(timed_check(root), part="check_text"),
        dict(timed_check(root, "--format", "json"), part="check_json"),
        dict(step_times(root, "long", args.early_step), part="step"),
    ]
    load = os.getloadavg()
    for row in rows:
        row.update(
            layers=args.layers,
            steps=args.steps,
            full_every=args.full_every,
            bytes=size,
            load_average_1min=load[0],
        )
        print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
