"""Per-label training counts and the smoothed label prior every model keeps.

A model fitted on labels ``Y`` (n, L) keeps, per label l, N_l: the positive entries, and O_l: the
observed entries (every row without a ``label_mask``, else the entries the mask marks; BNMC with
``unlabeled_rows="missing"`` counts only the rows that carry a label). From these two counts
comes the smoothed prior

    prior_l = (N_l + 1/2) / (O_l + 1),

the posterior mean of the label's positive rate under the Jeffreys prior Beta(1/2, 1/2) (the
Krichevsky-Trofimov estimator): strictly inside (0, 1), so that its logit is finite for a label
without a training positive (which is then predicted from it) and for one that is always on.

Counts add: the statistics of two ``partial_fit`` batches are the sum of theirs, and those of a
data-parallel fit the sum over its processes' rows (:meth:`LabelStatistics.summed`). A model keeps
them as the fitted attributes ``label_frequencies_`` (N), ``label_prior_`` and ``empty_labels_``
(:meth:`LabelStatistics.fitted_attributes`); :meth:`LabelStatistics.of_fitted` reads the counts
back from a fitted model (a loaded one included).
"""

from __future__ import annotations

import numpy as np

__all__ = ["LabelStatistics"]


class LabelStatistics:
    """The positive and the observed entries per label of some training rows (two (L,) int64 arrays).

    Parameters
    ----------
    positives : array-like of int, shape (L,), N_l
    observed : array-like of int, shape (L,), O_l (>= N_l)
    """

    __slots__ = ("positives", "observed")

    def __init__(self, positives, observed):
        self.positives = np.asarray(positives, dtype=np.int64)
        self.observed = np.asarray(observed, dtype=np.int64)
        if self.positives.ndim != 1 or self.positives.shape != self.observed.shape:
            raise ValueError(f"positives and observed must be two 1-D arrays of one length, got shapes "
                             f"{self.positives.shape} and {self.observed.shape}")

    @classmethod
    def of_labels(cls, Y, label_mask=None) -> LabelStatistics:
        """The counts of the CSR labels ``Y`` (n, L) whose stored entries are its positives; observed
        entries: every row when ``label_mask`` is None, else the stored entries of the CSR mask."""
        n, n_labels = Y.shape
        positives = np.bincount(Y.indices, minlength=n_labels)
        observed = np.full(n_labels, n) if label_mask is None else np.bincount(label_mask.indices, minlength=n_labels)
        return cls(positives, observed)

    @classmethod
    def zeros(cls, n_labels: int) -> LabelStatistics:
        """No rows seen: the start of a sum."""
        return cls(np.zeros(n_labels), np.zeros(n_labels))

    @classmethod
    def of_fitted(cls, estimator) -> LabelStatistics:
        """The counts a fitted model keeps: N = ``label_frequencies_`` and O recovered from
        ``label_prior_`` = (N + 1/2) / (O + 1) as O = round((N + 1/2) / prior - 1). The prior is
        stored in float64, whose relative error of 2^-53 moves (N + 1/2) / prior by less than 1/2
        for any O below 2^51, so O comes back exactly."""
        frequencies = np.asarray(estimator.label_frequencies_, dtype=np.int64)
        prior = np.asarray(estimator.label_prior_, dtype=np.float64)
        return cls(frequencies, np.rint((frequencies + 0.5) / prior - 1.0))

    def __add__(self, other: LabelStatistics) -> LabelStatistics:
        if not isinstance(other, LabelStatistics):
            return NotImplemented
        return LabelStatistics(self.positives + other.positives, self.observed + other.observed)

    def __eq__(self, other) -> bool:
        if not isinstance(other, LabelStatistics):
            return NotImplemented
        return np.array_equal(self.positives, other.positives) and np.array_equal(self.observed, other.observed)

    __hash__ = None

    def __repr__(self) -> str:
        return f"LabelStatistics(n_labels={self.n_labels}, rows={self.n_rows})"

    def summed(self, reduce_sum) -> LabelStatistics:
        """The counts over every process of a data-parallel fit: ``reduce_sum`` (a strategy's, see
        :mod:`bayesmlc.distributed`) of both arrays at once (one collective call)."""
        totals = np.asarray(reduce_sum(np.concatenate([self.positives, self.observed])))
        return LabelStatistics(totals[: self.n_labels], totals[self.n_labels:])

    @property
    def n_labels(self) -> int:
        return int(self.positives.shape[0])

    @property
    def n_rows(self) -> int:
        """The largest observed count: the number of rows whenever some label is observed in every
        row (always without a ``label_mask``); 0 when no label is observed."""
        return int(self.observed.max()) if self.observed.size else 0

    @property
    def prior(self) -> np.ndarray:
        """(N + 1/2) / (O + 1) per label, float64 (L,) (the module docstring)."""
        return (self.positives + 0.5) / (self.observed + 1.0)

    @property
    def empty_labels(self) -> np.ndarray:
        """The labels without a positive entry, ascending."""
        return np.flatnonzero(self.positives == 0)

    def fitted_attributes(self) -> dict:
        """The fitted attributes a model keeps of these counts: ``label_frequencies_`` (N),
        ``label_prior_`` and ``empty_labels_``."""
        return {"label_frequencies_": self.positives, "label_prior_": self.prior,
                "empty_labels_": self.empty_labels}
