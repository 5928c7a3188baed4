"""What the block record adds to the device statistics, on the device: ResNet50's tensors.

For each chosen layer of ResNet50 (its pooling layers, or all layers), the three
tensors a log event summarises: the activation, the gradient at the output (same
shape) and the gradient at the input. Their values are a pool of 4M random values
(normal times a random power of e in [-8, 8]) tiled: the statistics do the same work whatever
the values, so this measures the cost of a real event's tensors without running
the probe pass. Per repeat, interleaved:

- `stats`: `device_statistics.chunk_statistics` as the backend's pass runs it
  (jitted on JAX, XLA-compiled on TensorFlow, eager on PyTorch), with the
  precision record, as today;
- `stats+blocks`: the same with the block record of every format (`widths`);
- `step`: one `train_on_batch` of the model on a batch of that size.

Tensors are grouped by (size, dtype, last axis) in both, as the pass groups them
when the block record is on.

    KERAS_BACKEND=jax python bench/bench_device_blocks.py --image-size 224 --batch 32
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402


def layer_shapes(model, which, batch):
    """`[(layer, [shape of activation, output gradient, input gradient])]` of the chosen layers."""
    chosen = []
    for layer in model.layers:
        kind = type(layer).__name__
        if kind == "InputLayer" or (which == "pool" and "Pooling" not in kind):
            continue
        inputs = layer.input if not isinstance(layer.input, list) else layer.input[0]
        out_shape = (batch, *layer.output.shape[1:])
        in_shape = (batch, *inputs.shape[1:])
        chosen.append((layer.name, [out_shape, out_shape, in_shape]))
    return chosen


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--layers", default="pool,all")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    if args.smoke:
        args.image_size, args.batch, args.repeats, args.layers = 32, 2, 2, "pool"

    import keras
    import numpy as np

    from tb_gradviz.capture import device_statistics

    backend = keras.backend.backend()
    model = common.build_model("resnet50", args.image_size, args.seed)
    x, y = common.batch(args.batch, args.image_size, args.seed)
    rng = np.random.default_rng(args.seed)
    # One pool of values, tiled into every tensor: drawing each tensor anew costs more host time
    # than the measurement on a large model.
    pool = (rng.standard_normal(1 << 22) * np.exp(rng.uniform(-8, 8, 1 << 22))).astype("float32")
    sync, compile_fn = _backend_functions(backend)
    rows = []
    for which in args.layers.split(","):
        chosen = layer_shapes(model, which, args.batch)
        shapes = [s for _, layer in chosen for s in layer]
        arrays = [np.resize(pool, s) for s in shapes]
        tensors = [keras.ops.convert_to_tensor(a) for a in arrays]
        widths = [s[-1] for s in shapes]
        keys = [(a.size, "float32", False, w) for a, w in zip(arrays, widths)]
        groups = device_statistics.chunks(keys)
        scaled = [False] * len(tensors)
        plain = compile_fn(groups, scaled, None)
        with_blocks = compile_fn(groups, scaled, widths)
        compile_s = {}
        for name, fn in (("stats", plain), ("stats+blocks", with_blocks)):
            compile_s[name] = common.seconds(lambda fn=fn, t=tensors: sync(fn(t)))
            print(f"{which}: {name} compiled and ran once in {compile_s[name]:.1f} s", flush=True)
        model.train_on_batch(x, y)
        times = {"stats": [], "stats+blocks": [], "step": []}
        for _ in range(args.repeats):
            for name, fn in (("stats", plain), ("stats+blocks", with_blocks)):
                times[name].append(common.seconds(lambda fn=fn, t=tensors: sync(fn(t))))
            times["step"].append(common.seconds(lambda: sync(model.train_on_batch(x, y))))
        med = {k: common.median(v) for k, v in times.items()}
        added = [b - a for a, b in zip(times["stats"], times["stats+blocks"])]
        rows.append(
            {
                "backend": backend,
                "layers": which,
                "tensors": len(tensors),
                "values": int(sum(a.size for a in arrays)),
                "groups": len(groups),
                "step_ms": 1e3 * med["step"],
                "stats_ms": 1e3 * med["stats"],
                "blocks_ms": 1e3 * med["stats+blocks"],
                "added_ms": 1e3 * common.median(added),
                "added_of_step": common.median(added) / med["step"],
                "added_of_stats": common.median(added) / med["stats"],
                "compile_s": compile_s["stats+blocks"],
            }
        )
        print("RESULT " + json.dumps(rows[-1]), flush=True)
    common.print_table(
        f"block record on the device: {backend}, ResNet50 {args.image_size} px, batch "
        f"{args.batch}, {args.repeats} repeats (medians)",
        rows,
        [
            ("layers", "layers", "{}"),
            ("tensors", "tensors", "{}"),
            ("values", "values", "{:,}"),
            ("groups", "groups", "{}"),
            ("step_ms", "train step ms", "{:.1f}"),
            ("stats_ms", "stats ms", "{:.1f}"),
            ("blocks_ms", "stats+blocks ms", "{:.1f}"),
            ("added_ms", "added ms", "{:.1f}"),
            ("added_of_step", "added / step", "{:.2f}"),
            ("added_of_stats", "added / stats", "{:.2f}"),
            ("compile_s", "compile s", "{:.1f}"),
        ],
    )
    common.write_json(args.json, {"backend": backend, "args": vars(args), "rows": rows})


def _backend_functions(backend):
    """`(sync, compile_fn)`: wait for a result; build `tensors -> results` for groups/widths."""
    from tb_gradviz.capture import device_statistics

    if backend == "jax":
        import functools

        import jax

        platform = jax.devices()[0].platform
        mode = device_statistics.mode_for(platform)

        def compile_fn(groups, scaled, widths):
            fn = jax.jit(
                functools.partial(
                    device_statistics.chunk_statistics, groups, scaled, mode=mode, widths=widths
                )
            )

            def run(tensors):
                with jax.enable_x64(True):
                    return fn(tensors, jax.numpy.float64(1.0))

            return run

        return jax.block_until_ready, compile_fn
    if backend == "tensorflow":
        import tensorflow as tf

        from tb_gradviz.capture.backends import tf_statistics

        gpu = bool(tf.config.list_physical_devices("GPU"))
        mode = device_statistics.mode_for("gpu" if gpu else "cpu")

        def compile_fn(groups, scaled, widths):
            fn = tf_statistics.compiled(groups, scaled, mode, widths=widths)
            return lambda tensors: fn(tensors, tf.constant(1.0, tf.float64))

        def sync(result):
            tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, result)

        return sync, compile_fn
    import torch

    def compile_fn(groups, scaled, widths):
        def run(tensors):
            with torch.no_grad():
                return device_statistics.chunk_statistics(
                    groups, scaled, tensors, 1.0, mode="eager", widths=widths
                )

        return run

    def sync(result):
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    return sync, compile_fn


if __name__ == "__main__":
    main()
