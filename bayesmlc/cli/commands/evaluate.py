"""``bayesmlc evaluate``: score a saved model on a test file (:func:`bayesmlc.evaluation.evaluate_model`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import evaluation
from ..errors import EXIT_OK, CLIError
from ..output import device_name, emit, peak_rss_mb
from ..run_directory import META_FILE
from .data_files import announce_auc_rows, dataset_name, load_model_and_data


def cmd_evaluate(args) -> int:
    model, meta, test = load_model_and_data(args.model_dir, getattr(args, "allow_native_baselines", False), args.test,
                                            args.format, labels=True)
    inv_prop = None
    if "inv_propensity" in meta:
        inv_prop = np.asarray(meta["inv_propensity"])
        if inv_prop.dtype.kind not in "iuf" or inv_prop.shape != (model.n_labels_,):
            raise CLIError(f"{Path(args.model_dir) / META_FILE}: inv_propensity is not {model.n_labels_} numbers")
    result = evaluation.evaluate_model(model, test, inv_prop, announce_auc_rows(test, args.test))
    record = {"model": meta.get("model", type(model).__name__), "dataset": dataset_name(args.test),
              "params": model.get_params(deep=False), "metrics": result.metrics, "train_seconds": None,
              "predict_seconds": result.predict_seconds, "peak_rss_mb": peak_rss_mb(), "device": device_name(model),
              "evaluated_rows": test.n_samples, "auc_rows": result.auc_rows}
    emit(args, record, evaluation.format_metrics_table(result.metrics))
    return EXIT_OK
