"""How many CPU threads to compute with: fewer when other processes already keep the cores busy.

torch (and the BLAS under NumPy/SciPy) start one thread per core. On a machine whose cores are
already taken by other work, those threads compete with it and with each other: a fit then runs
several times slower than with one thread (docs/experiments.md, "Threads under a competing load").
:func:`choose_threads` picks a count from how busy the cores are now (:func:`current_load`: the idle
time of ``/proc/stat`` over a fraction of a second, less this process's own use), and
:func:`use_threads` applies it to torch and to the BLAS/OpenMP pools of the process inside a
``with`` block.

Every fit and prediction of a bayesmlc estimator runs inside :func:`compute_threads`: the model's
``n_threads`` when it has that parameter and it is set, else the count of an enclosing
:func:`use_threads` block, else the count :func:`choose_threads` picks then. The command line does the
same for every command that computes (``--threads N`` overrides). From Python::

    from bayesmlc import MLGPF
    from bayesmlc.threads import use_threads

    model = MLGPF().fit(X, Y)  # one thread per idle core, measured when fit starts
    with use_threads(1):       # one thread for everything in the block
        model = MLGPF().fit(X, Y)
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
import os
import sys
import threading
import time
from dataclasses import dataclass

from .exceptions import ValidationError

__all__ = ["ThreadChoice", "choose_threads", "compute_threads", "current_load", "decide_threads",
           "enclosing_threads", "cpu_times", "busy_cores_from_proc_stat", "sample_proc_stat", "load_average_busy",
           "usable_cores", "use_threads"]

#: environment variables through which a user (or ``bayesmlc bench --threads``) fixes the thread count
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: how long :func:`current_load` samples ``/proc/stat``, in seconds
SAMPLE_SECONDS = 0.15
#: how long a measurement of :func:`current_load` is reused, in seconds, so that many short fits and
#: predictions (a cross-validation loop) do not each pay for the sampling
MEASUREMENT_MAX_AGE_SECONDS = 5.0
#: the fields of a ``cpu`` line of ``/proc/stat`` that count time (user, nice, system, idle, iowait,
#: irq, softirq, steal; guest time is already inside user and nice), and those that are idle
_TIME_FIELDS = 8
_IDLE_FIELDS = (3, 4)

#: the thread count of the innermost :func:`use_threads` block of this context (None: outside any)
_ENCLOSING_THREADS: contextvars.ContextVar[int | None] = contextvars.ContextVar("bayesmlc_threads", default=None)


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
        return ThreadChoice(_checked_count(requested), "requested", load, cores)
    ceiling = max(1, min(int(max_threads), int(cores)))
    if load is None or not math.isfinite(load):
        return ThreadChoice(ceiling, "unknown load", load, cores)
    idle = math.floor(cores - max(load, 0.0) + 0.5)
    threads = max(1, min(ceiling, idle))
    return ThreadChoice(threads, "idle" if threads == ceiling else "busy", load, cores)


def _checked_count(threads) -> int:
    """``threads`` as an int when it is a positive integer, else a ValidationError."""
    if isinstance(threads, bool) or not isinstance(threads, numbers.Real) or int(threads) != threads or threads < 1:
        raise ValidationError(f"the thread count must be a positive integer, got {threads!r}")
    return int(threads)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the system reports it)."""
    return len(_usable_cpu_ids()) or max(1, os.cpu_count() or 1)


def _usable_cpu_ids() -> set[int]:
    """The CPU numbers this process may run on; empty where the system does not say (not Linux)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set()


# ---- how busy the cores are now ----------------------------------------------------------------------
def cpu_times(proc_stat_text: str, cpus=None) -> tuple[int, int, int] | None:
    """``(busy, total, n_cpus)`` clock ticks since boot from the text of ``/proc/stat``: summed over
    the ``cpuN`` lines of the CPU numbers in ``cpus`` when every one of them has a line, else from the
    aggregate ``cpu`` line (all CPUs: as many as it has ``cpuN`` lines, else ``os.cpu_count()``). Idle time is the idle and iowait fields; busy time the others
    (user, nice, system, irq, softirq, steal). ``None`` when the text has no usable ``cpu`` line."""
    per_cpu, aggregate = {}, None
    for line in proc_stat_text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu"):
            continue
        try:
            fields = [int(value) for value in rest.split()[:_TIME_FIELDS]]
        except ValueError:
            continue
        if len(fields) < 4:  # user, nice, system, idle: present since Linux 2.6
            continue
        if name == "cpu":
            aggregate = fields
        elif name[3:].isdigit():
            per_cpu[int(name[3:])] = fields
    if cpus and all(cpu in per_cpu for cpu in cpus):
        rows = [per_cpu[cpu] for cpu in cpus]
    elif aggregate is not None:
        rows = [aggregate]
        cpus = per_cpu if per_cpu else None
    else:
        return None
    total = sum(sum(fields) for fields in rows)
    idle = sum(fields[i] for fields in rows for i in _IDLE_FIELDS if i < len(fields))
    return total - idle, total, len(cpus) if cpus else (os.cpu_count() or 1)


def busy_cores_from_proc_stat(before: str, after: str, own_cpu_seconds: float, wall_seconds: float,
                              cpus=None) -> float | None:
    """How many cores other processes kept busy between two readings of ``/proc/stat`` taken
    ``wall_seconds`` apart (:func:`cpu_times` of each, over the CPUs in ``cpus``): the busy share
    of the clock ticks that passed times the number of CPUs, less ``own_cpu_seconds / wall_seconds``
    (what this process used meanwhile), at least 0. ``None`` when a reading is unusable or no tick
    passed."""
    first, second = cpu_times(before, cpus), cpu_times(after, cpus)
    if first is None or second is None or second[2] != first[2] or wall_seconds <= 0:
        return None
    busy, total = second[0] - first[0], second[1] - first[1]
    if total <= 0 or busy < 0:
        return None
    return max(0.0, second[2] * busy / total - own_cpu_seconds / wall_seconds)


def sample_proc_stat(proc_stat="/proc/stat", seconds: float = SAMPLE_SECONDS) -> float | None:
    """:func:`busy_cores_from_proc_stat` over ``seconds`` now, on the CPUs this process may use;
    ``None`` where ``proc_stat`` cannot be read (not Linux)."""
    try:
        with open(proc_stat) as handle:
            before = handle.read()
        wall, own = time.perf_counter(), time.process_time()
        time.sleep(seconds)
        with open(proc_stat) as handle:
            after = handle.read()
        own, wall = time.process_time() - own, time.perf_counter() - wall
    except OSError:
        return None
    return busy_cores_from_proc_stat(before, after, own, wall, sorted(_usable_cpu_ids()))


def load_average_busy(proc_loadavg="/proc/loadavg") -> float | None:
    """The fallback where ``/proc/stat`` is missing: the larger of the one-minute load average and,
    where Linux reports it (the fourth field of ``/proc/loadavg``, ``running/total``), the tasks
    runnable right now other than this one. ``None`` when the system reports neither."""
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


_measurement_lock = threading.Lock()
_last_measurement: tuple[float, float | None] | None = None  # (time.monotonic() when taken, load)


def current_load(max_age: float = MEASUREMENT_MAX_AGE_SECONDS) -> float | None:
    """How many cores other processes keep busy now: :func:`sample_proc_stat` (``/proc/stat`` over
    :data:`SAMPLE_SECONDS`, less this process's own use), else :func:`load_average_busy` where there
    is no ``/proc/stat``; ``None`` when the system reports neither. A measurement younger than
    ``max_age`` seconds is reused."""
    global _last_measurement
    with _measurement_lock:
        now = time.monotonic()
        if _last_measurement is not None and now - _last_measurement[0] < max_age:
            return _last_measurement[1]
        load = sample_proc_stat()
        if load is None:
            load = load_average_busy()
        _last_measurement = (time.monotonic(), load)
        return load


def _requested_by_environment() -> int | None:
    """The count set in ``OMP_NUM_THREADS`` (or MKL's, OpenBLAS's), when one is a positive integer."""
    for name in THREAD_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def choose_threads(requested: int | None = None) -> ThreadChoice:
    """:func:`decide_threads` for this process now: ``requested``, else a count set in
    ``OMP_NUM_THREADS`` (an explicit choice too), else one from :func:`current_load` and the cores
    (an explicit count is taken without measuring the load: ``load`` is then ``None``)."""
    import torch

    if requested is None:
        requested = _requested_by_environment()
    load = current_load() if requested is None else None
    return decide_threads(requested, load, usable_cores(), torch.get_num_threads())


_controller_lock = threading.Lock()
_controller = None  # (number of imported modules when made, threadpoolctl.ThreadpoolController)


def _thread_pools():
    """A ``threadpoolctl.ThreadpoolController`` of the native thread pools loaded in this process,
    made again only after new modules were imported (making one scans the loaded libraries, 2 ms,
    which a loop of small predictions would pay on every call)."""
    global _controller
    from threadpoolctl import ThreadpoolController

    with _controller_lock:
        if _controller is None or _controller[0] != len(sys.modules):
            _controller = (len(sys.modules), ThreadpoolController())
        return _controller[1]


@contextlib.contextmanager
def use_threads(threads: int | None = None):
    """Inside the ``with`` block, torch's intra-op pool and the BLAS/OpenMP pools of NumPy and SciPy
    use ``threads`` threads (``None``: the count :func:`choose_threads` picks now); the earlier
    counts come back after it. The fits and predictions of estimators without their own
    ``n_threads`` inside the block keep this count (:func:`compute_threads`)."""
    import torch

    if threads is None:
        threads = choose_threads().threads
    threads = _checked_count(threads)
    previous = torch.get_num_threads()
    token = _ENCLOSING_THREADS.set(threads)
    torch.set_num_threads(threads)
    try:
        with _thread_pools().limit(limits=threads):
            yield
    finally:
        torch.set_num_threads(previous)
        _ENCLOSING_THREADS.reset(token)


def enclosing_threads() -> int | None:
    """The thread count of the innermost :func:`use_threads` block around this call (the one every
    fit and prediction runs in), or ``None`` outside any."""
    return _ENCLOSING_THREADS.get()


@contextlib.contextmanager
def compute_threads(n_threads: int | None = None):
    """The threads of one fit or prediction: ``n_threads`` when given; else, inside a
    :func:`use_threads` block, that block's count (nothing changes); else the count
    :func:`choose_threads` picks now (one per idle core, or an ``OMP_NUM_THREADS`` count).
    ``MultiLabelEstimator`` runs its ``fit``, ``partial_fit`` and predictions inside it with the
    model's ``n_threads`` (``None`` for models without the parameter)."""
    enclosing = enclosing_threads()
    if n_threads is None and enclosing is not None or n_threads is not None and n_threads == enclosing:
        yield
        return
    with use_threads(choose_threads(n_threads).threads):
        yield
