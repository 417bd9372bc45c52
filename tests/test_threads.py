"""Thread back-off under load (bayesmlc.threads) against a hand-worked table, and the CLI's use of it."""

import contextvars
import os

import numpy as np
import pytest
import torch

from bayesmlc import threads
from bayesmlc.base import MultiLabelEstimator
from bayesmlc.exceptions import ValidationError
from bayesmlc.threads import decide_threads

# (requested, one-minute load, cores, torch's default threads) -> (threads, reason), worked by hand:
# idle cores = cores - load, rounded to the nearest whole core, then kept within [1, min(default, cores)]
TABLE = [
    (None, 0.0, 2, 2, 2, "idle"),      # nothing else runs: both cores
    (None, 0.4, 2, 2, 2, "idle"),      # 1.6 idle -> 2
    (None, 0.5, 2, 2, 2, "idle"),      # 1.5 idle -> 2 (halves round up)
    (None, 0.6, 2, 2, 1, "busy"),      # 1.4 idle -> 1
    (None, 1.0, 2, 2, 1, "busy"),      # one core taken
    (None, 1.6, 2, 2, 1, "busy"),      # 0.4 idle -> 0, but never fewer than 1
    (None, 7.9, 2, 2, 1, "busy"),      # overloaded
    (None, 3.2, 16, 16, 13, "busy"),   # 12.8 idle -> 13
    (None, 15.6, 16, 16, 1, "busy"),   # 0.4 idle -> 1
    (None, 2.0, 16, 8, 8, "idle"),     # 14 idle, but torch's default (physical cores) is 8
    (None, 0.0, 4, 8, 4, "idle"),      # a default above the usable cores (affinity) is cut to them
    (None, None, 4, 4, 4, "unknown load"),   # no load average (Windows): every usable thread
    (3, 7.9, 2, 2, 3, "requested"),    # an explicit count wins, even above the cores
    (1, 0.0, 16, 16, 1, "requested"),
]


@pytest.mark.parametrize("requested, load, cores, default, expected, reason", TABLE)
def test_thread_count_follows_the_hand_worked_table(requested, load, cores, default, expected, reason):
    choice = decide_threads(requested, load, cores, default)
    assert (choice.threads, choice.reason) == (expected, reason)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_a_requested_count_must_be_a_positive_integer(bad):
    with pytest.raises(ValidationError, match="positive integer"):
        decide_threads(bad, 0.0, 2, 2)


def test_the_load_average_fallback_is_the_larger_of_the_average_and_the_tasks_running_now(tmp_path, monkeypatch):
    proc = tmp_path / "loadavg"
    proc.write_text("0.50 0.60 0.70 4/512 12345\n")  # 4 runnable now, this process one of them
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.6, 0.7))
    assert threads.load_average_busy(proc) == 3.0  # a load that began seconds ago: the average lags
    proc.write_text("2.50 0.60 0.70 1/512 12345\n")
    monkeypatch.setattr(os, "getloadavg", lambda: (2.5, 0.6, 0.7))
    assert threads.load_average_busy(proc) == 2.5  # a load that just ended still counts for a minute
    assert threads.load_average_busy(tmp_path / "missing") == 2.5  # not Linux: the average alone

    def no_load():
        raise OSError("no load average")

    monkeypatch.setattr(os, "getloadavg", no_load)
    assert threads.load_average_busy(tmp_path / "missing") is None
    assert threads.load_average_busy(proc) == 0.0


# Two readings of /proc/stat 0.2 s apart on a two-CPU machine (USER_HZ = 100: 20 ticks per CPU).
# Fields: user nice system idle iowait irq softirq steal guest guest_nice.
STAT_BEFORE = """cpu  1000 0 500 8000 100 0 0 0 0 0
cpu0 500 0 250 4000 50 0 0 0 0 0
cpu1 500 0 250 4000 50 0 0 0 0 0
intr 12345 0 0
ctxt 999
"""
# cpu0: user +18, system +1, idle +1 -> 19 of 20 ticks busy; cpu1: user +10, idle +8, iowait +2 -> 10 of 20
STAT_AFTER = """cpu  1028 0 501 8009 102 0 0 0 0 0
cpu0 518 0 251 4001 50 0 0 0 0 0
cpu1 510 0 250 4008 52 0 0 0 0 0
intr 12400 0 0
ctxt 1010
"""


def test_cpu_times_sum_busy_and_idle_ticks_of_the_chosen_cpus():
    # busy = user + nice + system + irq + softirq + steal; idle = idle + iowait; guest fields are left out
    assert threads.cpu_times(STAT_BEFORE) == (1500, 9600, 2)  # the aggregate line, two CPUs
    assert threads.cpu_times(STAT_BEFORE, cpus=[1]) == (750, 4800, 1)  # the cpu1 line alone
    assert threads.cpu_times(STAT_BEFORE, cpus=[0, 1]) == (1500, 9600, 2)
    assert threads.cpu_times(STAT_BEFORE, cpus=[0, 5]) == (1500, 9600, 2)  # no cpu5 line: the aggregate
    stolen = "cpu  10 1 2 30 4 5 6 7 100 100\ncpu0 10 1 2 30 4 5 6 7 100 100\n"  # one CPU
    # steal (7) is busy; guest time (100, 100) is inside user and nice already
    assert threads.cpu_times(stolen) == (10 + 1 + 2 + 5 + 6 + 7, 10 + 1 + 2 + 30 + 4 + 5 + 6 + 7, 1)
    # an old kernel's four fields; no cpuN lines to count the CPUs: os.cpu_count()
    assert threads.cpu_times("cpu  1 2 3 4\n") == (6, 10, os.cpu_count())
    for unusable in ("", "intr 1 2 3\n", "cpu  a b c d\n", "cpu  1 2\n"):
        assert threads.cpu_times(unusable) is None


def test_busy_cores_between_two_readings_less_this_process(tmp_path):
    # 29 of 40 ticks busy on 2 CPUs: 1.45 cores; this process used 0.05 s of CPU in 0.2 s: 0.25 core
    assert threads.busy_cores_from_proc_stat(STAT_BEFORE, STAT_AFTER, 0.0, 0.2) == pytest.approx(1.45)
    assert threads.busy_cores_from_proc_stat(STAT_BEFORE, STAT_AFTER, 0.05, 0.2) == pytest.approx(1.2)
    # on cpu1 alone (affinity {1}): 10 of 20 ticks busy, 0.5 core, less this process's 0.25
    assert threads.busy_cores_from_proc_stat(STAT_BEFORE, STAT_AFTER, 0.05, 0.2, cpus=[1]) == pytest.approx(0.25)
    assert threads.busy_cores_from_proc_stat(STAT_BEFORE, STAT_AFTER, 1.0, 0.2) == 0.0  # never negative
    assert threads.busy_cores_from_proc_stat(STAT_BEFORE, STAT_BEFORE, 0.0, 0.2) is None  # no tick passed
    assert threads.busy_cores_from_proc_stat(STAT_BEFORE, "garbage", 0.0, 0.2) is None


def _sampled_from_files(tmp_path, monkeypatch, before: str, after: str, own_cpu: float, affinity):
    """:func:`threads.sample_proc_stat` on a file that holds ``before`` until the sampling sleeps and
    ``after`` from then on, with this process using ``own_cpu`` seconds of CPU in 0.2 s of wall time."""
    stat = tmp_path / "stat"
    stat.write_text(before)
    clock = {"wall": 100.0, "cpu": 7.0}

    def sleep(seconds):
        stat.write_text(after)
        clock["wall"] += 0.2
        clock["cpu"] += own_cpu

    monkeypatch.setattr(threads.time, "sleep", sleep)
    monkeypatch.setattr(threads.time, "perf_counter", lambda: clock["wall"])
    monkeypatch.setattr(threads.time, "process_time", lambda: clock["cpu"])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(affinity), raising=False)
    return threads.sample_proc_stat(stat)


@pytest.mark.parametrize("after, own_cpu, affinity, busy, expected", [
    (STAT_AFTER, 0.0, {0, 1}, 1.45, 1),    # 0.55 core idle -> 1 thread (at least one)
    (STAT_AFTER, 0.05, {0, 1}, 1.2, 1),    # 0.8 core idle -> 1
    (STAT_AFTER, 0.2, {0, 1}, 0.45, 2),    # this process kept one core busy itself: 1.55 idle -> 2
    (STAT_AFTER, 0.05, {1}, 0.25, 1),      # one usable CPU: always 1
    # both CPUs fully busy (40 of 40 ticks), none of it this process: 1 thread
    ("cpu  1040 0 500 8000 100 0 0 0 0 0\ncpu0 520 0 250 4000 50 0 0 0 0 0\ncpu1 520 0 250 4000 50 0 0 0 0 0\n",
     0.0, {0, 1}, 2.0, 1),
    # both CPUs idle (40 of 40 ticks idle): 2 threads
    ("cpu  1000 0 500 8038 102 0 0 0 0 0\ncpu0 500 0 250 4019 51 0 0 0 0 0\ncpu1 500 0 250 4019 51 0 0 0 0 0\n",
     0.0, {0, 1}, 0.0, 2),
])
def test_threads_chosen_from_two_proc_stat_snapshots(tmp_path, monkeypatch, after, own_cpu, affinity, busy, expected):
    load = _sampled_from_files(tmp_path, monkeypatch, STAT_BEFORE, after, own_cpu, affinity)
    assert load == pytest.approx(busy)
    assert threads.decide_threads(None, load, len(affinity), 2).threads == expected


def test_no_proc_stat_falls_back_to_the_load_average(tmp_path, monkeypatch):
    assert threads.sample_proc_stat(tmp_path / "missing", seconds=0.0) is None
    monkeypatch.setattr(threads, "_last_measurement", None)
    monkeypatch.setattr(threads, "sample_proc_stat", lambda: None)
    monkeypatch.setattr(threads, "load_average_busy", lambda: 1.75)
    assert threads.current_load() == 1.75


def test_a_measurement_is_reused_for_a_few_seconds(monkeypatch):
    samples = []
    clock = {"now": 50.0}
    monkeypatch.setattr(threads, "_last_measurement", None)
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(threads, "sample_proc_stat", lambda: samples.append(clock["now"]) or float(len(samples)))
    assert [threads.current_load() for _ in range(20)] == [1.0] * 20  # twenty calls, one sampling
    clock["now"] += threads.MEASUREMENT_MAX_AGE_SECONDS - 0.01
    assert threads.current_load() == 1.0
    clock["now"] += 0.02  # older than the limit: measured again
    assert threads.current_load() == 2.0
    assert threads.current_load(max_age=0.0) == 3.0
    assert len(samples) == 3


def test_choose_threads_reads_the_load_the_cores_and_the_environment(monkeypatch):
    for name in threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "current_load", lambda: os.getloadavg()[0])
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 0.5, 0.5))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert threads.choose_threads() == threads.ThreadChoice(1, "busy", 3.0, 4)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.2, 5.0, 5.0))
    assert threads.choose_threads().threads == 3
    # an explicit count is taken without measuring the load
    assert threads.choose_threads(requested=2) == threads.ThreadChoice(2, "requested", None, 4)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # set by the user or by `bayesmlc bench --threads`: kept
    assert threads.choose_threads() == threads.ThreadChoice(4, "requested", None, 4)
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # empty: not a choice
    assert threads.choose_threads().reason == "busy"
    monkeypatch.setattr(threads, "current_load", lambda: None)
    assert threads.choose_threads() == threads.ThreadChoice(4, "unknown load", None, 4)


def test_use_threads_sets_torch_and_the_blas_pools_inside_its_block():
    from threadpoolctl import threadpool_info

    torch_before = torch.get_num_threads()
    blas_before = [pool["num_threads"] for pool in threadpool_info()]
    with threads.use_threads(1):
        assert torch.get_num_threads() == 1
        assert all(pool["num_threads"] == 1 for pool in threadpool_info())
    assert torch.get_num_threads() == torch_before
    assert [pool["num_threads"] for pool in threadpool_info()] == blas_before


def test_use_threads_without_a_count_takes_the_chosen_one(monkeypatch):
    monkeypatch.setattr(threads, "choose_threads", lambda: threads.ThreadChoice(1, "busy", 5.0, 2))
    before = torch.get_num_threads()
    with threads.use_threads():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def _outside_any_block(function):
    """``function()`` in a fresh context, outside the ``use_threads`` block every test runs in
    (conftest.py), as a user's script runs."""
    return contextvars.Context().run(function)


def _busy_machine(monkeypatch, load: float = 2.0):
    """Two usable cores of which other processes keep ``load`` busy (torch's default: 2 threads)."""
    for name in threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "current_load", lambda: load)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    torch.set_num_threads(2)


def test_compute_threads_keeps_an_enclosing_count_and_an_explicit_one_wins(monkeypatch):
    _busy_machine(monkeypatch, load=1.0)  # one core idle: 1 thread

    def counts():
        seen = []
        with threads.compute_threads():  # no enclosing block: the chosen count
            seen.append(torch.get_num_threads())
        with threads.use_threads(2):
            with threads.compute_threads():  # the enclosing block's count
                seen.append(torch.get_num_threads())
            with threads.compute_threads(3):  # an explicit count wins
                seen.append(torch.get_num_threads())
            seen.append(torch.get_num_threads())
        seen.append(torch.get_num_threads())
        return seen

    assert _outside_any_block(counts) == [1, 2, 3, 2, 2]


class _ThreadRecorder(MultiLabelEstimator):
    """A toy estimator that records torch's and the BLAS pools' thread counts in each hook, with a
    ``partial_fit`` of its own (wrapped by the base class like its ``fit``)."""

    def __init__(self, n_threads=None):
        self.n_threads = n_threads

    def _fit(self, X, Y, label_mask):
        self.seen_ = [("fit", *_counts())]

    def partial_fit(self, X, Y):
        self.seen_.append(("partial_fit", *_counts()))
        return self

    def _decision_function(self, X):
        self.seen_.append(("predict", *_counts()))
        return np.zeros((X.shape[0], self.n_labels_), dtype=np.float32)


def _counts() -> tuple[int, int]:
    from threadpoolctl import threadpool_info

    return torch.get_num_threads(), max(pool["num_threads"] for pool in threadpool_info())


def test_estimators_fit_and_predict_with_one_thread_per_idle_core(monkeypatch):
    X, Y = np.eye(4), np.array([[1, 0], [0, 1], [1, 1], [0, 1]])

    def run(model):
        model.fit(X, Y).partial_fit(X, Y)
        model.predict(X)  # predict -> predict_proba -> decision_function: one choice, kept inside
        return model.seen_

    _busy_machine(monkeypatch, load=2.0)  # both cores busy: 1 thread for fit, partial_fit and predict
    assert _outside_any_block(lambda: run(_ThreadRecorder())) == [("fit", 1, 1), ("partial_fit", 1, 1),
                                                                  ("predict", 1, 1)]
    assert _outside_any_block(lambda: run(_ThreadRecorder(n_threads=2))) == [("fit", 2, 2), ("partial_fit", 2, 2),
                                                                             ("predict", 2, 2)]
    _busy_machine(monkeypatch, load=0.0)  # idle: both cores
    assert _outside_any_block(lambda: run(_ThreadRecorder()))[0] == ("fit", 2, 2)

    def inside_one_thread():
        with threads.use_threads(1):
            return run(_ThreadRecorder())

    assert _outside_any_block(inside_one_thread)[0] == ("fit", 1, 1)
    assert torch.get_num_threads() == 2  # restored after each call


def test_every_model_runs_its_own_computing_methods_in_compute_threads():
    from bayesmlc.base import COMPUTING_METHODS
    from bayesmlc.models import MODEL_CLASSES, get_model_class

    for key in MODEL_CLASSES:
        try:
            cls = get_model_class(key)
        except Exception:  # an optional package missing
            continue
        for name in COMPUTING_METHODS:  # the base class's own, or wrapped
            method = getattr(cls, name, None)
            if method is not None and method is not getattr(MultiLabelEstimator, name, None):
                assert getattr(method, "computes_with_threads", False), f"{cls.__name__}.{name}"


def test_a_cross_validation_loop_measures_the_load_once(monkeypatch):
    """Five fits and five scorings within the age a measurement is kept (the clock stands still
    here): one sampling of /proc/stat."""
    from bayesmlc.linear import LogisticRegression
    from bayesmlc.model_selection import cross_val_score

    for name in threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    samples = []
    monkeypatch.setattr(threads, "_last_measurement", None)
    monkeypatch.setattr(threads, "sample_proc_stat", lambda: samples.append(1) or 2.0)
    monkeypatch.setattr(threads.time, "monotonic", lambda: 1000.0)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 5))
    Y = (X[:, :2] + rng.normal(size=(60, 2)) > 0).astype(int)
    scores = _outside_any_block(lambda: cross_val_score(LogisticRegression(), X, Y, cv=5))
    assert scores.shape == (5,) and samples == [1]


def test_logistic_regression_takes_n_threads():
    from bayesmlc.linear import LogisticRegression

    with pytest.raises(ValidationError, match="n_threads"):
        LogisticRegression(n_threads=0).fit(np.eye(3), np.eye(3))


@pytest.mark.parametrize("name", ["bnmc", "bmls"])
def test_bnmc_and_bmls_fit_with_their_n_threads(name, monkeypatch):
    """``n_threads`` sets torch's pool inside ``fit`` (seen from the model's own ``_fit``), and a bad
    count is refused by name."""
    import torch

    from bayesmlc.bmls import BMLS
    from bayesmlc.bnmc import BNMC

    cls = {"bnmc": BNMC, "bmls": BMLS}[name]
    seen = []
    monkeypatch.setattr(cls, "_fit", lambda self, *args, **kwargs: seen.append(torch.get_num_threads()) or self)
    X, Y = np.eye(4), np.eye(4)
    for count in (1, 2):
        _outside_any_block(lambda: cls(n_threads=count).fit(X, Y))
    assert seen == [1, 2]
    with pytest.raises(ValidationError, match="n_threads"):
        cls(n_threads=0).fit(X, Y)
