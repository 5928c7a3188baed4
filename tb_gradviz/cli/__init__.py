"""`tb-gradviz`: run the demo; summarise, export or check tb_gradviz logs.

`summary`, `export` and `check` read through the same code as the
TensorBoard plugin and never import TensorFlow; `demo` does. The commands
and their options are in `arguments.SYNOPSIS`, the exit statuses in
`status` (docs/CLI.md describes both).
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
from tb_gradviz.cli.status import (
    EXIT_FLAGGED,
    EXIT_INTERRUPTED,
    EXIT_NO_DATA,
    EXIT_OK,
    EXIT_OUTPUT,
    EXIT_SERVE,
    EXIT_USAGE,
    CommandError,
)
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
    "EXIT_INTERRUPTED",
    "EXIT_NO_DATA",
    "EXIT_OK",
    "EXIT_OUTPUT",
    "EXIT_SERVE",
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
    """Entry point of the `tb-gradviz` console script; returns the exit status (`status`)."""
    from tensorboard import errors

    try:
        args = build_parser().parse_args(argv)
        return _COMMANDS[args.command](args)
    except CommandError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    except errors.NotFoundError as e:  # a run or record that vanished or never was
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
