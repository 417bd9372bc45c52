"""The lists MLGPF records while it trains: one entry per epoch (``MLGPF.history_``) and one per
optimisation step (``MLGPF.step_history_``). The trainer (:mod:`bayesmlc.gp.training`) fills them and
a checkpoint (:mod:`bayesmlc.gp.checkpoints`) stores them, checked against these field names."""

from __future__ import annotations

__all__ = ["EPOCH_FIELDS", "STEP_FIELDS", "new_history", "new_step_history"]

#: the per-epoch lists
EPOCH_FIELDS = ("epoch", "wall_time", "objective", "kl", "batch_size", "jitter", "train_P@1", "val_P@1", "val_P@3",
                "val_P@5")
#: the per-step lists
STEP_FIELDS = ("step", "wall_time", "elbo")


def new_history() -> dict:
    """Empty per-epoch history lists (see ``MLGPF.history_``)."""
    return {key: [] for key in EPOCH_FIELDS}


def new_step_history() -> dict:
    """Empty per-step history lists (see ``MLGPF.step_history_``)."""
    return {key: [] for key in STEP_FIELDS}
