"""The command line's errors: :class:`CLIError`, the exit codes, and the one line that reports an
exception that ends a command (:func:`describe_error`)."""

from __future__ import annotations

import sys

from ..exceptions import BayesMLCError

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CLIError(Exception):
    """A user error reported as ``bayesmlc: error: ...`` with exit code 2."""


def describe_error(exc: BaseException) -> tuple[int, str]:
    """``(exit code, one-line message)`` for an exception that ends a command: 2 for the user's
    errors, bad input and failed runs, 1 (with a hint to ``BAYESMLC_TRACEBACK=1``) for anything else."""
    if isinstance(exc, (CLIError, BayesMLCError)):
        message = str(exc)
    elif isinstance(exc, OSError) and exc.strerror:
        names = [n for n in (exc.filename, exc.filename2) if n is not None]
        message = exc.strerror + (": " + " -> ".join(str(n) for n in names) if names else "")
    elif isinstance(exc, MemoryError) or _is_torch_out_of_memory(exc):
        message = f"out of memory{': ' + ' '.join(str(exc).split()) if str(exc) else ''}"
    elif isinstance(exc, RecursionError):
        message = f"input nested too deeply ({exc})"
    elif isinstance(exc, (OSError, ValueError, ArithmeticError)) or _is_linalg_error(exc):
        # ValueError: bad values in arguments or data; ArithmeticError: training diverged (MLGPF's
        # TrainingDivergedError); a linear-algebra error: a kernel matrix lost positive definiteness
        message = f"{type(exc).__name__}: {exc}" if type(exc).__name__ not in ("ValueError", "OSError") else str(exc)
    else:
        return EXIT_INTERNAL, (f"unexpected {type(exc).__name__}: {exc} (a bug in bayesmlc; "
                               "set BAYESMLC_TRACEBACK=1 to see where)")
    return EXIT_USAGE, message


def _is_torch_out_of_memory(exc: BaseException) -> bool:
    """torch's out-of-memory error (a GPU's), or its CPU allocator's RuntimeError."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def _is_linalg_error(exc: BaseException) -> bool:
    if type(exc).__name__ in ("CholeskyError", "LinAlgError", "_LinAlgError"):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(exc, torch.linalg.LinAlgError)
