"""The data readers' warnings, held back while a file is read on a helper thread.

Python's warning filters are global to the process: a ``warnings.catch_warnings()`` block on one
thread (the model probe's at load, which hides warnings about its synthetic rows) also silences a
warning raised meanwhile on another. A reader on a helper thread therefore collects its warnings
(:func:`deferred`) and the calling thread raises them once the file is read
(:func:`raise_deferred`): none is lost, whatever the other thread does meanwhile.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings

_HELD: contextvars.ContextVar[list | None] = contextvars.ContextVar("bayesmlc_held_read_warnings", default=None)


def warn(message: str, stacklevel: int = 2) -> None:
    """``warnings.warn(message)`` (a ``UserWarning``), or, inside :func:`deferred`, the message kept for
    :func:`raise_deferred`. ``stacklevel`` counts from the caller of this function."""
    held = _HELD.get()
    if held is None:
        warnings.warn(message, stacklevel=stacklevel + 1)
    else:
        held.append(message)


@contextlib.contextmanager
def deferred():
    """Within the block (on this thread), the readers' warnings are appended to the list it yields
    instead of being raised."""
    held: list[str] = []
    token = _HELD.set(held)
    try:
        yield held
    finally:
        _HELD.reset(token)


def raise_deferred(messages) -> None:
    """Raise each held message as a ``UserWarning``, in the order it was held."""
    for message in messages:
        warnings.warn(message, stacklevel=2)
