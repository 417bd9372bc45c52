"""Plot a training history (``model.history_``): the objective against wall time from 0 with the
set-up marked, and the P@k curves against the epoch."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["plot_history", "setup_seconds"]

#: history keys that count training units, with the name of the unit (bayesmlc.bench.runner.EPOCH_KEYS)
_UNITS = (("epoch", "epoch"), ("sweep", "Gibbs sweep"), ("pass", "pass"))


def setup_seconds(wall_time) -> tuple[float, bool]:
    """``(seconds, estimated)``: how long the fit ran before its first training unit began.

    ``wall_time`` holds the seconds since the fit began at the end of each logged unit, so the first
    entry is the set-up plus one unit. With two or more entries the unit's length is taken as the
    median gap between entries and subtracted (``estimated`` is True); with one entry the set-up
    cannot be told from the unit and the first entry is returned whole (``estimated`` is False).
    """
    times = np.asarray(wall_time, dtype=float)
    if times.size < 2:
        return float(times[0]), False
    return max(0.0, float(times[0] - np.median(np.diff(times)))), True


def _unit(history: dict) -> tuple[list, str]:
    for key, name in _UNITS:
        if history.get(key):
            return list(history[key]), name
    return list(range(1, len(history["wall_time"]) + 1)), "logged step"


def _precision_label(key: str) -> str:
    if key.startswith("train_"):
        return key[len("train_"):] + " on training batches (running)"
    if key.startswith("val_"):
        return key[len("val_"):] + " on the validation rows"
    return key


def plot_history(history: dict, path=None, title: str | None = None):
    """Draw ``history`` and write it to ``path`` (any Matplotlib format, by the extension) when given;
    returns the Matplotlib ``Figure``.

    Left: the objective (the model's own: the mean minibatch ELBO estimate per epoch for MLGPF) against
    wall time in seconds, the axis starting at 0, the set-up before the first unit shaded (see
    :func:`setup_seconds`). Right, when P@k keys exist: running training P@1 and, where evaluated,
    validation P@1/P@3/P@5 against the epoch, ticks at whole epochs. The figure's title is ``title``
    (default ``"Training history"``) with the number of units and the total time.

    Parameters
    ----------
    history : dict of equal-length lists (``wall_time``, ``objective``, optionally ``epoch``,
        ``sweep`` or ``pass``, ``train_P@1``, ``val_P@1``, ...).
    path : str or Path, optional, the image file to write.
    title : str, optional, what was trained (``"mlgpf on bibtex"``).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    if not history.get("wall_time") or len(history["wall_time"]) != len(history.get("objective", [])):
        raise ValueError("history needs equal-length, non-empty 'wall_time' and 'objective' lists")
    times = [float(t) for t in history["wall_time"]]
    units, unit_name = _unit(history)
    precision_keys = [k for k in history if "P@" in k and any(not _missing(v) for v in history[k])]
    figure = Figure(figsize=(10 if precision_keys else 5.5, 4.0))
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 2 if precision_keys else 1, squeeze=False)[0]

    ax = axes[0]
    setup, estimated = setup_seconds(times)
    ax.axvspan(0.0, setup, color="grey", alpha=0.2, lw=0,
               label=(f"set-up, about {setup:.1f} s (first point less one {unit_name})" if estimated
                      else f"set-up and the first {unit_name} ({setup:.1f} s)"))
    objective = [float("nan") if _missing(v) else float(v) for v in history["objective"]]
    ax.plot(times, objective, marker=".", label="objective")
    ax.set_xlim(0.0, max(times) * 1.02 if max(times) > 0 else 1.0)
    ax.set_xlabel("wall time since the fit began (s)")
    ax.set_ylabel("objective (higher is better)")
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    if precision_keys:
        ax = axes[1]
        for key in precision_keys:
            points = [(u, v) for u, v in zip(units, history[key]) if not _missing(v)]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=_precision_label(key))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(left=0)
        ax.set_xlabel(unit_name)
        ax.set_ylabel("precision")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    n_units = len(set(units))
    plural = unit_name if n_units == 1 else ("passes" if unit_name == "pass" else unit_name + "s")
    figure.suptitle(f"{title or 'Training history'}: {n_units} {plural}, {times[-1]:.1f} s", fontsize=11)
    figure.tight_layout()
    if path is not None:
        figure.savefig(path)
    return figure


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
