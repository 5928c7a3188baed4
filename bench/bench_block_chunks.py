"""What a chunk of the host block kernel costs, and the block part inside the fused host pass.

Two measurements, in one process, on this machine's numba build of the kernels:

- per call: `block_counts._chunk` on chunks of 32 to `CHUNK` values of one
  gradient-like tensor (normal values times 1e-3), the whole tensor a chunk
  at a time; nanoseconds per call and per value. A cost per call that hardly
  grows with the chunk's length is what long chunks (`CHUNK`) save;
- fused: `kernels.summary(..., precision=True)` over four ResNet50-like
  tensors (a ReLU activation, two gradients, a wide one: 3.1 M values) with
  the block part and without it, alternated; the process's CPU time per
  value, the minimum of `--repeats`. The block part is the difference.

    python bench/bench_block_chunks.py --json bench/results/block_chunks.json

`--smoke` uses small tensors (not a measurement).
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import numba  # noqa: E402
import numpy as np  # noqa: E402

SHAPES = [(16, 16, 16, 256), (16, 8, 8, 512), (16, 32, 32, 64), (16, 4, 4, 2048)]


def per_call(values, lengths, repeats):
    """`{length: ns per call}` of `_chunk` over `values`, a chunk of `length` at a time."""
    from tb_gradviz.capture import block_counts

    @numba.njit(nogil=True)
    def calls(values, length, scratch, mx, spans, tensor_scale, out):
        stats, work = scratch
        for start in range(0, values.size - length + 1, length):
            block_counts._chunk(
                values, start, length, block_counts.HALF, stats, work, mx, spans, tensor_scale, out
            )

    scratch, out = block_counts.scratch(), block_counts.new_sums()
    found = {}
    for length in lengths:
        arguments = (values, length, scratch, block_counts.MX_CONSTANTS, block_counts.MX_SPANS)
        arguments += (np.float32(1.0), out)
        calls(*arguments)  # compiles
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            calls(*arguments)
            times.append(time.perf_counter() - start)
        found[length] = min(times) / (values.size // length) * 1e9
    return found


def fused(tensors, repeats):
    """`(ns per value with the block part, without it)`: CPU time, minima of `repeats`."""
    from tb_gradviz.capture import kernels

    def run(block_formats):
        for t in tensors:
            kernels.summary(t, None, precision=True, block_formats=block_formats)

    run(True)  # compiles, or loads numba's cache
    run(False)
    with_, without = [], []
    for _ in range(repeats):
        start = time.process_time()
        run(True)
        middle = time.process_time()
        run(False)
        with_.append(middle - start)
        without.append(time.process_time() - middle)
    values = sum(t.size for t in tensors)
    return min(with_) / values * 1e9, min(without) / values * 1e9


def main():
    parser = common.parser(__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    from tb_gradviz.capture import block_counts

    rng = np.random.default_rng(args.seed)
    scale = 1 if args.smoke else 16
    shapes = [(1, *shape[1:]) for shape in SHAPES] if args.smoke else SHAPES
    gradient = (rng.standard_normal(block_counts.CHUNK * 32 * scale) * 1e-3).astype(np.float32)
    tensors = [np.maximum(rng.standard_normal(shapes[0]), 0).astype(np.float32)]
    tensors += [(rng.standard_normal(s) * 1e-3).astype(np.float32) for s in shapes[1:]]
    lengths = [32, 128, 1024, block_counts.CHUNK]
    calls = per_call(gradient, lengths, args.repeats)
    with_block, without_block = fused(tensors, args.repeats)
    row = {
        "chunk": block_counts.CHUNK,
        **{f"call_ns_{n}": calls[n] for n in lengths},
        **{f"call_ns_per_value_{n}": calls[n] / n for n in lengths},
        "fused_values": sum(t.size for t in tensors),
        "fused_with_ns_per_value": with_block,
        "fused_without_ns_per_value": without_block,
        "block_part_ns_per_value": with_block - without_block,
        "loadavg": os.getloadavg()[0],
    }
    common.report("bench_block_chunks", args, [row])


if __name__ == "__main__":
    main()
