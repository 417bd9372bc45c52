"""Scoring a test set block by block: ``bayesmlc.metrics.StreamingEvaluation`` against ``evaluate`` on
dense arrays, and at the AmazonCat-13K test shape, where dense arrays do not fit.

Usage (from the repository root)::

    PYTHONPATH=. python benchmarks/bench_evaluation.py compare --rows 5000     # both ways, same figures
    PYTHONPATH=. python benchmarks/bench_evaluation.py stream --rows 237248    # the full test shape

The outputs are synthetic, drawn block by block with a fixed seed: ``--labels`` labels (13,330, the
AmazonCat-13K width), about 5.04 true labels per row (that set's mean), scores z = 4 y + N(0, 1) so
the ranking carries signal, probabilities sigmoid(z - 4), predictions p > 0.5. No model is trained:
what is timed is the metrics. ``compare`` builds the dense (rows, labels) arrays once and times
``evaluate`` on them and ``StreamingEvaluation`` over blocks of ``--block`` rows (default: the CLI's
2^26 scores per block), reporting seconds, the peak of traced Python allocations (``tracemalloc``:
numpy arrays included) and the largest difference between the two dicts of figures (the AUCs over
every row in both). ``stream`` never holds more than one block: seconds, peak traced memory, P@1,
ECE@1 and AURC over every row, and the AUCs over a seeded subset of 2^26 // labels rows, as the CLI
takes them. Prints one table with the 1-minute load average.
"""

from __future__ import annotations

import argparse
import os
import time
import tracemalloc

import numpy as np
import scipy.sparse as sp

from bayesmlc.metrics import StreamingEvaluation, evaluate

LIMIT = 1 << 26  # bayesmlc.evaluation.MAX_EVALUATION_ENTRIES


def block_outputs(rng, n_rows: int, n_labels: int, labels_per_row: float = 5.04):
    """(Y CSR, scores, proba, predictions CSR) of ``n_rows`` synthetic rows."""
    positives = rng.random((n_rows, n_labels), dtype=np.float32) < labels_per_row / n_labels
    scores = rng.standard_normal((n_rows, n_labels), dtype=np.float32)
    scores += 4.0 * positives
    proba = 1.0 / (1.0 + np.exp(4.0 - scores))
    return sp.csr_matrix(positives.astype(np.float32)), scores, proba, sp.csr_matrix(proba > 0.5)


def timed(function):
    tracemalloc.start()
    start = time.perf_counter()
    value = function()
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return value, seconds, peak / 2**20


def compare(args) -> list[tuple]:
    rng = np.random.default_rng(args.seed)
    Y, scores, proba, predicted = block_outputs(rng, args.rows, args.labels)
    dense, dense_s, dense_mb = timed(lambda: evaluate(Y, scores=scores, proba=proba, Y_pred=predicted))
    block = args.block or max(1, LIMIT // args.labels)

    def streamed():
        stream = StreamingEvaluation(args.labels)
        for begin in range(0, args.rows, block):
            rows = slice(begin, min(begin + block, args.rows))
            stream.add(Y[rows], scores=scores[rows], proba=proba[rows], Y_pred=predicted[rows])
        return stream.result()

    pooled, stream_s, stream_mb = timed(streamed)
    gap = max(abs(pooled[key] - dense[key]) for key in dense)
    return [("evaluate (dense)", args.rows, dense_s, dense_mb, dense["P@1"], dense["ECE@1"], dense["AURC"], "-"),
            (f"StreamingEvaluation ({block:,}-row blocks)", args.rows, stream_s, stream_mb, pooled["P@1"],
             pooled["ECE@1"], pooled["AURC"], f"{gap:.1e}")]


def stream(args) -> list[tuple]:
    rng = np.random.default_rng(args.seed)
    block = args.block or max(1, LIMIT // args.labels)
    auc_subset = np.sort(np.random.default_rng(0).choice(args.rows, min(args.rows, LIMIT // args.labels), replace=False))

    def run():
        evaluation = StreamingEvaluation(args.labels)
        for begin in range(0, args.rows, block):
            rows = np.arange(begin, min(begin + block, args.rows))
            Y, scores, proba, predicted = block_outputs(rng, rows.size, args.labels)
            evaluation.add(Y, scores=scores, proba=proba, Y_pred=predicted, auc_rows=np.isin(rows, auc_subset))
            del scores, proba
        return evaluation.result()

    pooled, seconds, peak = timed(run)
    return [(f"StreamingEvaluation ({block:,}-row blocks, AUCs on {auc_subset.size:,} rows)", args.rows, seconds, peak,
             pooled["P@1"], pooled["ECE@1"], pooled["AURC"], f"AUC_micro {pooled['AUC_micro']:.4f}")]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["compare", "stream"])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--labels", type=int, default=13330)
    parser.add_argument("--block", type=int, default=None, help="rows per block (default: 2^26 // labels)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = compare(args) if args.part == "compare" else stream(args)
    print(f"load average {os.getloadavg()[0]:.2f}; {args.labels:,} labels")
    print(f"{'method':58s} {'rows':>8s} {'seconds':>8s} {'peak MB':>8s} {'P@1':>7s} {'ECE@1':>7s} {'AURC':>7s}  note")
    for name, n, seconds, peak, p1, ece1, aurc_value, note in rows:
        print(f"{name:58s} {n:8,d} {seconds:8.1f} {peak:8.0f} {p1:7.4f} {ece1:7.4f} {aurc_value:7.4f}  {note}")


if __name__ == "__main__":
    main()
