"""The `tb-gradviz` argument parser: subcommands, their options, and the checks of each value."""

import argparse
import functools
import math
import textwrap

from tb_gradviz.cli.demo import DEFAULT_PORT
from tb_gradviz.cli.status import EXIT_CODES_HELP, CommandError
from tb_gradviz.format import health, leading


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise CommandError(f"{self.prog}: {message}")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Wraps option help at spaces only: a flag name (`block_underflow`, `--fail-on`) is never
    split across lines, where argparse would break a long word or a hyphenated one."""

    def _split_lines(self, text, width):
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)


SYNOPSIS = """commands:
  tb-gradviz demo [--logdir DIR] [--model all|resnet50|cnn|divergence] [--steps N]
                  [--image-size PX] [--batch-size N] [--no-serve] [--host HOST] [--port PORT]
                  [--serve-seconds S]
  tb-gradviz summary LOGDIR [--run RUN] [--step STEP] [--details]
  tb-gradviz export LOGDIR [--format csv|json] [--output FILE] [--run RUN]
  tb-gradviz check LOGDIR [--run RUN] [--fail-on FLAGS] [--ratio R] [--format text|json]"""


def build_parser():
    parser = _Parser(
        prog="tb-gradviz",
        description="Activations and gradients of Keras layers, in TensorBoard.",
        epilog=f"{SYNOPSIS}\n\n{EXIT_CODES_HELP}",
        formatter_class=_HelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    commands.add_parser = functools.partial(
        commands.add_parser,
        epilog=EXIT_CODES_HELP,
        formatter_class=_HelpFormatter,
    )

    demo = commands.add_parser(
        "demo",
        help="train nine demo runs with the callback (small CNNs, 20-layer plain CNNs, "
        "mixed_float16, a transformer, a run that diverges, ResNet50), then serve TensorBoard",
    )
    demo.add_argument(
        "--logdir", default="logs/tb_gradviz_demo", help="where the runs go (default: %(default)s)"
    )
    demo.add_argument(
        "--model",
        choices=("all", "resnet50", "cnn", "divergence"),
        default="all",
        help="which demo (default: %(default)s)",
    )
    demo.add_argument(
        "--steps",
        type=_positive_int,
        default=None,
        help="training steps per run of the small CNNs and ResNet50 (default: 48 ResNet50, 40 "
        "CNN; the plain CNNs always 24, the mixed_float16 CNNs 10, the transformer 150, the "
        "diverging run until it fails)",
    )
    demo.add_argument(
        "--image-size",
        type=_image_size,
        default=64,
        help="ResNet50 input size, >= 32 (default: %(default)s)",
    )
    demo.add_argument(
        "--batch-size",
        type=_positive_int,
        default=16,
        help="ResNet50 batch size (default: %(default)s)",
    )
    demo.add_argument(
        "--no-serve",
        action="store_true",
        help="write the logs and exit without starting TensorBoard",
    )
    demo.add_argument("--host", default="127.0.0.1", help="TensorBoard host (default: %(default)s)")
    demo.add_argument(
        "--port",
        type=_port,
        default=None,
        help=f"TensorBoard port (default: {DEFAULT_PORT}, TensorBoard's, or a free one when it is "
        "busy; 0: a free one)",
    )
    demo.add_argument(
        "--serve-seconds",
        type=_positive_float,
        default=None,
        help="stop serving after this many seconds",
    )

    summary = commands.add_parser(
        "summary", help="a table per run and layer at the last (or a chosen) step"
    )
    summary.add_argument("logdir")
    summary.add_argument("--run", default=None, help="only this run")
    summary.add_argument(
        "--step",
        type=_non_negative_int,
        default=None,
        help="the latest step <= STEP (default: last)",
    )
    summary.add_argument(
        "--details",
        action="store_true",
        help="every row of every table; without it, a run longer than a screen keeps the rows "
        "that matter most of each table (flags and NaN/Inf first) and says how many it left out",
    )

    export = commands.add_parser(
        "export", help="histograms, statistics and weight updates as CSV or JSON"
    )
    export.add_argument("logdir")
    export.add_argument(
        "--format", choices=("csv", "json"), default="csv", help="(default: %(default)s)"
    )
    export.add_argument("--output", default="-", help="file to write, '-' for stdout (default)")
    export.add_argument("--run", default=None, help="only this run")

    check = commands.add_parser(
        "check",
        help="training-health flags per run and layer at the last step, and where each began; "
        "exit 1 when a chosen one is raised",
    )
    check.add_argument("logdir")
    check.add_argument("--run", default=None, help="only this run")
    check.add_argument(
        "--fail-on",
        type=_flags,
        default=list(health.DEFAULT_FAIL_ON),
        help="the flags and warnings that fail the check, comma-separated, from "
        f"{', '.join(health.FLAGS + leading.WARNINGS)} (default: "
        f"{', '.join(health.DEFAULT_FAIL_ON)})",
    )
    check.add_argument(
        "--ratio",
        type=_ratio,
        default=health.DEFAULT_RATIO,
        help="vanishing / exploding: the output-gradient RMS ratio to the reference layer "
        "(default: %(default)g)",
    )
    check.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text tables, or one strict JSON document on stdout for CI (default: %(default)s)",
    )
    return parser


def _typed(name, convert, check, allowed):
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {allowed}; received {text!r}") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"expected {allowed}; received {text!r}")
        return value

    parse.__name__ = name
    return parse


_positive_int = _typed("positive int", int, lambda v: v > 0, "a positive integer")
_non_negative_int = _typed("step", int, lambda v: v >= 0, "an integer >= 0")
_positive_float = _typed(
    "seconds", float, lambda v: v > 0 and math.isfinite(v), "a positive number"
)
_image_size = _typed(
    "image size", int, lambda v: v >= 32, "an integer >= 32 (ResNet50's smallest input)"
)
_port = _typed("port", int, lambda v: 0 <= v <= 65535, "a port number 0-65535")
_ratio = _typed("ratio", float, lambda v: 1 < v < math.inf, "a finite number above 1")


def _flags(text):
    """The flags and warnings of `--fail-on`."""
    allowed = health.FLAGS + leading.WARNINGS
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    if not chosen or any(name not in allowed for name in chosen):
        raise argparse.ArgumentTypeError(
            f"flags must be a comma-separated list of {', '.join(health.FLAGS)}; received "
            f"{text!r} (the warnings {', '.join(leading.WARNINGS)} are allowed too)"
        )
    return chosen
