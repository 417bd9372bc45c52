"""The calibration procedures: a threshold t on each row's top-K candidate probabilities with a
guarantee on a risk of the label set ``{candidates with probability >= t}``.

All of them see the calibration rows only as :class:`~bayesmlc.risk_control.candidates.Candidates`
(memory O(rows x K)); the risk curves are computed for every threshold at once from one sort of the
n K candidate probabilities.

**Exchangeability.** Every guarantee assumes that the calibration rows and the test row are
exchangeable (for instance i.i.d. from one distribution) and that the model was fitted on other
rows; the probability (or expectation) is over the draw of the calibration rows and the test row
together. Under a label mask the unobserved entries are assumed missing at random (their being
unobserved says nothing about their truth given the features), so that the observed part of a row is
exchangeable with a test row's observed part.

The risks (per row; averaged over rows)
----------------------------------------
``recall``
    The share of the row's true labels missing from its set, ``1 - |set ∩ true| / |true|``; a true
    label outside the row's K candidates is always missed, so with too small a K a target may be out
    of reach (``feasible`` False). A row without a true label misses nothing: loss 0. The loss lies in
    [0, B], B = 1, and does not increase as t falls.
``precision``
    The false discovery proportion of the set: its labels observed negative over its labels whose
    truth is observed; an empty set (or one with no observed label) has loss ``empty_set_loss``
    (default 0, the convention of the false discovery rate, Benjamini and Hochberg 1995; MAPIE's
    controller counts it as 1).
``selective``
    Top-1 with abstention: a row is answered when its top candidate's probability is >= t, and the
    risk is the error rate *among answered rows*, P(top label is wrong | answered), a conditional
    risk. Rows whose top label is unobserved under the mask are left out (their error is unknown).
    A row without any true label is answered wrongly when it is answered.

The procedures
--------------
:func:`crc` (recall)
    Conformal risk control, Angelopoulos, Bates, Fisch, Lei and Schuster, "Conformal Risk Control",
    ICLR 2024, Section 2: the most conservative threshold with ``(n / (n + 1)) R_hat(t) + B / (n +
    1) <= alpha`` (B = 1); their Theorem 1 gives E[risk of the test row] <= alpha.
:func:`rcps` (recall)
    Risk-controlling prediction sets, Bates, Angelopoulos, Lei, Malik and Jordan, "Distribution-Free,
    Risk-Controlling Prediction Sets", JACM 2021, Section 2: the largest t such that an upper
    confidence bound R_plus(t') of the risk is below alpha at every t' <= t; then P(risk(t_hat) <=
    alpha) >= 1 - delta (their Theorem 1). Bounds (Section 3 there): ``"hb"`` (default), the
    Hoeffding-Bentkus bound, tested as ``p_HB(R_hat(t'), alpha) < delta`` (:func:`hoeffding_bentkus_p_value`;
    R_plus < alpha exactly when that holds); ``"hoeffding"``, R_hat + sqrt(log(1/delta) / (2 n));
    ``"bernstein"``, the empirical Bernstein bound of Maurer and Pontil, R_hat + sigma_hat sqrt(2
    log(2/delta) / n) + 7 log(2/delta) / (3 (n - 1)). The Waudby-Smith-Ramdas bound is not offered:
    it is sequential in the rows, O(n) per threshold.
:func:`ltt` (precision, selective)
    Learn then Test, Angelopoulos, Bates, Candès, Jordan and Lei, "Learn then Test: Calibrating
    Predictive Algorithms to Achieve Risk Control", 2021: each threshold of a grid fixed in advance is
    a null hypothesis H_t: risk(t) > alpha, tested with the Hoeffding-Bentkus p-value of their
    Section 3 (:func:`hoeffding_bentkus_p_value`, ``binary`` for the 0/1 selective loss); the family-wise
    error rate is controlled at delta by **fixed-sequence testing** (their Section 4), the grid from
    the most conservative threshold to the most liberal, stopping at the first p-value above delta,
    or by Bonferroni-Holm (``fwer="holm"``, as MAPIE's controller does). ``n_starts`` > 1 runs
    that many fixed-sequence chains from equally spaced grid points, each at level delta /
    ``n_starts`` (Bonferroni over the chains; LTT's fixed-sequence testing with multiple starts;
    default :data:`DEFAULT_STARTS`). The chosen threshold is the most liberal rejected one; then
    P(risk(t_hat) <= alpha) >= 1 - delta. For the selective risk the p-value of H_t takes the n_t
    answered rows only: given n_t, their errors are Binomial(n_t,
    risk(t)), so it is valid for the conditional risk (LTT's selective classification example).
    A consequence: the most conservative grid points answer few rows and cannot be rejected, and
    fixed-sequence testing then stops there; more starts (``n_starts``) or ``fwer="holm"`` get past
    them, at the price of delta / ``n_starts`` or delta / (grid size) per test.

**Thresholds.** CRC and RCPS search every threshold (the step functions change only at candidate
probabilities, so the continuous search is exact); ``thresholds=`` restricts them to a grid. LTT
needs a grid fixed before the data: :data:`DEFAULT_GRID` (0, 0.01, ..., 0.99) by default. A label
is in the set when its probability is >= t; MAPIE's ``p > lambda`` is ``t = nextafter(lambda, 1)``.
When no threshold meets the target the result is the most liberal threshold (CRC, RCPS: every
candidate) or no label at all (LTT: ``threshold = inf``), with ``feasible`` False.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.stats import binom

from ..exceptions import ValidationError
from .candidates import Candidates

__all__ = ["RISKS", "METHODS", "RCPS_BOUNDS", "FWER_PROCEDURES", "DEFAULT_GRID", "DEFAULT_STARTS", "Calibration",
           "crc", "rcps", "ltt", "calibrate_threshold", "recall_risk_curve", "precision_risk_curve", "selective_risk_curve",
           "hoeffding_bentkus_p_value", "row_losses"]

#: the risks and the methods each can be controlled with (the first is the default)
METHODS = {"recall": ("crc", "rcps"), "precision": ("ltt",), "selective": ("ltt",)}
RISKS = tuple(METHODS)
RCPS_BOUNDS = ("hb", "hoeffding", "bernstein")
FWER_PROCEDURES = ("fixed_sequence", "holm")
#: LTT's fixed-sequence starts per risk when none is given: one for precision (its most conservative
#: thresholds leave most sets empty, a loss of 0, so the sequence does not stall there); 25 for
#: selective (a start every 0.04), since the few rows answered at its most conservative thresholds
#: cannot reject (docs/experiments.md, "Selective top-1: fixed-sequence starts")
DEFAULT_STARTS = {"precision": 1, "selective": 25}
#: LTT's grid when none is given: MAPIE's ``np.arange(0, 1, 0.01)``
DEFAULT_GRID = np.round(np.arange(0, 100) / 100.0, 2)


class Calibration(NamedTuple):
    """What a procedure chose."""

    #: labels with probability >= threshold are in the set (``inf``: no label)
    threshold: float
    #: whether the target was met (False: the most liberal or empty choice, no guarantee)
    feasible: bool
    #: the empirical risk of the calibration rows at ``threshold``
    empirical_risk: float
    #: calibration rows the risk was averaged over (selective: those answered at ``threshold``)
    n_rows: int


def _check_level(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not 0 < value < 1:
        raise ValidationError(f"{name} must be a number strictly between 0 and 1, got {value!r}")
    return float(value)


def _descending_thresholds(candidates: Candidates, thresholds) -> np.ndarray:
    """The thresholds to consider, most conservative (largest) first: the grid given, or every distinct
    candidate probability after ``inf`` (the empty set)."""
    if thresholds is None:
        values = np.unique(candidates.proba)[::-1]
        return np.concatenate([[np.inf], values])
    grid = np.asarray(thresholds, dtype=np.float64).ravel()
    if grid.size == 0 or np.any(np.isnan(grid)):
        raise ValidationError("thresholds must be a non-empty grid of numbers")
    return np.unique(grid)[::-1]


def _included_counts(sorted_descending: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """For each threshold t, how many of the values (sorted descending) are >= t."""
    return np.searchsorted(-sorted_descending, -thresholds, side="right")


# ---- risk curves: the empirical risk (and what the bounds need) at each threshold ---------------
def recall_risk_curve(candidates: Candidates, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, mean of squares)`` of the rows' recall losses at each threshold, O(n K log(n K)).

    A hit that is the j-th of its row's m true labels to enter the set (the row's hits enter best
    first) lowers the row's loss from 1 - (j - 1) / m to 1 - j / m; the curves are the cumulative
    sums of these steps over the hits sorted by probability."""
    n = candidates.n_rows
    labelled = candidates.n_true > 0
    rank = np.cumsum(candidates.hit, axis=1)  # the j of each hit within its row (rows are best first)
    rows, columns = np.nonzero(candidates.hit)
    m = candidates.n_true[rows].astype(np.float64)
    j = rank[rows, columns].astype(np.float64)
    before, after = 1.0 - (j - 1.0) / m, 1.0 - j / m
    order = np.argsort(-candidates.proba[rows, columns], kind="stable")
    values = candidates.proba[rows, columns][order]
    first = np.concatenate([[0.0], np.cumsum((before - after)[order])])
    second = np.concatenate([[0.0], np.cumsum((before ** 2 - after ** 2)[order])])
    count = _included_counts(values, thresholds)
    start = np.count_nonzero(labelled) / n  # every labelled row misses everything at the empty set
    return start - first[count] / n, start - second[count] / n


def precision_risk_curve(candidates: Candidates, thresholds: np.ndarray,
                         empty_set_loss: float = 0.0) -> np.ndarray:
    """The mean false discovery proportion of the rows' sets at each threshold (rows with no observed
    label in the set: ``empty_set_loss``). O(n K + G n) time for G thresholds, O(n K) memory: a
    row's set at t is a prefix of its candidates, so its counts are prefix sums looked up per row."""
    observed_before = np.concatenate([np.zeros((candidates.n_rows, 1)), np.cumsum(candidates.observed, axis=1)], axis=1)
    hits_before = np.concatenate([np.zeros((candidates.n_rows, 1)), np.cumsum(candidates.hit, axis=1)], axis=1)
    risks = np.empty(thresholds.size)
    for g, t in enumerate(thresholds):
        size = np.count_nonzero(candidates.proba >= t, axis=1)  # prefix length per row
        seen = np.take_along_axis(observed_before, size[:, None], axis=1)[:, 0]
        hits = np.take_along_axis(hits_before, size[:, None], axis=1)[:, 0]
        loss = np.where(seen > 0, 1.0 - hits / np.maximum(seen, 1), empty_set_loss)
        risks[g] = loss.mean() if loss.size else 0.0
    return risks


def selective_risk_curve(candidates: Candidates, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(errors, answered)`` at each threshold: among the rows whose top label's truth is observed,
    how many are answered (top probability >= t) and how many of those are wrong."""
    usable = candidates.observed[:, 0]
    top = candidates.proba[usable, 0]
    wrong = ~candidates.hit[usable, 0]
    order = np.argsort(-top, kind="stable")
    errors_before = np.concatenate([[0], np.cumsum(wrong[order])])
    answered = _included_counts(top[order], thresholds)
    return errors_before[answered].astype(np.float64), answered.astype(np.float64)


def row_losses(candidates: Candidates, risk: str, threshold: float, empty_set_loss: float = 0.0):
    """Per row, the loss at ``threshold`` and whether the row counts (selective: answered and its top
    label observed; the others: every row): ``(loss, counts)``, two (n,) arrays."""
    size = np.count_nonzero(candidates.proba >= threshold, axis=1)
    in_set = np.arange(candidates.proba.shape[1])[None, :] < size[:, None]
    if risk == "recall":
        hits = np.count_nonzero(candidates.hit & in_set, axis=1)
        loss = np.where(candidates.n_true > 0, 1.0 - hits / np.maximum(candidates.n_true, 1), 0.0)
        return loss, np.ones(loss.size, dtype=bool)
    if risk == "precision":
        seen = np.count_nonzero(candidates.observed & in_set, axis=1)
        hits = np.count_nonzero(candidates.hit & in_set, axis=1)
        loss = np.where(seen > 0, 1.0 - hits / np.maximum(seen, 1), empty_set_loss)
        return loss, np.ones(loss.size, dtype=bool)
    if risk == "selective":
        counts = (size > 0) & candidates.observed[:, 0] if candidates.proba.shape[1] else np.zeros(size.size, bool)
        loss = (~candidates.hit[:, 0]).astype(np.float64) if candidates.proba.shape[1] else np.zeros(size.size)
        return loss, counts
    raise ValidationError(f"risk must be one of {', '.join(RISKS)}, got {risk!r}")


# ---- p-values and bounds ----------------------------------------------------------------------
def _h1(r: np.ndarray, alpha: float) -> np.ndarray:
    """h1(r, alpha) = r log(r / alpha) + (1 - r) log((1 - r) / (1 - alpha)), with 0 log 0 = 0."""
    r = np.asarray(r, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        first = np.where(r > 0, r * np.log(r / alpha), 0.0)
        second = np.where(r < 1, (1 - r) * np.log((1 - r) / (1 - alpha)), 0.0)
    return first + second


def hoeffding_bentkus_p_value(r_hat, n, alpha: float, binary: bool = False) -> np.ndarray:
    """The Hoeffding-Bentkus p-value of H: risk > alpha from an empirical risk ``r_hat`` over ``n``
    rows with losses in [0, 1] (Bates et al. 2021, Section 3; LTT, Section 3):
    ``min(exp(-n h1(min(r_hat, alpha), alpha)), c P(Binomial(n, alpha) <= ceil(n r_hat)))`` with
    c = e, or c = 1 for 0/1 losses (``binary``). ``n`` may be an array (one count per threshold);
    n = 0 gives 1."""
    r_hat = np.asarray(r_hat, dtype=np.float64)
    n = np.broadcast_to(np.asarray(n, dtype=np.float64), r_hat.shape)
    hoeffding = np.exp(-n * _h1(np.minimum(r_hat, alpha), alpha))
    # the product n * r_hat of a count of errors is an integer up to rounding: do not round it up
    successes = np.ceil(np.round(n * r_hat, 9))
    bentkus = (1.0 if binary else np.e) * binom.cdf(successes, n, alpha)
    return np.where(n > 0, np.minimum(np.minimum(hoeffding, bentkus), 1.0), 1.0)


# ---- the procedures ---------------------------------------------------------------------------
def crc(candidates: Candidates, alpha: float, thresholds=None) -> Calibration:
    """Conformal risk control of the recall risk (module docstring): the largest threshold t with
    (n / (n + 1)) R_hat(t) + 1 / (n + 1) <= alpha (Angelopoulos et al. 2024, Section 2, B = 1)."""
    alpha = _check_level("alpha", alpha)
    n = candidates.n_rows
    if n == 0:
        raise ValidationError("conformal risk control needs at least one calibration row")
    grid = _descending_thresholds(candidates, thresholds)
    risk, _ = recall_risk_curve(candidates, grid)
    passes = n / (n + 1.0) * risk + 1.0 / (n + 1.0) <= alpha + 1e-12
    return _first_passing(grid, risk, passes, n)


def rcps(candidates: Candidates, alpha: float, delta: float, bound: str = "hb", thresholds=None) -> Calibration:
    """Risk-controlling prediction sets for the recall risk (module docstring): the largest t whose
    upper confidence bound, and that of every smaller threshold, is below alpha."""
    alpha, delta = _check_level("alpha", alpha), _check_level("delta", delta)
    if bound not in RCPS_BOUNDS:
        raise ValidationError(f"bound must be one of {', '.join(RCPS_BOUNDS)}, got {bound!r}")
    n = candidates.n_rows
    if n < 2:
        raise ValidationError("RCPS needs at least two calibration rows")
    grid = _descending_thresholds(candidates, thresholds)
    risk, square = recall_risk_curve(candidates, grid)
    if bound == "hb":
        passes = hoeffding_bentkus_p_value(risk, n, alpha) < delta
    elif bound == "hoeffding":
        passes = risk + np.sqrt(np.log(1.0 / delta) / (2.0 * n)) < alpha
    else:
        variance = np.maximum(square - risk ** 2, 0.0) * n / (n - 1.0)
        log_term = np.log(2.0 / delta)
        passes = risk + np.sqrt(2.0 * variance * log_term / n) + 7.0 * log_term / (3.0 * (n - 1.0)) < alpha
    # RCPS: every threshold below the chosen one must pass too, so the passing run that ends the grid
    suffix_passes = np.flip(np.logical_and.accumulate(np.flip(passes)))
    return _first_passing(grid, risk, suffix_passes, n)


def _first_passing(grid: np.ndarray, risk: np.ndarray, passes: np.ndarray, n: int) -> Calibration:
    """The most conservative passing threshold of a descending grid whose passing thresholds form
    its end (a monotone risk); the most liberal one, infeasible, when none passes."""
    passing = np.flatnonzero(passes)
    if passing.size == 0:
        return Calibration(float(grid[-1]), False, float(risk[-1]), n)
    first = passing[0]
    return Calibration(float(grid[first]), True, float(risk[first]), n)


def _fixed_sequence(p_values: np.ndarray, delta: float, n_starts: int = 1) -> np.ndarray:
    """Which hypotheses fixed-sequence testing rejects, in the given order: from each of ``n_starts``
    equally spaced starting points (the first is the first hypothesis) a chain rejects while its
    p-values are <= delta / n_starts and stops at the first that is not; the rejections of the chains
    are pooled (Bonferroni over the chains, so the family-wise error rate stays <= delta)."""
    size = p_values.size
    n_starts = max(1, min(int(n_starts), size))
    rejected = np.zeros(size, dtype=bool)
    for start in (i * (size // n_starts) for i in range(n_starts)):
        rejected[start:] |= np.logical_and.accumulate(p_values[start:] <= delta / n_starts)
    return rejected


def ltt(candidates: Candidates, risk: str, alpha: float, delta: float, thresholds=None, fwer: str = "fixed_sequence",
        empty_set_loss: float = 0.0, n_starts: int | None = None) -> Calibration:
    """Learn then Test for the ``precision`` or ``selective`` risk (module docstring): the most liberal
    grid threshold whose null hypothesis risk > alpha is rejected, the family-wise error rate
    controlled at ``delta`` by fixed-sequence testing (conservative to liberal) or Bonferroni-Holm."""
    alpha, delta = _check_level("alpha", alpha), _check_level("delta", delta)
    if fwer not in FWER_PROCEDURES:
        raise ValidationError(f"fwer must be one of {', '.join(FWER_PROCEDURES)}, got {fwer!r}")
    n_starts = DEFAULT_STARTS.get(risk, 1) if n_starts is None else n_starts
    grid = np.unique(np.asarray(DEFAULT_GRID if thresholds is None else thresholds, dtype=np.float64))[::-1]
    if grid.size == 0 or np.any(np.isnan(grid)):
        raise ValidationError("thresholds must be a non-empty grid of numbers")
    if risk == "precision":
        r_hat = precision_risk_curve(candidates, grid, empty_set_loss)
        counts = np.full(grid.size, float(candidates.n_rows))
        p_values = hoeffding_bentkus_p_value(r_hat, counts, alpha)
    elif risk == "selective":
        errors, counts = selective_risk_curve(candidates, grid)
        r_hat = np.where(counts > 0, errors / np.maximum(counts, 1), 0.0)
        p_values = hoeffding_bentkus_p_value(r_hat, counts, alpha, binary=True)
    else:
        raise ValidationError(f"Learn then Test controls the precision or selective risk, not {risk!r}")
    if fwer == "fixed_sequence":
        rejected = _fixed_sequence(p_values, delta, n_starts)
    else:  # Holm: the i-th smallest p-value (i = 0, 1, ...) against delta / (G - i), stopping at the first failure
        order = np.argsort(p_values, kind="stable")
        steps = p_values[order] <= delta / (grid.size - np.arange(grid.size))
        rejected = np.zeros(grid.size, dtype=bool)
        rejected[order[np.logical_and.accumulate(steps)]] = True
    chosen = np.flatnonzero(rejected)
    if chosen.size == 0:
        return Calibration(np.inf, False, 0.0, 0 if risk == "selective" else candidates.n_rows)
    last = chosen[-1]  # the grid is descending: the last rejected threshold is the most liberal
    return Calibration(float(grid[last]), True, float(r_hat[last]), int(counts[last]))


def calibrate_threshold(candidates: Candidates, risk: str, alpha: float, delta: float = 0.1, method: str | None = None,
                        bound: str = "hb", fwer: str = "fixed_sequence", thresholds=None,
                        empty_set_loss: float = 0.0, n_starts: int | None = None) -> Calibration:
    """The threshold of ``risk`` with ``method`` (None: the risk's default, :data:`METHODS`)."""
    if risk not in METHODS:
        raise ValidationError(f"risk must be one of {', '.join(RISKS)}, got {risk!r}")
    method = METHODS[risk][0] if method is None else method
    if method not in METHODS[risk]:
        raise ValidationError(f"method {method!r} does not control the {risk} risk; use {' or '.join(METHODS[risk])}")
    if method == "crc":
        return crc(candidates, alpha, thresholds)
    if method == "rcps":
        return rcps(candidates, alpha, delta, bound, thresholds)
    return ltt(candidates, risk, alpha, delta, thresholds, fwer, empty_set_loss, n_starts)
