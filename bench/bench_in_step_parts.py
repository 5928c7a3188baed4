"""Where an in-step event's time goes: the parts of ResNet50's step logged at every step, timed.

One process, `keras.applications.ResNet50(weights=None)` at 64 x 64 x 3, batch
16 (`common.build_model`), every layer logged with `GradVizCallback(digest=
"step", every_n_batches=1, full_records=0)` on Keras' TensorFlow backend. Each
part is timed where it runs, by wrapping the function that does it:
`in_step_kernel.row_along` (numba's rows, on TensorFlow's threads: summed over
the step's calls, which may overlap), `in_step_kernel.update_norms` (the update
rows), the callback's `_log_in_step` (on the main thread: taking the step's
rows, the event's records, judging them, writing) and, inside it,
`Judge.judge` and `in_step_fit.event_records`. Per part, milliseconds per
logged step over `--steps` steps of the second fit of each kind (the first
compiles), beside the plain and logged fits' wall and CPU time per step (those
include the fit's start, so they are not the paired ratio: bench_in_step.py).

    python bench/bench_in_step_parts.py --steps 24 --json bench/results/in_step_parts.json

`--smoke` runs the small CNN at 32 px for 3 steps (not a measurement).
"""

import collections
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import bench_in_step  # noqa: E402
import common  # noqa: E402


def main():
    parser = common.parser(__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    name, image_size = ("cnn", 32) if args.smoke else ("resnet50", bench_in_step.IMAGE_SIZE)
    steps = 3 if args.smoke else args.steps

    from tb_gradviz import GradVizCallback
    from tb_gradviz.capture import callback, in_step_fit, in_step_kernel
    from tb_gradviz.format import judgement

    spent = collections.defaultdict(float)

    def timed(owner, attribute, part):
        cpu_part = part.replace("_ms", "_cpu_ms")
        setattr(owner, attribute, common.timed(getattr(owner, attribute), spent, part, cpu_part))

    timed(in_step_kernel, "row_along", "kernel_rows_ms")
    timed(in_step_kernel, "update_norms", "update_norms_ms")
    timed(callback.GradVizCallback, "_log_in_step", "callback_event_ms")
    timed(judgement.Judge, "judge", "judge_ms")
    timed(in_step_fit, "event_records", "event_records_ms")

    model = common.build_model(name, image_size, args.seed)
    x, y = common.batch(bench_in_step.BATCH * steps, image_size, args.seed)
    gradviz = GradVizCallback(
        tempfile.mkdtemp(prefix="bench_in_step_parts_"),
        probe_data=(x[: bench_in_step.BATCH], y[: bench_in_step.BATCH]),
        layers=lambda layer: True,
        every_n_batches=1,
        full_records=0,
        digest="step",
    )
    row = {"model": name, "steps": steps, "layers": None}
    for logged in (False, True, False, True):  # the second of each kind is kept
        spent.clear()
        wall, cpu = time.perf_counter(), time.process_time()
        model.fit(
            x,
            y,
            batch_size=bench_in_step.BATCH,
            epochs=1,
            verbose=0,
            shuffle=False,
            callbacks=[gradviz] if logged else [],
        )
        kind = "logged" if logged else "plain"
        row[f"{kind}_wall_s"] = (time.perf_counter() - wall) / steps
        row[f"{kind}_cpu_s"] = (time.process_time() - cpu) / steps
        if logged:
            row.update({part: seconds * 1000 / steps for part, seconds in spent.items()})
    row["layers"] = len(gradviz.chosen_layers)
    row["loadavg"] = os.getloadavg()[0]
    common.report("bench_in_step_parts", args, [row], digits=4)


if __name__ == "__main__":
    main()
