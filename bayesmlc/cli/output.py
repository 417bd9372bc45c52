"""What the commands print and write: text escaped for the terminal, one-line warnings, progress
lines, the JSON record or table of a command, and the JSON files of a run."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import unicodedata
import warnings
from pathlib import Path

import numpy as np

from ..safe_io import make_temporary_file, read_regular_file
from .errors import CLIError


def printable(text) -> str:
    """``text`` with control and other non-printing characters escaped (``\\x1b``), so that names
    read from files cannot move the cursor or recolour the terminal."""
    text = str(text)
    if text.isprintable():
        return text
    out = []
    for char in text:
        category = unicodedata.category(char)
        if category[0] not in "CZ" or category == "Zs":  # letters, marks, numbers, punctuation, symbols, spaces
            out.append(char)
        else:
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def format_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as the CLI prints it: one line, ``bayesmlc: warning: MESSAGE`` (Python's default
    adds the file, the line number and the source line that raised it)."""
    return f"bayesmlc: warning: {printable(' '.join(str(message).split()))}\n"


@contextlib.contextmanager
def one_line_warnings():
    """A context in which warnings print as :func:`format_warning` does; the previous formatter comes
    back afterwards (``main`` may be called from Python)."""
    previous = warnings.formatwarning
    warnings.formatwarning = format_warning
    try:
        yield
    finally:
        warnings.formatwarning = previous


def progress(message: str, quiet: bool) -> None:
    """A progress line on stderr, unless ``quiet``."""
    if not quiet:
        print(message, file=sys.stderr, flush=True)


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MB (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def device_name(model) -> str:
    """The device the model computes on, as the JSON record names it (``cuda (GPU name)``)."""
    device = getattr(model, "device", None)
    if device is None:
        return "cpu"
    from ..utils import resolve_device

    resolved = resolve_device(device)
    if resolved.type == "cuda":
        import torch

        return f"cuda ({torch.cuda.get_device_name(resolved)})"
    return str(resolved)


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def write_json(path: Path, payload) -> None:
    """Write ``payload`` as JSON (a temporary file, then a rename)."""
    fd, tmp = make_temporary_file(path.parent, path.name, suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(payload, indent=1, default=_json_default))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


#: a run folder's JSON files (meta.json, history.json) are parsed whole; beyond this size they are refused
MAX_RUN_JSON_BYTES = 256 * 2**20


def read_json(path: Path, what: str):
    """The JSON document in ``path``; a CLIError naming the file and ``what`` it should hold when corrupt,
    not a regular file (a FIFO, ``/dev/zero``) or larger than :data:`MAX_RUN_JSON_BYTES`."""
    try:
        return json.loads(read_regular_file(path, MAX_RUN_JSON_BYTES, lambda message: CLIError(f"{path}: {message}")))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise CLIError(f"{path}: corrupt {what} ({str(exc)[:200]})") from None


def emit(args, record: dict, table: str) -> None:
    """A command's result: the table on stdout, or with ``--json`` the record as the last stdout line
    (and the table on stderr unless ``--quiet``)."""
    if args.json:
        if not args.quiet and table:
            print(table, file=sys.stderr)
        print(json.dumps(record, default=_json_default))
    else:
        print(table)
