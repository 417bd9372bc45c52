"""Evaluating a fitted model on a test set: the figures ``bayesmlc train --test`` and ``bayesmlc
evaluate`` report, for Python callers as well.

:func:`evaluate_model` scores the test rows block by block, each block in one pass of the model
(:meth:`~bayesmlc.base.MultiLabelEstimator.score_and_proba`: scores, probabilities and predicted
labels together), and pools the metrics over every row
(:class:`~bayesmlc.metrics.StreamingEvaluation`). The propensity-scored metrics take Jain et al.'s
constants (A, B) of the data set (:func:`propensity_constants`: its registry entry, else the defaults).

Example
-------
>>> from bayesmlc.data import registry                                          # doctest: +SKIP
>>> from bayesmlc.metrics import inverse_propensity                               # doctest: +SKIP
>>> train, test = registry.load("bibtex", split="both")                           # doctest: +SKIP
>>> model = LogisticRegression().fit(train.X, train.Y)                            # doctest: +SKIP
>>> A, B = propensity_constants(train)                                            # doctest: +SKIP
>>> result = evaluate_model(model, test, inverse_propensity(train.Y, A=A, B=B))   # doctest: +SKIP
>>> result.metrics["PSP@5"], result.predict_seconds                               # doctest: +SKIP
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from .data.registry import DEFAULT_PROPENSITY, get_info
from .exceptions import ValidationError
from .metrics import StreamingEvaluation, evaluate

__all__ = [
    "MAX_EVALUATION_ENTRIES",
    "ModelEvaluation",
    "propensity_constants",
    "auc_row_subset",
    "evaluate_model",
    "label_frequency_baseline",
    "format_metrics_table",
]

#: Test sets are scored in blocks of rows of at most this many (rows x labels) entries, so the dense
#: scores, probabilities and predictions of a block stay bounded (about 5,000 rows at the AmazonCat-13K
#: width); every metric but the AUCs is exact over all rows. The AUCs need every score of the rows
#: they rank, so above this many entries they are taken on a seeded random subset of
#: MAX_EVALUATION_ENTRIES // labels rows (:func:`auc_row_subset`).
MAX_EVALUATION_ENTRIES = 1 << 26


class ModelEvaluation(NamedTuple):
    """What :func:`evaluate_model` returns."""

    #: metric name -> value (a fraction), ``None`` where undefined on this data (an AUC with one class)
    metrics: dict
    #: seconds the model spent scoring, summed over the blocks
    predict_seconds: float
    #: the calibration plots' data (:meth:`bayesmlc.metrics.StreamingEvaluation.curves`)
    reliability: dict
    #: rows whose scores entered the AUCs
    auc_rows: int


def propensity_constants(dataset=None) -> tuple[float, float]:
    """(A, B) of Jain et al.'s propensity model (KDD 2016) for ``dataset``.

    ``dataset``: a registry name (``"wikilshtc-325k"``), a :class:`~bayesmlc.data.Dataset` read by
    :func:`bayesmlc.data.registry.load` (its ``source["dataset"]`` names the entry), or None. The
    constants of the registry entry; the defaults (0.55, 1.5) for a data set the registry does not
    name. An unknown name is an error (a misspelt name must not silently take the defaults).
    """
    if dataset is None:
        return DEFAULT_PROPENSITY
    if not isinstance(dataset, str):
        dataset = (getattr(dataset, "source", None) or {}).get("dataset")
        if dataset is None:
            return DEFAULT_PROPENSITY
    info = get_info(dataset)
    return float(info.propensity_a), float(info.propensity_b)


def auc_row_subset(n_rows: int, n_labels: int, seed: int = 0, max_entries: int | None = None):
    """The rows whose scores enter the AUCs: None (every row) up to ``max_entries`` scores (default
    :data:`MAX_EVALUATION_ENTRIES`), else ``max_entries // n_labels`` rows drawn at random with
    ``seed``, as sorted indices."""
    max_entries = MAX_EVALUATION_ENTRIES if max_entries is None else int(max_entries)
    if n_rows * n_labels <= max_entries:
        return None
    kept = max(1, max_entries // n_labels)
    return np.sort(np.random.default_rng(seed).choice(n_rows, kept, replace=False))


def evaluate_model(model, test, inv_propensity=None, auc_rows="auto", max_entries: int | None = None) -> ModelEvaluation:
    """Metrics of the fitted ``model`` on the ``test`` :class:`~bayesmlc.data.Dataset`.

    The rows are scored in blocks of at most ``max_entries`` (rows x labels) entries (default
    :data:`MAX_EVALUATION_ENTRIES`), each block once (``score_and_proba``), and the metrics pooled
    over every row. ``inv_propensity`` (L,) adds PSP@k and PSnDCG@k
    (:func:`bayesmlc.metrics.inverse_propensity`). ``auc_rows``: "auto" (:func:`auc_row_subset` with
    seed 0), None (every row) or sorted row indices. Entries that ``test.label_mask`` marks
    unobserved are left out of the metrics that take a mask.
    """
    n_rows, n_labels = test.Y.shape
    if isinstance(auc_rows, str):
        if auc_rows != "auto":
            raise ValidationError(f"auc_rows must be 'auto', None or row indices, got {auc_rows!r}")
        auc_rows = auc_row_subset(n_rows, n_labels, max_entries=max_entries)
    max_entries = MAX_EVALUATION_ENTRIES if max_entries is None else int(max_entries)
    stream = StreamingEvaluation(n_labels, inv_propensity=inv_propensity)
    block = max(1, max_entries // n_labels)
    seconds = 0.0
    for begin in range(0, n_rows, block):
        end = min(begin + block, n_rows)
        start = time.perf_counter()
        scores, proba, predicted = model.score_and_proba(_row_range(test.X, begin, end), return_labels=True)
        seconds += time.perf_counter() - start
        stream.add(_row_range(test.Y, begin, end), scores=scores, proba=proba, Y_pred=predicted,
                   label_mask=_row_range(test.label_mask, begin, end),
                   auc_rows=None if auc_rows is None else np.isin(np.arange(begin, end), auc_rows))
    n_auc = n_rows if auc_rows is None else int(np.asarray(auc_rows).size)
    return ModelEvaluation(undefined_as_none(stream.result()), seconds, stream.curves(), n_auc)


def _row_range(matrix, begin: int, end: int):
    """Rows ``begin:end`` of ``matrix`` (None stays None); the matrix itself, not a copy, for all rows."""
    if matrix is None or (begin == 0 and end == matrix.shape[0]):
        return matrix
    return matrix[begin:end]


def label_frequency_baseline(train_Y, test, inv_propensity=None) -> dict:
    """Metrics of the trivial predictor that ranks every row's labels by their frequency in
    ``train_Y`` and gives that frequency as each label's probability; ``None`` where undefined."""
    frequency = np.asarray(train_Y.mean(axis=0), dtype=np.float64).ravel()
    proba = np.broadcast_to(frequency, (test.n_samples, frequency.size))
    return undefined_as_none(evaluate(test.Y, scores=proba, proba=proba, Y_pred=proba > 0.5,
                                      inv_propensity=inv_propensity, label_mask=test.label_mask))


def undefined_as_none(values: dict) -> dict:
    """Metric values as floats, with ``None`` for an undefined (NaN) one, as JSON records hold them."""
    return {key: (None if np.isnan(value) else float(value)) for key, value in values.items()}


def format_metrics_table(values: dict, baseline: dict | None = None, names=("", "")) -> str:
    """One metric per line; with ``baseline``, a second column of its values and a header line
    naming the two columns ``names``; an undefined (``None``) value reads ``undefined``."""
    width = max((len(k) for k in values), default=0)
    if baseline is None:
        return "\n".join(f"{key:<{width}}  {value:8.4f}" if value is not None else f"{key:<{width}}  undefined"
                         for key, value in values.items())

    def cell(value):
        return f"{value:9.4f}" if value is not None else f"{'undefined':>9}"

    header = f"{'':<{width}}  {names[0]:>9}  {names[1]:>9}"
    return "\n".join([header] + [f"{key:<{width}}  {cell(value)}  {cell(baseline.get(key))}"
                                  for key, value in values.items()])
