"""`tb-gradviz demo`: train the demo models with the callback, then serve TensorBoard."""

import contextlib
import errno
import importlib
import io
import os
import re
import socket
import sys
import tempfile
import time
import urllib.parse
import warnings

from tb_gradviz.cli.status import EXIT_INTERRUPTED, EXIT_OK, EXIT_SERVE, CommandError

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
    if not args.no_serve:
        check_host(args.host)
    for name, value in QUIET_TENSORFLOW.items():
        if not os.environ.get(name):
            os.environ[name] = value
    started = time.monotonic()
    print(
        f"Training into {os.path.abspath(args.logdir)} (data generated, no download).", flush=True
    )
    demos = import_quietly("tb_gradviz.demos")
    with warnings.catch_warnings():
        warnings.showwarning = show_warning
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
    if demos.DIVERGING_RUN in runs:
        print(warned_before_failing(args.logdir, demos.DIVERGING_RUN, demos.FAILURES), flush=True)
    if args.no_serve:
        # The plugin's loader keeps every point of its own series (API.md, "Downsampling"),
        # and the demo's runs are shorter than TensorBoard's 500-point histogram sample.
        print(f"View them with: tensorboard --logdir {args.logdir}")
        return EXIT_OK
    return serve(args.logdir, args.host, args.port, args.serve_seconds, focus(runs))


def show_warning(message, category, filename, lineno, file=None, line=None):
    """Writes a warning raised while the demo trains as one line, `warning: ...`, on stderr.

    Python's own display adds the file and the source line that raised it,
    which in the demo's output reads like a traceback.
    """
    print(f"warning: {message}", file=sys.stderr if file is None else file, flush=True)


def warned_before_failing(logdir, run, failures):
    """Where to see `run`'s first warning come before its first failure flag (one of
    `failures`): the onsets `tb-gradviz check` finds in the written run, in a line of text."""
    from tb_gradviz.cli.logs import open_logdir, runs_of

    where = os.path.join(logdir, run)
    gradviz, ctx, experiment = open_logdir(where)
    (found,) = runs_of(gradviz, ctx, experiment, where, None)
    _, body = gradviz.check_impl(ctx, experiment, found["run"])
    onsets = sorted(body["onsets"], key=lambda onset: onset["step"])
    warning = next((o for o in onsets if o.get("class") == "warning"), None)
    failure = next((o for o in onsets if o["flag"] in failures), None)

    def named(onset):
        return f"{onset['flag']} at step {onset['step']} ({onset['layer']}, {onset['tensor']})"

    if warning is None or failure is None or warning["step"] >= failure["step"]:
        return (
            f"{run}: no warning before a failure this time (first warning: "
            f"{named(warning) if warning else 'none'}; first failure: "
            f"{named(failure) if failure else 'none'})"
        )
    return (
        f"{run} warned before it failed: {named(warning)}, {failure['step'] - warning['step']} "
        f"steps before {named(failure)}. See it in the tab's 'Over time' section (the onset "
        f"table, run {run}) or with: tb-gradviz check {logdir} --run {run}"
    )


def check_host(host):
    """Raises `CommandError` (`EXIT_SERVE`) when `host` cannot be resolved, before any training.

    `serve` finds the same failure when TensorBoard starts; checking first
    saves a user who mistyped the host the minutes of training before it.
    An empty host (every interface, to a socket's bind) needs no resolving.
    """
    if not host:
        return
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise CommandError(
            f"cannot serve TensorBoard on {host}: {_socket_failure(e, host, None)}", EXIT_SERVE
        ) from None


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
    """Serves TensorBoard (with the GradViz tab) on logdir until Ctrl-C or `seconds`; returns
    `EXIT_OK` when `seconds` ran out, `EXIT_INTERRUPTED` after Ctrl-C.

    `port` None is TensorBoard's own default, `DEFAULT_PORT`, or a free port
    (said on stdout) when that one is busy; an explicit busy port fails. The
    printed URL ends `#gradviz` and `fragment` (the tab's run, layer and view).

    Raises:
      CommandError: with status `EXIT_SERVE` and what failed (the host that
        cannot be resolved, the port that is busy, ...), whenever TensorBoard
        cannot serve.
    """
    try:
        url = _launch(logdir, host, DEFAULT_PORT if port is None else port)
    except _PortBusy as e:
        if port is not None:
            raise CommandError(
                f"cannot serve TensorBoard on {host}:{port}: {e}", EXIT_SERVE
            ) from None
        print(f"Port {DEFAULT_PORT} is busy ({e}); serving on a free port instead.", flush=True)
        try:
            url = _launch(logdir, host, 0)
        except _PortBusy as e:
            raise CommandError(f"cannot serve TensorBoard on {host}: {e}", EXIT_SERVE) from None
    print(f"GradViz tab: {url}#gradviz{fragment}", flush=True)
    print("Press Ctrl-C to stop.", flush=True)
    deadline = None if seconds is None else time.monotonic() + seconds
    try:
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.2)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_OK


class _PortBusy(Exception):
    """The port is taken, where another port may serve: its text says what was tried."""


def _launch(logdir, host, port):
    """Starts TensorBoard on `host:port` in a thread and returns its URL.

    Every way TensorBoard's start can fail becomes an exception that says
    what failed: werkzeug, under TensorBoard, prints a socket error to stderr
    and calls `sys.exit(1)`, so what it printed is held back (and shown only
    when the start succeeds) and the socket error is read from the exit's
    context.

    Raises:
      _PortBusy: the port is taken.
      CommandError: with status `EXIT_SERVE`, for every other failure.
    """
    from tensorboard import program

    where = f"{host}:{port}" if port else host
    board = program.TensorBoard()
    board.configure(argv=[None, "--logdir", logdir, "--host", host, "--port", str(port)])
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            url = board.launch()
    except program.TensorBoardPortInUseError as e:
        raise _PortBusy(e.msg) from None
    except program.TensorBoardServerException as e:
        raise CommandError(f"cannot serve TensorBoard on {where}: {e.msg}", EXIT_SERVE) from None
    except SystemExit as e:
        error = e.__context__
        if isinstance(error, OSError) and error.errno == errno.EADDRINUSE:
            raise _PortBusy(f"port {port} is already in use") from None
        raise CommandError(
            f"cannot serve TensorBoard on {where}: {_socket_failure(error, host, port, e.code)}",
            EXIT_SERVE,
        ) from None
    except OSError as e:
        raise CommandError(
            f"cannot serve TensorBoard on {where}: {_socket_failure(e, host, port)}", EXIT_SERVE
        ) from None
    sys.stderr.write(held.getvalue())
    return url


def _socket_failure(error, host, port, exit_status=None):
    """What a failed start of the server means, in words, from its socket error (or none)."""
    if isinstance(error, socket.gaierror):
        return f"the host {host!r} cannot be resolved ({error.strerror})"
    if not isinstance(error, OSError):
        return f"TensorBoard exited with status {exit_status} while starting"
    reasons = {
        errno.EADDRINUSE: f"port {port} is already in use",
        errno.EADDRNOTAVAIL: f"{host!r} is not an address of this machine",
        errno.EACCES: f"no permission to bind port {port}",
    }
    return reasons.get(error.errno, error.strerror or str(error))
