"""What a calibrated threshold gives on other rows: the realised risk, the mean set size and the
coverage, and the repeated random calibration/test splits that ``bayesmlc bench --risk-control``
reports."""

from __future__ import annotations

import numpy as np

from .candidates import Candidates
from .procedures import calibrate_threshold, row_losses

__all__ = ["realised", "split_evaluation", "summarise_splits"]


def realised(candidates: Candidates, risk: str, threshold: float, empty_set_loss: float = 0.0) -> dict:
    """On the rows of ``candidates`` with their sets at ``threshold``:

    ``realised_risk``
        recall and precision: the mean per-row loss over every row (module
        :mod:`~bayesmlc.risk_control.procedures` defines the losses); selective: the error rate of the
        answered rows whose top label is observed (None when no row is answered).
    ``mean_set_size``
        labels per row, averaged over every row (selective: answered rows have one).
    ``coverage``
        the share of rows whose set is not empty (selective: the rows answered).
    """
    size = np.count_nonzero(candidates.proba >= threshold, axis=1)
    if risk == "selective":
        size = np.minimum(size, 1)
    loss, counts = row_losses(candidates, risk, threshold, empty_set_loss)
    n = candidates.n_rows
    value = float(loss[counts].mean()) if np.any(counts) else None
    return {"realised_risk": value, "mean_set_size": float(size.mean()) if n else 0.0,
            "coverage": float(np.count_nonzero(size) / n) if n else 0.0}


def split_evaluation(candidates: Candidates, risk: str, alpha: float, delta: float = 0.1, method: str | None = None,
                     n_splits: int = 20, calibration_share: float = 0.5, random_state=0, **options) -> list[dict]:
    """Calibrate on a random ``calibration_share`` of the rows and measure on the rest, ``n_splits``
    times (seeded by ``random_state``): one dict per split with ``threshold``, ``feasible`` and the
    fields of :func:`realised` on the held-out part."""
    rng = np.random.default_rng(random_state)
    n = candidates.n_rows
    n_calibration = int(round(calibration_share * n))
    results = []
    for _ in range(n_splits):
        order = rng.permutation(n)
        calibration = candidates.take(order[:n_calibration])
        test = candidates.take(order[n_calibration:])
        chosen = calibrate_threshold(calibration, risk, alpha, delta, method, **options)
        results.append({"threshold": chosen.threshold, "feasible": chosen.feasible,
                        **realised(test, risk, chosen.threshold, options.get("empty_set_loss", 0.0))})
    return results


def summarise_splits(results: list[dict], alpha: float) -> dict:
    """The splits of :func:`split_evaluation` in a few numbers: the mean realised risk (over the splits
    where it is defined), the share of all splits whose realised risk exceeds ``alpha``
    (``violations``; a selective split that answers no row violates nothing), the mean set size and
    coverage, and the share of splits where the target was met on the calibration rows (``feasible``)."""
    risks = [r["realised_risk"] for r in results if r["realised_risk"] is not None]
    return {
        "realised_risk": float(np.mean(risks)) if risks else None,
        "violations": float(np.mean([r["realised_risk"] is not None and r["realised_risk"] > alpha for r in results]))
        if results else None,
        "mean_set_size": float(np.mean([r["mean_set_size"] for r in results])),
        "coverage": float(np.mean([r["coverage"] for r in results])),
        "feasible": float(np.mean([r["feasible"] for r in results])),
        "n_splits": len(results),
    }
