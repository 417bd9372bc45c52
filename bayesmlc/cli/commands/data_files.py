"""The data files a command reads: their names in records, their widths against a saved model's,
and the rows of a test file whose scores enter the AUCs."""

from __future__ import annotations

import sys
from pathlib import Path

from ... import evaluation


def dataset_name(path) -> str:
    """A name for the data in ``path``, for progress lines and records: the folder of
    ``train.txt``/``test.txt``, else the file stem. Only a label: nothing is looked up by it."""
    path = Path(path)
    if path.stem in ("train", "test") and path.parent.name:
        return path.parent.name
    return path.stem


def read_for_model(path, data_format, model, labels: bool):
    """The data file ``path`` with the model's widths (see :func:`bayesmlc.data.io.conform_widths`): a
    narrower width the reader inferred is padded, a declared one that differs is refused."""
    from ...data.io import conform_widths, read_dataset

    return conform_widths(read_dataset(path, format=data_format), model.n_features_in_,
                          model.n_labels_ if labels else None, path, "the model was trained with")


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
