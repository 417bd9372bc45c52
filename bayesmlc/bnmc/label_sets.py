"""BNMC's label-set rules: how many, and which, labels :meth:`BNMC.predict <bayesmlc.bnmc.BNMC.predict>`
gives a row (eq. 9 of Nguyen et al. and three deterministic alternatives), and their tuning on held-out
rows by example-based F1 and exact match (:mod:`bayesmlc.metrics.set_based`)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..metrics import exact_match, f1_example, labels_at_or_above, topk

__all__ = ["COUNT_RULES", "choose_count_rule", "choose_threshold", "rule_predictions", "threshold_rows", "top_counts"]

#: The rules of ``BNMC(count_rule=...)``; "auto" chooses among the first three.
COUNT_RULES = ("threshold", "count", "expected", "sample")
#: The thresholds :func:`choose_threshold` tries.
THRESHOLD_GRID = np.linspace(0.05, 0.95, 37)


def top_counts(scores: np.ndarray, counts: np.ndarray) -> sp.csr_matrix:
    """0/1 float32 CSR with the ``counts[i]`` (in [1, L]) highest ``scores`` of row i set, ties to the
    lower index (a stable sort of -scores): the first ``counts[i]`` of row i's :func:`~bayesmlc.metrics.topk`
    of max(counts) (one heap pass rather than a full sort)."""
    n, L = scores.shape
    m = int(counts.max()) if n else 0
    if m == 0:
        return sp.csr_matrix((n, L), dtype=np.float32)
    best = topk(scores, m)[0]
    kept = np.arange(m)[None, :] < np.asarray(counts)[:, None]
    rows = np.nonzero(kept)[0]
    return sp.csr_matrix((np.ones(rows.size, dtype=np.float32), (rows, best[kept])), shape=(n, L))


def threshold_rows(proba: np.ndarray, threshold: float) -> sp.csr_matrix:
    """0/1 float32 CSR: proba >= threshold, and the most probable label for rows that would otherwise
    be empty (the first, by index, of tied ones). A float32 ``proba`` is compared, exactly as its
    float64 values would be, against the smallest float32 >= ``threshold``."""
    bound = threshold
    if proba.dtype == np.float32:
        bound = np.float32(threshold)
        if float(bound) < threshold:  # (a Python float beside a float32 compares in float32)
            bound = np.nextafter(bound, np.float32(np.inf))
    return labels_at_or_above(proba, bound, fill_empty=True)


def rule_predictions(proba: np.ndarray, rule: str, threshold: float, count_mean: float, count_std: float,
                     rng) -> sp.csr_matrix:
    """0/1 float32 CSR (b, L) label sets from calibrated probabilities ``proba`` (b, L) by one of :data:`COUNT_RULES`:
    "threshold" (:func:`threshold_rows` at ``threshold``), "count" (the top round(sum_c p_c) labels),
    "expected" (the top round(``count_mean``) labels) or "sample" (eq. 9: T ~ round(N(``count_mean``,
    ``count_std``)), labels ~ Mult(nu, T) with nu the normalised probabilities (eq. 8), drawn from
    ``rng``). The counts of "count" and "expected" are clipped to [1, L]. Sums are taken in float64
    whatever ``proba``'s precision."""
    n_labels = proba.shape[1]
    if rule == "threshold":
        return threshold_rows(proba, threshold)
    if rule == "expected":
        counts = np.full(proba.shape[0], int(np.clip(round(count_mean), 1, n_labels)))
        return top_counts(proba, counts)
    proba = proba.astype(np.float64, copy=False)
    if rule == "count":
        counts = np.clip(np.rint(proba.sum(axis=1)), 1, n_labels).astype(int)
        return top_counts(proba, counts)
    nu = proba / proba.sum(axis=1, keepdims=True)
    pred = np.zeros(proba.shape, dtype=np.float32)
    draws = np.rint(rng.normal(count_mean, count_std, size=proba.shape[0]))
    for i, t in enumerate(np.clip(draws, 0, None).astype(int)):
        if t:
            pred[i, np.flatnonzero(rng.multinomial(t, nu[i]))] = 1.0
    return sp.csr_matrix(pred)


def _set_scorer(Y: np.ndarray, observed: np.ndarray):
    """The function label sets (n, L) 0/1 -> (example-based F1, exact match) against the labels ``Y`` on
    the ``observed`` entries (both (n, L)), by :func:`~bayesmlc.metrics.f1_example` and
    :func:`~bayesmlc.metrics.exact_match`. Their ``label_mask`` drops the unobserved entries from both
    matrices; here ``Y`` is restricted once and each set as it comes, and the metrics get sparse input
    (densely given label sets cost them a conversion per call: ten times the time in the threshold
    search on 2,000 x 2,000 entries)."""
    observed = np.asarray(observed) > 0
    every_entry = bool(observed.all())
    truth = sp.csr_matrix(Y * observed)

    def scores(pred: sp.csr_matrix) -> tuple[float, float]:
        sets = pred if every_entry else sp.csr_matrix(pred.multiply(observed))
        return f1_example(truth, sets), exact_match(truth, sets)

    return scores


def choose_threshold(proba: np.ndarray, Y: np.ndarray, observed: np.ndarray) -> float:
    """The threshold of :func:`threshold_rows` for held-out probabilities ``proba``, labels ``Y`` and
    ``observed`` entries (all (n, L)): among the :data:`THRESHOLD_GRID` values within 0.01 of the best
    example-based F1, the one with the best exact match (ties: the highest, the smallest label sets)."""
    scores = _set_scorer(Y, observed)
    f1, exact = np.zeros(THRESHOLD_GRID.size), np.zeros(THRESHOLD_GRID.size)
    for index, threshold in enumerate(THRESHOLD_GRID):
        f1[index], exact[index] = scores(threshold_rows(proba, threshold))
    near = np.flatnonzero(f1 >= f1.max() - 0.01)
    return float(THRESHOLD_GRID[near[np.lexsort((THRESHOLD_GRID[near], exact[near]))[-1]]])


def choose_count_rule(proba: np.ndarray, Y: np.ndarray, observed: np.ndarray, threshold: float,
                      count_mean: float) -> str:
    """``count_rule="auto"``: of the deterministic rules ("threshold" at ``threshold``, "count",
    "expected" with ``count_mean``), the one whose label sets for held-out ``proba`` have the best
    example-based F1 + exact match against ``Y`` on the ``observed`` entries (ties: the first)."""
    scores = _set_scorer(Y, observed)
    quality = {rule: sum(scores(rule_predictions(proba, rule, threshold, count_mean, 0.0, None)))
               for rule in ("threshold", "count", "expected")}
    return max(quality, key=quality.get)
