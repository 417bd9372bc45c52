"""BMLS's sweep schedules (docs/bmls.md, "Schedules"): how many sweeps a chain may run, when its burn-in
ends, which collected sweeps offer a draw to keep, and when collection stops.

* ``"fixed"``: the authors' demo protocol, ``n_burnin`` sweeps, then ``n_draws`` draws every ``thin``
  sweeps.
* ``"auto"``: burn-in ends at the end of a window of :data:`AUTO_WINDOW` sweeps whose mean
  log-likelihood (training and, with a validation split, held-out) gained less than ``plateau_tol``
  relative to the window before (or at half the sweeps); collection ends when the posterior-mean rates
  at the training positives moved by less than ``predictive_tol`` since the previous window (after at
  least three windows). Every collected sweep offers a draw to the bounded store of
  :class:`bayesmlc.bmls.chain.DrawStore`.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = [
    "AUTO_MIN_PREDICTIVE_DRAWS",
    "AUTO_WINDOW",
    "Schedule",
    "auto_sweeps",
    "draw_capacity",
    "window_gain",
]

AUTO_WINDOW = 20  # sweeps per window of the "auto" schedule's plateau and collection rules
AUTO_MAX_DRAWS = 400  # draws kept by the "auto" schedule, at most ...
AUTO_DRAW_BYTES = 128 * 2**20  # ... and at most this many bytes of them
# The "auto" schedule predicts with the mean over its kept draws when it kept at least this many, and
# from the posterior moments otherwise (a model too wide for that many draws in AUTO_DRAW_BYTES, or
# max_kept_draws set low). docs/experiments.md, "BMLS: the auto schedule's predictor on small sets".
AUTO_MIN_PREDICTIVE_DRAWS = 16
# max_sweeps="auto": as many sweeps as a budget of about one minute of one core buys, predicted from the
# data's shape (deterministic, so the same seed gives the same chain on any machine). Cost model of one
# sweep: seconds = K (SECONDS_PER_ENTRY nnz(X') + SECONDS_PER_FEATURE D' + SECONDS_PER_LABEL L +
# SECONDS_PER_POSITIVE nnz(Y)): the h step's passes over X' and its D' K gamma draws (fitted to one-thread
# CPU times on Bibtex, 0.033 s, and the AmazonCat-13K shape at 1%, 0.8 s), the phi step's L K gamma draws,
# and the latent counts, their allocation to topics and the rates at the positives (fitted to one-thread
# step times on delicious, EURLex-4K shapes and Bibtex; docs/experiments.md, "BMLS: topics on large label
# spaces"). docs/bmls.md, "Schedules".
AUTO_BUDGET_SECONDS = 60.0
SECONDS_PER_ENTRY = 7e-10
SECONDS_PER_FEATURE = 5.5e-8
SECONDS_PER_LABEL = 7e-10
SECONDS_PER_POSITIVE = 3e-9
AUTO_SWEEP_RANGE = (5 * AUTO_WINDOW, 2000)  # the fewest sweeps the rules can use, and the most


def window_gain(series) -> float:
    """Relative gain of the mean of the last AUTO_WINDOW values over the mean of the window before:
    (m_last - m_previous) / |m_last|; +inf until two windows exist."""
    values = np.asarray(series[-2 * AUTO_WINDOW:], dtype=np.float64)
    if values.size < 2 * AUTO_WINDOW:
        return np.inf
    previous, last = values[:AUTO_WINDOW].mean(), values[AUTO_WINDOW:].mean()
    return float((last - previous) / max(abs(last), np.finfo(float).tiny))


def auto_sweeps(max_sweeps, X_bias: sp.csr_matrix, n_topics: int, n_labels: int = 0, n_positives: int = 0,
                n_entries: int | None = None) -> int:
    """The ``"auto"`` schedule's most sweeps: ``max_sweeps``, or for ``"auto"`` the sweeps that
    AUTO_BUDGET_SECONDS buy by the cost model above on the training features ``X_bias`` (with the bias
    column), ``n_topics`` topics, ``n_labels`` labels and ``n_positives`` observed positive label entries,
    within AUTO_SWEEP_RANGE. ``n_entries``: nnz(X') when ``X_bias`` holds only some of the rows (one
    process of a data-parallel fit; the budget is that of the whole data)."""
    if max_sweeps != "auto":
        return int(max_sweeps)
    per_topic = (SECONDS_PER_ENTRY * (X_bias.nnz if n_entries is None else int(n_entries)) + SECONDS_PER_FEATURE * X_bias.shape[1]
                 + SECONDS_PER_LABEL * int(n_labels) + SECONDS_PER_POSITIVE * int(n_positives))
    low, high = AUTO_SWEEP_RANGE
    return int(np.clip(AUTO_BUDGET_SECONDS // max(n_topics * per_topic, 1e-12), low, high))


def draw_capacity(settings, n_labels: int, n_features_bias: int, n_topics: int) -> int:
    """Draws to keep, for the BMLS ``settings``: all ``n_draws`` with ``"fixed"``; with ``"auto"``,
    ``max_kept_draws`` or, for ``"auto"``, at most AUTO_MAX_DRAWS and at most AUTO_DRAW_BYTES of
    ``sample_dtype``."""
    if settings.schedule == "fixed":
        return int(settings.n_draws)
    if settings.max_kept_draws != "auto":
        return int(settings.max_kept_draws)
    per_draw = (n_labels + n_features_bias) * n_topics * np.dtype(settings.sample_dtype).itemsize
    return int(min(AUTO_MAX_DRAWS, AUTO_DRAW_BYTES // per_draw))


class Schedule:
    """One chain's schedule, ``"auto"`` or ``"fixed"`` (module docstring).

    Attributes
    ----------
    auto : bool; total : int, the most sweeps; burnin_end : int or None, the last burn-in sweep (None
    while an ``"auto"`` burn-in runs); trace : dict of lists, the ``"auto"`` rules at each window end
    (``"window_end"``, ``"burnin_gain"``, ``"heldout_gain"``, ``"predictive_change"``), as
    ``BMLS.schedule_trace_``; reduce : None, or in a data-parallel fit the strategy's sum over
    processes, through which the collection rule's mean over the training positives runs (set after
    construction).
    """

    def __init__(self, auto: bool, total: int, burnin_end: int | None, thin: int = 1, plateau_tol: float = 0.0,
                 predictive_tol: float = 0.0, validating: bool = False):
        self.auto, self.total, self.burnin_end, self.thin = auto, int(total), burnin_end, int(thin)
        self.plateau_tol, self.predictive_tol, self.validating = float(plateau_tol), float(predictive_tol), validating
        self.trace = {"window_end": [], "burnin_gain": [], "heldout_gain": [], "predictive_change": []}
        self._previous_rates = None
        self.reduce = None

    @classmethod
    def of(cls, settings, X_bias: sp.csr_matrix, n_topics: int, validating: bool, n_labels: int = 0,
           n_positives: int = 0, n_entries: int | None = None) -> "Schedule":
        """The schedule of the BMLS ``settings`` for training features ``X_bias``, ``n_topics`` topics,
        ``n_labels`` labels and ``n_positives`` observed positives (``n_entries``: nnz(X') of all rows,
        see :func:`auto_sweeps`); ``validating``: a held-out log-likelihood is recorded and must plateau too."""
        if settings.schedule == "auto":
            total = auto_sweeps(settings.max_sweeps, X_bias, n_topics, n_labels, n_positives, n_entries)
            return cls(True, total, None, 1, settings.plateau_tol, settings.predictive_tol, validating)
        n_burnin = int(settings.n_burnin)
        return cls(False, n_burnin + int(settings.n_draws) * int(settings.thin), n_burnin, int(settings.thin))

    def collects(self, sweep: int) -> bool:
        """Whether ``sweep`` (from 1) is after the burn-in: its state enters the posterior moments."""
        return self.burnin_end is not None and sweep > self.burnin_end

    def offers_draw(self, sweep: int) -> bool:
        """Whether the collected ``sweep`` offers its state as a draw to keep: every one with ``"auto"``
        (the store thins), every ``thin``-th with ``"fixed"``."""
        return self.auto or (sweep - self.burnin_end) % self.thin == 0

    def stops_after(self, sweep: int, history: dict, moments, data) -> bool:
        """The ``"auto"`` rules, applied at the end of every window of AUTO_WINDOW sweeps: ends the
        burn-in when ``history``'s ``"objective"`` (and, validating, ``"heldout"``) plateaus or half
        the sweeps are spent; during collection, True (stop) when the posterior-mean rates of
        ``moments`` at ``data``'s training positives moved by less than ``predictive_tol`` (mean
        absolute log) since the window before, after at least three windows of collection."""
        if not self.auto or sweep % AUTO_WINDOW:
            return False
        trace = self.trace
        trace["window_end"].append(sweep)
        if self.burnin_end is None:
            gain = window_gain(history["objective"])
            held_gain = window_gain(history["heldout"]) if self.validating else -np.inf
            trace["burnin_gain"].append(gain)
            trace["heldout_gain"].append(held_gain)
            trace["predictive_change"].append(np.nan)
            if (gain <= self.plateau_tol and held_gain <= self.plateau_tol) or sweep >= self.total // 2:
                self.burnin_end = sweep
            return False
        trace["burnin_gain"].append(np.nan)
        trace["heldout_gain"].append(np.nan)
        rates = moments.rates_at(data)
        previous, self._previous_rates = self._previous_rates, rates
        change = np.nan if previous is None else self._mean_absolute(np.log(rates / previous))
        trace["predictive_change"].append(change)
        return moments.count >= 3 * AUTO_WINDOW and change < self.predictive_tol

    def _mean_absolute(self, values: np.ndarray) -> float:
        """mean |values| over the training positives: of this process's in one process, of all
        processes' through ``reduce`` (their sum and count)."""
        if self.reduce is None:
            return float(np.mean(np.abs(values)))
        total, count = self.reduce(np.array([np.sum(np.abs(values)), values.size], dtype=np.float64))
        return float(total / max(count, 1.0))
