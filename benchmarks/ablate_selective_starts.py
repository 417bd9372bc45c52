"""Selective top-1 by Learn then Test: how the fixed-sequence starts change feasibility and coverage.

A known, calibrated model (20 labels; probabilities from a logistic of Gaussian label and row effects,
labels drawn from them) gives ``--trials`` calibration sets of ``--rows`` rows; each is calibrated for
accuracy >= 0.9 of the answered rows (alpha 0.1, delta 0.1) by fixed-sequence testing with 1, 10 and
25 starts and by Bonferroni-Holm over the grid 0, 0.01, ..., 0.99. The true error and coverage of each
threshold are measured on 100,000 rows of the same model. Prints a table.

    PYTHONPATH=$PWD python benchmarks/ablate_selective_starts.py [--rows 300 2000] [--trials 40]
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy.sparse as sp

from bayesmlc.risk_control import calibrate_threshold, candidates_from_topk
from bayesmlc.risk_control.procedures import selective_risk_curve

N_LABELS = 20
VARIANTS = (("fixed sequence, 1 start", {"n_starts": 1}), ("fixed sequence, 10 starts", {"n_starts": 10}),
            ("fixed sequence, 25 starts", {"n_starts": 25}), ("Bonferroni-Holm", {"fwer": "holm"}))


def draw(n: int, seed: int):
    rng = np.random.default_rng(seed)
    proba = 1 / (1 + np.exp(-(rng.normal(-2.0, 1.8, size=(n, N_LABELS)) + rng.normal(0, 1.0, size=(n, 1)))))
    Y = sp.csr_matrix((rng.random((n, N_LABELS)) < proba).astype(np.float32))
    return candidates_from_topk(np.tile(np.arange(N_LABELS), (n, 1)), proba, Y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[300, 2000])
    parser.add_argument("--trials", type=int, default=40)
    args = parser.parse_args()
    reference = draw(100_000, seed=999)
    print("| calibration rows | procedure | feasible | mean coverage (feasible) | violations of 0.1 |")
    print("|---|---|---|---|---|")
    for rows in args.rows:
        for name, options in VARIANTS:
            chosen = np.array([calibrate_threshold(draw(rows, trial), "selective", 0.1, 0.1, **options).threshold
                               for trial in range(args.trials)])
            feasible = np.isfinite(chosen)
            coverage, violations = "–", "–"
            if feasible.any():
                errors, answered = selective_risk_curve(reference, chosen[feasible])
                coverage = f"{np.mean(answered / reference.n_rows):.3f}"
                violations = f"{np.mean(errors / answered > 0.1):.3f}"
            print(f"| {rows} | {name} | {feasible.mean():.3f} | {coverage} | {violations} |", flush=True)


if __name__ == "__main__":
    main()
