"""The exit statuses of `tb-gradviz` and the error that carries one."""

EXIT_USAGE = 2
EXIT_NO_DATA = 1
EXIT_FLAGGED = 1


class CommandError(Exception):
    """A problem with the user's input: printed as one line, exit status `code`."""

    def __init__(self, message, code=EXIT_USAGE):
        super().__init__(message)
        self.code = code
