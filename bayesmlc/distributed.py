"""Data-parallel training on ``torch.distributed``: the strategy object a training loop consults.

A training loop written against this module runs unchanged in one process (:class:`SingleProcess`,
every method a no-op) or in ``W`` processes started by ``torchrun`` (:class:`DataParallel`). The
scheme is synchronous and exact:

* every rank draws the same global minibatch (the same seed drives the same permutation on every
  rank) and computes the bound on its contiguous share of it, :meth:`DataParallel.local_rows`;
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

    from bayesmlc.distributed import DataParallel
    parallel = DataParallel.from_env()          # gloo on CPUs, nccl on GPUs (cuda:LOCAL_RANK)
    model = MLGPF(device=parallel.device, ...)
    model.fit(X, Y, parallel=parallel)          # every rank reads the same data and seed
    if parallel.is_main:
        model.save("model.npz")                 # rank 0 alone writes
    parallel.close()

See ``docs/scaling.md`` for the launch commands (several GPUs, several hosts) and memory bounds.
"""

from __future__ import annotations

import datetime
import math
import os
import traceback

import numpy as np
import torch

from .exceptions import BayesMLCError, ValidationError

__all__ = [
    "SingleProcess", "DataParallel", "RankFailedError", "RanksOutOfStepError", "shard_bounds", "DEFAULT_TIMEOUT_S",
]

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


def shard_bounds(n_rows: int, rank: int, world_size: int) -> tuple:
    """Rows ``[start, stop)`` of a batch of ``n_rows`` that ``rank`` computes.

    Contiguous shares whose sizes differ by at most one, the larger ones first (so rank 0 is empty
    only when the batch is); the shares of ranks 0..world_size-1 tile ``range(n_rows)`` in order.
    """
    base, extra = divmod(n_rows, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class SingleProcess:
    """The trivial strategy: one process computes everything; every hook leaves its input alone."""

    rank = 0
    world_size = 1
    is_main = True
    device = None

    def local_rows(self, n_rows: int) -> slice:
        """The part of a global batch of ``n_rows`` this process computes: all of it."""
        return slice(0, n_rows)

    def bound_weights(self, n_total, kl_weight, n_local: int, n_global: int):
        """(data-term scale, KL weight) for this process's bound: unchanged."""
        return n_total, kl_weight

    def sync_failure(self, exc: BaseException | None = None, parameters=None) -> None:
        """Nothing to agree on in one process; the caller re-raises ``exc`` itself."""

    def reduce_gradients(self, parameters, value: torch.Tensor) -> float:
        """Gradients stay as they are; returns ``float(value)``."""
        return float(value)

    def sum_counts(self, *counts):
        """Totals over processes of per-process counts: the counts themselves."""
        return counts

    def close(self) -> None:
        """Nothing to release."""


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

    # ---- the global batch ---------------------------------------------------------------------
    def local_rows(self, n_rows: int) -> slice:
        """This rank's contiguous share of a global batch of ``n_rows`` rows (see :func:`shard_bounds`)."""
        start, stop = shard_bounds(n_rows, self.rank, self.world_size)
        return slice(start, stop)

    def bound_weights(self, n_total, kl_weight, n_local: int, n_global: int):
        """(data-term scale, KL weight) that make the per-rank bounds sum to the global one.

        A minibatch bound is ``(n_total / n_batch) * data(batch) - kl_weight * KL``. Evaluated on
        ``n_local`` of the ``n_global`` rows with ``n_total * n_local / n_global`` in place of
        ``n_total``, its data term is scaled by ``n_total / n_global``, as in the single-process
        bound; the KL enters on rank 0 only. Summed over ranks: the single-process bound.
        """
        return n_total * n_local / n_global, kl_weight if self.is_main else 0.0

    # ---- failures -----------------------------------------------------------------------------
    def sync_failure(self, exc: BaseException | None = None, parameters=None) -> None:
        """Agree with the other ranks whether any of them failed since the last collective.

        Every rank calls this at the same points: the strategy before each of its own collectives,
        the caller with the exception it caught (or None when training ended). One small
        ``all_gather`` carries, per rank, a failure flag, the number of this call and, when
        ``parameters`` are given, their sum of squares. If some rank failed, the failure messages
        are gathered: a rank that passed its own ``exc`` returns (its caller re-raises the
        original), every other rank raises :class:`RankFailedError` naming the failing ranks.
        Otherwise, if the ranks are at different calls or hold different parameters, every rank
        raises :class:`RanksOutOfStepError` (instead of pairing unrelated collectives or training
        diverged replicas).
        """
        if self._broken or isinstance(exc, (RankFailedError, RanksOutOfStepError)):
            return  # the other ranks already know, or can no longer be reached
        self._syncs += 1
        checksum = math.nan
        if parameters is not None:
            checksum = torch.stack([p.detach().double().pow(2).sum() for p in parameters]).sum().item()
        mine = torch.tensor([0.0 if exc is None else 1.0, float(self._syncs), checksum],
                            dtype=torch.float64, device=self.device)
        table = [torch.empty_like(mine) for _ in range(self.world_size)]
        try:
            self._dist.all_gather(table, mine)
            flags, syncs, checksums = torch.stack(table).cpu().numpy().T
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
        self.sync_failure(None, parameters)
        dtype = parameters[0].dtype if parameters else torch.float64
        # layout: [value, grad_0 (flat), has_grad_0, grad_1 (flat), has_grad_1, ...], filled in place
        buffer = torch.zeros(1 + sum(p.numel() + 1 for p in parameters), dtype=dtype, device=self.device)
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
        self.sync_failure(None)
        buffer = torch.tensor([float(c) for c in counts], dtype=torch.float64, device=self.device)
        self._all_reduce(buffer)
        return tuple(type(c)(v) for c, v in zip(counts, buffer.tolist()))

    def _all_reduce(self, buffer: torch.Tensor) -> None:
        try:
            self._dist.all_reduce(buffer)
        except BaseException:
            self._broken = True
            raise

    def close(self) -> None:
        """Leave the process group if :meth:`from_env` created it."""
        if self._owns_group and self._dist.is_initialized():
            self._dist.destroy_process_group()
        self._owns_group = False


def _describe(exc: BaseException) -> str:
    """One line naming the exception and where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"
