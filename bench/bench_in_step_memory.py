"""Peak memory of a fit with the in-step digest against the same fit without GradViz.

Each arm runs in a process of its own (the peak resident set, `ru_maxrss`,
only grows in a process): `keras.applications.ResNet50(weights=None)` at
64 x 64 x 3, batch 16 (`common.build_model`), on Keras' TensorFlow backend
(or the one KERAS_BACKEND names), `--steps` steps of `fit`, either plain or
with `GradVizCallback(digest="step", every_n_batches=1, full_records=0)` over
`--layers` (`all` or `pooling`). Per process: the resident set once the model
is built and compiled (before `fit`), the peak over the whole process, and
the peak less the resident set before `fit` (what the fit added: the train
step's compile, its buffers and, with GradViz, the probe pass, the digest and
the kernel's work). Then the peak of each step alone: a callback after
GradViz's resets the process's peak (`/proc/self/clear_refs`) when a step
begins and reads it (`VmHWM`) when the step and GradViz's work after it have
ended, and the peak less the resident set the step began with (what the
step needed beyond what the process already held); per process the medians
over the steps after the first two (the compiles; a step whose event ran the
probe, about one in five here, is an outlier the median leaves out). The
arms alternate, `--repeats` each; medians.

    python bench/bench_in_step_memory.py --layers all --json bench/results/in_step_memory_all.json

`--smoke` runs the small CNN at 32 px for 2 steps (not a measurement).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import bench_in_step  # noqa: E402
import common  # noqa: E402


def _resident_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _peak_kb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def _step_peaks():
    """A Keras callback whose `peaks_kb` gets each step's peak resident set, and `added_kb`
    that peak less the resident set when the step began."""
    import keras

    class StepPeaks(keras.callbacks.Callback):
        peaks_kb, added_kb = [], []

        def on_train_batch_begin(self, batch, logs=None):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # the peak resident set is reset to the resident set
            self.began_kb = _peak_kb()

        def on_train_batch_end(self, batch, logs=None):
            self.peaks_kb.append(_peak_kb())
            self.added_kb.append(self.peaks_kb[-1] - self.began_kb)

    return StepPeaks()


def child(args):
    """One arm in this process: prints `{"before_fit_kb", "peak_kb", "step_peak_kb",
    "step_added_kb"}` as JSON."""
    name, image_size = ("cnn", 32) if args.smoke else ("resnet50", bench_in_step.IMAGE_SIZE)
    model = common.build_model(name, image_size, args.seed)
    x, y = common.batch(bench_in_step.BATCH * args.steps, image_size, args.seed)
    callbacks = []
    if args.arm == "step":
        from tb_gradviz import GradVizCallback

        callbacks.append(
            GradVizCallback(
                tempfile.mkdtemp(prefix="bench_in_step_memory_"),
                probe_data=(x[: bench_in_step.BATCH], y[: bench_in_step.BATCH]),
                layers=(lambda layer: True) if args.layers == "all" else None,
                every_n_batches=1,
                full_records=0,
                digest="step",
            )
        )
    before = _resident_kb()
    meter = _step_peaks()
    model.fit(
        x, y, batch_size=bench_in_step.BATCH, epochs=1, verbose=0, callbacks=callbacks + [meter]
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    step_peak = common.median(meter.peaks_kb[2:] or meter.peaks_kb)
    step_added = common.median(meter.added_kb[2:] or meter.added_kb)
    print(
        json.dumps(
            {
                "before_fit_kb": before,
                "peak_kb": peak,
                "step_peak_kb": step_peak,
                "step_added_kb": step_added,
            }
        )
    )


def main():
    parser = common.parser(__doc__.split("\n")[0])
    parser.add_argument("--layers", choices=["all", "pooling"], default="all")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--arm", choices=["plain", "step"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.repeats = 2, 1
    if args.arm:
        return child(args)
    found = {"plain": [], "step": []}
    for _ in range(args.repeats):
        for arm in found:
            command = [sys.executable, __file__, "--arm", arm, "--layers", args.layers]
            command += ["--steps", str(args.steps), "--seed", str(args.seed)]
            command += ["--smoke"] if args.smoke else []
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            found[arm].append(json.loads(out.strip().splitlines()[-1]))
    row = {"layers": args.layers, "steps": args.steps, "repeats": args.repeats}
    for arm, runs in found.items():
        row[f"{arm}_before_fit_mb"] = common.median([r["before_fit_kb"] / 1024 for r in runs])
        row[f"{arm}_peak_mb"] = common.median([r["peak_kb"] / 1024 for r in runs])
        row[f"{arm}_step_peak_mb"] = common.median([r["step_peak_kb"] / 1024 for r in runs])
        row[f"{arm}_step_added_mb"] = common.median([r["step_added_kb"] / 1024 for r in runs])
        row[f"{arm}_fit_added_mb"] = common.median(
            [(r["peak_kb"] - r["before_fit_kb"]) / 1024 for r in runs]
        )
    row["peak_ratio"] = row["step_peak_mb"] / row["plain_peak_mb"]
    row["fit_added_ratio"] = row["step_fit_added_mb"] / row["plain_fit_added_mb"]
    row["step_peak_ratio"] = row["step_step_peak_mb"] / row["plain_step_peak_mb"]
    print("RESULT", json.dumps(row))
    if args.json:
        common.write_json(args.json, {"rows": [row]})


if __name__ == "__main__":
    main()
