"""PNG plots of a suite's runs (matplotlib, Agg canvas; no display needed).

Per dataset:

* ``<dataset>-objective.png``: each model's training objective (ELBO, log-likelihood, penalised
  log-likelihood: the model's own ``history_["objective"]``) against wall time, one panel per model
  because the objectives are on different scales;
* ``<dataset>-p1-time.png``: test P@1 against training time, one point per model (median over
  repeats), plus the model's P@1 curve during training when its history logs ``"P@1"``, and hollow
  diamonds for the reference runs of other tools that state both numbers;
* ``<dataset>-reliability.png``: a reliability diagram per model (fraction relevant against the mean
  predicted probability, per probability bin, from the run's ``reliability.json``) of the top-1 and the
  top-5 (label, probability) pairs of each row, with the all-pairs diagram in grey; calibrated
  configurations get panels of their own;
* ``<dataset>-risk-coverage.png``: the top-1 risk-coverage curve of every model (error of the top-1
  label among the most confident rows kept, against the share kept), raw models on the left and
  calibrated ones on the right when the suite ran them.

For the scale suite, ``scale.png``: seconds per epoch and peak memory against N, D and L.
Curves come from the first finished repeat of each configuration.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .published import published_for
from .report import summarise

__all__ = ["make_plots", "PLOTS_DIR"]

PLOTS_DIR = "plots"


def _figure(n_panels: int, panel_size=(4.2, 3.3), max_columns: int = 3):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = max(1, min(max_columns, n_panels))
    rows = max(1, math.ceil(n_panels / columns))
    figure = Figure(figsize=(panel_size[0] * columns, panel_size[1] * rows), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for extra in axes[n_panels:]:
        extra.set_visible(False)
    return figure, axes[:n_panels]


def _save(figure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, bbox_inches="tight")


def _colours(labels) -> dict:
    from matplotlib import colormaps

    palette = colormaps["tab10"].colors + colormaps["Dark2"].colors
    return {label: palette[i % len(palette)] for i, label in enumerate(labels)}


def _plain_log_scale(ax, which: str, values) -> None:
    """Log-scale ``ax``'s ``which`` ("x" or "y") axis, with ticks reading 0.5, 2, 300 rather than 5x10^-1;
    ticks at 1, 2 and 5 per decade when ``values`` span at most 1.6 decades, else at powers of ten (more
    would crowd six-digit labels)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    positive = [v for v in values if v and v > 0]
    decades = math.log10(max(positive) / min(positive)) if positive else 0.0
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 1.6 else (1.0,)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda value, _: ""))


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _run_file(out_dir: Path, summary, name: str):
    """The JSON file ``name`` of the summary's first finished run that has one."""
    for record in summary.records:
        if record.get("run_dir"):
            content = _read_json(out_dir / record["run_dir"] / name)
            if content:
                return content
    return None


def _finite_pairs(xs, ys):
    pairs = [(float(x), float(y)) for x, y in zip(xs or [], ys or [])
             if x is not None and y is not None and np.isfinite(x) and np.isfinite(y)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _objective_plot(dataset, summaries, out_dir, path, colours) -> bool:
    curves = []
    for summary in summaries:
        history = _run_file(out_dir, summary, "history.json") or {}
        times, objective = _finite_pairs(history.get("wall_time"), history.get("objective"))
        if times:
            curves.append((summary.label, times, objective))
    if not curves:
        return False
    figure, axes = _figure(len(curves))
    for ax, (label, times, objective) in zip(axes, curves):
        ax.plot(times, objective, color=colours[label], marker="." if len(times) < 40 else None, lw=1.5)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("wall time since fit began (s)")
        ax.set_ylabel("training objective (higher is better)")
        ax.grid(alpha=0.3)
    figure.suptitle(f"{dataset}: training objective against wall time", fontsize=11)
    _save(figure, path)
    return True


def _p1_plot(dataset, summaries, out_dir, path, colours) -> bool:
    points = [(s, s.median("train_seconds"), s.median("P@1")) for s in summaries]
    points = [(s, t, p) for s, t, p in points if t is not None and p is not None]
    if not points:
        return False
    figure, (ax,) = _figure(1, panel_size=(10.0, 4.8))
    for summary, seconds, p1 in points:
        colour = colours[summary.label]
        history = _run_file(out_dir, summary, "history.json") or {}
        times, curve = _finite_pairs(history.get("wall_time"), history.get("P@1"))
        if times:
            ax.plot([max(t, 1e-3) for t in times], [100 * v for v in curve], color=colour, lw=1, alpha=0.7)
        ax.scatter([max(seconds, 1e-3)], [100 * p1], color=colour, s=45, label=summary.label, zorder=3,
                   edgecolors="black", linewidths=0.5)
        all_seconds, all_p1 = summary.values("train_seconds"), summary.values("P@1")
        if len(all_seconds) > 1:  # repeats: bars span min..max
            ax.errorbar([max(seconds, 1e-3)], [100 * p1], color=colour, lw=1, capsize=3,
                        xerr=[[seconds - min(all_seconds)], [max(all_seconds) - seconds]],
                        yerr=[[100 * (p1 - min(all_p1))], [100 * (max(all_p1) - p1)]])
    references = [e for e in published_for(dataset) if "P@1" in e.metrics and "train_seconds" in e.metrics]
    shown_seconds = [max(t, 1e-3) for _, t, _ in points] + [max(e.metrics["train_seconds"], 1e-3) for e in references]
    for entry, marker in zip(references, "Ds^v<>"):
        ax.scatter([max(entry.metrics["train_seconds"], 1e-3)], [100 * entry.metrics["P@1"]], s=50,
                   facecolors="none", edgecolors="black", marker=marker, linewidths=1,
                   label=f"{entry.method} ({entry.kind})")
    _plain_log_scale(ax, "x", shown_seconds)
    ax.set_xlabel("training time (s, log scale)")
    ax.set_ylabel("test P@1 (%)")
    ax.set_title(f"{dataset}: P@1 against training time\n(points: final, median over repeats, bars min to max; "
                 "lines: during training)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    _save(figure, path)
    return True


def _reliability_points(curve: dict):
    counts = np.asarray(curve.get("counts") or [], dtype=float)
    used = counts > 0
    predicted = np.asarray(curve["mean_predicted"], dtype=float)[used]
    observed = np.asarray(curve["observed"], dtype=float)[used]
    return predicted, observed, counts[used] / max(counts.sum(), 1.0)


def _reliability_plot(dataset, summaries, out_dir, path, colours) -> bool:
    panels = []
    for summary in summaries:
        curve = _run_file(out_dir, summary, "reliability.json")
        if curve and curve.get("counts"):
            panels.append((summary, curve))
    if not panels:
        return False
    figure, axes = _figure(len(panels), panel_size=(3.6, 3.4), max_columns=4)
    for ax, (summary, curve) in zip(axes, panels):
        ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=1)
        predicted, observed, _ = _reliability_points(curve)
        ax.plot(predicted, observed, color="grey", lw=1, alpha=0.6, label="all pairs")
        colour = colours[summary.label]
        for key, marker, style in (("top1", "o", "-"), ("top5", "s", ":")):
            if not (curve.get(key) or {}).get("counts"):
                continue
            predicted, observed, share = _reliability_points(curve[key])
            ax.plot(predicted, observed, color=colour, lw=1.2, ls=style, label=key.replace("top", "top-"))
            ax.scatter(predicted, observed, s=8 + 300 * np.sqrt(share), color=colour, marker=marker,
                       edgecolors="black", linewidths=0.4, zorder=3)
        figures = [f"{name} {value:.3f}" for name, value in
                   (("ECE@1", summary.median("ECE@1")), ("ECE@5", summary.median("ECE@5"))) if value is not None]
        ax.set_title(summary.label + ("\n" + ", ".join(figures) if figures else ""), fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("mean predicted probability")
        ax.set_ylabel("fraction relevant")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    figure.suptitle(f"{dataset}: reliability of the top-1 and top-5 predictions (marker area grows with the bin's "
                    "share of pairs; grey: all label pairs)", fontsize=10)
    _save(figure, path)
    return True


def _risk_coverage_plot(dataset, summaries, out_dir, path, colours) -> bool:
    groups = {False: [], True: []}
    for summary in summaries:
        curve = (_run_file(out_dir, summary, "reliability.json") or {}).get("risk_coverage")
        if curve and curve.get("coverage"):
            groups[bool(summary.calibrate)].append((summary, curve))
    shown = [(calibrated, items) for calibrated, items in groups.items() if items]
    if not shown:
        return False
    figure, axes = _figure(len(shown), panel_size=(5.2, 4.0))
    for ax, (calibrated, items) in zip(axes, shown):
        for summary, curve in items:
            area = summary.median("AURC")
            ax.plot(curve["coverage"], curve["risk"], color=colours[summary.label], lw=1.4,
                    label=summary.label + (f", AURC {area:.3f}" if area is not None else ""))
        ax.set_xlim(0, 1)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("coverage (share of rows kept, most confident first)")
        ax.set_ylabel("risk (top-1 error among rows kept)")
        ax.set_title("calibrated" if calibrated else "raw", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    figure.suptitle(f"{dataset}: top-1 risk against coverage (lower is better)", fontsize=10)
    _save(figure, path)
    return True


def _scale_plot(summaries, path) -> bool:
    dims = (("n_train", "N (training rows)"), ("n_features", "D (features)"), ("n_labels", "L (labels)"))
    quantities = (("seconds_per_epoch", "seconds per epoch / sweep"), ("peak_rss_mb", "peak memory (MB)"))
    series = []
    for summary in summaries:
        shape = next((r.get("dataset_shape") for r in summary.records if r.get("dataset_shape")), None)
        if shape:
            series.append((summary, shape))
    if not series:
        return False
    models = list(dict.fromkeys(summary.model for summary, _ in series))
    colours = _colours(models)
    figure, axes = _figure(6, panel_size=(4.2, 3.4))
    for row, (quantity, quantity_label) in enumerate(quantities):
        for column, (dim, dim_label) in enumerate(dims):
            ax = axes[3 * row + column]
            others = [name for name, _ in dims if name != dim]
            for model in models:
                points = [(shape, summary.median(quantity)) for summary, shape in series
                          if summary.model == model and summary.median(quantity) is not None and shape.get(dim)]
                ax.scatter([shape[dim] for shape, _ in points], [value for _, value in points], color=colours[model],
                           s=30, edgecolors="black", linewidths=0.4, label=model, zorder=3)
                # a line joins the sets that differ in this dimension only (the sweeps)
                groups: dict[tuple, list] = {}
                for shape, value in points:
                    groups.setdefault(tuple(shape.get(name) for name in others), []).append((shape[dim], value))
                for group in groups.values():
                    if len(group) > 1:
                        group.sort()
                        ax.plot([x for x, _ in group], [y for _, y in group], color=colours[model], lw=1.2)
            _plain_log_scale(ax, "x", [shape.get(dim) for _, shape in series])
            _plain_log_scale(ax, "y", [summary.median(quantity) for summary, _ in series])
            ax.set_xlabel(dim_label + ", log scale")
            ax.set_ylabel(quantity_label)
            ax.grid(alpha=0.3, which="both")
    handles, names = axes[0].get_legend_handles_labels()
    figure.legend(handles, names, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9)
    figure.suptitle("scale suite: time per epoch and peak memory against N, D and L "
                    "(lines join sets that differ in that dimension only)", fontsize=11)
    _save(figure, path)
    return True


def make_plots(records, out_dir, quality: bool = True) -> dict:
    """Write the PNGs under ``OUT/plots/``; returns ``{dataset or "scale": [(caption, relative path)]}``."""
    out_dir = Path(out_dir)
    folder = out_dir / PLOTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    summaries = [s for s in summarise(records) if s.records]
    # a calibrated configuration CONFIG+METHOD is drawn in the colour of CONFIG
    base = {s.label: (s.label.replace(f"+{s.calibrate})", ")") if s.calibrate else s.label) for s in summaries}
    palette = _colours(list(dict.fromkeys(base.values())))
    colours = {label: palette[plain] for label, plain in base.items()}
    made: dict[str, list] = {}
    if not quality:
        if _scale_plot(summaries, folder / "scale.png"):
            made["scale"] = [("time per epoch and peak memory against N, D and L", f"{PLOTS_DIR}/scale.png")]
        return made
    for dataset in dict.fromkeys(s.dataset for s in summaries):
        mine = [s for s in summaries if s.dataset == dataset]
        for suffix, caption, draw in (
            ("objective", "training objective against wall time", _objective_plot),
            ("p1-time", "P@1 against training time", _p1_plot),
            ("reliability", "reliability diagrams", _reliability_plot),
            ("risk-coverage", "risk-coverage curves", _risk_coverage_plot),
        ):
            name = f"{dataset}-{suffix}.png"
            if draw(dataset, mine, out_dir, folder / name, colours):
                made.setdefault(dataset, []).append((f"{dataset}: {caption}", f"{PLOTS_DIR}/{name}"))
    return made
