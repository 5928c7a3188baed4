"""`tb-gradviz demo`: train the demo models with the callback, then serve TensorBoard."""

import os
import time

from tb_gradviz.cli.status import EXIT_SERVE, CommandError

DEFAULT_PORT = 6006  # TensorBoard's


def run_demo(args):
    if os.path.exists(args.logdir) and not os.path.isdir(args.logdir):
        raise CommandError(
            f"--logdir must be a directory; received {args.logdir!r}, which is a file"
        )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    started = time.monotonic()
    print(
        f"Training into {os.path.abspath(args.logdir)} (data generated, no download)...", flush=True
    )
    from tb_gradviz import demos

    runs = demos.run_demo(
        args.logdir,
        model=args.model,
        steps=args.steps,
        image_size=args.image_size,
        batch_size=args.batch_size,
    )
    for run, layers in runs.items():
        print(f"  {run}: {', '.join(layers)}")
    print(f"Logs written in {time.monotonic() - started:.0f} s.", flush=True)
    if args.no_serve:
        print(
            f"View them with: tensorboard --logdir {args.logdir} "
            "--samples_per_plugin=gradviz=0,histograms=0"
        )
        return 0
    return serve(args.logdir, args.host, args.port, args.serve_seconds)


def serve(logdir, host, port=None, seconds=None):
    """Serves TensorBoard (with the GradViz tab) on logdir until Ctrl-C or `seconds`.

    `port` None is TensorBoard's own default, `DEFAULT_PORT`, or a free port
    (said on stdout) when that one is busy; an explicit busy port fails.
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
    print(f"GradViz tab: {url}#gradviz", flush=True)
    print("Press Ctrl-C to stop.", flush=True)
    deadline = None if seconds is None else time.monotonic() + seconds
    try:
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    return 0
