"""The data files a command reads: their names in records, read beside a saved model and conformed to
its widths, and the rows of a test file whose scores enter the AUCs."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ... import evaluation
from ...data import read_warnings
from .saved_run import load_model_dir


def dataset_name(path) -> str:
    """A name for the data in ``path``, for progress lines and records: the folder of
    ``train.txt``/``test.txt``, else the file stem. Only a label: nothing is looked up by it."""
    path = Path(path)
    if path.stem in ("train", "test") and path.parent.name:
        return path.parent.name
    return path.stem


def load_model_and_data(model_dir, allow_native: bool, path, data_format, labels: bool):
    """``(model, meta, dataset)``: the run folder's model (:func:`load_model_dir`) and the data file
    ``path`` with the model's widths (:func:`bayesmlc.data.io.conform_widths`: a narrower width the
    reader inferred is padded, a declared one that differs is refused; ``labels``: the label width
    too). The file is parsed on a second thread while the model loads, as both run mostly outside the
    interpreter lock (the compiled parser; the archive's reads and the model's load-time probe); the
    reader's warnings are raised here once it is done (:mod:`bayesmlc.data.read_warnings`). A model
    that does not load is reported before a file that does not parse, as when one ran after the other.
    """
    from ...data.io import conform_widths

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bayesmlc-read") as pool:
        reading = pool.submit(_read_holding_warnings, path, data_format)
        model, meta = load_model_dir(model_dir, allow_native)
        dataset, held = reading.result()
    read_warnings.raise_deferred(held)
    return model, meta, conform_widths(dataset, model.n_features_in_, model.n_labels_ if labels else None, path,
                                       "the model was trained with")


def _read_holding_warnings(path, data_format):
    """``(read_dataset(path, format=data_format), the reader's held warnings)``, without the file's
    sha256 (no record of ``evaluate`` or ``predict`` names it)."""
    from ...data.io import read_dataset

    with read_warnings.deferred() as held:
        return read_dataset(path, format=data_format, sha256=False), held


def announce_auc_rows(test, source, seed: int = 0):
    """The rows of ``test`` whose scores enter the AUCs (:func:`bayesmlc.evaluation.auc_row_subset`),
    with a notice on stderr naming ``source`` when they are not every row."""
    n_rows, n_labels = test.Y.shape
    rows = evaluation.auc_row_subset(n_rows, n_labels, seed)
    if rows is not None:
        print(f"{source}: {n_rows:,} rows x {n_labels:,} labels is more than {evaluation.MAX_EVALUATION_ENTRIES:,} "
              f"scores to hold; every metric is taken over all rows, the AUCs over {rows.size:,} rows drawn at "
              f"random (seed {seed})", file=sys.stderr)
    return rows
