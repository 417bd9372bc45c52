"""Calibration of predicted probabilities: the reliability curve and ECE over all pairs, and over the
top-k predictions (ECE@k, the ECE@k a calibrated model would show on the same test set, Brier@k), and
the top-1 risk-coverage curve and its area (AURC)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from ..exceptions import ValidationError
from ..utils import numpy_rng
from ._checks import (_block_rows, _check_dense, _check_k, _check_mask, _check_proba, _check_y_true, _entry_rows,
                      _kernel_array, _restrict)
from ._kernels import probability_bins
from .ranking import _hits, _ranked_indices, _topk

__all__ = [
    "ReliabilityCurve",
    "reliability_curve",
    "expected_calibration_error",
    "topk_reliability_curve",
    "ece_at_k",
    "ece_at_k_if_calibrated",
    "brier_at_k",
    "RiskCoverage",
    "risk_coverage_curve",
    "aurc",
    "calibration_curves",
]


class ReliabilityCurve(NamedTuple):
    """Per-bin calibration summary (arrays of length n_bins; empty bins hold NaN and count 0)."""

    bin_centers: np.ndarray
    mean_predicted: np.ndarray
    observed_frequency: np.ndarray
    counts: np.ndarray


def _bin_of(probabilities: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-width bin of each probability: [b/n, (b+1)/n), the last bin closed at 1."""
    return np.minimum((np.asarray(probabilities, dtype=np.float64) * n_bins).astype(np.int64), n_bins - 1)


def _check_n_bins(n_bins) -> int:
    if not isinstance(n_bins, (int, np.integer)) or isinstance(n_bins, bool) or n_bins < 1:
        raise ValidationError(f"n_bins must be a positive integer, got {n_bins!r}")
    return int(n_bins)


def _bin_sums(Y_true, proba, n_bins, label_mask):
    """(count, sum of predicted probability, number of positives) per bin over all evaluated pairs."""
    n_bins = _check_n_bins(n_bins)
    Y = _check_y_true(Y_true)
    mask = _check_mask(label_mask, Y.shape)
    counts = np.zeros(n_bins, dtype=np.int64)
    predicted = np.zeros(n_bins)
    if mask is None:  # one compiled pass, which also checks every probability
        proba = _check_dense(proba, Y.shape, "proba", check_finite=False)
        # float64 sums taken per block of _block_rows rows, each from zero, then added
        if probability_bins(_kernel_array(proba), n_bins, _block_rows(Y.shape[1]), counts, predicted) >= 0:
            _check_proba(proba, Y.shape)  # raises the error naming the values
    else:
        proba = _check_proba(proba, Y.shape)
        observed = proba[_entry_rows(mask), mask.indices]
        bins = _bin_of(observed, n_bins)
        counts += np.bincount(bins, minlength=n_bins)
        predicted += np.bincount(bins, weights=observed, minlength=n_bins)
    positives = _restrict(Y, mask)
    positives_bins = _bin_of(proba[_entry_rows(positives), positives.indices], n_bins)
    return counts, predicted, np.bincount(positives_bins, minlength=n_bins).astype(np.float64)


def _pair_bin_sums(probabilities: np.ndarray, relevant: np.ndarray, n_bins: int):
    """:func:`_bin_sums` for flattened (probability, is-relevant) pairs, 1-D arrays of equal length."""
    bins = _bin_of(probabilities, n_bins)
    counts = np.bincount(bins, minlength=n_bins).astype(np.int64)
    predicted = np.bincount(bins, weights=probabilities, minlength=n_bins)
    positives = np.bincount(bins, weights=relevant.astype(np.float64), minlength=n_bins)
    return counts, predicted, positives


def _curve(counts, predicted, positives, n_bins) -> "ReliabilityCurve":
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_predicted = np.where(counts > 0, predicted / counts, np.nan)
        observed = np.where(counts > 0, positives / counts, np.nan)
    centers = (np.arange(n_bins) + 0.5) / n_bins
    return ReliabilityCurve(centers, mean_predicted, observed, counts)


def reliability_curve(Y_true, proba, n_bins: int = 15, label_mask=None) -> ReliabilityCurve:
    """Reliability diagram data over all (instance, label) pairs, ``n_bins`` equal-width bins on [0, 1].

    Bin b holds the pairs with predicted probability in [b/n_bins, (b+1)/n_bins) (the last bin also
    holds 1). For each bin: its centre, the mean predicted probability, the observed frequency of the
    positive class, and the number of pairs.

    Parameters
    ----------
    Y_true : sparse or dense 0/1, shape (n, L)
    proba : dense array in [0, 1], shape (n, L), predicted probability that each label is on
    n_bins : int
    label_mask : optional 0/1, shape (n, L), 1 = observed; unobserved pairs are left out.
    """
    counts, predicted, positives = _bin_sums(Y_true, proba, n_bins, label_mask)
    return _curve(counts, predicted, positives, n_bins)


def expected_calibration_error(Y_true, proba, n_bins: int = 15, label_mask=None) -> float:
    """Expected calibration error, binary over *all* (instance, label) pairs (the all-pairs figure).

    With a few positives among many labels per row nearly every pair is a confident negative, so this
    figure is small for every reasonable model; :func:`ece_at_k` measures the predictions that matter.

    ``ECE = sum_b (n_b / N) |freq_b - conf_b|``, with equal-width bins as in :func:`reliability_curve`,
    ``conf_b`` the mean predicted probability of the *positive* class in bin b and ``freq_b`` the
    fraction of positives there (not the max-class confidence of multi-class ECE). N is the number of
    evaluated pairs (n L, or the observed ones under ``label_mask``).
    """
    return _ece_of_bins(*_bin_sums(Y_true, proba, n_bins, label_mask))


def _ece_of_bins(counts, predicted, positives) -> float:
    """ECE from per-bin (pairs, sum of probabilities, positives): n_b |freq_b - conf_b| = |positives_b
    - predicted_b|, summed and divided by the pairs."""
    return float(np.abs(positives - predicted).sum() / counts.sum())


# ---- calibration of the top-k predictions --------------------------------------------------------
def _topk_pairs(Y_true, proba, k: int, label_mask, scores=None):
    """The top-``k`` (probability, is-relevant) pairs of every row.

    ``proba`` is a dense (n, L) array in [0, 1] or a top-k pair ``(indices, probabilities)`` of shape
    (n, k') with k' >= min(k, L), best first. The top k are ranked by ``scores`` when given (dense
    (n, L) or a top-k pair, with a dense ``proba`` to read the probabilities from), else by ``proba``;
    ties go to the lower label index, as in :func:`topk`. Pairs that ``label_mask`` marks unobserved are
    dropped (their relevance is unknown).

    Returns
    -------
    probabilities : float64 (n, k'') with k'' = min(k, L)
    relevant : bool (n, k'')
    observed : bool (n, k''), or None without a mask
    """
    k = _check_k(k)
    Y = _check_y_true(Y_true)
    mask = _check_mask(label_mask, Y.shape)
    if scores is not None:
        if isinstance(proba, tuple):
            raise ValidationError("with scores to rank by, proba must be the dense (n, L) probabilities")
        dense = _check_proba(proba, Y.shape)
        indices = _ranked_indices(scores, k, Y.shape)
        values = np.take_along_axis(dense, indices, axis=1).astype(np.float64)
    elif isinstance(proba, tuple):
        indices = _ranked_indices(proba, k, Y.shape)
        values = np.asarray(proba[1])[:, : indices.shape[1]].astype(np.float64)
        if values.size and (values.min() < 0 or values.max() > 1):
            raise ValidationError(
                f"top-k probabilities must lie in [0, 1]; found values in [{values.min()}, {values.max()}]"
            )
    else:
        dense = _check_proba(proba, Y.shape)
        indices, values = _topk(dense, k)
        values = values.astype(np.float64)
    return _pairs_at(Y, mask, indices, values, k)


def _pairs_at(Y: sp.csr_matrix, mask, indices: np.ndarray, values: np.ndarray, k: int):
    """(values, relevant, observed) of the ranked ``indices`` (n, k'), cut to the first min(k, L)."""
    needed = min(k, Y.shape[1])
    indices, values = indices[:, :needed], values[:, :needed]
    relevant = _hits(Y, indices)
    observed = None
    if mask is not None:
        if not mask.has_sorted_indices:
            mask = mask.copy()
            mask.sort_indices()
        observed = _hits(mask, indices)
        if not observed.any():
            raise ValidationError(f"label_mask marks none of the top-{k} predictions as observed: nothing to evaluate")
    return values, relevant, observed


def _flat_pairs(values, relevant, observed):
    if observed is None:
        return values.ravel(), relevant.ravel()
    return values[observed], relevant[observed]


def topk_reliability_curve(Y_true, proba, k: int, n_bins: int = 15, label_mask=None, scores=None) -> ReliabilityCurve:
    """Reliability diagram data over the flattened top-``k`` (probability, is-relevant) pairs.

    Each row contributes its ``k`` best labels (by ``scores`` when given, else by ``proba``; ties to the
    lower label index); the n k pairs are binned as in :func:`reliability_curve`. Pairs unobserved
    under ``label_mask`` are left out. ``proba``: dense (n, L) in [0, 1], or a top-k pair ``(indices,
    probabilities)``, best first.
    """
    n_bins = _check_n_bins(n_bins)
    p, y = _flat_pairs(*_topk_pairs(Y_true, proba, k, label_mask, scores))
    return _curve(*_pair_bin_sums(p, y, n_bins), n_bins)


def ece_at_k(Y_true, proba, k: int, n_bins: int = 15, label_mask=None, scores=None) -> float:
    """ECE@k: binary L1 calibration error of the flattened top-``k`` (probability, is-relevant) pairs.

    ``ECE@k = sum_b (n_b / N) |freq_b - conf_b|`` over ``n_bins`` equal-width bins of [0, 1] (bin b
    holds p in [b/n_bins, (b+1)/n_bins), the last bin also p = 1), where the N = n min(k, L) pairs are
    each row's ``k`` most probable labels with their predicted probability and whether the label is
    relevant; conf_b is the mean probability and freq_b the fraction relevant in bin b. This is the
    definition of Ullah, Schultheis, Zhang and Babbar, "How Well Calibrated are Extreme Multi-label
    Classifiers?" (arXiv 2411.04276), with 15 bins. The top k are the labels ranked first by
    ``scores`` when given (the ranking P@k evaluates), else by ``proba`` (ties to the lower label
    index); pairs unobserved under ``label_mask`` are dropped from N.

    Parameters
    ----------
    Y_true : sparse or dense 0/1, shape (n, L)
    proba : dense (n, L) in [0, 1], or a top-k pair ``(indices, probabilities)`` (n, k'), best first
    k : int >= 1 (clipped to L)
    n_bins : int, 15 as in the paper
    label_mask : optional 0/1, shape (n, L), 1 = observed
    scores : optional dense (n, L) or top-k pair: rank by these instead of ``proba`` (then ``proba``
        must be dense)

    Returns
    -------
    float in [0, 1]
    """
    n_bins = _check_n_bins(n_bins)
    return _ece_of_pairs(*_flat_pairs(*_topk_pairs(Y_true, proba, k, label_mask, scores)), n_bins)


def ece_at_k_if_calibrated(proba, k: int, n_bins: int = 15, label_mask=None, scores=None, n_draws: int = 1000,
                           quantiles=(0.05, 0.5, 0.95), random_state=0) -> np.ndarray:
    """The ECE@k that a perfectly calibrated model with these top-``k`` probabilities would show on a
    test set of this size: quantiles of :func:`ece_at_k` over ``n_draws`` test sets in which every
    top-k pair is relevant with exactly its predicted probability (relevance ~ Bernoulli(p), drawn
    with ``random_state``).

    ECE@k is not 0 for a calibrated model: each bin's frequency is a sample mean, and on a small test
    set its noise alone gives a sizeable ECE (on emotions' 202 test rows about 0.04-0.10 at k = 1). A
    model whose ECE@k falls inside the returned range cannot be told from a calibrated one on this
    test set, nor two models whose ECE@k both do from each other.

    Parameters
    ----------
    proba : dense (n, L) in [0, 1], or a top-k pair ``(indices, probabilities)`` (n, k'), best first
    k, n_bins, label_mask, scores : as in :func:`ece_at_k` (the pairs are the same; unobserved ones are
        dropped)
    n_draws : int >= 1, simulated test sets
    quantiles : sequence of levels in [0, 1]
    random_state : int, Generator or None

    Returns
    -------
    ndarray of the ECE@k quantiles, one per level
    """
    n_bins = _check_n_bins(n_bins)
    if not isinstance(n_draws, (int, np.integer)) or isinstance(n_draws, bool) or n_draws < 1:
        raise ValidationError(f"n_draws must be a positive integer, got {n_draws!r}")
    levels = np.asarray(quantiles, dtype=np.float64)
    if levels.ndim != 1 or not np.all((levels >= 0) & (levels <= 1)):
        raise ValidationError(f"quantiles must be levels in [0, 1], got {quantiles!r}")
    if label_mask is not None:
        shape = np.shape(label_mask)
    elif isinstance(proba, tuple):  # the labels a top-k pair names (at least its width)
        indices = np.asarray(proba[0])
        shape = (indices.shape[0], max(int(indices.max(initial=-1)) + 1, indices.shape[1], 1))
    else:
        shape = np.shape(proba)
    p, _ = _flat_pairs(*_topk_pairs(sp.csr_matrix(shape), proba, k, label_mask, scores))  # relevance: drawn
    rng = numpy_rng(random_state)
    bins = _bin_of(p, n_bins)
    counts, predicted, _ = _pair_bin_sums(p, np.zeros(p.size, dtype=bool), n_bins)
    chunk = max(1, int(2**24 // max(p.size, 1)))  # draws per block of at most 2^24 uniforms
    values = []
    for start in range(0, n_draws, chunk):
        relevant = rng.random((min(chunk, n_draws - start), p.size)) < p
        values += [_ece_of_bins(counts, predicted, np.bincount(bins, weights=row, minlength=n_bins))
                   for row in relevant.astype(np.float64)]
    return np.quantile(values, levels)


def _ece_of_pairs(p: np.ndarray, y: np.ndarray, n_bins: int = 15) -> float:
    return _ece_of_bins(*_pair_bin_sums(p, y, n_bins))


def brier_at_k(Y_true, proba, k: int, label_mask=None, scores=None) -> float:
    """Brier score of the top-``k`` predictions: mean over the flattened top-k pairs of (p - y)^2.

    Pairs as in :func:`ece_at_k` (each row's ``k`` best labels; unobserved ones dropped). Unlike
    ECE@k it has no bins and rewards sharpness as well as calibration.
    """
    p, y = _flat_pairs(*_topk_pairs(Y_true, proba, k, label_mask, scores))
    return float(np.mean((p - y) ** 2))


class RiskCoverage(NamedTuple):
    """Selective prediction of the top-1 label: ``risk[m-1]`` is the error rate among the ``m`` most
    confident rows, kept at ``coverage[m-1] = m / n``; ``threshold[m-1]`` is the m-th highest top-1
    probability (arrays of length n, the number of rows evaluated)."""

    coverage: np.ndarray
    risk: np.ndarray
    threshold: np.ndarray


def risk_coverage_curve(Y_true, proba, label_mask=None, scores=None) -> RiskCoverage:
    """The risk-coverage curve of the top-1 label (Geifman and El-Yaniv 2017).

    The top-1 label of a row is its best by ``scores`` when given, else by ``proba``; its probability
    is the row's confidence. Rows are ordered by confidence, most confident first; the top-1 label of a row is
    an error when it is not a true label of the row (a row without true labels is always an error, so
    the risk at full coverage is ``1 - P@1`` when ranking by ``proba``). ``risk[m-1]`` is the error
    rate among the first m rows. Rows whose top-1 probabilities tie are interchangeable: the curve is
    the expectation over their orders, i.e. each row of a tie group counts the group's mean error.
    With ``label_mask``, rows whose top-1 pair is unobserved are left out.

    Parameters
    ----------
    Y_true : sparse or dense 0/1, shape (n, L)
    proba : dense (n, L) in [0, 1], or a top-k pair ``(indices, probabilities)``, best first

    Returns
    -------
    :class:`RiskCoverage` of arrays of length n (rows evaluated).
    """
    values, relevant, observed = _topk_pairs(Y_true, proba, 1, label_mask, scores)
    confidence, correct = values[:, 0], relevant[:, 0]
    if observed is not None:
        confidence, correct = confidence[observed[:, 0]], correct[observed[:, 0]]
    order = np.argsort(-confidence, kind="stable")
    confidence = confidence[order]
    errors = (~correct[order]).astype(np.float64)
    # tie groups: runs of equal confidence; every member gets the group's mean error
    starts = np.flatnonzero(np.r_[True, confidence[1:] != confidence[:-1]])
    group = np.cumsum(np.r_[True, confidence[1:] != confidence[:-1]]) - 1
    sizes = np.diff(np.r_[starts, confidence.size])
    errors = (np.add.reduceat(errors, starts) / sizes)[group]
    kept = np.arange(1, confidence.size + 1, dtype=np.float64)
    return RiskCoverage(kept / confidence.size, np.cumsum(errors) / kept, confidence)


def aurc(Y_true, proba, label_mask=None, scores=None) -> float:
    """Area under the top-1 risk-coverage curve: ``AURC = (1/n) sum_{m=1..n} risk(m/n)``.

    Lower is better; it mixes how often the top-1 label is wrong with how well confidence orders the
    errors. A predictor whose confidence carries no information (all rows tied) has AURC equal to its
    top-1 error rate; one whose confidence puts every error last reaches the minimum for that error
    rate. Arguments as for :func:`risk_coverage_curve`.
    """
    return float(np.mean(risk_coverage_curve(Y_true, proba, label_mask, scores).risk))


def _curve_json(curve: ReliabilityCurve) -> dict:
    return {key: [None if np.isnan(v) else float(v) for v in np.asarray(value, dtype=float)]
            for key, value in zip(("bin_centers", "mean_predicted", "observed", "counts"), curve)}


def calibration_curves(Y_true, proba, label_mask=None, ks=(1, 5), n_bins: int = 15, max_points: int = 200,
                       scores=None) -> dict:
    """The calibration plots' data as plain lists (JSON-ready), for a run's ``reliability.json``.

    Keys: ``bin_centers``, ``mean_predicted``, ``observed``, ``counts`` (all pairs, as
    :func:`reliability_curve`; NaN as None); ``"top{k}"`` for each k in ``ks``, the same four keys for
    :func:`topk_reliability_curve`; ``"risk_coverage"``: ``coverage`` and ``risk`` of
    :func:`risk_coverage_curve` at about ``max_points`` evenly spaced coverages (the last one 1).
    The top-k labels are ranked by ``scores`` when given, else by ``proba``.
    """
    out = _curve_json(reliability_curve(Y_true, proba, n_bins=n_bins, label_mask=label_mask))
    for k in ks:
        out[f"top{k}"] = _curve_json(topk_reliability_curve(Y_true, proba, k, n_bins, label_mask, scores))
    out["risk_coverage"] = _risk_coverage_json(risk_coverage_curve(Y_true, proba, label_mask, scores), max_points)
    return out


def _risk_coverage_json(curve: RiskCoverage, max_points: int) -> dict:
    """A risk-coverage curve as plain lists, thinned to at most ``max_points`` evenly spaced points."""
    n = curve.coverage.size
    keep = np.unique(np.linspace(0, n - 1, min(n, max_points)).round().astype(np.int64))
    return {"coverage": curve.coverage[keep].tolist(), "risk": curve.risk[keep].tolist()}
