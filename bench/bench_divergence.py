"""The divergence suite: reproducible runs that diverge, healthy runs beside them, and how early
tb_gradviz's onsets come before the loss diverges.

Each case trains a small model on generated data with fixed seeds on the CPU,
with `GradVizCallback(layers=every layer, every_n_batches=N)`, and records
each batch's own loss. The transformer and the float16 network, and the ramp, are
`tb_gradviz/divergence_cases.py`'s (the demo trains two of them). Cases:

- `cnn_lr_ramp`: the demo's small CNN (`demos.small_cnn`), Adam at 1e-3,
  whose learning rate grows by `--ramp` per step from step `RAMP_START` (100);
- `transformer_high_lr`: a two-block transformer (Keras `MultiHeadAttention`,
  `LayerNormalization`) on generated sequences, Adam at 1e-3 whose learning
  rate grows as the CNN's, far past stability;
- `mixed_overflow`: a dense ReLU network under `mixed_float16` with no loss
  scaling, trained by SGD whose learning rate grows by `--ramp` per step
  from step `RAMP_START`, so its weights and then its float16 activations
  grow until they overflow;
- `cnn_corrupt_batch`: the small CNN at a sane learning rate, with the
  inputs of one batch, at step `CORRUPT_STEP`, multiplied by 1e4;
- `*_healthy`: the same models at sane settings, as long as the others.

Every layer is logged with `weights=True` (`--weights off` to leave the
weights out): the update ratios are what the `update_spike` warning reads.

**Divergence.** The loss at step `t` is the loss of the batch trained with
the weights after `t` updates (those the callback's records at `t` see). A
run diverges at the first `t` where that loss is non-finite, or where its
mean over the last 5 steps is above 3 times the smallest such mean before
it. A healthy run must not diverge by this definition.

**Lead.** For each flag and each warning (`format/leading.py`: leading
indicators over each tensor's recent history; each onset's `class` says
which) that `tb-gradviz check --format json` reports an onset for, the lead
is the divergence step minus the onset's step, in steps and in logged
events (the events at or after the onset and before the divergence). A
healthy run's onsets are false alarms.

    python bench/bench_divergence.py --every 1,10 --json bench/results/divergence.json
"""

import json
import math
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

CORRUPT_STEP = 150
DIVERGENCE_FACTOR = 3.0
SMOOTHING = 5


def divergence_step(losses, window=SMOOTHING):
    """The first step whose loss is non-finite, or whose mean loss over the last `window` steps
    is above `DIVERGENCE_FACTOR` times the smallest such mean before it; None when the run never
    diverges. The mean keeps a healthy run's batch-to-batch noise, large once its loss is
    near zero, from reading as a divergence."""
    smallest = math.inf
    for step, loss in enumerate(losses):
        if not math.isfinite(loss):
            return step
        if step + 1 < window:
            continue
        mean = sum(losses[step + 1 - window : step + 1]) / window
        if mean > DIVERGENCE_FACTOR * smallest:
            return step
        smallest = min(smallest, mean)
    return None


def batch_losses_callback(stop_after):
    """A callback that keeps each batch's own loss (Keras' logs hold the epoch's running mean)
    and stops `fit` `stop_after` steps past the divergence."""
    import keras

    class BatchLosses(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.losses, self._mean, self._diverged = [], 0.0, None

        def on_epoch_begin(self, epoch, logs=None):
            self._mean = 0.0

        def on_train_batch_end(self, batch, logs=None):
            mean = float(logs["loss"])
            self.losses.append((batch + 1) * mean - batch * self._mean)
            self._mean = mean
            if self._diverged is None:
                self._diverged = divergence_step(self.losses)
            elif len(self.losses) > self._diverged + stop_after:
                self.model.stop_training = True

    return BatchLosses()


def cnn_case(steps, seed, learning_rate, ramp=None, corrupt_step=None):
    import keras

    from tb_gradviz import demos
    from tb_gradviz.divergence_cases import RAMP_START, RampedRate

    keras.backend.clear_session()  # a case's weights do not depend on the cases before it
    keras.utils.set_random_seed(seed)
    batch_size = 32
    x, y = demos.pattern_images(steps * batch_size, 32, seed)
    if corrupt_step is not None:
        x[corrupt_step * batch_size : (corrupt_step + 1) * batch_size] *= 1e4
    model = demos.small_cnn("max")
    rate = learning_rate if ramp is None else RampedRate(learning_rate, RAMP_START, ramp)
    model.compile(
        keras.optimizers.Adam(rate),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model, x, y, batch_size


def cases(args):
    """`{name: (diverges, build(steps, seed))}`."""
    from tb_gradviz.divergence_cases import mixed_case, transformer_case

    return {
        "cnn_lr_ramp": (True, lambda s, r: cnn_case(s, r, 1e-3, ramp=args.ramp)),
        "cnn_healthy": (False, lambda s, r: cnn_case(s, r, 1e-3)),
        "transformer_high_lr": (True, lambda s, r: transformer_case(s, r, 1e-3, args.ramp)),
        "transformer_healthy": (False, lambda s, r: transformer_case(s, r, 1e-3)),
        "mixed_overflow": (True, lambda s, r: mixed_case(s, r, args.ramp)),
        "mixed_healthy": (False, lambda s, r: mixed_case(s, r)),
        "cnn_corrupt_batch": (True, lambda s, r: cnn_case(s, r, 1e-3, corrupt_step=CORRUPT_STEP)),
    }


def onsets_of(logdir):
    """`check --format json`'s onsets of the run in `logdir`."""
    done = subprocess.run(
        [sys.executable, "-m", "tb_gradviz.cli", "check", logdir, "--format", "json"],
        capture_output=True,
        text=True,
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"check exited {done.returncode}: {done.stderr[-2000:]}")
    (run,) = json.loads(done.stdout)["runs"]
    return run.get("onsets", [])


def deterministic():
    """Same seeds, same losses: TensorFlow's CPU kernels otherwise reduce in an order that
    depends on thread scheduling, which moves a divergence by several steps under load."""
    import keras

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()


def run_case(name, build, every, args):
    from tb_gradviz import GradVizCallback

    model, x, y, batch_size = build(args.steps, args.seed)
    logdir = tempfile.mkdtemp(prefix=f"divergence_{name}_")
    gradviz = GradVizCallback(
        logdir,
        probe_data=(x[:batch_size], y[:batch_size]),
        layers=lambda layer: True,
        every_n_batches=every,
        weights=args.weights,
    )
    losses = batch_losses_callback(args.stop_after)
    begin = time.perf_counter()
    model.fit(
        x,
        y,
        batch_size=batch_size,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[gradviz, losses],
    )
    seconds = time.perf_counter() - begin
    diverged = divergence_step(losses.losses)
    events = list(range(every, len(losses.losses) + 1, every))
    onsets = []
    for onset in onsets_of(logdir):
        step = onset["step"]
        lead = None if diverged is None else diverged - step
        ahead = None if diverged is None else sum(step <= e < diverged for e in events)
        onsets.append(
            {
                "flag": onset["flag"],
                "class": onset.get("class", "flag"),
                "step": step,
                "layer": onset["layer"],
                "tensor": onset["tensor"],
                "lead_steps": lead,
                "lead_events": ahead,
            }
        )
    return {
        "case": name,
        "every_n_batches": every,
        "steps_run": len(losses.losses),
        "divergence_step": diverged,
        "seconds": round(seconds, 1),
        "onsets": onsets,
        "logdir": logdir,
    }


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--every", default="1,10", help="every_n_batches values, comma-separated")
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    p.add_argument("--ramp", type=float, default=1.05, help="learning rate growth per step")
    p.add_argument("--stop-after", type=int, default=10, help="steps run past the divergence")
    p.add_argument(
        "--weights",
        type=lambda text: {"on": True, "off": False}[text],
        default=True,
        help="record weights and their update ratios (on|off, default on)",
    )
    args = p.parse_args()
    if args.smoke:
        args.steps, args.every = 30, "10"
    known = cases(args)
    chosen = args.cases.split(",") if args.cases else list(known)
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        p.error(f"unknown cases {unknown}; expected some of {sorted(known)}")
    deterministic()
    rows = []
    for every in (int(n) for n in args.every.split(",")):
        for name in chosen:
            diverges, build = known[name]
            row = run_case(name, build, every, args)
            row["expected_to_diverge"] = diverges
            rows.append(row)
            summary = {k: row[k] for k in ("case", "every_n_batches", "steps_run", "seconds")}
            summary["divergence_step"] = row["divergence_step"]
            for kind in ("flag", "warning"):
                first = min(
                    (o for o in row["onsets"] if o["class"] == kind),
                    key=lambda o: o["step"],
                    default=None,
                )
                summary[f"first_{kind}"] = first and (
                    first["flag"],
                    first["step"],
                    first["layer"],
                    first["lead_steps"],
                    first["lead_events"],
                )
            print("RESULT", summary, flush=True)
    common.write_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
