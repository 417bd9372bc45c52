"""``cross_val_score`` of ``LogisticRegression`` on medical while busy loops keep the cores busy: the
default thread choice (one thread per idle core, :mod:`bayesmlc.threads`) against ``use_threads(1)``.

Usage (from the repository root)::

    PYTHONPATH=. python benchmarks/bench_threads_under_load.py
    PYTHONPATH=. python benchmarks/bench_threads_under_load.py --load 2 --repeats 3 --all-cores

The script starts ``--load`` processes that spin in a Python loop (default 2: both cores of a 2-core
machine), waits a second for them to run, then, ``--repeats`` times and alternately, runs a
``--folds``-fold ``bayesmlc.model_selection.cross_val_score`` of ``LogisticRegression()`` on the
training file of medical (333 rows, 1,449 features, 45 labels) with the default thread choice and
inside ``use_threads(1)``; ``--all-cores`` adds ``LogisticRegression(n_threads=<cores>)``, what a fit
did before it measured the load. It prints the median wall and CPU seconds (``time.process_time``:
this process, all its threads) of each variant, each wall time as a multiple of ``use_threads(1)``'s,
and the count the default chose; the load processes are stopped at the end, also after an error or
Ctrl-C. The folds' P@1 is printed too: it must not depend on the variant beyond float rounding.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: a process that keeps one core busy until it is killed
BUSY_LOOP = "while True:\n    pass\n"


def start_load(n_processes: int) -> list[subprocess.Popen]:
    """``n_processes`` busy loops, each a Python process spinning on one core."""
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(n_processes)]


def stop_load(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.kill()
    for process in processes:
        process.wait()


def timed_cross_validation(variant: str, X, Y, folds: int) -> dict:
    """One cross-validation of ``variant`` ("default", "use_threads(1)" or "all cores"): wall and CPU
    seconds and the mean P@1 over the folds."""
    from bayesmlc.linear import LogisticRegression
    from bayesmlc.model_selection import cross_val_score
    from bayesmlc.threads import use_threads

    model = LogisticRegression(n_threads=os.cpu_count() if variant == "all cores" else None)
    start, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LogisticRegression's ConvergenceWarning at max_iter, every fold
        if variant == "use_threads(1)":
            with use_threads(1):
                scores = cross_val_score(model, X, Y, cv=folds)
        else:
            scores = cross_val_score(model, X, Y, cv=folds)
    return {"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu, "p1": float(scores.mean())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default=str(REPO.parent / "shared" / "datasets"),
                        help="folder of the real data sets (default: ../shared/datasets)")
    parser.add_argument("--load", type=int, default=2, help="busy-loop processes to start (default 2)")
    parser.add_argument("--repeats", type=int, default=1, help="cross-validations per variant (default 1)")
    parser.add_argument("--folds", type=int, default=5, help="folds of each cross-validation (default 5)")
    parser.add_argument("--all-cores", action="store_true", help="also n_threads=<cores> (slow under load)")
    args = parser.parse_args(argv)

    from bayesmlc.data.io import read_dataset
    from bayesmlc.threads import choose_threads

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        if os.environ.get(name):  # an explicit count turns the choice off
            print(f"unset {name} to measure the default thread choice", file=sys.stderr)
            return 2
    train = read_dataset(Path(args.data_root) / "medical" / "train.txt")
    variants = ["default", "use_threads(1)"] + (["all cores"] if args.all_cores else [])
    results = {variant: [] for variant in variants}
    load = start_load(args.load)
    try:
        time.sleep(1.0)
        choice = choose_threads()
        for _ in range(args.repeats):
            for variant in variants:
                results[variant].append(timed_cross_validation(variant, train.X, train.Y, args.folds))
    finally:
        stop_load(load)
    print(f"medical, {args.folds}-fold cross_val_score of LogisticRegression(), {args.load} busy loops on "
          f"{os.cpu_count()} cores; the default chose {choice.threads} thread(s) ({choice.reason}: other processes "
          f"kept {choice.load if choice.load is None else round(choice.load, 2)} cores busy); medians of "
          f"{args.repeats} run(s)")
    reference = statistics.median(r["wall"] for r in results["use_threads(1)"])
    print(f"{'variant':<16} {'wall s':>8} {'CPU s':>8} {'wall ÷ use_threads(1)':>22} {'P@1':>7}")
    for variant in variants:
        wall = statistics.median(r["wall"] for r in results[variant])
        cpu = statistics.median(r["cpu"] for r in results[variant])
        p1 = statistics.median(r["p1"] for r in results[variant])
        print(f"{variant:<16} {wall:8.2f} {cpu:8.2f} {wall / reference:21.2f}x {p1:7.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
