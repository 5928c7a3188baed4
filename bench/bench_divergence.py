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

Those seven are the **tuning** set, the runs the warnings' thresholds were
chosen on. The **held_back** set (`divergence_heldback.py`) is for
measuring them on runs they were not chosen on: a learning rate ramped
past stability in a tanh network under Adam, a sigmoid network under SGD
with momentum, a GELU transformer, a float16 CNN and a recurrent network;
healthy runs under warm-up then cosine decay and under step decay,
fine-tuning with frozen convolutions, dropout, and a recurrent network.
`--sets` picks the sets, `--seeds` runs every case on each seed.

Every layer is logged with `weights=True` (`--weights off` to leave the
weights out): the update ratios are what the `update_spike` warning reads.
`--digest step --weights off` logs the digest from the train step itself
(`digest="step"`: that step's batch, every trainable weight's update from
the step), the probe running only at the full records' events.

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
healthy run's onsets are false alarms. The corrupted batch cannot be
foreseen (its lead is 0 by construction): its row says so.

Each run's logdir is kept under `--logdirs` (`SET/CASE_seedS_everyN`),
and the JSON names it: `--rejudge previous.json` trains nothing and
re-runs `check` on those logdirs, so the rows' onsets and leads are those
of the rules as they are now. The summary (`divergence_table.py`) is
printed, and written as markdown with `--table`.

    python bench/bench_divergence.py --every 1,10 --json bench/results/divergence.json
    python bench/bench_divergence.py --every 1 --seeds 0,1,2 --sets tuning,held_back \
        --logdirs DIR --json runs.json --table runs.md
    python bench/bench_divergence.py --rejudge runs.json --json rejudged.json
"""

import json
import math
import os
import shlex
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import divergence_table  # noqa: E402
from divergence_judging import judged  # noqa: E402

CORRUPT_STEP = 150
SETS = ("tuning", "held_back")
# Cases whose divergence no rule can see coming: it is in the data of the step it happens at.
UNFORESEEABLE = {"cnn_corrupt_batch"}


def cause_step(name, diverges):
    """The step at which case `name`'s fault begins: its corrupted batch, or the start of its
    learning rate's ramp (every other diverging case ramps); None for a healthy case. A warning
    before it cannot be a sign of the divergence."""
    from tb_gradviz.divergence_cases import RAMP_START

    if not diverges:
        return None
    return CORRUPT_STEP if name == "cnn_corrupt_batch" else RAMP_START


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
    """`{name: (set, diverges, build(steps, seed))}`."""
    import divergence_heldback

    from tb_gradviz.divergence_cases import mixed_case, transformer_case

    tuning = {
        "cnn_lr_ramp": (True, lambda s, r: cnn_case(s, r, 1e-3, ramp=args.ramp)),
        "cnn_healthy": (False, lambda s, r: cnn_case(s, r, 1e-3)),
        "transformer_high_lr": (True, lambda s, r: transformer_case(s, r, 1e-3, args.ramp)),
        "transformer_healthy": (False, lambda s, r: transformer_case(s, r, 1e-3)),
        "mixed_overflow": (True, lambda s, r: mixed_case(s, r, args.ramp)),
        "mixed_healthy": (False, lambda s, r: mixed_case(s, r)),
        "cnn_corrupt_batch": (True, lambda s, r: cnn_case(s, r, 1e-3, corrupt_step=CORRUPT_STEP)),
    }
    found = {name: ("tuning", *case) for name, case in tuning.items()}
    for name, case in divergence_heldback.cases().items():
        found[name] = ("held_back", *case)
    return found


def deterministic():
    """Same seeds, same losses: TensorFlow's CPU kernels otherwise reduce in an order that
    depends on thread scheduling, which moves a divergence by several steps under load."""
    import keras

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()


def run_case(name, build, every, seed, logdir, args):
    """Trains case `name` on `seed`, logging into `logdir` (emptied first); returns its row."""
    from tb_gradviz import GradVizCallback

    model, x, y, batch_size = build(args.steps, seed)
    shutil.rmtree(logdir, ignore_errors=True)
    os.makedirs(logdir)
    gradviz = GradVizCallback(
        logdir,
        probe_data=(x[:batch_size], y[:batch_size]),
        layers=lambda layer: True,
        every_n_batches=every,
        weights=args.weights,
        digest=args.digest,
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
    row = {
        "case": name,
        "seed": seed,
        "every_n_batches": every,
        "digest": args.digest,
        "steps_run": len(losses.losses),
        "logged_steps": len(losses.losses) // every,
        "divergence_step": divergence_step(losses.losses),
        "seconds": round(time.perf_counter() - begin, 1),
        "logdir": os.path.abspath(logdir),
    }
    begin = time.perf_counter()
    row["onsets"] = judged(row)
    row["check_seconds"] = round(time.perf_counter() - begin, 1)
    return row


def print_result(row):
    summary = {
        k: row[k] for k in ("case", "set", "seed", "every_n_batches", "steps_run", "seconds")
    }
    summary["divergence_step"] = row["divergence_step"]
    for kind in ("flag", "warning"):
        first = divergence_table.first_onset(row, kind)
        summary[f"first_{kind}"] = first and (
            first["flag"],
            first["step"],
            first["layer"],
            first["lead_steps"],
            first["lead_events"],
        )
    print("RESULT", summary, flush=True)


def rejudge(path):
    """The rows of the JSON at `path`, their onsets judged again from their logdirs; and the
    command that trained them."""
    with open(path) as f:
        previous = json.load(f)
    rows = previous["rows"]
    for row in rows:
        if not os.path.isdir(row.get("logdir") or ""):
            raise SystemExit(
                f"{path}: the logdir of {row['case']} (seed {row.get('seed')}) is not there: "
                f"{row.get('logdir')!r}"
            )
    for row in rows:
        if "cause_step" not in row:  # a JSON written before rows had it
            row["cause_step"] = cause_step(row["case"], row["expected_to_diverge"])
        begin = time.perf_counter()
        row["onsets"] = judged(row, in_process=True)
        row["check_seconds"] = round(time.perf_counter() - begin, 1)
        print_result(row)
    return rows, previous.get("trained_by", previous.get("command"))


def _names(text, allowed, what):
    chosen = [name for name in text.split(",") if name]
    unknown = sorted(set(chosen) - set(allowed))
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; expected some of {sorted(allowed)}")
    return chosen


def chosen_cases(args, known):
    """The cases named by `--cases`, whatever their set; else every case of `--sets`."""
    if args.cases:
        return _names(args.cases, known, "cases")
    sets = _names(args.sets, SETS, "sets")
    return [name for name in known if known[name][0] in sets]


def train(args, known, chosen):
    seeds = [int(n) for n in args.seeds.split(",")] if args.seeds else [args.seed]
    root = args.logdirs or tempfile.mkdtemp(prefix="divergence_")
    deterministic()
    rows = []
    for every in (int(n) for n in args.every.split(",")):
        for name in chosen:
            kind, diverges, build = known[name]
            for seed in seeds:
                logdir = os.path.join(root, kind, f"{name}_seed{seed}_every{every}")
                row = run_case(name, build, every, seed, logdir, args)
                row.update(
                    set=kind,
                    expected_to_diverge=diverges,
                    foreseeable=name not in UNFORESEEABLE,
                    cause_step=cause_step(name, diverges),
                )
                rows.append(row)
                print_result(row)
    return rows


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--every", default="1,10", help="every_n_batches values, comma-separated")
    p.add_argument("--cases", default="", help="comma-separated case names, of any set")
    p.add_argument(
        "--sets", default="tuning", help=f"without --cases: the sets run, of {','.join(SETS)}"
    )
    p.add_argument("--seeds", default="", help="comma-separated seeds (default: --seed)")
    p.add_argument("--logdirs", help="where each run's logdir is kept (default: a temp dir)")
    p.add_argument("--rejudge", metavar="JSON", help="re-run check on a previous JSON's logdirs")
    p.add_argument("--table", metavar="PATH", help="also write the summary as markdown")
    p.add_argument(
        "--ramp", type=float, default=1.05, help="the tuning set's learning rate growth per step"
    )
    p.add_argument("--stop-after", type=int, default=10, help="steps run past the divergence")
    p.add_argument(
        "--weights",
        type=lambda text: {"on": True, "off": False}[text],
        default=True,
        help="record weights and their update ratios (on|off, default on)",
    )
    p.add_argument(
        "--digest",
        choices=["probe", "step"],
        default="probe",
        help="where each event's digest is computed (GradVizCallback's digest=); step: by the "
        "train step, whose update rows replace weights=True (then --weights off)",
    )
    args = p.parse_args()
    if args.digest == "step" and args.weights:
        p.error("--digest step computes every weight's update in the step: pass --weights off")
    if args.smoke:
        args.steps, args.every = 30, "10"
    begin = time.perf_counter()
    command = shlex.join(["python", "bench/bench_divergence.py", *sys.argv[1:]])
    trained_by = command
    if args.rejudge:
        rows, trained_by = rejudge(args.rejudge)
    else:
        known = cases(args)
        try:
            chosen = chosen_cases(args, known)
        except ValueError as e:
            p.error(str(e))
        rows = train(args, known, chosen)
    commands = [trained_by, command] if args.rejudge else [command]
    table = divergence_table.markdown(rows, [c for c in commands if c])
    print("\n" + table)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table + "\n")
    seconds = round(time.perf_counter() - begin, 1)
    common.write_json(
        args.json,
        {"rows": rows, "command": command, "trained_by": trained_by, "wall_seconds": seconds},
    )


if __name__ == "__main__":
    main()
