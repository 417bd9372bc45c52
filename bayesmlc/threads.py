"""How many CPU threads to compute with: fewer when other processes already keep the cores busy.

torch (and the BLAS under NumPy/SciPy) start one thread per core. On a machine whose cores are
already taken by other work, those threads compete with it and with each other: a fit then runs
several times slower than with one thread (docs/experiments.md, "Threads under a competing load").
:func:`choose_threads` picks a count from the load (:func:`current_load`), and :func:`use_threads` applies it to
torch and to the BLAS/OpenMP pools of the process inside a ``with`` block. The command line does both before every command
that computes (``--threads N`` overrides). From Python::

    from bayesmlc import MLGPF
    from bayesmlc.threads import use_threads

    with use_threads():        # the count choose_threads() picks; use_threads(2) for two
        model = MLGPF().fit(X, Y)
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass

from .exceptions import ValidationError

__all__ = ["ThreadChoice", "choose_threads", "current_load", "decide_threads", "usable_cores", "use_threads"]

#: environment variables through which a user (or ``bayesmlc bench``) fixes the thread count already
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True)
class ThreadChoice:
    """The count :func:`decide_threads` chose and why: ``reason`` is ``"requested"`` (an explicit
    count), ``"idle"`` (every usable thread), ``"busy"`` (fewer, because of the load) or
    ``"unknown load"`` (the system reports no load: every usable thread)."""

    threads: int
    reason: str
    load: float | None
    cores: int


def decide_threads(requested, load: float | None, cores: int, max_threads: int) -> ThreadChoice:
    """The thread count for a process that starts on ``cores`` usable cores of which other processes
    keep ``load`` busy (:func:`current_load`; ``None``: unknown).

    An explicit ``requested`` count wins. Otherwise the cores other processes leave idle,
    ``cores - load``, rounded to the nearest whole core, and at least 1, at most ``max_threads``
    (torch's default: one per physical core).
    """
    if requested is not None:
        if isinstance(requested, bool) or int(requested) != requested or requested < 1:
            raise ValidationError(f"the thread count must be a positive integer, got {requested!r}")
        return ThreadChoice(int(requested), "requested", load, cores)
    ceiling = max(1, min(int(max_threads), int(cores)))
    if load is None or not math.isfinite(load):
        return ThreadChoice(ceiling, "unknown load", load, cores)
    idle = math.floor(cores - max(load, 0.0) + 0.5)
    threads = max(1, min(ceiling, idle))
    return ThreadChoice(threads, "idle" if threads == ceiling else "busy", load, cores)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the system reports it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def current_load(proc_loadavg="/proc/loadavg") -> float | None:
    """How many cores other processes keep busy: the larger of the one-minute load average and, where
    Linux reports it (the fourth field of ``/proc/loadavg``, ``running/total``), the tasks runnable
    right now other than this one, so that a load that began seconds ago counts too. ``None`` when
    the system reports neither."""
    try:
        average = float(os.getloadavg()[0])
    except (AttributeError, OSError):  # Windows
        average = None
    try:
        with open(proc_loadavg) as handle:
            running = float(handle.read().split()[3].split("/")[0]) - 1.0
    except (OSError, IndexError, ValueError):  # not Linux
        running = None
    known = [value for value in (average, running) if value is not None]
    return max(known) if known else None


def _requested_by_environment() -> int | None:
    """The count set in ``OMP_NUM_THREADS`` (or MKL's, OpenBLAS's), when one is a positive integer."""
    for name in THREAD_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def choose_threads(requested: int | None = None) -> ThreadChoice:
    """:func:`decide_threads` for this process now: ``requested``, else a count set in
    ``OMP_NUM_THREADS`` (an explicit choice too), else one from :func:`current_load` and the cores."""
    import torch

    if requested is None:
        requested = _requested_by_environment()
    return decide_threads(requested, current_load(), usable_cores(), torch.get_num_threads())


@contextlib.contextmanager
def use_threads(threads: int | None = None):
    """Inside the ``with`` block, torch's intra-op pool and the BLAS/OpenMP pools of NumPy and SciPy
    use ``threads`` threads (``None``: the count :func:`choose_threads` picks now); the earlier
    counts come back after it."""
    import torch
    from threadpoolctl import threadpool_limits

    if threads is None:
        threads = choose_threads().threads

    previous = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        with threadpool_limits(limits=int(threads)):
            yield
    finally:
        torch.set_num_threads(previous)
