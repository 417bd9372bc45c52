"""Label sets with guarantees: conformal risk control over each row's top-K candidate labels.

:class:`RiskController` wraps any bayesmlc estimator and calibrates, on held-out rows, one
threshold on its probabilities so that the label sets it predicts control a risk:

* ``recall``: the share of a row's true labels the set misses; conformal risk control (expected
  risk <= alpha) or RCPS (risk <= alpha with probability >= 1 - delta);
* ``precision``: the false discovery proportion of the set; Learn then Test;
* ``selective``: top-1 with abstention, the error of the answered rows; Learn then Test.

:mod:`~bayesmlc.risk_control.procedures` states each procedure, its paper and its exchangeability
assumption; :mod:`~bayesmlc.risk_control.candidates` how rows without labels and label masks are
treated. Everything works from each row's top-K candidates: memory O(rows x K), never rows x labels.
docs/risk-control.md explains how to choose a risk and alpha.
"""

from .candidates import Candidates, candidates_from_model, candidates_from_topk
from .controller import RiskController
from .evaluation import realised, split_evaluation, summarise_splits
from .procedures import (DEFAULT_GRID, METHODS, RISKS, Calibration, calibrate_threshold, crc,
                         hoeffding_bentkus_p_value, ltt, rcps)

__all__ = ["RiskController", "Candidates", "Calibration", "candidates_from_model", "candidates_from_topk",
           "calibrate_threshold", "crc", "rcps", "ltt", "hoeffding_bentkus_p_value", "realised", "split_evaluation",
           "summarise_splits", "DEFAULT_GRID", "METHODS", "RISKS"]
