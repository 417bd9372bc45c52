"""Data-parallel training on ``torch.distributed``: the strategy object a training loop consults.

A training loop written against this module runs unchanged in one process (:class:`SingleProcess`,
every method a no-op) or in ``W`` processes started by ``torchrun`` (:class:`DataParallel`). The
scheme is synchronous and exact:

* each rank holds only its shard of the training rows, a contiguous range of the global row order
  (:class:`~bayesmlc.data.shard.RowShard`; :func:`~bayesmlc.data.shard.read_shard` reads just those
  rows of a file); the initialisation (randomized subspace iteration, k-means, warm starts) is
  computed from statistics summed over ranks (:meth:`DataParallel.reduce_sum`), so it equals the
  single-process one; a :class:`ParallelContext` carries a rank's shard and its strategy together;
* every rank draws the same global minibatch (the same seed drives the same permutation of global
  row ids on every rank) and computes the bound on the rows of it that its shard holds;
* the data term on rank r is scaled by N / B (B the global batch size, not r's share) and the
  KL term enters on rank 0 only (:meth:`DataParallel.bound_weights`), so the per-rank bounds sum to
  the single-process bound and their gradients sum to its gradient;
* one flattened ``all_reduce(SUM)`` per step adds the gradients (:meth:`DataParallel.reduce_gradients`);
  every rank then takes the same optimiser step on the same parameters, so the parameters stay
  identical on all ranks without a broadcast;
* before every collective the ranks agree whether any of them failed (:meth:`DataParallel.sync_failure`):
  a failing rank re-raises its own error and every other rank raises :class:`RankFailedError` naming
  it and its message, so one rank's exception stops all ranks instead of leaving them waiting. The
  same message checks that the ranks are at the same step and hold the same parameters
  (:class:`RanksOutOfStepError` otherwise, e.g. when one rank could not read the checkpoint). The
  process-group timeout is the backstop for failures inside a collective (a dead host, a lost link).

Usage under ``torchrun --nproc-per-node 2 script.py``::

    from bayesmlc.data.shard import read_shard
    from bayesmlc.distributed import DataParallel
    parallel = DataParallel.from_env()          # gloo on CPUs, nccl on GPUs (cuda:LOCAL_RANK)
    train = read_shard("train.npz", parallel)   # this rank's rows only
    model = MLGPF(device=parallel.device, ...)  # the same settings and seed on every rank
    model.fit(train.X, train.Y, label_mask=train.label_mask, parallel=parallel)
    if parallel.is_main:
        model.save("model.npz")                 # rank 0 alone writes
    parallel.close()

See ``docs/scaling.md`` for the launch commands (several GPUs, several hosts) and memory bounds;
:func:`bayesmlc.cluster.fit_data_parallel` is the same worker body for torchrun, Ray Train's
``TorchTrainer`` and Spark's ``TorchDistributor``.
"""

from __future__ import annotations

import datetime
import gc
import math
import os
import traceback
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from .data.shard import RowShard, shard_bounds
from .exceptions import BayesMLCError, ValidationError

__all__ = ["SingleProcess", "DataParallel", "ParallelContext", "RankFailedError", "RanksOutOfStepError", "DEFAULT_TIMEOUT_S"]

#: Seconds a collective may wait for the other ranks before the process group gives up (backstop).
DEFAULT_TIMEOUT_S = 600.0

_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class RankFailedError(BayesMLCError, RuntimeError):
    """Another rank of a data-parallel run raised; ``failures`` maps its rank to its error message."""

    def __init__(self, failures: dict):
        self.failures = dict(failures)
        shown = "; ".join(f"rank {rank} failed: {message}" for rank, message in sorted(self.failures.items()))
        super().__init__(f"data-parallel training stopped because {shown}")


class RanksOutOfStepError(BayesMLCError, RuntimeError):
    """The ranks reached different collectives, or hold different parameters: they were not given
    the same data, settings, seed or checkpoint."""


class SingleProcess:
    """The trivial strategy: one process computes everything; every hook leaves its input alone."""

    rank = 0
    world_size = 1
    is_main = True
    device = None

    def local_data(self, X, Y, label_mask=None):
        """``(X, Y, label_mask, RowShard)``: one process holds every row."""
        return X, Y, label_mask, RowShard.whole(X.shape[0])

    def reduce_sum(self, array, checked: bool = True) -> np.ndarray:
        """The sum over processes of ``array``: the array itself (see :meth:`DataParallel.reduce_sum`)."""
        return _reducible(array)

    def bound_weights(self, n_total, kl_weight, n_local: int, n_global: int):
        """(data-term scale, KL weight) for this process's bound: unchanged."""
        return n_total, kl_weight

    def sync_failure(self, exc: BaseException | None = None, parameters=None, collective: float = 0.0) -> None:
        """Nothing to agree on in one process; the caller re-raises ``exc`` itself."""

    def reduce_gradients(self, parameters, value: torch.Tensor) -> float:
        """Gradients stay as they are; returns ``float(value)``."""
        return float(value)

    def sum_counts(self, *counts):
        """Totals over processes of per-process counts: the counts themselves."""
        return counts

    def gather_rows(self, rows, global_ids, shard: RowShard):
        """The rows ``global_ids`` (any order) of a row-sharded matrix: here ``rows[global_ids]``."""
        return rows[np.asarray(global_ids, dtype=np.int64)]

    def close(self) -> None:
        """Nothing to release."""


ONE_PROCESS = SingleProcess()  # the strategy of a program that is not distributed


@dataclass(frozen=True)
class ParallelContext:
    """Where this process's rows sit among all processes' rows (``shard``), and the strategy that sums
    over processes (``strategy``): what a computation over row-split data needs, in one object.

    Every statistic of the set-up is a sum over rows; computed from this process's rows and
    summed by :meth:`reduce_sum`, it equals the one-process value. ``ParallelContext.whole(n)`` is
    one process holding all ``n`` rows.
    """

    shard: RowShard
    strategy: object = ONE_PROCESS

    @classmethod
    def whole(cls, n_rows: int) -> "ParallelContext":
        return cls(RowShard.whole(n_rows), ONE_PROCESS)

    @property
    def n_total(self) -> int:
        """Rows over all processes."""
        return self.shard.n_total

    def reduce_sum(self, array) -> np.ndarray:
        """Element-wise sum of ``array`` over processes."""
        return self.strategy.reduce_sum(array)

    def select(self, sorted_ids: np.ndarray):
        """(local row indices, ParallelContext) for the subset ``sorted_ids`` (increasing global row
        ids): this process's members of the subset, and the context of the subset's rows
        (:meth:`RowShard.select <bayesmlc.data.shard.RowShard.select>`)."""
        local, shard = self.shard.select(sorted_ids)
        return local, ParallelContext(shard, self.strategy)

    def gather(self, rows, global_ids: np.ndarray) -> np.ndarray:
        """Dense float64 copy of the global rows ``global_ids`` of a row-split matrix whose local part
        is ``rows``, on every process (:meth:`RowShard.gather <bayesmlc.data.shard.RowShard.gather>`)."""
        return self.shard.gather(rows, global_ids, self.strategy.reduce_sum)


class DataParallel:
    """Synchronous data parallelism over an initialised ``torch.distributed`` process group.

    Parameters
    ----------
    device : torch.device or str or None, where this rank's collectives run (``cuda:LOCAL_RANK`` for
        nccl; the CPU for gloo). None picks it from the backend of the default process group.

    Attributes
    ----------
    rank, world_size : int, this process's rank and the number of processes.
    is_main : bool, rank 0: the one rank that writes checkpoints, history and the model.
    device : torch.device, the device this rank trains on (pass it to the estimator).
    """

    def __init__(self, device=None):
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ValidationError(
                "DataParallel needs an initialised torch.distributed process group: start the program with "
                "torchrun and call DataParallel.from_env(), or call torch.distributed.init_process_group first"
            )
        self._dist = dist
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.is_main = self.rank == 0
        if device is None:
            on_gpu = dist.get_backend() == "nccl"
            device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        self.device = torch.device(device)
        self._broken = False  # a collective itself failed: no further collective can be trusted
        self._syncs = 0  # calls of sync_failure so far: equal on every rank when the ranks are in step
        self._owns_group = False

    @classmethod
    def from_env(cls, backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> "DataParallel":
        """Join the process group described by torchrun's environment variables.

        ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` must be set
        (torchrun sets them). ``backend`` defaults to nccl when CUDA is available (this rank then
        trains on ``cuda:LOCAL_RANK``) and to gloo otherwise. ``timeout_s`` bounds how long a
        collective waits for the other ranks.
        """
        import torch.distributed as dist

        missing = [name for name in _TORCHRUN_VARIABLES if name not in os.environ]
        if missing:
            raise ValidationError(
                f"distributed training needs the environment variables {', '.join(missing)}: start the program "
                "with torchrun (e.g. torchrun --nproc-per-node 2 -m bayesmlc train ... --distributed)"
            )
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend not in ("nccl", "gloo"):
            raise ValidationError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
        local_rank = int(os.environ["LOCAL_RANK"])
        device = torch.device("cpu")
        if backend == "nccl":
            if not torch.cuda.is_available():
                raise ValidationError("backend='nccl' needs CUDA GPUs; use backend='gloo' on CPUs")
            if local_rank >= torch.cuda.device_count():
                raise ValidationError(
                    f"LOCAL_RANK={local_rank} but this host has {torch.cuda.device_count()} GPU(s): start at "
                    "most one process per GPU (--nproc-per-node)"
                )
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        owns = not dist.is_initialized()
        if owns:
            dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
        strategy = cls(device=device)
        strategy._owns_group = owns
        return strategy

    # ---- the data ------------------------------------------------------------------------------
    def local_data(self, X, Y, label_mask=None):
        """This rank's rows and their place in the global row order: ``(X, Y, label_mask, RowShard)``.

        Either every rank passes the same full data set (detected: same shapes, non-zeros and sums
        on every rank), of which each rank keeps its :func:`shard_bounds` share; or each rank passes
        its own shard (from :func:`~bayesmlc.data.shard.read_shard`), and the global rows are the shards in rank order.
        One ``all_gather`` of seven numbers per rank. Ranks whose widths (D, L) differ stop with
        :class:`RanksOutOfStepError`.
        """
        self.sync_failure(None, collective=_collective_id(_LOCAL_DATA, 8 * 7))
        mine = torch.tensor([
            X.shape[0], X.shape[1], Y.shape[1], X.nnz, float(np.sum(X.data, dtype=np.float64)), Y.nnz,
            float(np.sum(Y.indices, dtype=np.float64)),
        ], dtype=torch.float64, device=self.device)
        table = [torch.empty_like(mine) for _ in range(self.world_size)]
        try:
            self._dist.all_gather(table, mine)
        except BaseException:
            self._broken = True
            raise
        table = torch.stack(table).cpu().numpy()
        if (table[:, 1:3] != table[0, 1:3]).any():
            raise RanksOutOfStepError(
                "the ranks were given data of different widths (features, labels per rank: "
                f"{', '.join(f'{int(d)}, {int(l)}' for d, l in table[:, 1:3])}): every rank's rows must come from "
                "the same data set"
            )
        if self.world_size > 1 and (table == table[0]).all():  # the full data set on every rank
            start, stop = shard_bounds(X.shape[0], self.rank, self.world_size)
            shard = RowShard(start, stop, X.shape[0])
            mask = None if label_mask is None else label_mask[start:stop]
            return X[start:stop], Y[start:stop], mask, shard
        counts = table[:, 0].astype(np.int64)
        start = int(counts[: self.rank].sum())
        return X, Y, label_mask, RowShard(start, start + X.shape[0], int(counts.sum()))

    def reduce_sum(self, array, checked: bool = True) -> np.ndarray:
        """Element-wise sum over ranks of ``array`` (one ``all_reduce``), in its dtype when that is
        float32 or float64, in float64 otherwise (integers, lists). ``checked=False`` skips the
        failure and step check of :meth:`sync_failure` before it (half the messages), for a loop of
        many small sums whose every iteration the ranks are known to reach together (BMLS's blocks
        of features); a failure there ends at the process group's timeout."""
        array = _reducible(array)
        if checked:
            self.sync_failure(None, collective=_collective_id(_REDUCE_SUM, array.nbytes))
        buffer = torch.from_numpy(np.array(array)).to(self.device)  # a copy: the caller's array stays
        self._all_reduce(buffer)
        return buffer.cpu().numpy()

    def bound_weights(self, n_total, kl_weight, n_local: int, n_global: int):
        """(data-term scale, KL weight) that make the per-rank bounds sum to the global one.

        A minibatch bound is ``(n_total / n_batch) * data(batch) - kl_weight * KL``. Evaluated on
        ``n_local`` of the ``n_global`` rows with ``n_total * n_local / n_global`` in place of
        ``n_total``, its data term is scaled by ``n_total / n_global``, as in the single-process
        bound; the KL enters on rank 0 only. Summed over ranks: the single-process bound.
        """
        return n_total * n_local / n_global, kl_weight if self.is_main else 0.0

    # ---- failures -----------------------------------------------------------------------------
    def sync_failure(self, exc: BaseException | None = None, parameters=None, collective: float = 0.0) -> None:
        """Agree with the other ranks whether any of them failed since the last collective.

        Every rank calls this at the same points: the strategy before each of its own collectives,
        the caller with the exception it caught (or None when training ended). One small
        ``all_gather`` carries, per rank, a failure flag, the number of this call, when
        ``parameters`` are given their sum of squares, and ``collective``, a number that identifies
        the collective that follows (its kind and size in bytes). If some rank failed, the failure messages
        are gathered: a rank that passed its own ``exc`` returns (its caller re-raises the
        original), every other rank raises :class:`RankFailedError` naming the failing ranks.
        Otherwise, if the ranks are at different calls or collectives or hold different
        parameters, every rank raises :class:`RanksOutOfStepError` (instead of pairing unrelated
        collectives, which gloo answers by aborting the process, or training diverged replicas).
        """
        if self._broken or isinstance(exc, (RankFailedError, RanksOutOfStepError)):
            return  # the other ranks already know, or can no longer be reached
        self._syncs += 1
        checksum = math.nan
        if parameters is not None:
            checksum = torch.stack([p.detach().double().pow(2).sum() for p in parameters]).sum().item()
        mine = torch.tensor([0.0 if exc is None else 1.0, float(self._syncs), checksum, float(collective)],
                            dtype=torch.float64, device=self.device)
        table = [torch.empty_like(mine) for _ in range(self.world_size)]
        try:
            self._dist.all_gather(table, mine)
            flags, syncs, checksums, collectives = torch.stack(table).cpu().numpy().T
            messages = [None] * self.world_size
            if flags.any():
                self._dist.all_gather_object(messages, None if exc is None else _describe(exc))
        except BaseException:
            self._broken = True
            raise
        if flags.any():
            if exc is None:
                raise RankFailedError({rank: text for rank, text in enumerate(messages) if text is not None})
            return
        if (syncs != syncs[0]).any():
            raise RanksOutOfStepError(
                f"the ranks are out of step (at synchronisation {', '.join(str(int(v)) for v in syncs)} on ranks "
                f"0..{self.world_size - 1}): give every rank the same data, settings and seed"
            )
        if (collectives != collectives[0]).any():
            raise RanksOutOfStepError(
                "the ranks are out of step (they reached different collectives): they did not start from the same "
                "data, settings, seed or checkpoint (with resume=True every rank must read the same checkpoint file)"
            )
        if not np.isnan(checksums).any() and not np.allclose(checksums, checksums[0], rtol=1e-6, atol=0.0):
            raise RanksOutOfStepError(
                "the ranks hold different parameters (sums of squares "
                f"{', '.join(f'{v:.9g}' for v in checksums)}): they did not start from the same data, seed or "
                "checkpoint (with resume=True every rank must read the same checkpoint file)"
            )

    # ---- collectives --------------------------------------------------------------------------
    def reduce_gradients(self, parameters, value: torch.Tensor) -> float:
        """Sum every parameter's gradient over ranks with one flattened ``all_reduce``.

        The message has the parameters' dtype (float32 by default: half the bytes of float64).
        ``value`` (a scalar, e.g. this rank's share of the bound) travels in the same message and
        its total is returned. A gradient that is None on every rank stays None; one that is None
        on some ranks counts as zero there.
        """
        parameters = list(parameters)
        size = 1 + sum(p.numel() + 1 for p in parameters)
        dtype = parameters[0].dtype if parameters else torch.float64
        element_bytes = torch.empty((), dtype=dtype).element_size()
        self.sync_failure(None, parameters, collective=_collective_id(_REDUCE_GRADIENTS, size * element_bytes))
        # layout: [value, grad_0 (flat), has_grad_0, grad_1 (flat), has_grad_1, ...], filled in place
        buffer = torch.zeros(size, dtype=dtype, device=self.device)
        buffer[0] = torch.as_tensor(value).detach().to(device=self.device, dtype=dtype).reshape(())
        spans, start = [], 1
        for param in parameters:
            stop = start + param.numel()
            if param.grad is not None:
                buffer[start:stop].copy_(param.grad.detach().reshape(-1))
                buffer[stop] = 1.0
            spans.append((start, stop))
            start = stop + 1
        self._all_reduce(buffer)
        has_grad = buffer[[stop for _, stop in spans]].tolist() if parameters else []
        for param, (start, stop), count in zip(parameters, spans, has_grad):
            if count > 0:
                summed = buffer[start:stop].view(param.shape).to(device=param.device, dtype=param.dtype)
                if param.grad is None:
                    param.grad = summed
                else:
                    param.grad.copy_(summed)
        return float(buffer[0])

    def sum_counts(self, *counts):
        """Totals over ranks of per-rank counts (ints or floats), in the same order and types."""
        self.sync_failure(None, collective=_collective_id(_SUM_COUNTS, 8 * len(counts)))
        buffer = torch.tensor([float(c) for c in counts], dtype=torch.float64, device=self.device)
        self._all_reduce(buffer)
        return tuple(type(c)(v) for c, v in zip(counts, buffer.tolist()))

    def gather_rows(self, rows, global_ids, shard: RowShard):
        """The rows ``global_ids`` (any order) of a row-sharded matrix whose local part is ``rows``
        (sparse or dense, ``shard.n_local`` rows), on every rank, in the type of ``rows``; unlike
        :meth:`RowShard.gather` a sparse matrix stays sparse (a sample of rows of a wide bag of
        words, e.g. BNMC's mixture initialisation). One ``all_gather_object``."""
        global_ids = np.asarray(global_ids, dtype=np.int64)
        held = np.flatnonzero((global_ids >= shard.start) & (global_ids < shard.stop))
        self.sync_failure(None, collective=_collective_id(_GATHER_ROWS, 8 * global_ids.size))
        parts = [None] * self.world_size
        try:
            self._dist.all_gather_object(parts, (held, rows[global_ids[held] - shard.start]))
        except BaseException:
            self._broken = True
            raise
        positions = np.concatenate([part[0] for part in parts])
        stacked = sp.vstack([part[1] for part in parts], format="csr") if sp.issparse(rows) else \
            np.concatenate([part[1] for part in parts])
        return stacked[np.argsort(positions, kind="stable")]

    def _all_reduce(self, buffer: torch.Tensor) -> None:
        try:
            self._dist.all_reduce(buffer)
        except BaseException:
            self._broken = True
            raise

    def close(self) -> None:
        """Leave the process group if :meth:`from_env` created it.

        Unreachable objects are collected first: a caught error's traceback can keep tensors of an
        interrupted step alive in a reference cycle, and freed only at interpreter shutdown, after
        the group is gone, they made gloo abort the process (SIGABRT, "terminate called without an
        active exception") in about one exit in fifteen.
        """
        if self._owns_group and self._dist.is_initialized():
            gc.collect()
            self._dist.destroy_process_group()
        self._owns_group = False


def _reducible(array) -> np.ndarray:
    """``array`` as float32 or float64 (its own dtype when it is one of them)."""
    array = np.asarray(array)
    return array if array.dtype in (np.float32, np.float64) else array.astype(np.float64)


# kinds of collective, for the check that all ranks reach the same one (see DataParallel.sync_failure)
_LOCAL_DATA, _REDUCE_SUM, _REDUCE_GRADIENTS, _SUM_COUNTS, _GATHER_ROWS = 1, 2, 3, 4, 5


def _collective_id(kind: int, n_bytes: int) -> float:
    """One number naming a collective's kind and message size in bytes (exact in float64 below 2^50)."""
    return float(n_bytes * 8 + kind)


def _describe(exc: BaseException) -> str:
    """One line naming the exception and where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"
