"""Scale: 200 layers x 1000 steps in a real TensorBoard (Rust data server) and Chromium.

The logdir is written by `synthetic.write_large_run` (real format, ~0.9 GB).
An interaction that re-renders the layer view (its data cached in the page
or the plugin) must take under INTERACTION_BOUND_S: a bound that leaves room
for a small machine shared with other tests, without hiding a regression to
reading every series again.
"""

import contextlib
import os
import pathlib
import subprocess
import time

import pytest
import synthetic
from browser import GRID, PANELS, WAIT_MS, PageProblems, browser, tab, wait_drawn  # noqa: F401
from tbserver import get_json, running_tensorboard

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LAYERS, STEPS = 200, 1000
INTERACTION_BOUND_S = 5.0
# Opening the tab: TensorBoard's own page, the iframe, /runs (200 layers),
# three /series of 1000 steps, /routing and /step.
FIRST_VIEW_BOUND_S = 15.0
# The grid at a step before the last reads every series of the run whole
# once (800 series x 1000 steps through the data server). Bounded in the
# CPU time TensorBoard and its data server spend on it, which a busy machine
# does not stretch as it stretches the wall-clock time.
FIRST_FULL_GRID_CPU_BOUND_S = 40.0


def _process_tree(pid):
    """`{pid: rss in KiB}` of a process and its descendants (the Rust data server)."""
    rows = [
        line.split()
        for line in subprocess.run(
            ["ps", "-e", "-o", "pid=,ppid=,rss="], capture_output=True, text=True, check=True
        ).stdout.splitlines()
    ]
    tree, grew = {pid}, True
    while grew:
        grew = False
        for child, parent, _ in rows:
            if int(parent) in tree and int(child) not in tree:
                tree.add(int(child))
                grew = True
    return {int(child): int(rss) for child, _, rss in rows if int(child) in tree}


def _rss_mb(pid):
    """Resident memory of a process and its descendants, in MB."""
    return sum(_process_tree(pid).values()) / 1024


def _cpu_s(pid):
    """CPU time (user and system) a process and its running descendants have used, in seconds."""
    ticks = 0
    for member in _process_tree(pid):
        with contextlib.suppress(OSError):
            # Fields 14 and 15 of /proc/PID/stat, counted after the command name's ")".
            fields = pathlib.Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _tensorboard_pid(port):
    out = subprocess.run(
        ["pgrep", "-f", f"tensorboard.main .*--port {port}"], capture_output=True, text=True
    ).stdout
    (pid,) = out.split()
    return int(pid)


@pytest.fixture(scope="module")
def large_logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale")
    start = time.perf_counter()
    names, path = synthetic.write_large_run(root / "logs" / "big", layers=LAYERS, steps=STEPS)
    seconds = time.perf_counter() - start
    print(
        f"\nwrote {LAYERS} layers x {STEPS} steps ({os.path.getsize(path) / 1e6:.0f} MB) "
        f"in {seconds:.1f} s"
    )
    return root, names


def _all_loaded(url):
    runs = get_json(f"{url}/data/plugin/gradviz/runs")["runs"]
    return (
        len(runs) == 1
        and len(runs[0]["layers"]) == LAYERS
        and all(layer["max_step"] == STEPS for layer in runs[0]["layers"])
    )


def _timed(action, done):
    start = time.perf_counter()
    action()
    done()
    return time.perf_counter() - start


def test_layer_view_of_200_layers_x_1000_steps_stays_responsive(browser, large_logdir):  # noqa: F811
    root, names = large_logdir
    start = time.perf_counter()
    with running_tensorboard(
        root / "logs", root / "tensorboard.log", _all_loaded, timeout=300
    ) as url:
        loaded_s = time.perf_counter() - start
        pid = _tensorboard_pid(url.rsplit(":", 1)[1])
        loaded_rss_mb = _rss_mb(pid)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(WAIT_MS)
        problems = PageProblems(page)
        times = {}
        try:
            frame = tab(page)
            times["first view"] = _timed(
                lambda: page.goto(f"{url}/#gradviz"),
                lambda: wait_drawn(frame, PANELS, layer=names[0], step=STEPS),
            )
            # The grid is in "Across layers", fetched when that section is first shown.
            across = frame.get_by_role("tab", name="Across layers")
            the_layer = frame.get_by_role("tab", name="The layer")
            across.click()
            wait_drawn(frame, GRID, step=STEPS)
            times["first view + grid"] = time.perf_counter() - start - loaded_s
            assert frame.locator("table.layer-grid tbody tr").count() == LAYERS
            assert (
                frame.locator("h2", has_text="All layers of")
                .text_content()
                .endswith(f"at step {STEPS}")
            )
            assert frame.get_by_label("Layer", exact=True).input_value() == names[0]
            the_layer.click()

            layer_select = frame.get_by_label("Layer", exact=True)
            times["switch layer"] = _timed(
                lambda: layer_select.select_option(names[150]),
                lambda: wait_drawn(frame, PANELS, layer=names[150], step=STEPS),
            )

            slider = frame.get_by_label("Step", exact=True)
            slider.focus()
            cpu_before_first_step = _cpu_s(pid)
            times["step to first"] = _timed(
                lambda: slider.press("Home"),
                lambda: wait_drawn(frame, PANELS, layer=names[150], step=1),
            )
            times["grid at first step"] = _timed(
                across.click, lambda: wait_drawn(frame, GRID, step=1)
            )
            first_grid_cpu_s = _cpu_s(pid) - cpu_before_first_step
            times["grid at next step"] = _timed(
                lambda: slider.press("ArrowRight"),
                lambda: wait_drawn(frame, GRID, step=2),
            )
            times["step forward"] = _timed(
                the_layer.click,
                lambda: wait_drawn(frame, PANELS, layer=names[150], step=2),
            )
            times["switch layer back"] = _timed(
                lambda: layer_select.select_option(names[3]),
                lambda: wait_drawn(frame, PANELS, layer=names[3], step=2),
            )
            rss_mb = _rss_mb(pid)
        finally:
            page.close()
    print(
        f"start -> all loaded {loaded_s:.1f} s; "
        + "; ".join(f"{k} {v:.2f} s" for k, v in times.items())
        + f"; tensorboard RSS (with data server) {loaded_rss_mb:.0f} MB loaded, "
        + f"{rss_mb:.0f} MB at the end; the grid at the first step took the server "
        + f"{first_grid_cpu_s:.1f} s of CPU time"
    )
    assert problems.errors == []
    # Measured 3.4 GB at the end, ~0.55 GB of it the plugin's decoded stats
    # series (800 x 1000 x 86 float64): a regression that keeps more shows here.
    assert rss_mb < 6000
    assert times["first view"] < FIRST_VIEW_BOUND_S
    assert first_grid_cpu_s < FIRST_FULL_GRID_CPU_BOUND_S, (first_grid_cpu_s, times)
    for interaction in (
        "switch layer",
        "step to first",
        "step forward",
        "grid at next step",
        "switch layer back",
    ):
        assert times[interaction] < INTERACTION_BOUND_S, (interaction, times)
