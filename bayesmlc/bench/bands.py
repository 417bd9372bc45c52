"""``bayesmlc bench --bands``: each finished run's ranking metrics by label-frequency band.

After a run finishes, :func:`band_fields` loads the model it saved (``RUN_DIR/model.npz``), ranks the
test rows with it (``predict_topk``: the order of ``decision_function``, the one the run's own P@k was
taken on), and splits P@k, PSP@k and recall@k into the training-frequency bands of
:func:`bayesmlc.metrics.metrics_by_band` (deciles of the labels, head to tail). The propensities are the
ones the run used (``RUN_DIR/meta.json``), so each metric's bands add up to the run's own value. The
record gains ``bands`` (:meth:`bayesmlc.metrics.BandMetrics.to_json`) and ``bands_seconds``, or
``bands_error`` when the bands could not be computed (the run itself still counts as finished).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

__all__ = ["BAND_KS", "band_fields"]

#: The cut-offs recorded per band.
BAND_KS = (1, 3, 5)

_TRAIN_LABELS: dict = {}  # training file -> its label matrix, read once per suite


def _training_labels(path: Path):
    key = str(Path(path).resolve())
    if key not in _TRAIN_LABELS:
        from ..data.io import read_dataset

        _TRAIN_LABELS.clear()  # one dataset at a time: the runs of a suite go dataset by dataset
        _TRAIN_LABELS[key] = read_dataset(path).Y
    return _TRAIN_LABELS[key]


def band_fields(test_path, train_path, run_dir) -> dict:
    """``{"bands": ..., "bands_seconds": ...}`` for the run saved in ``run_dir``, or ``{"bands_error": why}``."""
    from ..base import MultiLabelEstimator
    from ..data.io import conform_widths, read_dataset
    from ..metrics import metrics_by_band

    start = time.perf_counter()
    run_dir = Path(run_dir)
    try:
        # the harness's own run wrote this file a moment ago (a finished run only): a napkinXC or
        # omikuji model among its runs is reloaded without --allow-native-baselines
        model = MultiLabelEstimator.load(run_dir / "model.npz", allow_native=True)
        meta = json.loads((run_dir / "meta.json").read_text(encoding="utf-8"))
        test = conform_widths(read_dataset(test_path), model.n_features_in_, model.n_labels_, test_path,
                              "the model was trained with")
        train_labels = _training_labels(train_path)
        ranking = model.predict_topk(test.X, max(BAND_KS))
        result = metrics_by_band(test.Y, ranking, train_labels, ks=BAND_KS,
                                 propensities=np.asarray(meta["inv_propensity"], dtype=np.float64))
    except Exception as exc:  # recorded with the run; a finished run is never failed by its bands
        return {"bands_error": f"{type(exc).__name__}: {exc}"}
    return {"bands": result.to_json(), "bands_seconds": time.perf_counter() - start}
