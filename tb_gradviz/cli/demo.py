"""`tb-gradviz demo`: train the demo models with the callback, then serve TensorBoard."""

import importlib
import os
import re
import sys
import tempfile
import time
import urllib.parse

from tb_gradviz.cli.status import EXIT_OK, EXIT_SERVE, CommandError

DEFAULT_PORT = 6006  # TensorBoard's


# Set, unless the user set them, before TensorFlow is first imported: its C++
# log lines (CPU instructions, oneDNN, float16 kernels) and absl's notice
# before them say nothing about the demo; Python errors still surface.
QUIET_TENSORFLOW = {"TF_CPP_MIN_LOG_LEVEL": "3", "GRPC_VERBOSITY": "ERROR"}


# The lines TensorFlow's C++ side writes to file descriptor 2 while it loads,
# whatever TF_CPP_MIN_LOG_LEVEL says (oneDNN's notice, absl's before it).
_LOAD_NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\)|[IW]\d{4} [\d:.]+ +\d+ \S+:\d+\]"
)


def import_quietly(name):
    """Imports module `name`, dropping TensorFlow's start-up lines from stderr.

    File descriptor 2 is caught while the module (and TensorFlow with it)
    loads; every caught line that is not such a notice is written to stderr
    afterwards, so warnings and errors of the import still show.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            return importlib.import_module(name)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            for line in caught.read().decode(errors="replace").splitlines(keepends=True):
                if not _LOAD_NOISE.match(line):
                    sys.stderr.write(line)


def run_demo(args):
    if os.path.exists(args.logdir) and not os.path.isdir(args.logdir):
        raise CommandError(
            f"--logdir must be a directory; received {args.logdir!r}, which is a file"
        )
    for name, value in QUIET_TENSORFLOW.items():
        if not os.environ.get(name):
            os.environ[name] = value
    started = time.monotonic()
    print(
        f"Training into {os.path.abspath(args.logdir)} (data generated, no download).", flush=True
    )
    demos = import_quietly("tb_gradviz.demos")
    runs = demos.run_demo(
        args.logdir,
        model=args.model,
        steps=args.steps,
        image_size=args.image_size,
        batch_size=args.batch_size,
        say=lambda text: print(text, flush=True),
    )
    print(f"Logs written in {time.monotonic() - started:.0f} s.", flush=True)
    print(
        f"Check them with: tb-gradviz check {args.logdir}  (the sigmoid network's vanishing "
        "gradient, and dead ReLU channels in the small CNNs, are flagged)",
        flush=True,
    )
    if args.no_serve:
        print(
            f"View them with: tensorboard --logdir {args.logdir} "
            "--samples_per_plugin=gradviz=0,histograms=0"
        )
        return EXIT_OK
    return serve(args.logdir, args.host, args.port, args.serve_seconds, focus(runs))


def focus(runs):
    """The URL fragment's parameters that open ResNet50's `pool1_pool` in "The layer", or ''.

    Args:
      runs: `{run: [layer paths]}`, as `demos.run_demo` returns it.
    """
    for run, layers in runs.items():
        for layer in layers:
            if layer.rsplit("/", 1)[-1] == "pool1_pool":
                return "&" + urllib.parse.urlencode({"run": run, "layer": layer, "view": "layer"})
    return ""


def serve(logdir, host, port=None, seconds=None, fragment=""):
    """Serves TensorBoard (with the GradViz tab) on logdir until Ctrl-C or `seconds`.

    `port` None is TensorBoard's own default, `DEFAULT_PORT`, or a free port
    (said on stdout) when that one is busy; an explicit busy port fails. The
    printed URL ends `#gradviz` and `fragment` (the tab's run, layer and view).
    """
    from tensorboard import program

    def launch(port):
        board = program.TensorBoard()
        board.configure(
            argv=[
                None,
                "--logdir",
                logdir,
                "--host",
                host,
                "--port",
                str(port),
                "--samples_per_plugin",
                "gradviz=0,histograms=0",
            ]
        )
        return board.launch()

    try:
        url = launch(DEFAULT_PORT if port is None else port)
    except program.TensorBoardServerException as e:
        if port is not None:
            raise CommandError(
                f"cannot serve TensorBoard on {host}:{port}: {e.msg}", EXIT_SERVE
            ) from None
        print(f"Port {DEFAULT_PORT} is busy ({e.msg}); serving on a free port instead.", flush=True)
        try:
            url = launch(0)
        except program.TensorBoardServerException as e:
            raise CommandError(f"cannot serve TensorBoard on {host}: {e.msg}", EXIT_SERVE) from None
    print(f"GradViz tab: {url}#gradviz{fragment}", flush=True)
    print("Press Ctrl-C to stop.", flush=True)
    deadline = None if seconds is None else time.monotonic() + seconds
    try:
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    return EXIT_OK
