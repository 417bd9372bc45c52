"""Thread back-off under load (bayesmlc.threads) against a hand-worked table, and the CLI's use of it."""

import os

import pytest
import torch

from bayesmlc import threads
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


def test_current_load_is_the_larger_of_the_average_and_the_tasks_running_now(tmp_path, monkeypatch):
    proc = tmp_path / "loadavg"
    proc.write_text("0.50 0.60 0.70 4/512 12345\n")  # 4 runnable now, this process one of them
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.6, 0.7))
    assert threads.current_load(proc) == 3.0  # a load that began seconds ago: the average lags
    proc.write_text("2.50 0.60 0.70 1/512 12345\n")
    monkeypatch.setattr(os, "getloadavg", lambda: (2.5, 0.6, 0.7))
    assert threads.current_load(proc) == 2.5  # a load that just ended still counts for a minute
    assert threads.current_load(tmp_path / "missing") == 2.5  # not Linux: the average alone

    def no_load():
        raise OSError("no load average")

    monkeypatch.setattr(os, "getloadavg", no_load)
    assert threads.current_load(tmp_path / "missing") is None
    assert threads.current_load(proc) == 0.0


def test_choose_threads_reads_the_load_the_cores_and_the_environment(monkeypatch):
    for name in threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "current_load", lambda: os.getloadavg()[0])
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 0.5, 0.5))  # the 1-minute figure counts
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert threads.choose_threads() == threads.ThreadChoice(1, "busy", 3.0, 4)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.2, 5.0, 5.0))
    assert threads.choose_threads().threads == 3
    assert threads.choose_threads(requested=2) == threads.ThreadChoice(2, "requested", 1.2, 4)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # set by the user or by `bayesmlc bench`: kept
    assert threads.choose_threads() == threads.ThreadChoice(4, "requested", 1.2, 4)
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
