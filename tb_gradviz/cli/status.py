"""The exit statuses of `tb-gradviz` and the error that carries one.

Each outcome has its own status, so that a CI job can tell a sick model from
a typo or a full disk (docs/CLI.md lists them):

* `EXIT_OK` 0: done; for `check`, no flag among `--fail-on` is raised.
* `EXIT_FLAGGED` 1: `check` only: a flag among `--fail-on` is raised.
* `EXIT_USAGE` 2: bad arguments, or no data to read: a logdir that does not
  exist or cannot be read (a remote store that does not answer), one with no
  tb_gradviz data, an unknown `--run`, no step `<= --step`.
* `EXIT_OUTPUT` 3: `export --output` cannot be written (a folder, a missing
  parent folder, no permission).
* `EXIT_SERVE` 4: `demo` cannot serve TensorBoard (a host that cannot be
  resolved or is not this machine's, a port that is taken, ...).
* `EXIT_INTERRUPTED` 130: stopped with Ctrl-C.
"""

EXIT_OK = 0
EXIT_FLAGGED = 1
EXIT_USAGE = 2
EXIT_NO_DATA = EXIT_USAGE  # missing data is a usage error: the wrong logdir or run was named
EXIT_OUTPUT = 3
EXIT_SERVE = 4
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = """exit status:
  0    done; check: no flag among --fail-on raised
  1    check: a flag among --fail-on raised
  2    bad arguments, or no data: missing or unreadable logdir, no tb_gradviz data,
       unknown --run, no step <= --step
  3    export: --output cannot be written (a folder, a missing folder, no permission)
  4    demo: TensorBoard cannot serve (a host that cannot be resolved, a taken port, ...)
  130  interrupted"""


class CommandError(Exception):
    """A problem with the input or the environment: printed as one line, exit status `code`."""

    def __init__(self, message, code=EXIT_USAGE):
        super().__init__(message)
        self.code = code
