"""Which held-out pairs the global isotonic map should be fitted on: each row's top 1, 3 or 5.

Fits ``CalibratedClassifier(estimator, random_state=0, min_label_positives=None)`` once per model on
bibtex_xc (the estimator on 80% of the training rows), then refits only the global isotonic map on the
held-out rows' top-k (probability, is-relevant) pairs for k = 1, 3, 5 and scores the test file with
each. The bayesmlc models use the quick suite's settings; one thread.

    PYTHONPATH=$PWD python benchmarks/calibration_map_pairs.py
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import torch

from bayesmlc import metrics as M
from bayesmlc.bnmc import BNMC
from bayesmlc.calibration import CalibratedClassifier, apply_isotonic, fit_isotonic
from bayesmlc.data.io import read_train_test
from bayesmlc.gp import MLGPF
from bayesmlc.linear import LogisticRegression

DATA = "../shared/datasets/bibtex_xc"


def main() -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    train, test = read_train_test(f"{DATA}/train.txt", f"{DATA}/test.txt")
    models = (("bnmc", BNMC(n_passes=2, random_state=0)),
              ("mlgpf", MLGPF(n_inducing=100, n_latent=20, epochs=20, random_state=0, verbose=False)),
              ("logistic", LogisticRegression(random_state=0)))
    for name, estimator in models:
        start, cpu = time.perf_counter(), time.process_time()
        model = CalibratedClassifier(estimator, random_state=0, min_label_positives=None).fit(train.X, train.Y)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        fitted = model.estimator_
        X_held, Y_held = train.X[model.calibration_rows_], train.Y[model.calibration_rows_].toarray()
        held_proba = fitted.predict_proba(X_held).astype(np.float64)
        held_scores = fitted.decision_function(X_held)
        scores, raw = fitted.decision_function(test.X), fitted.predict_proba(test.X).astype(np.float64)
        for k in (1, 3, 5):
            top, _ = M.topk(held_scores, k)
            thresholds = fit_isotonic(np.take_along_axis(held_proba, top, 1).ravel(),
                                      np.take_along_axis(Y_held, top, 1).ravel())
            calibrated = np.clip(apply_isotonic(thresholds, raw.ravel()).reshape(raw.shape), 0.0, 1.0)
            r = M.evaluate(test.Y, scores=scores, proba=calibrated, ks=(1, 5))
            print(f"{name:<9} map on top-{k}: P@1 {100 * r['P@1']:.2f}  ECE@1 {r['ECE@1']:.4f}  ECE@5 {r['ECE@5']:.4f}  "
                  f"AURC {r['AURC']:.4f}  (fit {seconds:.1f} s wall, {cpu:.1f} s CPU)", flush=True)


if __name__ == "__main__":
    main()
