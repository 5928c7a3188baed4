"""`/series` and the layer view at 10,000 steps: the server's downsampled body, then Chromium.

A run of `--layers` synthetic max pools x `--steps` events, every step
kept (`tests/synthetic.write_large_run`, with a one-step spike), served by
`tensorboard` (Rust data server) with
`--samples_per_plugin=gradviz=0,histograms=0,gradviz_digest=0`. Times:

- `/series` of one tensor at `width=300` (what the layer view asks for at
  1400 px), cold (the first request of the series) and warm (again), and the
  whole series (`width=10000`, every step: the body the tab fetched before
  downsampling), with each body's size;
- in headless Chromium (1400 x 1000): `page.goto` until the layer view shows
  its panels at the last step and its spread charts (first render), and a
  change of layer until the new layer's panels and charts are drawn; both
  again after a page reload, the server's caches then warm.

    python bench/bench_series.py --json bench/results/series.json
"""

import os
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import common  # noqa: E402
import synthetic  # noqa: E402
import tbserver  # noqa: E402

SAMPLES = ("--samples_per_plugin", "gradviz=0,histograms=0,gradviz_digest=0")
TENSORS = ("activation", "input_gradient", "output_gradient")


def _get(url):
    begin = time.perf_counter()
    with urllib.request.urlopen(url, timeout=300) as response:
        size = len(response.read())
    return time.perf_counter() - begin, size


def measure_routes(url, layer):
    base = f"{url}/data/plugin/gradviz/series?run=long&layer={layer.replace('/', '%2F')}"
    result = {}
    for tensor in TENSORS:
        cold = _get(f"{base}&tensor={tensor}&width=300")
        warm = _get(f"{base}&tensor={tensor}&width=300")
        whole = _get(f"{base}&tensor={tensor}&width=10000")
        result[tensor] = {
            "cold_s": cold[0],
            "warm_s": warm[0],
            "bytes": cold[1],
            "whole_s": whole[0],
            "whole_bytes": whole[1],
        }
    return result


def measure_browser(url, names, steps):
    def drawn(frame, layer):
        # The layer's panels and its charts over steps say they show it (tests/browser.py).
        for view in (common.browser.PANELS, common.browser.HEATMAPS):
            common.wait_drawn(frame, view, layer=layer, step=steps)

    with common.chromium_page(1400, 1000, 300) as (page, errors):
        begin = time.perf_counter()
        page.goto(f"{url}/#gradviz")
        frame = page.frame_locator(common.PLUGIN_FRAME)
        drawn(frame, names[0])
        first_render = time.perf_counter() - begin
        begin = time.perf_counter()
        frame.get_by_label("Layer", exact=True).select_option(names[1])
        drawn(frame, names[1])
        layer_change = time.perf_counter() - begin
        # Again with the server's caches warm: the page reloaded (the tab's own cache
        # empty), which opens the layer its URL names, then back to the first.
        begin = time.perf_counter()
        page.reload()
        frame = page.frame_locator(common.PLUGIN_FRAME)
        drawn(frame, names[1])
        warm_first_render = time.perf_counter() - begin
        begin = time.perf_counter()
        frame.get_by_label("Layer", exact=True).select_option(names[0])
        drawn(frame, names[0])
        warm_layer_change = time.perf_counter() - begin
        columns = int(
            frame.locator(
                '.heatmap-figure[data-tensor="output_gradient"] svg.spread'
            ).get_attribute("data-columns")
        )
    return {
        "first_render_s": first_render,
        "layer_change_s": layer_change,
        "warm_first_render_s": warm_first_render,
        "warm_layer_change_s": warm_layer_change,
        "spread_columns": columns,
        "page_errors": errors,
    }


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--steps", type=int, default=10_000)
    args = p.parse_args()
    if args.smoke:
        args.layers, args.steps = 2, 1200
    with tempfile.TemporaryDirectory() as root:
        logs = os.path.join(root, "logs")
        names, _ = synthetic.write_large_run(
            os.path.join(logs, "long"),
            layers=args.layers,
            steps=args.steps,
            spike=(int(args.steps * 0.7777), 1e4),
        )

        def loaded(url):
            runs = tbserver.get_json(f"{url}/data/plugin/gradviz/runs")["runs"]
            return len(runs) == 1 and all(
                layer["max_step"] == args.steps for layer in runs[0]["layers"]
            )

        log = os.path.join(root, "tensorboard.log")
        load_before = os.getloadavg()[0]
        with tbserver.running_tensorboard(logs, log, loaded, SAMPLES, timeout=600) as url:
            row = {"layers": args.layers, "steps": args.steps}
            for tensor, times in measure_routes(url, names[-1]).items():
                row.update({f"series_{tensor}_{key}": value for key, value in times.items()})
            row.update(measure_browser(url, names, args.steps))
        row.update(load_average_before=load_before, load_average_after=os.getloadavg()[0])
    print("RESULT", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    common.write_json(args.json, {"rows": [row]})


if __name__ == "__main__":
    main()
