"""How many CPU threads a command computes with (``--threads``, ``--set n_threads``)."""

from __future__ import annotations

import contextlib
import os

#: upper bound on ``--set n_threads=...`` and ``--threads`` as a multiple of the cores (an absurd count
#: aborts OpenMP)
MAX_THREADS_PER_CORE = 8


def max_threads() -> int:
    """The most threads ``--threads`` or ``--set n_threads`` may ask for."""
    return MAX_THREADS_PER_CORE * (os.cpu_count() or 1)


def too_many_threads() -> str:
    """Why a thread count above :func:`max_threads` is refused, for an error message."""
    return f"more than {max_threads()} threads ({MAX_THREADS_PER_CORE} per core) is refused"


def command_threads(args):
    """A context in which a command computes with ``--threads`` threads, or with fewer than one per
    core when other processes keep the cores busy (:func:`bayesmlc.threads.choose_threads`, kept in
    ``args.thread_choice`` for :func:`thread_note`); commands without ``--threads`` get a context that
    changes nothing."""
    if not getattr(args, "choose_threads", False):
        return contextlib.nullcontext()
    from ..threads import choose_threads, use_threads

    args.thread_choice = choose_threads(args.threads)
    return use_threads(args.thread_choice.threads)


def thread_note(args) -> str:
    """``"; 1 thread: ..."`` for a progress line when the command backed off under load, else ``""``."""
    choice = getattr(args, "thread_choice", None)
    if choice is None or choice.reason != "busy":
        return ""
    return (f"; {choice.threads} thread{'s' if choice.threads > 1 else ''}: other processes keep {choice.load:.1f} "
            f"of {choice.cores} cores busy (--threads N to choose)")
