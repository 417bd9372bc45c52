"""Probe: BNMC's low-rank classifiers plus a per-label sparse term on K support columns, fitted after them.

    python benchmarks/probe_bnmc_support.py SET [--features 128] [--precision 0.3 1 evidence]

On the validation split of SET's training rows (80% fitted, 20% scored; ``bench_mlgpf_linear.validation_split``),
a default BNMC is fitted; then, for every label l, weights v_l on the K columns S_l that
:func:`bayesmlc.feature_support.gradient_support` picks (the standardised logistic gradient at zero,
Tibshirani et al. 2012) are fitted with the BNMC classifier's posterior-mean margin m_il as a fixed offset:
the mode of sum_i log p(y_il | m_il + x_{i,S_l}^T v_l) - lambda / 2 |v_l|^2 by six Newton steps on the
rows where x_{i,S_l} is not zero (one backfitting pass; Hastie and Tibshirani 1990). ``--precision``
takes lambda as multiples of BNMC's ``weight_precision_``, "count:B:T" for B (1 + T / n_l) of it (n_l the
label's training positives: a prior that the first few positives do not overrule), or "evidence":
MacKay's fixed point per label,
lambda = gamma / |v|^2 with gamma = K - lambda tr(H^-1), four rounds from ``weight_precision_``
(MacKay 1992). Prints P@k / PSP@k of the classifier margins with and without the term, and of BNMC's
ranking score with the term added to the classifier evidence. A dense per-label loop in numpy: a probe
of the accuracy, not of the cost (docs/experiments.md, "BNMC on thousands of labels").
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_bnmc_scale import load_data  # noqa: E402
from bench_mlgpf_linear import DATA_ROOT, validation_split  # noqa: E402

from bayesmlc.bnmc import BNMC  # noqa: E402
from bayesmlc.feature_support import gradient_support  # noqa: E402
from bayesmlc.metrics import inverse_propensity, precision_at_k, psprecision_at_k  # noqa: E402


def support_weights(Z: sp.csc_matrix, y: np.ndarray, offset: np.ndarray, columns: np.ndarray, precision: float,
                    evidence: bool) -> tuple[np.ndarray, np.ndarray, float]:
    """(v, H^-1, lambda): the mode of the label's support weights given the margins ``offset`` (n,) and
    the inverse of the log posterior's negative Hessian there (the Laplace covariance)."""
    block = Z[:, columns].tocsr()
    rows = np.flatnonzero(np.diff(block.indptr))
    X, o, t = block[rows].toarray(), offset[rows], y[rows]
    v, lam = np.zeros(columns.size), precision
    for _ in range(4 if evidence else 1):
        for _ in range(6):
            p = 1.0 / (1.0 + np.exp(-(o + X @ v)))
            H = (X * (p * (1.0 - p))[:, None]).T @ X + lam * np.eye(columns.size)
            v = v + np.linalg.solve(H, X.T @ (t - p) - lam * v)
        if evidence:
            p = 1.0 / (1.0 + np.exp(-(o + X @ v)))
            H = (X * (p * (1.0 - p))[:, None]).T @ X + lam * np.eye(columns.size)
            gamma = columns.size - lam * np.trace(np.linalg.inv(H))
            lam = float(np.clip(gamma / max(v @ v, 1e-12), 1e-3 * precision, 1e3 * precision))
    p = 1.0 / (1.0 + np.exp(-(o + X @ v)))
    H = (X * (p * (1.0 - p))[:, None]).T @ X + lam * np.eye(columns.size)
    return v, np.linalg.inv(H), lam


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("set")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--precision", nargs="+", default=["0.3", "1", "evidence"])
    parser.add_argument("--data-root", default=str(DATA_ROOT))
    args = parser.parse_args()
    X, Y, _, _ = load_data(args.set, args.data_root)
    X, Y, Xv, Yv = validation_split(X, Y, 0)
    inv = inverse_propensity(Y)

    def report(tag, S):
        figures = [100 * precision_at_k(Yv, S, k) for k in (1, 3, 5)] + [100 * psprecision_at_k(Yv, S, k, inv) for k in (1, 5)]
        print(f"| {tag} | " + " | ".join(f"{v:.2f}" for v in figures) + " |", flush=True)

    start = time.time()
    model = BNMC(random_state=0).fit(X, Y)
    print(f"{args.set}: BNMC fit {time.time() - start:.1f} s, solver {model.solver_}, "
          f"basis {None if model.classifier_basis_ is None else model.classifier_basis_.shape[1]}")
    mean = model.classifier_samples_.mean(axis=0)
    Z, Zv = model._classifier_features(X), model._classifier_features(Xv)

    def margins(rows):
        return np.asarray(model._classifier_inputs(rows) @ mean[:-1] + mean[-1])

    M, Mv = margins(Z), margins(Zv)
    s_clf, s_pat = model._evidence(Zv, Xv)
    a, b, d = model.evidence_weights_
    print("| scores | P@1 | P@3 | P@5 | PSP@1 | PSP@5 |\n|---|---|---|---|---|---|")
    report("BNMC ranking score", model.decision_function(Xv))
    report("classifier margins", Mv)
    support = gradient_support(sp.csr_matrix(Z), sp.csr_matrix(Y), args.features)
    Zc, Zvc, Yc = sp.csc_matrix(Z), sp.csc_matrix(Zv), sp.csc_matrix(Y)
    for choice in args.precision:
        evidence = choice == "evidence"
        base_share, tau = (float(choice.split(":")[1]), float(choice.split(":")[2])) if choice.startswith("count:") else (
            1.0 if evidence else float(choice), 0.0)
        positives = np.diff(Yc.indptr)
        start, extra, spread, used = time.time(), np.zeros(Mv.shape), np.zeros(Mv.shape), []
        for label in range(Y.shape[1]):
            columns = support[label][support[label] >= 0]
            if columns.size:
                base = model.weight_precision_ * base_share * (1.0 + tau / max(positives[label], 1))
                v, cov, lam = support_weights(Zc, Yc[:, label].toarray().ravel(), M[:, label], columns, base, evidence)
                rows = Zvc[:, columns]
                extra[:, label] = rows @ v
                spread[:, label] = np.asarray((rows @ cov).__mul__(rows.toarray()).sum(axis=1)).ravel()
                used.append(lam)
        tag = f"lambda {choice} ({time.time() - start:.0f} s; median {np.median(used) / model.weight_precision_:.2f} x)"
        report(f"margins + support term, {tag}", Mv + extra)
        report(f"ranking score, the term in the classifier evidence, {tag}", a * (s_clf + extra) + b * s_pat + d)
        moderated = extra / np.sqrt(1.0 + np.pi * spread / 8.0)  # the term's mean shrunk by its Laplace variance
        report(f"ranking score, the moderated term in the evidence, {tag}", a * (s_clf + moderated) + b * s_pat + d)


if __name__ == "__main__":
    main()
