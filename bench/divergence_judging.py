"""The divergence suite's judging: a run's onsets as `tb-gradviz check` finds them in its logdir,
with their leads on the run's divergence, and which rules judged them.
"""

import contextlib
import io
import json
import os
import subprocess
import sys


def onsets_of(logdir, in_process=False):
    """`check --format json`'s onsets of the run in `logdir`: from a `tb-gradviz check` process,
    as a user runs it, or `in_process` (no import of its own: what `--rejudge` does, in a
    process that has not imported TensorFlow)."""
    argv = ["check", logdir, "--format", "json"]
    if in_process:
        from tb_gradviz import cli

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = cli.main(argv)
        done = subprocess.CompletedProcess(argv, status, out.getvalue(), err.getvalue())
    else:
        done = subprocess.run(
            [sys.executable, "-m", "tb_gradviz.cli", *argv], capture_output=True, text=True
        )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"check exited {done.returncode}: {done.stderr[-2000:]}")
    (run,) = json.loads(done.stdout)["runs"]
    return run.get("onsets", [])


def rules_digest():
    """A digest of the read side's sources (`format/` and `board/`), which hold the rules a
    row's onsets were judged by: rows of one digest were judged alike."""
    import hashlib

    import tb_gradviz

    root = os.path.dirname(tb_gradviz.__file__)
    digest = hashlib.sha256()
    for side in ("format", "board"):
        folder = os.path.join(root, side)
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as f:
                    digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()[:12]


def judged(row, in_process=False):
    """`row`'s onsets as `check` judges its logdir now, with their leads on its divergence."""
    diverged, every = row["divergence_step"], row["every_n_batches"]
    events = range(every, row["steps_run"] + 1, every)
    onsets = []
    row["rules_digest"] = rules_digest()
    for onset in onsets_of(row["logdir"], in_process):
        step = onset["step"]
        onsets.append(
            {
                "flag": onset["flag"],
                "class": onset.get("class", "flag"),
                "step": step,
                "layer": onset["layer"],
                "tensor": onset["tensor"],
                "raised_steps": onset["raised_steps"],
                "last_raised_step": onset["last_raised_step"],
                "lead_steps": None if diverged is None else diverged - step,
                "lead_events": None
                if diverged is None
                else sum(step <= e < diverged for e in events),
            }
        )
    return onsets
