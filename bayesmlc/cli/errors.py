"""The error the command line turns into one line and exit 2."""


class CLIError(Exception):
    """A user error reported as ``bayesmlc: error: ...`` with exit code 2."""
