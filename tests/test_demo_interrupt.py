"""`tb-gradviz demo`'s exit on Ctrl-C, and how it shows a warning raised while it trains.

Neither needs the demo's models: `tb_gradviz.demos` is replaced by a module whose `run_demo`
writes an empty logdir (or only warns), so that what runs is the command's own code, serving a
real TensorBoard in a real child process.
"""

import os
import signal
import subprocess
import sys
import threading
import types
import warnings

import limits
import pytest
from test_cli import REPO, run_cli

from tb_gradviz import cli

# The child: the demo command with a run_demo that trains nothing, serving on a free port. It
# takes Ctrl-C as a terminal's foreground process does: a process started in the background of
# a shell without job control (CI's runner may be one) inherits SIGINT ignored.
CHILD = """
import os, signal, sys, types
signal.signal(signal.SIGINT, signal.default_int_handler)
def run_demo(logdir, **options):
    os.makedirs(logdir, exist_ok=True)
    return {}
sys.modules["tb_gradviz.demos"] = types.SimpleNamespace(
    run_demo=run_demo, DIVERGING_RUN="diverging_mlp", FAILURES=())
from tb_gradviz.cli import main
sys.exit(main(["demo", "--logdir", sys.argv[1], "--port", "0"]))
"""


@pytest.mark.slow
def test_ctrl_c_while_the_demo_serves_exits_130(tmp_path):
    # The loop that serves caught KeyboardInterrupt and returned 0; docs/CLI.md says 130.
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / "logs")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        said, ready = [], threading.Event()

        def read():
            for line in child.stdout:
                said.append(line)
                if line.startswith("Press Ctrl-C to stop."):
                    ready.set()

        # A thread reads, so that the wait for the line is bounded.
        threading.Thread(target=read, daemon=True).start()
        assert ready.wait(limits.SERVER_START_S), "".join(said) + child.stderr.read()
        assert any(line.startswith("GradViz tab: http://127.0.0.1:") for line in said), said
        child.send_signal(signal.SIGINT)
        status = child.wait(timeout=limits.CHILD_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert status == cli.EXIT_INTERRUPTED == 130, child.stderr.read()


def test_a_warning_raised_while_the_demo_trains_is_one_clean_line(tmp_path, monkeypatch):
    # The callback's budget warning printed its file, line number and source line
    # ("self._budget.log_ended()"), which read like a traceback.
    message = "tb_gradviz: logging takes 40% of training time (2.0 s of 5.0 s); log less often"

    def run_demo(logdir, **options):
        os.makedirs(logdir, exist_ok=True)
        warnings.warn(message, UserWarning, stacklevel=1)
        return {}

    stub = types.SimpleNamespace(run_demo=run_demo, DIVERGING_RUN="diverging_mlp", FAILURES=())
    monkeypatch.setitem(sys.modules, "tb_gradviz.demos", stub)
    status, out, err = run_cli("demo", "--logdir", tmp_path / "logs", "--no-serve")
    assert status == 0, err
    assert err == f"warning: {message}\n"
    assert "Logs written in" in out
