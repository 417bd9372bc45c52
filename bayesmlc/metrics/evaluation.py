"""Every metric the given inputs allow, at once (what ``bayesmlc train`` and ``evaluate`` report):
:func:`evaluate` for arrays in memory, :class:`StreamingEvaluation` for a test set scored block by block
of rows (the same figures, holding the top-k of each row instead of dense (rows, labels) arrays)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..exceptions import ValidationError
from ._checks import _check_dense, _check_k, _check_mask, _check_y_true
from .auc import _all_aucs
from .calibration import (
    _bin_sums, _curve, _curve_json, _ece_of_bins, _ece_of_pairs, _flat_pairs, _pair_bin_sums, _pairs_at,
    _risk_coverage_json, risk_coverage_curve,
)
from .ranking import (_check_weights, _dcg, _hits, _ideal_dcg, _precision, _psndcg, _psp, _ranked_indices, _safe_ratio,
                      _weight_order)
from .set_based import exact_match, f1_example, f1_macro, f1_micro, hamming_loss

__all__ = ["evaluate", "StreamingEvaluation"]

#: Ranks kept per row for the top-k calibration curves (``calibration_curves`` draws the top 1 and 5).
CURVE_RANKS = 5


def evaluate(
    Y_true,
    scores=None,
    proba=None,
    Y_pred=None,
    inv_propensity=None,
    ks=(1, 3, 5),
    label_mask=None,
) -> dict:
    """All metrics the given inputs allow, as a dict of Python floats (fractions, not percentages).

    Keys, in this order, when their inputs are given:

    * ``P@k``, ``nDCG@k`` for each k in ``ks``: need ``scores`` (dense or top-k tuple) or ``proba``
      (used for ranking when ``scores`` is None);
    * ``PSP@k``, ``PSnDCG@k`` (normalised): also need ``inv_propensity`` (array (L,), see
      :func:`inverse_propensity`);
    * ``AUC_micro``, ``AUC_macro``, ``AUC_instance``: need dense ``scores``, or ``proba`` when scores
      is None or a top-k tuple;
    * ``F1_example``, ``F1_micro``, ``F1_macro`` (zero_division=1), ``exact_match``,
      ``hamming_loss``: need ``Y_pred`` (sparse 0/1);
    * ``ECE`` (15 bins, all pairs), ``ECE@k`` and ``Brier@k`` for each k in ``ks`` (15 bins; the top-k
      labels of the ranking P@k uses, i.e. by ``scores`` when given, with their ``proba``), ``AURC``
      (top-1 risk-coverage area, same ranking): need ``proba``.

    ``label_mask`` (1 = observed) applies to AUC, F1, exact match, Hamming loss and the calibration
    figures; the ranking metrics rank all labels. An undefined AUC is NaN (with a warning).
    """
    Y = _check_y_true(Y_true)
    stream = StreamingEvaluation(Y.shape[1], ks=ks, inv_propensity=inv_propensity, curve_ranks=0)
    stream.add(Y, scores=scores, proba=proba, Y_pred=Y_pred, label_mask=label_mask)
    return stream.result()


class StreamingEvaluation:
    """:func:`evaluate`'s figures for a test set given block by block of rows.

    Each :meth:`add` takes the true labels of some rows and the model's outputs for them; the metrics
    of :meth:`result` are those of :func:`evaluate` on all the rows at once (tested to agree), while
    only O(rows x max(ks) + nnz) values are kept: each row's ranked top labels and their probabilities,
    the predicted label sets (sparse), the all-pairs calibration bins, and the dense scores of the rows
    chosen for the AUCs (``auc_rows`` of :meth:`add`; every row by default). This is how ``bayesmlc
    train --test`` and ``evaluate`` score test sets too large for dense (rows, labels) arrays.

    Parameters
    ----------
    n_labels : int, the label columns of every block.
    ks, inv_propensity : as for :func:`evaluate`.
    curve_ranks : int, ranks kept per row for :meth:`curves` (its top-k reliability curves need
        ``curve_ranks >= k``); 0 keeps only what the metrics need.

    Example
    -------
    >>> stream = StreamingEvaluation(Y.shape[1])                      # doctest: +SKIP
    >>> for rows in np.array_split(np.arange(Y.shape[0]), 10):        # doctest: +SKIP
    ...     X_rows = X[rows]
    ...     stream.add(Y[rows], scores=model.decision_function(X_rows),
    ...                proba=model.predict_proba(X_rows), Y_pred=model.predict(X_rows))
    >>> stream.result()["P@1"]                                         # doctest: +SKIP
    """

    N_BINS = 15

    def __init__(self, n_labels: int, ks=(1, 3, 5), inv_propensity=None, curve_ranks: int = CURVE_RANKS):
        self.n_labels = int(n_labels)
        self.ks = tuple(_check_k(k, "every entry of ks") for k in ks)
        if not self.ks:
            raise ValidationError("ks must name at least one k")
        self.inv_propensity = inv_propensity
        self.ranks = max(max(self.ks), int(curve_ranks))
        self._inputs = None  # which of scores / proba / Y_pred / label_mask the blocks carry
        self._labels, self._masks, self._indices, self._values, self._predicted = [], [], [], [], []
        self._auc_labels, self._auc_masks, self._auc_scores = [], [], []
        self._bins = [np.zeros(self.N_BINS, dtype=np.int64), np.zeros(self.N_BINS), np.zeros(self.N_BINS)]

    def add(self, Y_true, scores=None, proba=None, Y_pred=None, label_mask=None, auc_rows=None) -> "StreamingEvaluation":
        """Add the rows of one block: ``Y_true`` (n, L) and the outputs of :func:`evaluate` for them.

        ``auc_rows``: boolean (n,) or row indices of this block whose dense scores enter the AUCs
        (None: every row). Every block must carry the same outputs (a block with probabilities and
        one without cannot be pooled). Returns ``self``."""
        Y = _check_y_true(Y_true)
        if Y.shape[1] != self.n_labels:
            raise ValidationError(f"Y_true has {Y.shape[1]} label columns; this evaluation was set up for {self.n_labels}")
        given = (scores is not None, isinstance(scores, tuple), proba is not None, Y_pred is not None,
                 label_mask is not None)
        if self._inputs is None:
            self._inputs = given
        elif given != self._inputs:
            raise ValidationError("every block must give the same outputs (scores, proba, Y_pred, label_mask) "
                                  "as the first one")
        mask = _check_mask(label_mask, Y.shape)
        self._labels.append(Y)
        self._masks.append(mask)
        ranking = scores if scores is not None else proba
        if ranking is not None:
            indices = _ranked_indices(ranking, self.ranks if not isinstance(ranking, tuple) else max(self.ks), Y.shape)
            self._indices.append(indices)
        elif self.inv_propensity is not None:
            raise ValidationError("inv_propensity was given but neither scores nor proba to rank labels by")
        if proba is not None:
            dense_proba = _check_dense(proba, Y.shape, "proba", check_finite=False)
            for total, part in zip(self._bins, _bin_sums(Y, dense_proba, self.N_BINS, mask)):  # checks proba
                total += part
            self._values.append(np.take_along_axis(dense_proba, indices, axis=1).astype(np.float64))
        if Y_pred is not None:
            self._predicted.append(sp.csr_matrix(Y_pred))
        dense = scores if scores is not None and not isinstance(scores, tuple) else proba
        if dense is not None:
            if auc_rows is None:  # every row: the arrays themselves, not copies
                self._auc_labels.append(Y)
                self._auc_masks.append(mask)
                self._auc_scores.append(np.asarray(dense))
            else:
                keep = np.arange(Y.shape[0])[np.asarray(auc_rows)]
                if keep.size:
                    self._auc_labels.append(Y[keep])
                    self._auc_masks.append(None if mask is None else mask[keep])
                    self._auc_scores.append(np.asarray(dense)[keep])
        return self

    @staticmethod
    def _stack(blocks):
        """The blocks as one array (the block itself when there is one: no copy)."""
        if not blocks or blocks[0] is None:
            return None
        if len(blocks) == 1:
            return blocks[0]
        return sp.vstack(blocks, format="csr") if sp.issparse(blocks[0]) else np.concatenate(blocks)

    def result(self) -> dict:
        """The metrics of every row added so far, keys and definitions as :func:`evaluate`."""
        if not self._labels:
            raise ValidationError("no rows were added to this evaluation")
        Y, mask = self._stack(self._labels), self._stack(self._masks)
        indices, values = self._stack(self._indices), self._stack(self._values)
        results: dict[str, float] = {}
        if indices is not None:
            hits = _hits(Y, indices[:, :max(self.ks)])
            for k in self.ks:
                results[f"P@{k}"] = float(_precision(hits[:, :k], k).mean())
            for k in self.ks:
                results[f"nDCG@{k}"] = float(_safe_ratio(_dcg(hits[:, :k]), _ideal_dcg(Y, k)).mean())
            if self.inv_propensity is not None:
                weights = _check_weights(self.inv_propensity, None, None, None, Y.shape[1])
                order = _weight_order(Y, weights)  # one sort for every k
                for k in self.ks:
                    results[f"PSP@{k}"] = _psp(Y, indices[:, :k], hits[:, :k], weights, k, True, order)
                for k in self.ks:
                    results[f"PSnDCG@{k}"] = _psndcg(Y, indices[:, :k], hits[:, :k], weights, k, True, order)
        if self._auc_scores:
            Y_auc, mask_auc, dense = self._stack(self._auc_labels), self._stack(self._auc_masks), self._stack(self._auc_scores)
            results.update(_all_aucs(Y_auc, dense, mask_auc))  # dense was checked by add
        if self._predicted:
            predicted = self._stack(self._predicted)
            results["F1_example"] = f1_example(Y, predicted, mask)
            results["F1_micro"] = f1_micro(Y, predicted, mask)
            results["F1_macro"] = f1_macro(Y, predicted, mask)
            results["exact_match"] = exact_match(Y, predicted, mask)
            results["hamming_loss"] = hamming_loss(Y, predicted, mask)
        if values is not None:
            results["ECE"] = _ece_of_bins(*self._bins)
            pairs = {k: _flat_pairs(*_pairs_at(Y, mask, indices, values, k)) for k in self.ks}  # (p, y) of the top k
            for k in self.ks:
                results[f"ECE@{k}"] = _ece_of_pairs(*pairs[k])
            for k in self.ks:
                p, y = pairs[k]
                results[f"Brier@{k}"] = float(np.mean((p - y) ** 2))
            top1 = (indices[:, :1], values[:, :1])
            results["AURC"] = float(np.mean(risk_coverage_curve(Y, top1, label_mask=mask).risk))
        return results

    def curves(self, ks=(1, 5), max_points: int = 200) -> dict:
        """The calibration plots' data of :func:`~bayesmlc.metrics.calibration.calibration_curves` for
        every row added so far (needs probabilities, and ``curve_ranks >= max(ks)``)."""
        if not self._values:
            raise ValidationError("the calibration curves need probabilities (proba) in every block")
        if max(ks) > self.ranks:
            raise ValidationError(f"curves for the top {max(ks)} need curve_ranks >= {max(ks)}; this evaluation keeps {self.ranks}")
        Y, mask = self._stack(self._labels), self._stack(self._masks)
        indices, values = self._stack(self._indices), self._stack(self._values)
        if indices.shape[1] < min(max(ks), self.n_labels):  # a top-k ranking of fewer labels was given
            raise ValidationError(f"curves for the top {max(ks)} need that many ranked labels per row; "
                                  f"the blocks ranked {indices.shape[1]}")
        out = _curve_json(_curve(*self._bins, self.N_BINS))
        for k in ks:
            p, y = _flat_pairs(*_pairs_at(Y, mask, indices, values, k))
            out[f"top{k}"] = _curve_json(_curve(*_pair_bin_sums(p, y, self.N_BINS), self.N_BINS))
        curve = risk_coverage_curve(Y, (indices[:, :1], values[:, :1]), label_mask=mask)
        out["risk_coverage"] = _risk_coverage_json(curve, max_points)
        return out
