"""The markdown report of a suite's records.

Per dataset: a ranking table (P@1/3/5, PSP@1/3/5, nDCG@5) and a probabilities-and-cost table (micro and
macro AUC, example F1, exact match, the all-pairs ECE, ECE@1, ECE@5, AURC, train and predict seconds,
peak memory, and the ratio of the training time to the fastest baseline's), with the published numbers
for that dataset alongside and marked as such; when the suite ran calibrated configurations
(``bench --calibrate``, with ``--calibration-folds K`` cross-fitted), a calibration table with each model
raw and calibrated side by side; then the plots. With repeats, a cell is the median over the
repeats followed by ``±`` half the range (max - min) / 2. Runs that did not finish are listed with
their reason.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

import re

from .published import published_for
from .risk import RISK_CONTROL_SENTENCE, risk_control_table
from .runner import calibration_suffix
from .suites import BASELINE_MODELS

__all__ = ["Summary", "summarise", "fastest_baselines", "format_cell", "dataset_tables", "calibration_table",
           "render_report",
           "write_report", "splice_into_document", "REPORT_FILE"]

REPORT_FILE = "report.md"

#: Baselines whose "training" only stores the data; their cost is at prediction, so they are left
#: out of the fastest-baseline denominator (a ratio to ~0 s would say nothing).
LAZY_MODELS = ("knn",)

RANKING_COLUMNS = (
    ("P@1", "P@1", "pct"), ("P@3", "P@3", "pct"), ("P@5", "P@5", "pct"),
    ("PSP@1", "PSP@1", "pct"), ("PSP@3", "PSP@3", "pct"), ("PSP@5", "PSP@5", "pct"),
    ("nDCG@5", "nDCG@5", "pct"),
)
PROBABILITY_COLUMNS = (
    ("AUC_micro", "AUC micro", "frac"), ("AUC_macro", "AUC macro", "frac"),
    ("F1_example", "F1 example", "pct"), ("exact_match", "exact match", "pct"), ("ECE", "ECE all pairs", "frac"),
    ("ECE@1", "ECE@1", "frac"), ("ECE@5", "ECE@5", "frac"), ("AURC", "AURC", "frac"),
)
#: The calibration table: (key, header, kind) shown raw and calibrated, then the costs.
CALIBRATION_COLUMNS = (
    ("P@1", "P@1", "pct"), ("P@5", "P@5", "pct"), ("ECE@1", "ECE@1", "frac"), ("ECE@5", "ECE@5", "frac"),
    ("AURC", "AURC", "frac"),
)
#: The band contributions of the label-frequency table (``bench --bands``), every model side by side
#: under each.
BAND_COLUMNS = ("P@1", "P@5", "PSP@1", "PSP@5", "R@5")
COST_COLUMNS = (
    ("train_seconds", "train s", "sec"), ("predict_seconds", "predict s", "sec"), ("peak_rss_mb", "peak MB", "mb"),
    ("wall_seconds", "run s", "sec"), ("cpu_seconds", "run CPU s", "sec"),
)
SCALE_COLUMNS = (
    ("n_epochs", "epochs", "int"), ("seconds_per_epoch", "s / epoch", "sec"),
) + COST_COLUMNS
_TOP_LEVEL = {"train_seconds", "predict_seconds", "peak_rss_mb", "n_epochs", "seconds_per_epoch", "calibration_seconds",
              "cpu_seconds", "wall_seconds"}


def _value(record: dict, key: str):
    value = record.get(key) if key in _TOP_LEVEL else (record.get("metrics") or {}).get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class Summary:
    """The runs of one (dataset, model, configuration): values of the finished runs, statuses of all."""

    dataset: str
    model: str
    config: str
    baseline: bool
    calibrate: str | None = None  # the calibration method of a calibrated configuration
    calibration_folds: int | None = None  # K of a cross-fitted calibrated configuration, None: the 20% split
    statuses: list = field(default_factory=list)
    records: list = field(default_factory=list)  # the records with status "ok"

    @property
    def label(self) -> str:
        return f"{self.model} ({self.config})"

    @property
    def raw_config(self) -> str:
        """The configuration without its calibration suffix (``default`` of ``default+isotonic-cv5``)."""
        suffix = calibration_suffix(self.calibrate, self.calibration_folds)
        return self.config[: len(self.config) - len(suffix)] if suffix and self.config.endswith(suffix) else self.config

    @property
    def raw_label(self) -> str:
        return f"{self.model} ({self.raw_config})"

    def values(self, key: str) -> list[float]:
        return [v for v in (_value(r, key) for r in self.records) if v is not None]

    def median(self, key: str) -> float | None:
        values = self.values(key)
        return statistics.median(values) if values else None


def summarise(records) -> list[Summary]:
    """Group records by (dataset, model, configuration), in the order they first appear."""
    groups: dict[tuple, Summary] = {}
    for record in records:
        key = (record["dataset"], record["model"], record["config"])
        if key not in groups:
            groups[key] = Summary(record["dataset"], record["model"], record["config"],
                                  bool(record.get("baseline", record["model"] in BASELINE_MODELS)),
                                  record.get("calibrate"), record.get("calibration_folds"))
        groups[key].statuses.append(record.get("status"))
        if record.get("status") == "ok":
            groups[key].records.append(record)
    return list(groups.values())


def fastest_baselines(summaries) -> dict[str, Summary]:
    """Per dataset, the baseline with the smallest median training time (lazy learners left out)."""
    best: dict[str, Summary] = {}
    for summary in summaries:
        seconds = summary.median("train_seconds")
        if not summary.baseline or summary.model in LAZY_MODELS or summary.calibrate or seconds is None:
            continue
        current = best.get(summary.dataset)
        if current is None or seconds < current.median("train_seconds"):
            best[summary.dataset] = summary
    return best


def _format_number(value: float, kind: str) -> str:
    if kind == "pct":
        return f"{100 * value:.2f}"
    if kind == "frac":
        return f"{value:.4f}"
    if kind == "sec":
        return f"{value:.3g}" if value < 100 else f"{value:.0f}"
    if kind in ("mb", "int"):
        return f"{value:.0f}"
    raise ValueError(f"unknown column kind {kind!r}")


def format_cell(values, kind: str) -> str:
    """Median of ``values``, with ``±`` half their range when there is more than one; ``–`` when none."""
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    text = _format_number(statistics.median(values), kind)
    if len(values) > 1:
        text += " ±" + _format_number((max(values) - min(values)) / 2, kind)
    return text


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _ratio_cell(summary: Summary, fastest: Summary | None) -> str:
    if fastest is None:
        return "–"
    base = fastest.median("train_seconds")
    ratios = [seconds / base for seconds in summary.values("train_seconds")] if base and base > 0 else []
    return (format_cell(ratios, "sec") + "×") if ratios else "–"


def _runs_cell(summary: Summary) -> str:
    return f"{len(summary.records)}/{len(summary.statuses)}"


def calibration_table(dataset: str, summaries) -> str | None:
    """Each configuration of ``dataset`` raw and calibrated side by side, one row per calibration method;
    the lowest ECE and AURC of each column in bold. ``None`` when the dataset has no calibrated run."""
    mine = [s for s in summaries if s.dataset == dataset and s.records]
    calibrated = [s for s in mine if s.calibrate]
    if not calibrated:
        return None
    raw_of = {(s.model, s.config): s for s in mine if not s.calibrate}
    pairs = [(raw_of.get((s.model, s.raw_config)), s) for s in calibrated]
    columns = [(key, f"{header} {which}", kind, which) for key, header, kind in CALIBRATION_COLUMNS
               for which in ("raw", "cal")]
    medians = {(key, which): [(raw if which == "raw" else cal).median(key) if (raw if which == "raw" else cal)
                              else None for raw, cal in pairs] for key, _, _, which in columns}
    best = {column: min((v for v in values if v is not None), default=None) for column, values in medians.items()}
    header = ["model", "calibration"] + [h for _, h, _, _ in columns] + ["train s raw", "train s cal",
                                                                          "calibration s"]
    rows = []
    for i, (raw, cal) in enumerate(pairs):
        cells = []
        for key, _, kind, which in columns:
            summary = raw if which == "raw" else cal
            cell = format_cell(summary.values(key), kind) if summary else "–"
            value = medians[(key, which)][i]
            if kind == "frac" and value is not None and value == best[(key, which)]:
                cell = f"**{cell}**"
            cells.append(cell)
        method = cal.calibrate + (f", {cal.calibration_folds} folds" if cal.calibration_folds is not None else "")
        rows.append([cal.raw_label, method] + cells + [
            format_cell(raw.values("train_seconds"), "sec") if raw else "–",
            format_cell(cal.values("train_seconds"), "sec"), format_cell(cal.values("calibration_seconds"), "sec")])
    return _table(header, rows)


def dataset_tables(dataset: str, summaries, quality: bool = True, with_published: bool = True) -> str:
    """The markdown tables of one dataset: measured rows, then the published ones, marked; calibrated
    configurations only in the calibration table."""
    calibration = calibration_table(dataset, summaries) if quality else None
    mine = [s for s in summaries if s.dataset == dataset and s.records and not s.calibrate]
    fastest = fastest_baselines(summaries).get(dataset)
    fastest_note = (f"fastest baseline: {fastest.label}, {format_cell(fastest.values('train_seconds'), 'sec')} s"
                    if fastest else "no baseline finished")
    if not quality:
        header = ["model", "runs"] + [h for _, h, _ in SCALE_COLUMNS] + ["train ÷ fastest baseline"]
        rows = [[s.label, _runs_cell(s)] + [format_cell(s.values(k), kind) for k, _, kind in SCALE_COLUMNS]
                + [_ratio_cell(s, fastest)] for s in mine]
        return _table(header, rows) + f"\n\n({fastest_note}.)"
    published = published_for(dataset) if with_published else []

    def published_rows(columns):
        rows = []
        for entry in published:
            if not any(key in entry.metrics for key, _, _ in columns):
                continue
            cells = [format_cell([entry.metrics.get(key)], kind) for key, _, kind in columns]
            rows.append([f"{entry.method} *({entry.kind})*", "–"] + cells)
        return rows

    ranking_header = ["model", "runs"] + [h for _, h, _ in RANKING_COLUMNS]
    ranking_rows = [[s.label, _runs_cell(s)] + [format_cell(s.values(k), kind) for k, _, kind in RANKING_COLUMNS]
                    for s in mine] + published_rows(RANKING_COLUMNS)
    other_columns = PROBABILITY_COLUMNS + COST_COLUMNS
    other_header = ["model", "runs"] + [h for _, h, _ in other_columns] + ["train ÷ fastest baseline"]
    other_rows = [[s.label, _runs_cell(s)] + [format_cell(s.values(k), kind) for k, _, kind in other_columns]
                  + [_ratio_cell(s, fastest)] for s in mine]
    other_rows += [row + ["–"] for row in published_rows(other_columns)]
    sources = sorted({f"{e.method}: {e.source}" + (f" ({e.note})" if e.note else "") for e in published})
    parts = [
        "Ranking (%):", "", _table(ranking_header, ranking_rows), "",
        "Probabilities and cost (AUC and ECE as fractions, F1 and exact match in %; `run s` and `run CPU s`: the "
        "whole run's wall and CPU seconds, reading and writing included):", "",
        _table(other_header, other_rows), "", f"({fastest_note}.)",
    ]
    if sources:
        parts += ["", "Published and reference rows: " + "; ".join(sources) + "."]
    if calibration:
        folds = {s.calibration_folds for s in summaries if s.dataset == dataset and s.records and s.calibrate}
        parts += ["", _calibration_sentence(folds), "", calibration]
    bands = band_table(mine)
    if bands:
        parts += ["", BAND_SENTENCE, "", bands]
    risk_sets = risk_control_table([r for s in summaries if s.dataset == dataset for r in s.records])
    if risk_sets:
        parts += ["", RISK_CONTROL_SENTENCE, "", risk_sets]
    return "\n".join(parts)


def _calibration_sentence(folds: set) -> str:
    """The sentence above a calibration table, for the ways its maps were fitted (``folds``: ``None`` for
    the 20% split, K for K-fold cross-fitting; rows of both kinds when a resumed suite mixes them)."""
    mixed = len(folds) > 1
    ways, explained = [], []
    if None in folds:
        ways.append("on 20% held-out training rows")
        explained.append(("rows whose `calibration` names no folds" if mixed else "`cal`") + ": the model fitted on the other 80%")
    for k in sorted(k for k in folds if k is not None):
        ways.append(f"by {k}-fold cross-fitting")
        explained.append((f"rows with `{k} folds`" if mixed else "`cal`")
                         + f": the maps fitted on every training row's held-out prediction, from {k} models each "
                           f"fitted without one fold, then the model refitted on all rows, so `train s cal` "
                           f"includes {k + 1} fits")
    return (f"Calibration, raw and recalibrated {' or '.join(ways)} ({'; '.join(explained)}; ECE@k over each row's "
            "top-k predictions, 15 bins; AURC: area under the top-1 risk-coverage curve; lowest ECE and AURC of each "
            "column in bold; `train s cal` includes the calibration, `calibration s` is predicting the held-out rows "
            "and fitting the maps):")


def _environment_lines(records) -> list[str]:
    first = next((r for r in records if r.get("machine")), None)
    if first is None:
        return []
    machine, versions = first["machine"], first.get("versions") or {}
    loads = [r["load_avg_1m"] for r in records if isinstance(r.get("load_avg_1m"), (int, float))]
    lines = [
        f"- machine: {machine.get('cpu')}, {machine.get('cpu_count')} cores, {machine.get('memory_gb')} GB"
        + (f", GPU {machine['gpu']}" if machine.get("gpu") else ", no GPU") + f" ({machine.get('platform')})",
        f"- threads per run: {_threads_text(records, first)}; device requested: "
        f"{first.get('device_requested') or 'model default'}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v),
    ]
    commits = list(dict.fromkeys(
        (r["git"].get("commit"), bool(r["git"].get("dirty"))) for r in records if r.get("git")))
    if commits:
        label = "git commit" if len(commits) == 1 else "git commits (runs were resumed or added later)"
        lines.append(f"- {label}: " + ", ".join(
            f"{commit}" + (" (with uncommitted changes)" if dirty else "") for commit, dirty in commits))
    if loads:
        lines.append(f"- 1-minute load average at run starts: {min(loads):.2f} to {max(loads):.2f}")
    devices = sorted({str(r.get("device")) for r in records if r.get("status") == "ok" and r.get("device")})
    if devices:
        lines.append("- devices used: " + ", ".join(devices))
    return lines


def _threads_text(records, first: dict) -> str:
    """The threads of the runs: the ``--threads`` count, or the counts the runs chose (records written
    before ``threads_requested`` existed hold the requested count in ``threads``)."""
    requested = first.get("threads_requested", first.get("threads"))
    if requested is not None:
        return f"{requested} (--threads)"
    chosen = sorted({r["threads"] for r in records if r.get("status") == "ok" and isinstance(r.get("threads"), int)})
    return "one per idle core when each run started" + (f" ({', '.join(map(str, chosen))} chosen)" if chosen else "")


def _settings_text(settings: dict) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in settings.items()) or "library defaults"


def _configurations(records) -> list[str]:
    """One line per configuration: its ``--set`` parameters, per dataset where they differ."""
    by_label: dict[str, dict[str, dict]] = {}
    for record in records:
        label = f"{record['model']} ({record['config']})"
        by_label.setdefault(label, {})[record["dataset"]] = record.get("settings") or {}
    lines = []
    for label, per_dataset in by_label.items():
        distinct = {_settings_text(settings) for settings in per_dataset.values()}
        if len(distinct) == 1:
            lines.append(f"- {label}: {distinct.pop()}")
        else:
            shown = "; ".join(f"{dataset}: {_settings_text(settings)}" for dataset, settings in per_dataset.items())
            lines.append(f"- {label}: {shown}")
    return lines


def _not_completed(records) -> str:
    rows = []
    for record in records:
        if record.get("status") == "ok":
            continue
        tail = (record.get("stderr_tail") or "").strip().splitlines()
        last = tail[-1][:160].replace("|", "\\|") if tail else ""
        reason = str(record.get("reason", "")).replace("|", "\\|")
        rows.append([record["run_id"], record.get("status", "?"), reason, f"`{last}`" if last else ""])
    if not rows:
        return "Every run finished."
    return _table(["run", "status", "reason", "last stderr line"], rows)


BAND_SENTENCE = (
    "By label-frequency band (`bench --bands`; `bayesmlc.metrics.metrics_by_band`): the labels sorted by "
    "training frequency, head first, cut into deciles (fewer bands for fewer labels). Each cell is the band's "
    "contribution in %: the hits in each row's top k whose label lies in the band, so a metric's bands add up "
    "to its `all` row (P@k: hits / (k rows); PSP@k: propensity-weighted hits over the best achievable total; "
    "R@k: mean over rows of hits / the row's true labels). `test positives %` bounds what a band can add.")


def _count_range(low: int, high: int) -> str:
    return f"{low}" if low == high else f"{low}-{high}"


def band_table(summaries) -> str | None:
    """One dataset's bands, every configuration side by side under each of :data:`BAND_COLUMNS` (in %,
    the median over repeats), with a last row of totals; ``None`` when no run recorded bands.
    ``summaries``: the :class:`~bayesmlc.bench.report.Summary` objects of one dataset."""
    with_bands = [(s, [r["bands"] for r in s.records if r.get("bands")]) for s in summaries if not s.calibrate]
    with_bands = [(s, bands) for s, bands in with_bands if bands]
    if not with_bands:
        return None
    first = with_bands[0][1][0]
    n_bands = len(first["n_labels"])
    header = ["band", "labels", "train rows per label", "test positives %"] + [
        f"{name} {s.label}" for name in BAND_COLUMNS for s, _ in with_bands]
    rows = []
    for band in list(range(n_bands)) + ["all"]:
        if band == "all":
            cells = ["all", str(sum(first["n_labels"])), "", "100"]
        else:
            cells = [str(band + 1), str(first["n_labels"][band]),
                     _count_range(first["min_count"][band], first["max_count"][band]),
                     f"{100 * first['positive_share'][band]:.1f}"]
        for name in BAND_COLUMNS:
            for _, records in with_bands:
                values = [sum(b["values"][name]) if band == "all" else b["values"][name][band]
                          for b in records if name in b["values"]]
                cells.append(format_cell(values, "pct"))
        rows.append(cells)
    return _table(header, rows)


def render_report(records, *, suite: str, quality: bool = True, plots: dict | None = None,
                  command: str | None = None, title: str | None = None) -> str:
    """The whole report as markdown. ``plots`` maps a dataset (or ``"scale"``) to ``[(caption, path)]``
    with paths relative to the report."""
    plots = plots or {}
    summaries = summarise(records)
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    lines = [f"# {title or f'bayesmlc benchmark: suite {suite}'}", ""]
    if command:
        lines += ["Reproduce with:", "", "```", command, "```", ""]
    lines += _environment_lines(records)
    lines += [
        "",
        "Each cell is the median over repeats, ± half the range when there are several; `runs` counts "
        "finished runs out of those attempted. Rows marked *(published)* are the papers' numbers; rows "
        "marked *(reference run)* are single runs of other tools on the development machine. The last "
        "column divides each training time by that of the fastest baseline on the same dataset (kNN, "
        "which only stores the data, is left out of that choice).",
        "",
    ]
    if not quality:
        lines += ["## Speed and memory", ""]
        for dataset in datasets:
            shape = next((r.get("dataset_shape") for r in records if r["dataset"] == dataset and r.get("dataset_shape")), None)
            described = (f" (N={shape['n_train']}, D={shape['n_features']}, L={shape['n_labels']})" if shape else "")
            lines += [f"### {dataset}{described}", "", dataset_tables(dataset, summaries, quality=False), ""]
        for caption, path in plots.get("scale", []):
            lines += [f"![{caption}]({path})", ""]
    else:
        for dataset in datasets:
            lines += [f"## {dataset}", "", dataset_tables(dataset, summaries), ""]
            for caption, path in plots.get(dataset, []):
                lines += [f"![{caption}]({path})", ""]
    lines += ["## Configurations", "", "Parameters passed to `bayesmlc train --set` (the rest are the "
              "models' defaults; the `params` of each record in `results.jsonl` has them all):", ""]
    lines += _configurations(records) + [""]
    lines += ["## Runs not completed", "", _not_completed(records), ""]
    return "\n".join(lines)


def write_report(records, out_dir, **kwargs) -> Path:
    """Write :func:`render_report` to ``OUT/report.md``; returns its path."""
    path = Path(out_dir) / REPORT_FILE
    path.write_text(render_report(records, **kwargs), encoding="utf-8")
    return path


def _markers(suite: str) -> tuple[str, str]:
    return (f"<!-- begin: generated by bayesmlc bench --suite {suite} --doc; edits here are overwritten -->",
            f"<!-- end: generated by bayesmlc bench --suite {suite} --doc -->")


def splice_into_document(document: str, suite: str, report: str, *, plots_folder: str) -> str:
    """Put ``report`` (as written by :func:`render_report`) into ``document``, between the suite's markers.

    The report's title is dropped and its other headings are demoted one level, so that its datasets
    sit under the section heading and the hand-written introduction that stay *outside* the markers;
    links to ``plots/`` are pointed at ``plots_folder`` (relative to the document). Text outside the
    markers is kept as it is. Without markers, a section "Benchmarks from the harness: the ``SUITE``
    suite" holding them is appended.
    """
    begin, end = _markers(suite)
    body = re.sub(r"\A# [^\n]*\n+", "", report)
    body = re.sub(r"^(#+) ", r"#\1 ", body, flags=re.MULTILINE)
    body = body.replace("](plots/", f"]({plots_folder.rstrip('/')}/")
    section = f"{begin}\n{body.strip()}\n{end}"
    if begin in document and end in document:
        head, _, tail = document.partition(begin)
        _, _, tail = tail.partition(end)
        return f"{head}{section}{tail}"
    return f"{document.rstrip()}\n\n## Benchmarks from the harness: the `{suite}` suite\n\n{section}\n"
