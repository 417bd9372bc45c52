"""BNMC's rank calibration: the probability of a label given its evidence *and its rank in its row*.

The ranking logit z = a s_clf + b s_pattern + d of BNMC's two kinds of evidence (eq. 8, with fitted
weights) orders a row's labels; the calibrated probability adds to the logit z' = a' s_clf + b' s_pattern
+ d' terms for the leading label, the runner-up and the labels ranked 3 to 5 (:class:`RankTerms`,
fitted by :func:`fit_calibration`), and a beta calibration map for the leading label
(:func:`fit_top_label_map`). Everything here is a pure function of held-out evidence and labels;
the estimator (:class:`bayesmlc.bnmc.BNMC`) stores what these fits return.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.optimize import minimize

from ..metrics import topk
from ..utils import sigmoid, softplus

__all__ = [
    "NEXT_RANKS",
    "RANK_TERM_PRECISIONS",
    "TOP_LABEL_IDENTITY",
    "RankTerms",
    "apply_top_label_map",
    "bernoulli_log_likelihood",
    "calibrated_probability_logits",
    "fit_calibration",
    "fit_top_label_map",
    "rank_adjusted_logits",
    "top_positions",
]

#: The labels ranked 2 to 1 + NEXT_RANKS in a row (with the leading label, the top five that ECE@5
#: and most readers look at) get an offset and a slope of their own in the probability.
NEXT_RANKS = 4


class RankTerms(NamedTuple):
    """The terms of BNMC's calibrated probability that depend on a label's rank in its row
    (:func:`fit_calibration`). With z a label's ranking logit a s_clf + b s_pattern + d, z' its
    probability logit a' s_clf + b' s_pattern + d' and z_2 the row's runner-up's z, the leading label's
    probability is sigmoid(z' + r + c z + e z_2), the runner-up's sigmoid(z' + g_2 + h_2 z), that of the
    labels ranked 3 to 1 + :data:`NEXT_RANKS` sigmoid(z' + g + h z), the others' sigmoid(z')."""

    offset: float = 0.0  # r >= 0, also added to the leading label's ranking score
    slope: float = 0.0  # c
    runner_up: float = 0.0  # e: how the runner-up's strength moves the leading label's probability
    second_offset: float = 0.0  # g_2
    second_slope: float = 0.0  # h_2
    next_offset: float = 0.0  # g
    next_slope: float = 0.0  # h


def top_positions(z: np.ndarray, m: int) -> np.ndarray:
    """Column indices (n, m) of each row's ``m`` largest entries of the finite ``z`` (n, L), largest
    first, ties to the lower index (``argsort(-z, kind="stable")[:, :m]``, as ``argmax`` and the
    ranking metrics break them): one heap pass of :func:`bayesmlc.metrics.topk`."""
    if m == 1:
        return np.argmax(z, axis=1)[:, None]
    return topk(z, m)[0]


def rank_adjusted_logits(z: np.ndarray, terms: RankTerms, probability: bool = False, ranking=None,
                          top_map=None, top=None) -> np.ndarray:
    """``z`` (n, L) turned in place into the ranking score (each row's leading label + r) or, with
    ``probability``, the calibrated logits of :class:`RankTerms`, the ranks (and the runner-up) taken
    from ``ranking`` (n, L; default ``z``), the leading label's through ``top_map``
    (:func:`apply_top_label_map`; None: none). The probabilities are then capped: within a row's top 1 +
    :data:`NEXT_RANKS` each is at most that of the label ranked just above it, and every other label's
    at most the last of them. So ``predict_proba``'s top five are ``decision_function``'s, in its
    order (up to ties); below them, labels keep the order of their probability logits. ``top``: the
    ranking's :func:`top_positions` when already known (at least the columns this needs)."""
    ranking = z if ranking is None else ranking
    if not z.size or (ranking is z and top_map is None and not (any(terms) if probability else terms.offset)):
        return z
    m = min(1 + NEXT_RANKS, z.shape[1]) if probability else 1
    top = top_positions(ranking, m) if top is None else top[:, :m]
    values = np.take_along_axis(z, top, axis=1)
    if not probability:
        np.put_along_axis(z, top, values + terms.offset, axis=1)
        return z
    ranked = values if ranking is z else np.take_along_axis(ranking, top, axis=1)
    runner_up = ranked[:, 1] if m > 1 else np.zeros(z.shape[0])
    adjusted = values.copy()
    adjusted[:, 0] += terms.offset + terms.slope * ranked[:, 0] + terms.runner_up * runner_up
    if top_map is not None:
        adjusted[:, 0] = apply_top_label_map(adjusted[:, 0], top_map)
    adjusted[:, 1:2] += terms.second_offset + terms.second_slope * ranked[:, 1:2]
    adjusted[:, 2:] += terms.next_offset + terms.next_slope * ranked[:, 2:]
    adjusted = np.minimum.accumulate(adjusted, axis=1)
    np.minimum(z, adjusted[:, -1:], out=z)
    np.put_along_axis(z, top, adjusted, axis=1)
    return z


#: Precisions lambda of the N(0, 1/lambda) prior on the rank terms, chosen among by 5-fold
#: cross-validation over the validation rows (:func:`fit_calibration`).
RANK_TERM_PRECISIONS = (1.0, 10.0, 100.0, 1000.0)


def fit_calibration(s_clf: np.ndarray, s_pat: np.ndarray, Y: np.ndarray, observed: np.ndarray,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray, RankTerms]:
    """BNMC's calibration, fitted on the ``observed`` entries (boolean (n, L)) of the validation rows
    ``Y`` (n, L): the ranking logit z = a s_clf + b s_pattern + d, and the calibrated probability
    p(y_il = 1) = sigmoid(z'_il + rank terms), z' = a' s_clf + b' s_pattern + d', with the rank terms
    of :class:`RankTerms` and a N(0, 1/lambda) prior on them.

    (a, b, d) are the maximum-likelihood fit without rank terms over every observed entry; the ranks
    (and each row's runner-up) are those of z, in the fit as in predictions. (a', b', d') and the rank
    terms are then fitted together (maximum a posteriori, Newton's method) over the same entries. lambda
    is the one of :data:`RANK_TERM_PRECISIONS` with the best held-out log-likelihood, of the
    probabilities as :func:`rank_adjusted_logits` gives them, in a 5-fold cross-validation over the
    rows (folds drawn with ``seed``): the terms shrink on small validation splits. They model what
    independent per-label evidence misses: a row's labels compete, so how often a label is right
    depends on its rank in the row and, for the leading label, on how strong the runner-up is, not on
    its own evidence alone (docs/experiments.md, "Calibration: the leading label" and "Calibration: the
    runner-up and the next ranks"). r < 0 is refitted as r = 0, so that the ranking score z + r keeps
    every row's ranking. Above :data:`CALIBRATION_FULL_ENTRIES` observed entries the fits and the
    cross-validation's scores run on a weighted sample of the negatives (:func:`negative_sample_weights`).
    Returns (ranking theta (3,), probability theta (3,), :class:`RankTerms`).
    """
    weights = negative_sample_weights(Y, observed, seed)
    folds = np.random.default_rng(seed).permutation(s_clf.shape[0]) % 5
    scores = np.zeros(len(RANK_TERM_PRECISIONS))
    for fold in range(5):
        fit, held = folds != fold, folds == fold
        fits = _fit_rank_terms(s_clf[fit], s_pat[fit], Y[fit], observed[fit], RANK_TERM_PRECISIONS,
                               None if weights is None else weights[fit])
        for index, (theta, probability_theta, terms) in enumerate(fits):
            logits = calibrated_probability_logits(s_clf[held], s_pat[held], theta, probability_theta, terms)
            log_likelihood = bernoulli_log_likelihood(Y[held], logits)
            if weights is None:
                scores[index] += float(np.sum(log_likelihood[observed[held]]))
            else:
                scores[index] += float(np.sum(log_likelihood * weights[held]))
    return _fit_rank_terms(s_clf, s_pat, Y, observed, [RANK_TERM_PRECISIONS[int(np.argmax(scores))]], weights)[0]


#: Observed validation entries above which :func:`fit_calibration` fits on a weighted sample of the
#: negatives, and the negatives it then keeps (in expectation). On the EURLex-4K shape at a quarter of
#: its rows (2.5M entries) the full fit took 17 s of a 41 s BNMC fit (docs/experiments.md, "BNMC on
#: thousands of labels").
CALIBRATION_FULL_ENTRIES = 2**20
CALIBRATION_NEGATIVES = 2**19


def negative_sample_weights(Y: np.ndarray, observed: np.ndarray, seed: int = 0):
    """None when ``observed`` (boolean (n, L)) holds at most :data:`CALIBRATION_FULL_ENTRIES` entries;
    else the weights (n, L) of a sample of them: every observed positive of ``Y`` with weight 1, each
    observed negative kept with probability q = :data:`CALIBRATION_NEGATIVES` / negatives and weight
    1 / q (0 when left out; Horvitz-Thompson weights, so every weighted sum of log-likelihoods, and the
    gradients of the fits, are unbiased for the sums over all entries)."""
    if int(observed.sum()) <= CALIBRATION_FULL_ENTRIES:
        return None
    negatives = observed & (Y <= 0)
    rate = min(1.0, CALIBRATION_NEGATIVES / max(int(negatives.sum()), 1))
    kept = np.random.default_rng([seed, 1]).random(Y.shape) < rate
    return np.where(negatives, kept / rate, observed.astype(np.float64))


def calibrated_probability_logits(s_clf, s_pat, theta, probability_theta, terms: RankTerms,
                                   top_map=None) -> np.ndarray:
    """The logits of the calibrated probabilities (n, L): ranks taken from z = theta . (s_clf, s_pat,
    1), values from z' = probability_theta . (s_clf, s_pat, 1) plus the rank terms, the leading label's
    through ``top_map``, capped along the ranking of the top five (:func:`rank_adjusted_logits`)."""
    z = theta[0] * s_clf + theta[1] * s_pat + theta[2]
    z_prob = probability_theta[0] * s_clf + probability_theta[1] * s_pat + probability_theta[2]
    return rank_adjusted_logits(z_prob, terms, True, ranking=z, top_map=top_map)


def scores_and_probability_logits(s_clf, s_pat, theta, probability_theta, terms: RankTerms,
                                  top_map=None) -> tuple[np.ndarray, np.ndarray]:
    """The ranking scores (:func:`rank_adjusted_logits` of z = theta . (s_clf, s_pat, 1)) and
    :func:`calibrated_probability_logits`, equal to the two computed apart, from one z and one
    :func:`top_positions` of it."""
    z = theta[0] * s_clf + theta[1] * s_pat + theta[2]
    z_prob = probability_theta[0] * s_clf + probability_theta[1] * s_pat + probability_theta[2]
    top = top_positions(z, min(1 + NEXT_RANKS, z.shape[1])) if z.size else None
    probability = rank_adjusted_logits(z_prob, terms, True, ranking=z, top_map=top_map, top=top)
    return rank_adjusted_logits(z, terms, top=top), probability


#: :func:`fit_top_label_map`'s "no map": (alpha, beta, gamma) = (1, 1, 0).
TOP_LABEL_IDENTITY = np.array([1.0, 1.0, 0.0])
#: The leading labels a top-label map needs, and the z-score of its cross-validated log-likelihood gain
#: over the identity above which it is kept (docs/experiments.md, "Calibration: a beta map for the
#: leading label").
TOP_LABEL_MAP_MIN_ROWS = 100
TOP_LABEL_MAP_MIN_Z = 2.0


def apply_top_label_map(logits: np.ndarray, top_map) -> np.ndarray:
    """alpha log sigmoid(l) - beta log sigmoid(-l) + gamma for the leading labels' probability logits
    l: the beta calibration map of Kull, Silva Filho and Flach (AISTATS 2017) on p = sigmoid(l),
    logit p' = alpha log p - beta log(1 - p) + gamma; increasing in l for alpha, beta >= 0 (not both 0),
    the identity at (1, 1, 0)."""
    return _top_label_features(logits) @ np.asarray(top_map, dtype=np.float64)


def _top_label_features(logits: np.ndarray) -> np.ndarray:
    """(log sigmoid(l), -log sigmoid(-l), 1) for each logit l of ``logits`` (n,): the map of
    :func:`apply_top_label_map` is these (n, 3) features times (alpha, beta, gamma)."""
    logits = np.asarray(logits, dtype=np.float64)
    return np.stack([-softplus(-logits), softplus(logits), np.ones_like(logits)], axis=1)


def fit_top_label_map(logits: np.ndarray, y: np.ndarray, seed: int = 0) -> np.ndarray:
    """A beta calibration map (:func:`apply_top_label_map`) for the leading labels' probability logits
    ``logits`` (n,) with outcomes ``y`` (n,), kept only when a 5-fold cross-validation over them (folds
    drawn with ``seed``) gains held-out log-likelihood over the identity by more than
    :data:`TOP_LABEL_MAP_MIN_Z` standard errors of the per-row gains, and at least
    :data:`TOP_LABEL_MAP_MIN_ROWS` rows; else the identity. The map is fitted by maximum likelihood
    with alpha, beta >= 0 (L-BFGS-B) and a ridge of 1e-4 towards the identity. Returns (alpha, beta,
    gamma)."""
    logits, y = np.asarray(logits, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if logits.size < TOP_LABEL_MAP_MIN_ROWS or y.min() == y.max():
        return TOP_LABEL_IDENTITY.copy()
    features = _top_label_features(logits)

    def fit(rows):
        def objective(params):
            z = features[rows] @ params
            shift = params - TOP_LABEL_IDENTITY
            value = -float(np.sum(bernoulli_log_likelihood(y[rows], z))) + 1e-4 * float(shift @ shift)
            gradient = features[rows].T @ (sigmoid(z) - y[rows]) + 2e-4 * shift
            return value, gradient

        bounds = [(0.0, None), (0.0, None), (None, None)]
        return minimize(objective, TOP_LABEL_IDENTITY, jac=True, method="L-BFGS-B", bounds=bounds).x

    def log_likelihood(params, rows):
        return bernoulli_log_likelihood(y[rows], features[rows] @ params)

    folds = np.random.default_rng(seed).permutation(logits.size) % 5
    gains = np.zeros(logits.size)
    for fold in range(5):
        held = folds == fold
        gains[held] = log_likelihood(fit(~held), held) - log_likelihood(TOP_LABEL_IDENTITY, held)
    spread = gains.std() * np.sqrt(gains.size)
    if not spread > 0 or gains.sum() / spread <= TOP_LABEL_MAP_MIN_Z:
        return TOP_LABEL_IDENTITY.copy()
    return fit(np.ones(logits.size, dtype=bool))


def _base_features(s_clf, s_pat, entries) -> np.ndarray:
    """(s_clf, s_pattern, 1) of the ``entries`` (a boolean (n, L) mask, row-major, or (rows, columns)),
    (n_entries, 3)."""
    clf = s_clf[entries]
    return np.stack([clf, s_pat[entries], np.ones(clf.size)], axis=1)


def _ranked_entries(z: np.ndarray, observed: np.ndarray, sampled: np.ndarray) -> tuple:
    """The entries of :func:`_fit_rank_terms`'s two blocks, found from each row's top 1 + NEXT_RANKS
    positions of ``z`` (n, L) without (n, L) temporaries beyond one mask: ``rest`` (boolean (n, L)),
    the ``sampled`` entries outside every row's top ranks; ``top_entries`` (rows, columns), the
    ``observed`` entries among them, row by row in column order; and their rank columns (n_top, 7):
    lead, lead z, lead times the runner-up's z, second, second z, following, following z."""
    n, L = z.shape
    ranks = min(1 + NEXT_RANKS, L) if z.size else 0
    top = top_positions(z, ranks) if ranks else np.zeros((n, 0), dtype=np.int64)
    rows, columns, rank = np.repeat(np.arange(n), ranks), top.ravel(), np.tile(np.arange(ranks), n)
    order = np.lexsort((columns, rows))
    rows, columns, rank = rows[order], columns[order], rank[order]
    kept = observed[rows, columns]
    rows, columns, rank = rows[kept], columns[kept], rank[kept]
    values = z[rows, columns]
    lead, second, following = (rank == 0), (rank == 1), (rank >= 2)
    runner_up = z[rows, top[rows, 1]] * lead if ranks > 1 else np.zeros(rows.size)
    rank_columns = np.stack([lead, lead * values, runner_up, second, second * values, following, following * values],
                            axis=1).astype(np.float64)
    rest = sampled.copy()
    rest[np.arange(n)[:, None], top] = False
    return rest, (rows, columns), rank_columns


def _fit_rank_terms(s_clf, s_pat, Y, observed, precisions, weights=None) -> list:
    """:func:`fit_calibration`'s (ranking theta, probability theta, :class:`RankTerms`) for each prior
    precision of the rank terms in ``precisions``: one fit of the ranking (a, b, d) without them (it does
    not depend on the precision), then the joint fit of the probability's (a, b, d) and the rank terms
    per precision, each started from the one before (the objective is strictly concave, so the start
    changes only the number of Newton steps). ``weights`` (n, L) (:func:`negative_sample_weights`):
    the entries outside each row's top ranks count with their weight (0: left out); the top-ranked
    entries, which the rank terms are fitted on, all count once."""
    sampled = observed if weights is None else observed & (weights > 0)
    theta = _logistic_newton([(_base_features(s_clf, s_pat, sampled), Y[sampled], _BASE_COLUMNS,
                               None if weights is None else weights[sampled])], np.array([1.0, 1.0, 0.0]))
    z = theta[0] * s_clf + theta[1] * s_pat + theta[2]
    rest, top_entries, rank_columns = _ranked_entries(z, observed, sampled)
    # the rank terms touch only each row's top 1 + NEXT_RANKS entries: the other entries form a block
    # with the three base columns alone (the Newton steps then cost 3 columns per entry, not 10)
    blocks = [(_base_features(s_clf, s_pat, rest), Y[rest], _BASE_COLUMNS, None if weights is None else weights[rest]),
              (np.concatenate([_base_features(s_clf, s_pat, top_entries), rank_columns], axis=1), Y[top_entries],
               np.arange(3 + len(RankTerms._fields)), None)]
    start, fits = np.r_[theta, np.zeros(len(RankTerms._fields))], []
    for precision in precisions:
        ridge = np.r_[np.full(3, 1e-4), np.full(len(RankTerms._fields), 1e-4 + precision)]
        joint = _logistic_newton(blocks, start, ridge)
        start = joint
        if joint[3] < 0.0:  # refit with r = 0 (a prior of precision 1e12 on it), so the ranking score keeps
            pinned = ridge.copy()  # each row's ranking
            pinned[3] = 1e12
            joint = _logistic_newton(blocks, np.r_[joint[:3], 0.0, joint[4:]], pinned)
            joint[3] = 0.0
        fits.append((theta, joint[:3], RankTerms(*(float(v) for v in joint[3:]))))
    return fits


def bernoulli_log_likelihood(y: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """log Bernoulli(y | sigmoid(logits)) = y z - log(1 + e^z), elementwise."""
    return y * logits - softplus(logits)


#: Rows per block of the Hessian in :func:`_logistic_newton` (bounds its temporary array).
NEWTON_BLOCK_ROWS = 1 << 18
#: The (a, b, d) coefficients' positions in the calibration's parameter vector.
_BASE_COLUMNS = np.arange(3)


def _logistic_newton(blocks, theta: np.ndarray, ridge=1e-4) -> np.ndarray:
    """Maximise sum log Bernoulli(y | sigma(x @ theta)) - 1/2 sum_j ridge_j theta_j^2 by Newton's method
    with step halving (so the objective never decreases); ``ridge`` a number or one per coefficient.
    The entries come in ``blocks`` of (feats (n_b, k_b), target (n_b,), columns (k_b,), weights (n_b,)
    or None): an entry of a block has x = feats row on ``theta[columns]`` and zero elsewhere, and its
    log-likelihood counts ``weights`` times (None: once)."""

    def objective(t):
        total = 0.0
        for feats, target, columns, counts in blocks:
            log_likelihood = bernoulli_log_likelihood(target, feats @ t[columns])
            total += float(np.sum(log_likelihood if counts is None else log_likelihood * counts))
        return total - 0.5 * float(ridge * t @ t)

    current = objective(theta)
    for _ in range(50):
        grad = -ridge * theta
        hess = ridge * np.eye(theta.size)
        for feats, target, columns, counts in blocks:
            p = sigmoid(feats @ theta[columns])
            grad[columns] += feats.T @ (target - p if counts is None else counts * (target - p))
            weights = p * (1 - p) if counts is None else counts * p * (1 - p)
            part = np.zeros((columns.size, columns.size))
            for start in range(0, feats.shape[0], NEWTON_BLOCK_ROWS):
                rows = feats[start:start + NEWTON_BLOCK_ROWS]
                part += (rows * weights[start:start + NEWTON_BLOCK_ROWS, None]).T @ rows
            hess[np.ix_(columns, columns)] += part
        step = np.linalg.solve(hess, grad)
        scale = 1.0
        while scale > 1e-6:
            candidate = objective(theta + scale * step)
            if candidate >= current:
                break
            scale *= 0.5
        if scale <= 1e-6:
            break
        theta = theta + scale * step
        improvement, current = candidate - current, candidate
        if improvement < 1e-8 * max(1.0, abs(current)):
            break
    return theta
