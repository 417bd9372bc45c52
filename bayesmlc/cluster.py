"""Training and scoring on the clusters users already run: Ray, Spark and Dask (docs/scaling.md).

Training. :func:`fit_data_parallel` is the body every worker of a data-parallel fit runs, whichever
launcher started it: ``torchrun``, Spark's ``TorchDistributor`` (which calls ``torch.distributed.run``)
or Ray Train's ``TorchTrainer`` (which sets up the process group itself). Each worker reads only its
rows of the training file (:func:`~bayesmlc.data.shard.read_shard`) and fits an MLGPF, BNMC or BMLS
estimator under :class:`~bayesmlc.distributed.DataParallel`; every rank returns the fitted model
(the same on every rank), which the launchers hand back to the caller (``TorchDistributor.run``'s
value, Ray's ``Result.return_value``).
:func:`ray_train_loop` is the same as a ``train_loop_per_worker`` taking Ray's config dict::

    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    trainer = TorchTrainer(ray_train_loop, scaling_config=ScalingConfig(num_workers=4),
                           train_loop_config={"estimator": MLGPF(epochs=15, random_state=0),
                                              "train": "/shared/amazoncat/train.npz"})
    model = trainer.fit().return_value

Scoring. A fitted estimator pickles light (no training state), and every prediction method works
on CSR blocks of any number of rows, one bounded batch at a time, so Dask's ``ParallelPostFit`` takes
it as it is. Ray Data and Spark pass sparse rows as two list columns, each row's feature indices
and values: :class:`SparseRowScorer` turns a batch of them into CSR (:func:`csr_from_rows`) and
returns each row's top-k labels and scores, as a Ray Data ``map_batches`` callable class or as the
predict function of Spark's ``predict_batch_udf``.
"""

from __future__ import annotations

import atexit
import inspect
import numbers
import os

import numpy as np
import scipy.sparse as sp

from .data.shard import read_shard
from .distributed import DataParallel
from .exceptions import ValidationError

__all__ = ["fit_data_parallel", "ray_train_loop", "csr_from_rows", "SparseRowScorer"]


def fit_data_parallel(estimator, train, format: str | None = None):
    """Fit ``estimator`` data-parallel on this worker's rows of the file ``train``; every worker of
    the run calls it with the same estimator settings and file.

    The process group is the one the launcher set up (Ray Train) or, when none is initialised, the
    one torchrun's environment variables describe (``torchrun``, Spark's ``TorchDistributor``;
    :meth:`DataParallel.from_env <bayesmlc.distributed.DataParallel.from_env>`). A group joined here
    stays open for later fits in the process and is left when it exits: a default group destroyed
    and initialised again under torchrun meets the first one's entries in torchrun's key-value store
    (its gloo addresses), and the ranks fail to connect or wait forever.

    The worker reads its shard with :func:`~bayesmlc.data.shard.read_shard` (``.npz`` or XC text,
    ``format`` as there; the file must be readable at the same path on every host: a shared file
    system, or a copy on each) and fits with ``parallel=``; a worker that cannot read its shard stops
    the others with :class:`~bayesmlc.distributed.RankFailedError` instead of leaving them waiting.
    An ``estimator`` whose ``device`` is ``"auto"`` trains on the worker's device (``cuda:LOCAL_RANK``
    under nccl) and is returned with ``device="auto"`` again, so that a CPU scoring worker can use a
    model trained on GPUs.

    Parameters
    ----------
    estimator : an unfitted MLGPF, BNMC or BMLS (the models whose ``fit`` takes ``parallel=``).
    train : str or path, the training file.
    format : str or None, its format (None: from the extension).

    Returns
    -------
    The fitted estimator, the same on every rank. Every rank returns it: Spark's local mode has
    every process write its return value to the one output file, so the last writer's is the one
    ``TorchDistributor.run`` returns.
    """
    if "parallel" not in inspect.signature(estimator._fit).parameters:
        raise ValidationError(f"fit_data_parallel trains MLGPF, BNMC or BMLS (their fit takes parallel=), not "
                              f"{type(estimator).__name__}")
    parallel = _process_group()
    on_any_device = estimator.get_params().get("device") == "auto"
    if on_any_device:
        estimator.set_params(device=str(parallel.device))
    try:
        shard = read_shard(train, parallel, format=format)
    except Exception as exc:
        parallel.sync_failure(exc)  # the others, at fit's first collective, raise RankFailedError
        raise
    estimator.fit(shard.X, shard.Y, label_mask=shard.label_mask, parallel=parallel)
    if on_any_device:  # shipped to scoring workers, the model predicts on whatever device each has
        estimator.set_params(device="auto")
    return estimator


def _process_group() -> DataParallel:
    """A strategy over the initialised default process group, or over the one joined from torchrun's
    variables, which is then left at the process's exit (:meth:`DataParallel.close`)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return DataParallel()
    parallel = DataParallel.from_env()
    atexit.register(parallel.close)
    return parallel


def ray_train_loop(config: dict):
    """``train_loop_per_worker`` for Ray Train's ``TorchTrainer``: :func:`fit_data_parallel` with the
    entries of ``config`` (``estimator``, ``train``, optionally ``format``). The fitted model (rank
    0's) becomes the run's ``Result.return_value``."""
    unknown = sorted(set(config) - {"estimator", "train", "format"})
    if unknown or not {"estimator", "train"} <= set(config):
        raise ValidationError(f"train_loop_config must hold 'estimator' and 'train' (and optionally 'format'), "
                              f"got the keys {sorted(config)}")
    return fit_data_parallel(config["estimator"], config["train"], config.get("format"))


def csr_from_rows(indices, values, n_features: int) -> sp.csr_matrix:
    """A float32 CSR matrix (n, ``n_features``) from each row's feature indices and values.

    ``indices`` and ``values`` are sequences of n one-dimensional arrays (or lists), row i's
    ``indices[i]`` and ``values[i]`` of the same length: the two list columns of a Ray Data batch
    (``batch_format="numpy"``) or of a Spark or pandas batch. An index outside ``[0, n_features)``, or
    rows whose two lists differ in length, are a ``ValidationError`` naming the row.
    """
    if len(indices) != len(values):
        raise ValidationError(f"csr_from_rows: {len(indices)} rows of indices but {len(values)} rows of values")
    row_indices = [np.asarray(row, dtype=np.int64).reshape(-1) for row in indices]
    row_values = [np.asarray(row, dtype=np.float32).reshape(-1) for row in values]
    lengths = np.array([row.size for row in row_indices], dtype=np.int64)
    for i, (row_index, row_value) in enumerate(zip(row_indices, row_values)):
        if row_index.size != row_value.size:
            raise ValidationError(f"csr_from_rows: row {i} has {row_index.size} indices but {row_value.size} values")
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    flat_indices = np.concatenate(row_indices) if row_indices else np.zeros(0, dtype=np.int64)
    flat_values = np.concatenate(row_values) if row_values else np.zeros(0, dtype=np.float32)
    outside = np.flatnonzero((flat_indices < 0) | (flat_indices >= n_features))
    if outside.size:
        row = int(np.searchsorted(indptr, outside[0], side="right") - 1)
        raise ValidationError(f"csr_from_rows: row {row} has the feature index {int(flat_indices[outside[0]])}, "
                              f"outside [0, {n_features})")
    matrix = sp.csr_matrix((flat_values, flat_indices, indptr), shape=(len(row_indices), n_features))
    matrix.sum_duplicates()  # canonical: sorted indices, repeated ones added
    return matrix


class SparseRowScorer:
    """Each row's ``k`` best labels and their scores, for rows given as feature-index and value lists.

    Parameters
    ----------
    model : a fitted bayesmlc estimator, or the path of a model file (read with
        :func:`bayesmlc.load_model`: each Ray actor or Spark Python worker reads it once).
    k : int >= 1, labels per row (lowered to the model's number of labels).
    indices_column, values_column : str, the batch's columns of feature indices and values.
    proba : bool, rank and score by :meth:`predict_proba <bayesmlc.base.MultiLabelEstimator.predict_proba>`
        (``top_k``: calibrated-probability scores) instead of :meth:`predict_topk` (the model's
        ranking scores).

    Ray Data: ``dataset.map_batches(SparseRowScorer, fn_constructor_kwargs={"model": path, "k": 5},
    batch_size=4096, concurrency=4, batch_format="numpy")``; each output batch holds the input's
    other columns (an id, say) and ``labels`` (int64, (b, k)) and ``scores`` (float32, (b, k)).
    Spark: ``predict_batch_udf(lambda: SparseRowScorer(path, k=5).predict, return_type=..., batch_size=4096)``
    on the two columns (docs/scaling.md).
    """

    def __init__(self, model, k: int = 5, indices_column: str = "indices", values_column: str = "values",
                 proba: bool = False):
        if isinstance(model, (str, os.PathLike)):
            from . import load_model

            model = load_model(model)
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValidationError(f"SparseRowScorer: k must be a positive integer, got {k!r}")
        self.model = model
        self.k = int(k)
        self.indices_column, self.values_column = indices_column, values_column
        self.proba = bool(proba)

    def predict(self, indices, values) -> dict:
        """``{"labels": (b, k) int64, "scores": (b, k) float32}`` for the rows ``indices``, ``values``
        (sequences of per-row arrays, :func:`csr_from_rows`), best label first."""
        X = csr_from_rows(indices, values, self.model.n_features_in_)
        if not self.proba:
            labels, scores = self.model.predict_topk(X, self.k)
            return {"labels": labels, "scores": scores}
        top = self.model.predict_proba(X, top_k=self.k)  # min(k, L) entries per row, ascending columns
        k = min(self.k, self.model.n_labels_)
        columns, probabilities = top.indices.reshape(-1, k), top.data.reshape(-1, k)
        order = np.argsort(-probabilities, axis=1, kind="stable")  # best first; ties to the lower label
        return {"labels": np.take_along_axis(columns, order, axis=1).astype(np.int64),
                "scores": np.take_along_axis(probabilities, order, axis=1)}

    def __call__(self, batch: dict) -> dict:
        """A Ray Data batch (``batch_format="numpy"``: column name -> array): the batch's other
        columns, ``labels`` and ``scores``."""
        for column in (self.indices_column, self.values_column):
            if column not in batch:
                raise ValidationError(f"SparseRowScorer: the batch has no column {column!r} (columns: "
                                      f"{sorted(batch)}); set indices_column and values_column")
        out = {name: column for name, column in batch.items() if name not in (self.indices_column, self.values_column)}
        out.update(self.predict(batch[self.indices_column], batch[self.values_column]))
        return out
