"""Small pure pieces of the MLGPF training loop: batches, schedule, optimiser, checks, checkpoints."""

from __future__ import annotations

import math
import os
import zipfile

import numpy as np
import torch

from ..exceptions import ModelFormatError
from ..persistence import decode, encode, read_npz, write_npz_atomically

__all__ = [
    "TrainingDivergedError",
    "epoch_batches",
    "resolve_batch_size",
    "batch_size_at",
    "make_optimizer",
    "learning_rate_factor",
    "step_progress",
    "all_finite",
    "early_stop",
    "save_checkpoint",
    "load_checkpoint",
    "optimizer_state_from_checkpoint",
]

CHECKPOINT_FORMAT = "bayesmlc-mlgpf-checkpoint"
CHECKPOINT_VERSION = 1


class TrainingDivergedError(FloatingPointError):
    """The bound or its gradient became NaN or infinite; the model keeps the last good parameters."""


def epoch_batches(n_rows: int, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch: a fresh random permutation of ``range(n_rows)`` cut into batches (last may be short).

    Per-epoch permutations (not the reference code's shuffle-after-repeat) so every row is seen once
    per epoch.
    """
    order = rng.permutation(n_rows)
    return [np.sort(order[start : start + batch_size]) for start in range(0, n_rows, batch_size)]


#: ``batch_size="auto"``: rows per batch at most, steps per epoch at least, rows per batch at least.
AUTO_BATCH_ROWS, AUTO_MIN_STEPS, AUTO_MIN_ROWS = 500, 8, 32


def resolve_batch_size(batch_size, n_rows: int) -> int:
    """The starting batch size: ``batch_size`` itself, or for ``"auto"``
    ``min(500, max(32, ceil(n_rows / 8)))``.

    "auto" keeps the batch of 500 that the Bibtex measurements used (4,880 rows: 10 steps an epoch)
    and shrinks it on smaller sets so that an epoch still takes at least 8 Adam steps: with 500 rows
    a batch a 333-row set gets one step per epoch, and 50 epochs leave the model far from converged
    (docs/mlgpf.md, "Small and dense data sets").
    """
    if batch_size == "auto":
        return min(AUTO_BATCH_ROWS, max(AUTO_MIN_ROWS, math.ceil(n_rows / AUTO_MIN_STEPS)))
    return int(batch_size)


def batch_size_at(epoch: int, batch_size: int, growth: int, every: int, max_batch_size: int | None) -> int:
    """Batch size in 0-based ``epoch``: ``batch_size + growth * (epoch // every)``, capped.

    The authors' code grows the batch by 20 every 10 epochs (reference notes, sec. 1.8).
    """
    size = batch_size + (growth * (epoch // every) if growth and every else 0)
    return size if max_batch_size is None else min(size, max(max_batch_size, batch_size))


def make_optimizer(module: torch.nn.Module, learning_rate: float, variational_learning_rate: float | None):
    """Adam over all trainable parameters; those of ``module.variational`` and the factor loadings may
    get their own learning rate (the notes found a higher one for variational parameters helps)."""
    variational_names = {f"variational.{name}" for name, _ in module.variational.named_parameters()}
    variational, others = [], []
    for name, param in module.named_parameters():
        if param.requires_grad:
            (variational if name in variational_names else others).append(param)
    rate = learning_rate if variational_learning_rate is None else variational_learning_rate
    return torch.optim.Adam(
        [{"params": others, "lr": learning_rate}, {"params": variational, "lr": rate}]
    )


def step_progress(epoch: int, step: int, steps_in_epoch: int, epochs: int) -> float:
    """Fraction of training done before 0-based ``step`` of 0-based ``epoch``:
    ``(epoch + step / steps_in_epoch) / epochs``, in [0, 1)."""
    return (epoch + step / steps_in_epoch) / epochs


def learning_rate_factor(progress: float, decay_fraction: float) -> float:
    """Multiplier of the base learning rate at training ``progress`` in [0, 1]: a constant rate, then
    a cosine decay to zero over the last ``decay_fraction`` of training.

    factor = 1                               for progress <= 1 - decay_fraction,
    factor = (1 + cos(pi t)) / 2,  t = (progress - (1 - decay_fraction)) / decay_fraction, otherwise.

    ``decay_fraction = 0`` keeps the rate constant. Stochastic-gradient Adam keeps the iterate
    bouncing around the optimum at a constant rate (test P@1 moved by about 1 point between
    evaluations on Bibtex); shrinking the step at the end settles it.
    """
    if decay_fraction <= 0.0 or progress <= 1.0 - decay_fraction:
        return 1.0
    t = min(1.0, (progress - (1.0 - decay_fraction)) / decay_fraction)
    return 0.5 * (1.0 + math.cos(math.pi * t))


def all_finite(loss: torch.Tensor, parameters) -> bool:
    """True when the loss and every gradient are finite."""
    if not torch.isfinite(loss).all():
        return False
    return all(p.grad is None or torch.isfinite(p.grad).all() for p in parameters)


def early_stop(scores: list[float], patience: int) -> bool:
    """True when the best of ``scores`` (higher is better; NaN = not evaluated) is more than
    ``patience`` evaluations old."""
    evaluated = [s for s in scores if not math.isnan(s)]
    if len(evaluated) <= patience:
        return False
    best = int(np.argmax(evaluated))
    return len(evaluated) - 1 - best >= patience


def save_checkpoint(path, payload: dict) -> None:
    """Write ``payload`` (tensors, arrays, dicts, numbers) atomically: temporary file, then rename."""
    arrays: dict = {}
    meta = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "payload": encode(payload, arrays, "c")}
    write_npz_atomically(path, meta, arrays)


def load_checkpoint(path) -> dict:
    """Read a checkpoint written by :func:`save_checkpoint`."""
    path = os.fspath(path)
    try:
        meta, arrays = read_npz(path)
    except (OSError, ValueError, KeyError, UnicodeDecodeError, zipfile.BadZipFile) as exc:
        raise ModelFormatError(f"{path}: not a readable MLGPF checkpoint ({exc})") from None
    if meta.get("format") != CHECKPOINT_FORMAT or meta.get("version", 0) > CHECKPOINT_VERSION:
        raise ModelFormatError(f"{path}: not an MLGPF checkpoint this version can read")
    return decode(meta["payload"], arrays)


def optimizer_state_from_checkpoint(state: dict) -> dict:
    """Undo the string keys JSON gave the optimizer's per-parameter state."""
    return {
        "state": {int(k): v for k, v in state["state"].items()},
        "param_groups": state["param_groups"],
    }
