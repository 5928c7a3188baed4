"""A real `tensorboard` process for tests: started on a free loopback port, always stopped."""

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import limits

STARTUP_TIMEOUT_S = limits.SERVER_START_S

KEEP_EVERY_STEP = ("--samples_per_plugin", "gradviz=0,histograms=0")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url):
    with urllib.request.urlopen(url, timeout=limits.REQUEST_S) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def running_tensorboard(
    logdir,
    log_path,
    ready=lambda url: True,
    extra_args=(),
    timeout=STARTUP_TIMEOUT_S,
    samples=KEEP_EVERY_STEP,
):
    """Starts `tensorboard` on logdir and yields its URL once GradViz is enabled and `ready(url)`.

    Every step is kept (`samples`, by default `KEEP_EVERY_STEP`; `()` starts
    it with no `--samples_per_plugin`, as a plain `tensorboard --logdir`);
    the process is stopped on exit, and its log is in the assertion message
    of any failure to start.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable,
        "-m",
        "tensorboard.main",
        "--logdir",
        str(logdir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *samples,
        *extra_args,
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise AssertionError(
                    f"tensorboard exited with {process.returncode}:\n"
                    f"{pathlib.Path(log_path).read_text()}"
                )
            with contextlib.suppress(OSError, ValueError):
                listing = get_json(f"{url}/data/plugins_listing")
                # The plugin is enabled as soon as some data is loaded; `ready` waits for the rest.
                if listing.get("gradviz", {}).get("enabled") and ready(url):
                    break
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"GradViz not ready within {timeout} s:\n{pathlib.Path(log_path).read_text()}"
                )
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
