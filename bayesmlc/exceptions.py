"""Exceptions raised by bayesmlc.

Every error a user can cause with their data or arguments is one of these, with a message that names
the file, line, argument or value at fault.
"""

from sklearn.exceptions import NotFittedError

__all__ = [
    "BayesMLCError", "DataFormatError", "ValidationError", "ModelFormatError", "NotFittedError",
    "DownloadError", "DatasetNotFoundError", "OutputPathError",
]


class BayesMLCError(Exception):
    """Base class of bayesmlc's own errors."""


class DataFormatError(BayesMLCError, ValueError):
    """A data file cannot be parsed.

    Parameters
    ----------
    message:
        What is wrong.
    path:
        The file at fault, if known.
    line:
        1-based line number at fault, if known.
    """

    def __init__(self, message: str, path=None, line=None):
        self.path = None if path is None else str(path)
        self.line = line
        self.reason = message
        where = ""
        if self.path is not None:
            where = self.path
            if line is not None:
                where += f":{line}"
            where += ": "
        elif line is not None:
            where = f"line {line}: "
        super().__init__(where + message)


class ValidationError(BayesMLCError, ValueError):
    """Arguments handed to an estimator or function are inconsistent (shapes, values, types)."""


class ModelFormatError(BayesMLCError, ValueError):
    """A saved model file cannot be read (wrong file, corrupt, or written by a newer format version)."""


class DownloadError(BayesMLCError, OSError):
    """A download failed, or its size or sha256 does not match the registry."""


class DatasetNotFoundError(BayesMLCError, FileNotFoundError):
    """The files of a data set are not where :func:`bayesmlc.datasets.load` looked."""


class OutputPathError(BayesMLCError, OSError):
    """An output path cannot be written safely: something that is not a regular file is in the way, or
    the path would make a run folder write into itself."""
