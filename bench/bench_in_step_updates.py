"""What the in-step digest's update rows cost: ResNet50 logged at every step, with and without them.

`keras.applications.ResNet50(weights=None)` at 64 x 64 x 3, 10 classes, Adam
(`common.build_model`), batch 16, generated data, on Keras' TensorFlow backend
(or the one KERAS_BACKEND names, PyTorch). One model, one process; rounds of
three fits of `--steps` steps each, their order rotating: without GradViz
(`plain`), with `GradVizCallback(digest="step", every_n_batches=1,
full_records=0)` over `--layers` (`step`: every trainable weight's update
measured in the step, the default), and the same with the update rows left out
(`no_updates`: the installed step given no weights before it first runs). Each
fit carries the same timer (batch hooks, so Keras waits for every batch in all
three), which takes the time from one batch's start to the next's, wall and this
process's CPU time.

Per round, the ratios of the fits' median step times: `step / no_updates` (what
the update rows cost), `step / plain` and `no_updates / plain`; the figures are
the medians over rounds, the first round (compiling) left out.

    python bench/bench_in_step_updates.py --layers all --rounds 6 --steps 12
    python bench/bench_in_step_updates.py --layers pooling --rounds 6 --steps 12

`--smoke` runs the small CNN at 32 px, one round of 3 steps (not a measurement).
"""

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import bench_in_step  # noqa: E402
import common  # noqa: E402

BATCH = bench_in_step.BATCH
ARMS = ("plain", "step", "no_updates")


def main():
    args, name, image_size = bench_in_step.arguments(__doc__)

    import keras
    import numpy as np

    from tb_gradviz import GradVizCallback

    model = common.build_model(name, image_size, args.seed)
    x, y = common.batch(BATCH * args.steps, image_size, args.seed)

    def callback():
        return GradVizCallback(
            tempfile.mkdtemp(prefix="bench_in_step_updates_"),
            probe_data=(x[:BATCH], y[:BATCH]),
            layers=(lambda layer: True) if args.layers == "all" else None,
            every_n_batches=1,
            full_records=0,
            digest="step",
        )

    with_updates, without = callback(), callback()

    def leave_out_updates(logs=None):
        # The step reads its weights when it first runs (TensorFlow traces it then): none.
        if without._in_step is not None:
            without._in_step.weights = []

    callbacks = {
        "plain": [],
        "step": [with_updates],
        "no_updates": [without, keras.callbacks.LambdaCallback(on_train_begin=leave_out_updates)],
    }
    timer = bench_in_step.StepTimes(model)

    def fit(arm):
        timer.reset()
        model.fit(
            x,
            y,
            batch_size=BATCH,
            epochs=1,
            verbose=0,
            shuffle=False,
            callbacks=[*callbacks[arm], timer.callback],
        )
        return np.median(timer.times), np.median(timer.cpu_times)

    rounds = []
    for r in range(args.rounds + 1):
        order = ARMS[r % 3 :] + ARMS[: r % 3]
        times = {arm: fit(arm) for arm in order}
        if r == 0:
            continue  # compiles the train functions and the probe
        row = {f"{arm}_median_s": times[arm][0] for arm in ARMS}
        for kind, k in (("", 0), ("cpu_", 1)):
            row[f"{kind}updates_ratio"] = times["step"][k] / times["no_updates"][k]
            row[f"{kind}step_ratio"] = times["step"][k] / times["plain"][k]
            row[f"{kind}no_updates_ratio"] = times["no_updates"][k] / times["plain"][k]
        row["loadavg"] = os.getloadavg()[0]
        rounds.append({k: float(v) for k, v in row.items()})
        print(json.dumps(rounds[-1]), flush=True)
    ratios = [k for k in rounds[0] if k.endswith("_ratio")]
    weights = with_updates._in_step.weights if with_updates._in_step is not None else []

    def update_rows(gradviz):
        layout = None if gradviz._in_step is None else gradviz._in_step.layout
        return 0 if layout is None else sum(row[0] == "update" for row in layout.rows)

    result = {
        "backend": keras.backend.backend(),
        "layers": args.layers,
        "chosen": len(with_updates.chosen_layers),
        "weights": len(weights),
        "update_rows": {"step": update_rows(with_updates), "no_updates": update_rows(without)},
        "weight_values": int(sum(w.count for w in weights)),
        "steps": args.steps,
        "rounds": args.rounds,
        **{k: float(np.median([r[k] for r in rounds])) for k in ratios},
        "plain_step_s": float(np.median([r["plain_median_s"] for r in rounds])),
        "rounds_detail": rounds,
    }
    print("RESULT", json.dumps({k: v for k, v in result.items() if k != "rounds_detail"}))
    common.write_json(
        args.json, {"script": "bench_in_step_updates", "args": vars(args), "rows": [result]}
    )


if __name__ == "__main__":
    main()
