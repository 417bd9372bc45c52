"""Every metric the given inputs allow, at once (what ``bayesmlc train`` and ``evaluate`` report)."""

from __future__ import annotations

import numpy as np

from ..exceptions import ValidationError
from ._checks import _check_k, _check_mask, _check_proba, _check_y_true
from .auc import auc_instance, auc_macro, auc_micro
from .calibration import _ece_of_pairs, _flat_pairs, _pairs_at, aurc, expected_calibration_error
from .ranking import _check_weights, _dcg, _hits, _ideal_dcg, _precision, _psndcg, _psp, _ranked_indices, _safe_ratio
from .set_based import exact_match, f1_example, f1_macro, f1_micro, hamming_loss

__all__ = ["evaluate"]


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
    ks = tuple(_check_k(k, "every entry of ks") for k in ks)
    if not ks:
        raise ValidationError("ks must name at least one k")
    results: dict[str, float] = {}
    ranking = scores if scores is not None else proba
    indices = None
    if ranking is not None:
        indices = _ranked_indices(ranking, max(ks), Y.shape)
        hits = _hits(Y, indices)
        for k in ks:
            results[f"P@{k}"] = float(_precision(hits[:, :k], k).mean())
        for k in ks:
            results[f"nDCG@{k}"] = float(_safe_ratio(_dcg(hits[:, :k]), _ideal_dcg(Y, k)).mean())
        if inv_propensity is not None:
            weights = _check_weights(inv_propensity, None, None, None, Y.shape[1])
            for k in ks:
                results[f"PSP@{k}"] = _psp(Y, indices[:, :k], hits[:, :k], weights, k, True)
            for k in ks:
                results[f"PSnDCG@{k}"] = _psndcg(Y, indices[:, :k], hits[:, :k], weights, k, True)
    elif inv_propensity is not None:
        raise ValidationError("inv_propensity was given but neither scores nor proba to rank labels by")
    dense = scores if scores is not None and not isinstance(scores, tuple) else proba
    if dense is not None:
        results["AUC_micro"] = auc_micro(Y, dense, label_mask)
        results["AUC_macro"] = auc_macro(Y, dense, label_mask)
        results["AUC_instance"] = auc_instance(Y, dense, label_mask)
    if Y_pred is not None:
        results["F1_example"] = f1_example(Y, Y_pred, label_mask)
        results["F1_micro"] = f1_micro(Y, Y_pred, label_mask)
        results["F1_macro"] = f1_macro(Y, Y_pred, label_mask)
        results["exact_match"] = exact_match(Y, Y_pred, label_mask)
        results["hamming_loss"] = hamming_loss(Y, Y_pred, label_mask)
    if proba is not None:
        results["ECE"] = expected_calibration_error(Y, proba, label_mask=label_mask)
        mask = _check_mask(label_mask, Y.shape)
        dense = _check_proba(proba, Y.shape)
        values = np.take_along_axis(dense, indices, axis=1).astype(np.float64)  # the ranking of P@k
        for k in ks:
            results[f"ECE@{k}"] = _ece_of_pairs(*_flat_pairs(*_pairs_at(Y, mask, indices, values, k)))
        for k in ks:
            p, y = _flat_pairs(*_pairs_at(Y, mask, indices, values, k))
            results[f"Brier@{k}"] = float(np.mean((p - y) ** 2))
        results["AURC"] = aurc(Y, dense, label_mask=label_mask, scores=(indices[:, :1], values[:, :1]))
    return results
