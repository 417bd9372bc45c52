"""Plot an MLGPF training history (``model.history_``): ELBO against wall time, and P@1 curves."""

from __future__ import annotations

import math

__all__ = ["plot_history"]


def plot_history(history: dict, path) -> None:
    """Write a two-panel figure to ``path`` (any Matplotlib format, chosen by the extension).

    Left: the objective (mean minibatch ELBO estimate per epoch) against wall time in seconds.
    Right: running training P@1 and, where evaluated, validation P@1/P@3/P@5 against the epoch.
    Works for any bayesmlc history with ``wall_time`` and ``objective``; the right panel is drawn
    only when P@k keys exist.

    Parameters
    ----------
    history : dict of equal-length lists (``wall_time``, ``objective``, optionally ``epoch``,
        ``train_P@1``, ``val_P@1``, ...).
    path : str or Path, the image file to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not history.get("wall_time") or len(history["wall_time"]) != len(history.get("objective", [])):
        raise ValueError("history needs equal-length, non-empty 'wall_time' and 'objective' lists")
    precision_keys = [k for k in history if "P@" in k and any(not _missing(v) for v in history[k])]
    fig, axes = plt.subplots(1, 2 if precision_keys else 1, figsize=(10 if precision_keys else 5, 3.6), squeeze=False)
    ax = axes[0, 0]
    ax.plot(history["wall_time"], history["objective"], marker=".")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("objective (ELBO estimate)")
    ax.grid(alpha=0.3)
    if precision_keys:
        ax = axes[0, 1]
        epochs = history.get("epoch") or list(range(1, len(history["objective"]) + 1))
        for key in precision_keys:
            points = [(e, v) for e, v in zip(epochs, history[key]) if not _missing(v)]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=key)
        ax.set_xlabel("epoch")
        ax.set_ylabel("precision")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
