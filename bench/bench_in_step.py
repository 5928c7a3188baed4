"""The in-step digest's cost: ResNet50 logged at every step, paired with plain training.

`keras.applications.ResNet50(weights=None)` at 64 x 64 x 3, 10 classes, Adam
(`common.build_model`), batch 16, generated data, on Keras' TensorFlow
backend (or the one KERAS_BACKEND names). One model, one process; rounds of
two fits of `--steps` steps each,
in alternating order: without GradViz, and with
`GradVizCallback(digest="step", every_n_batches=1, full_records=0)` over
`--layers` (`all`: every layer; `pooling`: the default, the pooling layers).
Both fits carry the same timing callback (batch hooks, so Keras waits for
every batch in both), which takes the time from one batch's start to the
next's: the train step and whatever the callbacks do at its end.

Per round, the ratio of the two fits' median step times (a step whose event
ran the probe, at the full records' schedule, is an outlier the median
leaves out; the ratio of the means, which counts them, is given too); the
figure is the median over rounds. The first round of each kind compiles and
is left out. The same ratios of this process's CPU time are given too: on a
machine other work loads, they move less than wall time.

    python bench/bench_in_step.py --layers all --rounds 6 --steps 12
    python bench/bench_in_step.py --layers pooling --rounds 6 --steps 12
    KERAS_BACKEND=jax python bench/bench_in_step.py --layers all --rounds 6 --steps 12

`--smoke` runs the small CNN at 32 px, one round of 3 steps (not a measurement).
"""

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import common  # noqa: E402

IMAGE_SIZE, BATCH = 64, 16


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


class StepTimes:
    """The time from each batch's start to the next's (the last: to its end): wall time, and
    this process's CPU time (all its threads), which the machine's other load moves less.

    On JAX, which dispatches a step and returns before it has run, each time is taken once the
    state the last step returned is computed (`model._jax_state`, read without the sync that
    a callback's `model` does)."""

    def __init__(self, model):
        import keras

        self.model = model
        self.times, self.cpu_times = [], []
        self._start = self._cpu_start = None
        self.callback = keras.callbacks.LambdaCallback(
            on_train_batch_begin=lambda batch, logs: self._begin(),
            on_train_end=lambda logs: self._begin(),
        )

    def _begin(self):
        state = getattr(self.model, "_jax_state", None)
        if state:
            import jax

            # Keras' tracked dict and lists, which are no pytrees: plain lists of arrays.
            jax.block_until_ready([list(values) for values in state.values()])
        now, cpu = time.perf_counter(), time.process_time()
        if self._start is not None:
            self.times.append(now - self._start)
            self.cpu_times.append(cpu - self._cpu_start)
        self._start, self._cpu_start = now, cpu

    def reset(self):
        self.times, self.cpu_times = [], []
        self._start = self._cpu_start = None


def arguments(doc):
    """`(args, model name, image size)` of the in-step benches' command line (`doc`: the
    script's docstring): `--layers`, `--rounds`, `--steps` and `common.parser`'s."""
    parser = common.parser(doc.split("\n")[0])
    parser.add_argument("--layers", choices=("all", "pooling"), default="all")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.steps = 1, 3
        return args, "cnn", 32
    return args, "resnet50", IMAGE_SIZE


def main():
    args, name, image_size = arguments(__doc__)

    import numpy as np

    from tb_gradviz import GradVizCallback

    model = common.build_model(name, image_size, args.seed)
    x, y = common.batch(BATCH * args.steps, image_size, args.seed)
    run = tempfile.mkdtemp(prefix="bench_in_step_")
    gradviz = GradVizCallback(
        run,
        probe_data=(x[:BATCH], y[:BATCH]),
        layers=(lambda layer: True) if args.layers == "all" else None,
        every_n_batches=1,
        full_records=0,
        digest="step",
    )
    timer = StepTimes(model)

    def fit(with_gradviz):
        timer.reset()
        callbacks = [gradviz, timer.callback] if with_gradviz else [timer.callback]
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
        return np.array(timer.times), np.array(timer.cpu_times)

    rounds = []
    for r in range(args.rounds + 1):
        order = (False, True) if r % 2 == 0 else (True, False)
        times = {with_gradviz: fit(with_gradviz) for with_gradviz in order}
        if r == 0:
            continue  # compiles both train functions and the probe
        (plain, plain_cpu), (logged, logged_cpu) = times[False], times[True]
        rounds.append(
            {
                "plain_median_s": float(np.median(plain)),
                "logged_median_s": float(np.median(logged)),
                "ratio_median": float(np.median(logged) / np.median(plain)),
                "ratio_mean": float(logged.mean() / plain.mean()),
                "cpu_ratio_median": float(np.median(logged_cpu) / np.median(plain_cpu)),
                "loadavg": loadavg(),
            }
        )
        print(json.dumps(rounds[-1]), flush=True)
    import keras

    result = {
        "backend": keras.backend.backend(),
        "layers": args.layers,
        "chosen": len(gradviz.chosen_layers),
        "steps": args.steps,
        "rounds": args.rounds,
        "ratio_median": float(np.median([r["ratio_median"] for r in rounds])),
        "ratio_mean": float(np.median([r["ratio_mean"] for r in rounds])),
        "cpu_ratio_median": float(np.median([r["cpu_ratio_median"] for r in rounds])),
        "plain_step_s": float(np.median([r["plain_median_s"] for r in rounds])),
        "in_step_events": gradviz._in_step_events,
        "rounds_detail": rounds,
    }
    print("RESULT", json.dumps({k: v for k, v in result.items() if k != "rounds_detail"}))
    common.write_json(args.json, {"script": "bench_in_step", "args": vars(args), "rows": [result]})


if __name__ == "__main__":
    main()
