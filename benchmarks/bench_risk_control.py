"""Risk control at the AmazonCat-13K shape: time and memory of the calibration step against rows x K.

Generates ``make_shape("amazoncat-13k", scale=0.1)`` (118,624 rows, 203,882 features, 13,330 labels;
seed 0), holds out 20% of the rows (23,725) as calibration rows, fits the kNN baseline on the rest
and predicts each calibration row's top K candidates once (the model's own cost, printed apart). Then,
for subsets of the calibration rows and K in (10, 100), it times the calibration step of
:mod:`bayesmlc.risk_control`: building the candidates (each candidate's truth looked up in the sparse
label matrix) and choosing the threshold by CRC (recall 0.9), RCPS (recall 0.9, Hoeffding-Bentkus),
LTT (precision 0.9) and LTT (selective 0.9), with the peak memory Python allocated on the way
(``tracemalloc``) and that peak per row x K. A step whose memory is O(rows x K) keeps the last
column flat as rows and K grow, with L = 13,330 labels in every row.

    PYTHONPATH=$PWD python benchmarks/bench_risk_control.py [--scale 0.1] [--rows 5000 10000 23725]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from bayesmlc.baselines import KNNBaseline
from bayesmlc.data.synthetic import make_shape, split
from bayesmlc.risk_control import calibrate_threshold, candidates_from_topk
from bayesmlc.risk_control.candidates import top_candidates

PROCEDURES = (("recall", "crc", {}), ("recall", "rcps", {"bound": "hb"}), ("precision", "ltt", {}),
              ("selective", "ltt", {}))


def calibration_step(labels, proba, Y):
    """Build the candidates and run every procedure: (seconds per part, peak bytes)."""
    tracemalloc.start()
    seconds = {}
    start = time.perf_counter()
    candidates = candidates_from_topk(labels, proba, Y)
    seconds["candidates"] = time.perf_counter() - start
    for risk, method, options in PROCEDURES:
        start = time.perf_counter()
        calibrate_threshold(candidates, risk, 0.1, 0.1, method, **options)
        seconds[f"{risk}/{method}"] = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return seconds, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--rows", type=int, nargs="+", default=[5000, 10000, 23725])
    args = parser.parse_args()
    start = time.perf_counter()
    data = make_shape("amazoncat-13k", scale=args.scale, random_state=0)
    train, held_out = split(data, 0.2, random_state=0)
    print(f"data: {data.n_samples} rows, {data.n_features} features, {data.n_labels} labels "
          f"(generated in {time.perf_counter() - start:.0f} s); {held_out.n_samples} calibration rows")
    start = time.perf_counter()
    model = KNNBaseline().fit(train.X, train.Y)
    fit_seconds = time.perf_counter() - start
    start = time.perf_counter()
    labels, proba = top_candidates(model, held_out.X, 100)
    print(f"kNN baseline: fit {fit_seconds:.1f} s, top-100 candidates of the calibration rows "
          f"{time.perf_counter() - start:.1f} s (the model's cost, not the calibration step's)\n")
    header = ["rows", "K", "candidates s"] + [f"{r}/{m} s" for r, m, _ in PROCEDURES] + ["step s", "peak MB",
                                                                                           "bytes / (row x K)"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for k in (10, 100):
        for rows in args.rows:
            rows = min(rows, held_out.n_samples)
            seconds, peak = calibration_step(labels[:rows, :k], proba[:rows, :k], held_out.Y[:rows])
            cells = [str(rows), str(k)] + [f"{value:.2f}" for value in seconds.values()]
            cells += [f"{sum(seconds.values()):.2f}", f"{peak / 2**20:.1f}", f"{peak / (rows * k):.0f}"]
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
