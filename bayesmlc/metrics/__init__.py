"""Multi-label evaluation metrics, vectorised over sparse ground truth.

Ground truth ``Y_true`` is a 0/1 matrix of shape (n, L), preferably ``scipy.sparse`` CSR; it is never
densified. Ranking metrics take either dense ``scores`` of shape (n, L) or a top-k result
``(indices, values)``, two arrays of shape (n, k) with the best label first, as returned by
:meth:`bayesmlc.base.MultiLabelEstimator.predict_topk`. Every metric returns a Python ``float``, a
fraction (not a percentage).

Conventions for rows without any true label (see ``docs/metrics.md``):

* P@k, nDCG@k and the unnormalised PSP@k / PSnDCG@k count such a row as 0 in their mean over rows
  (as pyxclib does); the row's ideal DCG is 0 and its nDCG is *defined* as 0.
* The normalised PSP@k / PSnDCG@k are ratios of means; an empty row adds 0 to both means, so it does
  not change the value.
* ``auc_instance`` averages over rows with both classes only; ``auc_macro`` over labels with both
  classes only (``return_count=True`` says how many were used).
* ``f1_example``: a row with no true and no predicted label scores ``zero_division`` (default 1).
* ``exact_match``: such a row matches when nothing is predicted for it.

The metrics live in one module per family (:mod:`~bayesmlc.metrics.ranking`,
:mod:`~bayesmlc.metrics.bands` (the ranking metrics by label-frequency band),
:mod:`~bayesmlc.metrics.auc`, :mod:`~bayesmlc.metrics.set_based`, :mod:`~bayesmlc.metrics.calibration`,
:func:`evaluate` in :mod:`~bayesmlc.metrics.evaluation`, and scikit-learn scorers of the ranking metrics in
:mod:`~bayesmlc.metrics.scorers`), with the shared input checks in
``_checks``; every public name is importable from ``bayesmlc.metrics``.
"""

from . import auc, bands, calibration, evaluation, ranking, scorers, set_based
from .auc import auc_instance, auc_macro, auc_micro
from .bands import BandMetrics, FrequencyBands, frequency_bands, metrics_by_band
from .calibration import (ReliabilityCurve, RiskCoverage, aurc, brier_at_k, calibration_curves, ece_at_k,
                          ece_at_k_if_calibrated, expected_calibration_error, reliability_curve, risk_coverage_curve,
                          topk_reliability_curve)
from .evaluation import StreamingEvaluation, evaluate
from .ranking import (inverse_propensity, inverse_propensity_from_counts, labels_at_or_above, ndcg_at_k, precision_at_k,
                      psndcg_at_k, psprecision_at_k, topk)
from .scorers import TopKScorer, get_topk_scorer, make_topk_scorer, training_inverse_propensity
from .set_based import exact_match, f1_example, f1_macro, f1_micro, hamming_loss

#: every public function and class of the families, as each family lists it (their constants, such as
#: ``bands.DEFAULT_N_BANDS``, stay in their modules)
__all__ = [name for family in (ranking, bands, auc, set_based, calibration, evaluation, scorers)
           for name in family.__all__ if not name.isupper()]
