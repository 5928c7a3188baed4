"""`tb-gradviz`: run the demo, summarise or export tb_gradviz logs.

    tb-gradviz demo [--logdir DIR] [--model all|resnet50|cnn] [--no-serve]
    tb-gradviz summary LOGDIR [--run RUN] [--step STEP]
    tb-gradviz export LOGDIR [--format csv|json] [--output FILE]
    tb-gradviz check LOGDIR [--run RUN] [--fail-on FLAGS] [--ratio R]

`summary`, `export` and `check` read through the same code as the
TensorBoard plugin and never import TensorFlow; `demo` does. `check` exits
with status 1 (`EXIT_FLAGGED`) when a chosen training-health flag is raised.
"""

import sys

from tb_gradviz.cli.arguments import build_parser
from tb_gradviz.cli.check import run_check
from tb_gradviz.cli.demo import DEFAULT_PORT, run_demo, serve
from tb_gradviz.cli.export import (
    csv_header,
    export_routing_maps,
    export_series,
    export_updates,
    run_export,
    write_csv,
)
from tb_gradviz.cli.logs import open_logdir
from tb_gradviz.cli.status import EXIT_FLAGGED, EXIT_NO_DATA, EXIT_USAGE, CommandError
from tb_gradviz.cli.summary import (
    LAYER_UPDATE,
    SUMMARY_COLUMNS,
    UPDATE_COLUMNS,
    mass_conservation,
    run_summary,
    summary_rows,
    update_rows,
)

__all__ = [
    "DEFAULT_PORT",
    "EXIT_FLAGGED",
    "EXIT_NO_DATA",
    "EXIT_USAGE",
    "LAYER_UPDATE",
    "SUMMARY_COLUMNS",
    "UPDATE_COLUMNS",
    "CommandError",
    "build_parser",
    "csv_header",
    "export_routing_maps",
    "export_series",
    "export_updates",
    "main",
    "mass_conservation",
    "open_logdir",
    "serve",
    "summary_rows",
    "update_rows",
    "write_csv",
]

_COMMANDS = {"demo": run_demo, "summary": run_summary, "export": run_export, "check": run_check}

# The name the tests of the read side open a logdir by.
_open_logdir = open_logdir


def main(argv=None):
    """Entry point of the `tb-gradviz` console script; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
        return _COMMANDS[args.command](args)
    except CommandError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
