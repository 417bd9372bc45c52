"""PNG plots of a suite's runs (matplotlib, Agg canvas; no display needed).

Per dataset:

* ``<dataset>-objective.png``: each model's training objective (ELBO, log-likelihood, penalised
  log-likelihood: the model's own ``history_["objective"]``) against wall time, one panel per model
  because the objectives are on different scales;
* ``<dataset>-p1-time.png``: test P@1 against training time, one point per model (median over
  repeats, bars from minimum to maximum when there are repeats), and hollow markers for the reference
  runs of other tools that state both numbers; the subtitle lists only what is drawn;
* ``<dataset>-reliability.png``: a reliability diagram per model (fraction relevant against the mean
  predicted probability, per probability bin, from the run's ``reliability.json``) of the top-1 and the
  top-5 (label, probability) pairs of each row, with the all-pairs diagram in grey; calibrated
  configurations get panels of their own;
* ``<dataset>-risk-coverage.png``: the top-1 risk-coverage curve of every model (error of the top-1
  label among the most confident rows kept, against the share kept), raw models on the left and
  calibrated ones on the right when the suite ran them.

For the scale suite, ``scale.png``: a row of panels per quantity (seconds per epoch, per Gibbs sweep,
per pass: each unit is its own quantity; peak memory) against N, D and L, a line per configuration
through the sets that differ in one dimension only, with a legend in every panel.
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


def _p1_plot(dataset, summaries, out_dir, path, colours):
    """Test P@1 against training time, a point per configuration (the median over repeats, with bars
    from the minimum to the maximum when there are repeats) and the reference runs of other tools;
    the subtitle lists only what is drawn. Returns the figure, or None when there is nothing to draw."""
    points = [(s, s.median("train_seconds"), s.median("P@1")) for s in summaries]
    points = [(s, t, p) for s, t, p in points if t is not None and p is not None]
    if not points:
        return None
    figure, (ax,) = _figure(1, panel_size=(10.0, 4.8))
    with_bars = False
    for summary, seconds, p1 in points:
        colour = colours[summary.label]
        ax.scatter([max(seconds, 1e-3)], [100 * p1], color=colour, s=45, label=summary.label, zorder=3,
                   edgecolors="black", linewidths=0.5)
        all_seconds, all_p1 = summary.values("train_seconds"), summary.values("P@1")
        if len(all_seconds) > 1:  # repeats: bars span min..max
            with_bars = True
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
    drawn = ["filled points: each configuration's final test P@1"
             + (" (median over repeats; bars: minimum to maximum)" if with_bars else "")]
    if references:
        drawn.append("hollow markers: reference runs of other tools")
    ax.set_title(f"{dataset}: P@1 against training time\n({'; '.join(drawn)})", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    _save(figure, path)
    return figure


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


#: the dimensions of a scale set, with their axis labels
_SCALE_DIMENSIONS = (("n_train", "N (training rows)"), ("n_features", "D (features)"), ("n_labels", "L (labels)"))
#: a record's ``epoch_unit`` to the quantity its ``seconds_per_epoch`` is
_UNIT_QUANTITIES = {"epoch": "seconds per epoch", "sweep": "seconds per Gibbs sweep", "pass": "seconds per pass",
                    "iteration": "seconds per logged iteration"}
_FAMILY_STYLES = ("-", "--", ":", "-.")


def _scale_families(shapes: dict, dim: str) -> list[list[str]]:
    """Groups of datasets (``shapes``: dataset -> shape) that differ in ``dim`` only, two or more
    sets each, ordered by ``dim``."""
    others = [name for name, _ in _SCALE_DIMENSIONS if name != dim]
    groups: dict[tuple, list[str]] = {}
    for dataset, shape in shapes.items():
        groups.setdefault(tuple(shape.get(name) for name in others), []).append(dataset)
    families = []
    for members in groups.values():
        members.sort(key=lambda name: shapes[name][dim])
        if len({shapes[name][dim] for name in members}) > 1:
            families.append(members)
    return families


def _family_label(shapes: dict, family: list[str], dim: str) -> str:
    fixed = [(label.split(" ")[0], shapes[family[0]][name]) for name, label in _SCALE_DIMENSIONS if name != dim]
    return ", ".join(f"{letter}={value:,}" for letter, value in fixed)


def _epoch_unit(summary, out_dir) -> str | None:
    for record in summary.records:
        if record.get("epoch_unit"):
            return record["epoch_unit"]
    history = _run_file(out_dir, summary, "history.json") if out_dir is not None else None
    if history:
        from .runner import timing_unit

        return timing_unit(history)
    return None


def _scale_plot(summaries, path, out_dir=None):
    """The scale suite's figure: a row of panels per quantity (seconds per epoch, per Gibbs sweep and
    per pass are different quantities, each drawn only for the models that have it; then peak memory),
    a column per dimension (N, D, L). In a panel each configuration has a line through the sets that
    differ in that dimension only (one line per such family, told apart by line style), and a legend.
    Sets that differ from every other in more than one dimension are named in the title, not drawn.
    Returns the figure, or None when no run has a dataset shape."""
    shapes, series = {}, []
    for summary in summaries:
        shape = next((r.get("dataset_shape") for r in summary.records if r.get("dataset_shape")), None)
        if shape and all(shape.get(name) for name, _ in _SCALE_DIMENSIONS):
            shapes[summary.dataset] = shape
            series.append(summary)
    if not series:
        return None
    labels = list(dict.fromkeys(summary.label for summary in series))
    colours = _colours(labels)
    units = {summary.label: _epoch_unit(summary, out_dir) for summary in series}
    order = list(_UNIT_QUANTITIES)  # rows in a fixed order: epoch, sweep, pass, iteration, then any other unit
    present = sorted({u for u in units.values() if u}, key=lambda u: (order.index(u) if u in order else len(order), u))
    quantities = [(("seconds_per_epoch", unit), _UNIT_QUANTITIES.get(unit, f"seconds per {unit}")) for unit in present]
    quantities.append((("peak_rss_mb", None), "peak memory (MB)"))
    families = {dim: _scale_families(shapes, dim) for dim, _ in _SCALE_DIMENSIONS}
    drawn_sets = {name for groups in families.values() for family in groups for name in family}
    figure, axes = _figure(len(quantities) * 3, panel_size=(4.4, 3.3))
    for row, ((key, unit), quantity_label) in enumerate(quantities):
        for column, (dim, dim_label) in enumerate(_SCALE_DIMENSIONS):
            ax = axes[3 * row + column]
            values = []
            for label in labels:
                if unit is not None and units[label] != unit:
                    continue
                for family, style in zip(families[dim], _FAMILY_STYLES):
                    points = [(shapes[s.dataset][dim], s.median(key)) for s in series
                              if s.label == label and s.dataset in family and s.median(key) is not None]
                    if not points:
                        continue
                    points.sort()
                    name = label if len(families[dim]) == 1 else f"{label}, {_family_label(shapes, family, dim)}"
                    ax.plot([x for x, _ in points], [y for _, y in points], color=colours[label], ls=style, lw=1.4,
                            marker="o", ms=4, label=name)
                    values += [y for _, y in points]
            ax.set_ylabel(quantity_label)
            ax.set_xlabel(dim_label + ", log scale")
            if values:
                _plain_log_scale(ax, "x", [shapes[name][dim] for family in families[dim] for name in family])
                _plain_log_scale(ax, "y", values)
                ax.legend(fontsize=6.5, loc="best")
            else:
                ax.text(0.5, 0.5, f"no sets that differ in {dim_label.split(' ')[0]} only" if not families[dim]
                        else "no runs", ha="center", va="center", transform=ax.transAxes, fontsize=9, color="grey")
            ax.grid(alpha=0.3, which="both")
    left_out = [name for name in shapes if name not in drawn_sets]
    figure.suptitle("scale suite: each quantity against N, D and L; a line joins the sets that differ in that "
                    "dimension only" + (f"\n(not drawn, no set differs from them in one dimension only: "
                                        f"{', '.join(left_out)}; see the table)" if left_out else ""), fontsize=11)
    _save(figure, path)
    return figure


def make_plots(records, out_dir, quality: bool = True) -> dict:
    """Write the PNGs under ``OUT/plots/``; returns ``{dataset or "scale": [(caption, relative path)]}``."""
    out_dir = Path(out_dir)
    folder = out_dir / PLOTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    summaries = [s for s in summarise(records) if s.records]
    # a calibrated configuration CONFIG+METHOD (or CONFIG+METHOD-cvK) is drawn in the colour of CONFIG
    base = {s.label: s.raw_label for s in summaries}
    palette = _colours(list(dict.fromkeys(base.values())))
    colours = {label: palette[plain] for label, plain in base.items()}
    made: dict[str, list] = {}
    if not quality:
        if _scale_plot(summaries, folder / "scale.png", out_dir) is not None:
            made["scale"] = [("time per epoch, sweep or pass and peak memory against N, D and L",
                              f"{PLOTS_DIR}/scale.png")]
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
            if draw(dataset, mine, out_dir, folder / name, colours) not in (None, False):
                made.setdefault(dataset, []).append((f"{dataset}: {caption}", f"{PLOTS_DIR}/{name}"))
    return made
