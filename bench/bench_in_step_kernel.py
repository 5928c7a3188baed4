"""The in-step kernel's speed against one plain read of the same values: is it memory-bound?

`in_step_kernel.row_along` over tensors shaped as ResNet50's at 64 px, batch 16
(16 x 16 x 16 x 256 float32, ReLU-like: about half the values zero, the
channels axis last), timed three ways in one process, medians of `--repeats`:

- hot: one tensor again and again (it stays in the 32 MB L3 cache): the
  kernel's own speed;
- cold: a sweep over `--tensors` distinct tensors (96 of 1 M values: about
  the 97 M values a logged step of every ResNet50 layer hands it, far more
  than the cache holds), as the step hands them over;
- read: `np.max` over the same sweep, one plain read of every value: the
  floor any pass over them has on this machine.

Values per second (G/s), and the cold sweep's milliseconds: on this 2-core CPU
the kernel's cold sweep is what a logged step pays for its rows.

    python bench/bench_in_step_kernel.py --json bench/results/in_step_kernel.json

`--smoke` runs 4 small tensors (not a measurement).
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import numpy as np  # noqa: E402

SHAPE = (16, 16, 16, 256)


def median_seconds(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return common.median(times)


def main():
    parser = common.parser(__doc__.split("\n")[0])
    parser.add_argument("--tensors", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    shape, count = ((4, 8, 8, 64), 4) if args.smoke else (SHAPE, args.tensors)

    from tb_gradviz.capture import in_step_kernel

    rng = np.random.default_rng(args.seed)
    tensors = [np.maximum(rng.standard_normal(shape, np.float32), 0) for _ in range(count)]
    axis = len(shape) - 1
    in_step_kernel.row_along(tensors[0], axis)  # compiles, or loads numba's cache
    values = count * tensors[0].size

    def sweep(fn):
        return lambda: [fn(t) for t in tensors]

    hot = median_seconds(
        lambda: [in_step_kernel.row_along(tensors[0], axis) for _ in range(count)], args.repeats
    )
    cold = median_seconds(sweep(lambda t: in_step_kernel.row_along(t, axis)), args.repeats)
    read = median_seconds(sweep(np.max), args.repeats)
    row = {
        "tensors": count,
        "values": values,
        "hot_gvalues_s": values / hot / 1e9,
        "cold_gvalues_s": values / cold / 1e9,
        "read_gvalues_s": values / read / 1e9,
        "cold_sweep_ms": cold * 1000,
        "read_sweep_ms": read * 1000,
        "cold_over_read": cold / read,
        "loadavg": os.getloadavg()[0],
    }
    common.report("bench_in_step_kernel", args, [row])


if __name__ == "__main__":
    main()
