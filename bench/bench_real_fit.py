"""A long run as users run it: a real `fit` logged at every step, a NaN put in at a known step.

A CNN of `--convs` 3x3 convolutions (8 channels, 16 x 16 inputs, one max pool
halfway, a global pool and a dense head: convs + 3 logged layers) trains
`--steps` steps at batch 8 on generated data, with `GradVizCallback(layers=all,
every_n_batches=1)` and its defaults (`full_records=100`, block formats on). At
the end of step `--nan-step` one value of the middle convolution's kernel becomes
NaN, so the log event of that step meets it first in that layer's activation.

Then, as a user would look at it:
- the bytes the callback wrote, and the fit's wall time;
- `tb-gradviz check --format json`: the onset it names, and its time;
- a plain `tensorboard --logdir` (no flags): `/onset`'s nonfinite onset, and
  whether `/step` at that step serves the middle layer's full records (its
  histograms and precision record), each request's time.

    python bench/bench_real_fit.py --steps 10000 --nan-step 7000 --json bench/results/real_fit.json
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import common  # noqa: E402
import tbserver  # noqa: E402


def build(convs):
    import keras

    layers = keras.layers
    inputs = keras.Input((16, 16, 3))
    h = inputs
    for i in range(1, convs + 1):
        h = layers.Conv2D(8, 3, padding="same", activation="relu", name=f"c{i}")(h)
        if i == convs // 2:
            h = layers.MaxPooling2D(2, name="pool")(h)
    h = layers.GlobalAveragePooling2D(name="gap")(h)
    outputs = layers.Dense(10, name="head")(h)
    model = keras.Model(inputs, outputs)
    model.compile(
        keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def nan_at(layer, step):
    """A callback that puts a NaN into `layer`'s kernel at the end of optimizer step `step`."""
    import keras
    import numpy as np

    class PutNaN(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) == step:
                kernel = np.array(keras.ops.convert_to_numpy(layer.kernel))
                kernel.flat[0] = np.nan
                layer.kernel.assign(kernel)

    return PutNaN()


def disk_bytes(logdir):
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(logdir)
        for name in names
    )


def check_json(logdir):
    """`(answer, seconds, exit status)` of `tb-gradviz check LOGDIR --format json`, run as a
    user runs it."""
    start = time.perf_counter()
    check = subprocess.run(
        [sys.executable, "-m", "tb_gradviz.cli", "check", logdir, "--format", "json"],
        capture_output=True,
        text=True,
    )
    return json.loads(check.stdout), time.perf_counter() - start, check.returncode


def timed_json(url):
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as response:
        body = json.loads(response.read())
    return body, time.perf_counter() - start


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--nan-step", type=int, default=7000)
    p.add_argument("--convs", type=int, default=20)
    p.add_argument("--logdir", help="where the run is written (default: a temporary folder)")
    args = p.parse_args()
    if args.smoke:
        args.steps, args.nan_step, args.convs = 30, 20, 4

    import numpy as np

    import tb_gradviz

    logdir = args.logdir or tempfile.mkdtemp(prefix="real_fit_")
    run = os.path.join(logdir, "cnn")
    model = build(args.convs)
    middle = model.get_layer(f"c{args.convs // 2}")
    rng = np.random.default_rng(args.seed)
    x = rng.uniform(0, 1, (512, 16, 16, 3)).astype("float32")
    y = rng.integers(0, 10, 512).astype("int32")
    gradviz = tb_gradviz.GradVizCallback(
        run, (x[:8], y[:8]), layers=lambda layer: True, every_n_batches=1
    )
    epochs = -(-args.steps * 8 // len(x))
    start = time.perf_counter()
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=epochs,
        steps_per_epoch=min(args.steps, len(x) // 8),
        verbose=0,
        callbacks=[nan_at(middle, args.nan_step), gradviz],
    )
    fit_s = time.perf_counter() - start
    steps = int(np.asarray(model.optimizer.iterations))
    result = {
        "steps": steps,
        "logged_layers": len(gradviz._capture.plans),
        "nan_step": args.nan_step,
        "nan_layer": middle.name,
        "fit_s": fit_s,
        "disk_bytes": disk_bytes(run),
    }
    print(result, flush=True)

    checked, result["check_s"], result["check_exit"] = check_json(logdir)
    result["check_nonfinite"] = _nonfinite_onset(checked)
    print(result, flush=True)

    with tbserver.running_tensorboard(logdir, os.path.join(logdir, "tb.log"), samples=()) as url:
        base = f"{url}/data/plugin/gradviz"
        onset, result["onset_s"] = timed_json(f"{base}/onset?run=cnn")
        result["onset_steps_judged"] = onset["steps"]
        result["onset_nonfinite"] = _nonfinite_onset(onset)
        at = result["onset_nonfinite"].get("step", args.nan_step)
        snapshot, result["step_s"] = timed_json(f"{base}/step?run=cnn&step={at}")
        layer = next(entry for entry in snapshot["layers"] if entry["layer"] == middle.name)
        # A tensor's full records are those of its latest step <= the asked one.
        result["full_records_at_onset"] = {
            name: tensor.get("step") == at for name, tensor in layer["tensors"].items()
        }
    print(json.dumps(result, indent=1, default=str), flush=True)
    print("RESULT " + json.dumps(result, default=str))
    common.write_json(args.json, {"args": vars(args), "rows": [result]})


def _nonfinite_onset(body):
    """The `nonfinite` entry of an `/onset` body's `onsets` (also inside `check`'s JSON)."""
    for run in body.get("runs", [body]):
        onsets = run.get("onset", run).get("onsets", [])
        for entry in onsets:
            if entry.get("flag") == "nonfinite":
                return entry
    return {}


if __name__ == "__main__":
    main()
