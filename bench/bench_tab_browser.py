"""The GradViz tab in Chromium on a long run: its first render, a step change, the time view.

The run of bench_long_run.py (`--layers` synthetic layers x `--steps` events,
the full records at one event in `--full-every`, the digest at every event) is
served by `tensorboard` as README says for a long run
(`bench_long_run.running_tensorboard`) and opened in headless Chromium
(playwright, /usr/bin/chromium) at 1400 x 1000. Timed from Python around
playwright calls, so each figure includes a few ms of playwright's own:

- first render: `page.goto` until the layer view says it has drawn the
  run's last step with full records (its `data-drawn` marker, tests/browser.py);
- step change: the Step slider moved one position (a key press) until the
  layer view says it has drawn the new step, `--repeats` times (median and largest);
- time view: the "Over time" section opened until it says it has drawn the
  run (the server's first /timeline of the run: cold), then the page reloaded
  until it says so again (warm: the page's own load included).

    python bench/bench_tab_browser.py --logdir /tmp/long_run --json bench/results/tab_browser.json
"""

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_long_run  # noqa: E402
import common  # noqa: E402

# The views' elements that say which state they have drawn (tests/browser.py).
PANELS, TIMELINE = common.browser.PANELS, common.browser.TIMELINE


def measure(base, last_full, full_every, repeats):
    with common.chromium_page(1400, 1000, 180) as (page, errors):
        begin = time.perf_counter()
        page.goto(f"{base}/#gradviz&run=long")
        frame = page.frame_locator(common.PLUGIN_FRAME)
        common.wait_drawn(frame, PANELS, run="long", step=last_full)
        first_render = time.perf_counter() - begin
        slider = frame.get_by_label("Step", exact=True)
        changes = []
        # The layer view's steps are those with full records: one position left is one
        # `full_every` earlier.
        for step in range(
            last_full - full_every, last_full - (repeats + 1) * full_every, -full_every
        ):
            begin = time.perf_counter()
            slider.press("ArrowLeft")
            common.wait_drawn(frame, PANELS, run="long", step=step)
            changes.append(time.perf_counter() - begin)
        times = {}
        for name in ("cold", "warm"):
            begin = time.perf_counter()
            if name == "warm":
                # The page again, from its URL, which now opens the time view.
                page.reload()
                frame = page.frame_locator(common.PLUGIN_FRAME)
            else:
                frame.get_by_role("tab", name="Over time").click()
            common.wait_drawn(frame, TIMELINE, run="long")
            times[name] = time.perf_counter() - begin
        columns = int(frame.locator("canvas.timeline-canvas").get_attribute("data-columns"))
        assert errors == [], errors
    return {
        "first_render_s": first_render,
        "step_change_median_s": common.median(changes),
        "step_change_max_s": max(changes),
        "step_changes": len(changes),
        "time_view_cold_s": times["cold"],
        "time_view_warm_s": times["warm"],
        "time_view_columns": columns,
    }


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=176)
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--full-every", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--logdir", help="where the long run is written, or read if already there")
    # The run bench_long_run writes by default: no precision records, the digest's levels.
    p.set_defaults(precision=False, levels=True)
    args = p.parse_args()
    if args.smoke:
        args.layers, args.steps, args.full_every, args.repeats = 3, 50, 10, 2
        args.logdir = args.logdir or tempfile.mkdtemp()
    root, written = bench_long_run.written_run(args)
    last_full = ((args.steps - 1) // args.full_every) * args.full_every + 1
    with bench_long_run.running_tensorboard(root, args.steps, args.full_every) as served:
        base, load_s, sampler, rss_mb = served
        row = dict(
            written, load_s=load_s, **measure(base, last_full, args.full_every, args.repeats)
        )
        row["peak_rss_mb"] = sampler.peak_kb / 1024
    common.print_table("the tab in Chromium on a long run", [row], [(k, k, "{:.4g}") for k in row])
    print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"rows": [row]})


if __name__ == "__main__":
    main()
