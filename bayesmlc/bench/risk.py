"""``bayesmlc bench --risk-control``: the label sets each finished run's model gives at the same
guarantees, side by side.

After a run finishes, :func:`risk_control_fields` loads the model it saved (``RUN_DIR/model.npz``; the
harness wrote it, so a napkinXC or omikuji baseline's native files are trusted), takes each test row's
:data:`TOP_K` most probable labels once, and then, :data:`N_SPLITS` times, splits the test rows at
random in halves, calibrates a threshold on one half and measures the sets on the other
(:func:`bayesmlc.risk_control.split_evaluation`; the training rows are the model's, so they cannot
calibrate). Three guarantees, each at 0.9 (:data:`TARGETS`):

* recall >= 0.9 in expectation (conformal risk control): the realised recall loss and the mean set
  size; smaller sets at the same recall are better;
* precision >= 0.9 with probability >= 0.9 (Learn then Test): the realised false discovery proportion
  and the mean set size; larger sets at the same precision are better;
* selective top-1 with accuracy >= 0.9 on the answered rows with probability >= 0.9 (Learn then Test):
  the realised error of the answered rows and the coverage (share answered); higher is better.

It also records ECE@1 and ECE@5 beside their noise floor on this test set
(:func:`bayesmlc.metrics.ece_at_k_if_calibrated`: the 5%-95% range a perfectly calibrated model with
these top-k probabilities would show). The record gains ``risk_control`` and ``risk_control_seconds``,
or ``risk_control_error`` (the run itself still counts as finished).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

__all__ = ["TARGETS", "TOP_K", "N_SPLITS", "DELTA", "RISK_CONTROL_SENTENCE", "risk_control_fields",
           "risk_control_summary", "risk_control_table", "overview"]

#: (risk, alpha) of each guarantee the report compares
TARGETS = (("recall", 0.1), ("precision", 0.1), ("selective", 0.1))
DELTA = 0.1
#: candidates per row (at most the labels): enough that recall 0.9 is reachable on delicious, whose rows
#: hold 19 labels on average and whose top 100 hold about 71% of them (docs/risk-control.md)
TOP_K = 1000
N_SPLITS = 20
ECE_KS = (1, 5)


def risk_control_summary(labels, proba, Y, label_mask=None, random_state=0) -> dict:
    """The ``risk_control`` record of a model's test-set top-k ``(labels, proba)`` against ``Y``:
    per risk of :data:`TARGETS` the summary of :data:`N_SPLITS` half/half splits
    (:func:`bayesmlc.risk_control.summarise_splits`), and per k of :data:`ECE_KS` the measured
    ECE@k with the 5%, 50% and 95% quantiles of its noise floor."""
    from ..metrics import ece_at_k, ece_at_k_if_calibrated
    from ..risk_control import candidates_from_topk, split_evaluation, summarise_splits

    candidates = candidates_from_topk(labels, proba, Y, label_mask)
    result = {"top_k": int(labels.shape[1]), "delta": DELTA, "n_splits": N_SPLITS}
    for risk, alpha in TARGETS:
        splits = split_evaluation(candidates, risk, alpha, DELTA, n_splits=N_SPLITS, random_state=random_state)
        result[risk] = {"alpha": alpha, **summarise_splits(splits, alpha)}
    pair = (np.asarray(labels), np.asarray(proba, dtype=np.float64))
    for k in ECE_KS:
        if k <= labels.shape[1]:
            floor = ece_at_k_if_calibrated(pair, k, label_mask=label_mask, n_draws=200)
            result[f"ECE@{k}"] = {"measured": float(ece_at_k(Y, pair, k, label_mask=label_mask)),
                                  "floor": [float(value) for value in floor]}
    return result


def risk_control_fields(test_path, run_dir) -> dict:
    """``{"risk_control": ..., "risk_control_seconds": ...}`` for the run saved in ``run_dir``, or
    ``{"risk_control_error": why}``."""
    from ..base import MultiLabelEstimator
    from ..data.io import conform_widths, read_dataset
    from ..risk_control.candidates import top_candidates

    start = time.perf_counter()
    try:
        model = MultiLabelEstimator.load(Path(run_dir) / "model.npz", allow_native=True)
        test = conform_widths(read_dataset(test_path), model.n_features_in_, model.n_labels_, test_path,
                              "the model was trained with")
        labels, proba = top_candidates(model, test.X, TOP_K)
        result = risk_control_summary(labels, proba, test.Y, test.label_mask)
    except Exception as exc:  # recorded with the run; a finished run is never failed by this scoring
        return {"risk_control_error": f"{type(exc).__name__}: {exc}"}
    return {"risk_control": result, "risk_control_seconds": time.perf_counter() - start}


RISK_CONTROL_SENTENCE = (
    "Label sets with guarantees (`bench --risk-control`; docs/risk-control.md): each model's test rows split "
    f"{N_SPLITS} times at random in halves, a threshold calibrated on one half and measured on the other "
    f"(medians over repeats of the means over splits; top {TOP_K} candidates per row). `recall 0.9`: conformal risk "
    "control, realised recall loss (target <= 0.1 in expectation) and mean set size (smaller is better); "
    f"`precision 0.9`: Learn then Test with delta {DELTA}, realised false discovery proportion and mean set size "
    "(larger is better; `met` is the share of splits where a threshold was certified); `selective 0.9`: top-1 or "
    "abstain, Learn then Test, realised error of the answered rows and coverage (larger is better); best set size "
    "and coverage in bold. ECE@k beside its noise floor, the 5%-95% range of a perfectly calibrated model with "
    "these probabilities on this many test rows (`metrics.ece_at_k_if_calibrated`).")


def _median_cell(values) -> str:
    """The median of ``values`` to four decimals, with ``±`` half their range when there are several
    (the report's rule for fractions, :func:`bayesmlc.bench.report.format_cell`); ``–`` when none."""
    if not values:
        return "–"
    text = f"{float(np.median(values)):.4f}"
    return text + (f" ±{(max(values) - min(values)) / 2:.4f}" if len(values) > 1 else "")


def _markdown_table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _by_configuration(records) -> dict:
    """The finished records with ``risk_control``, grouped by ``"model (config)"`` in order."""
    groups: dict = {}
    for record in records:
        if record.get("status") == "ok" and isinstance(record.get("risk_control"), dict):
            groups.setdefault(f"{record['model']} ({record['config']})", []).append(record)
    return groups


def _values(records, path) -> list:
    values = []
    for record in records:
        value = record["risk_control"]
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values.append(float(value))
    return values


def _floor_cell(records, k: int) -> str:
    measured = _median_cell(_values(records, (f"ECE@{k}", "measured")))
    floors = [r["risk_control"][f"ECE@{k}"]["floor"] for r in records if f"ECE@{k}" in r["risk_control"]]
    if not floors:
        return measured
    low, high = np.median([f[0] for f in floors]), np.median([f[-1] for f in floors])
    return f"{measured} ({low:.4f}-{high:.4f})"


#: the columns of the table: (header, path in the record, best: "min", "max" or None)
_COLUMNS = (
    ("recall 0.9: risk", ("recall", "realised_risk"), None),
    ("recall 0.9: set size", ("recall", "mean_set_size"), "min"),
    ("precision 0.9: FDP", ("precision", "realised_risk"), None),
    ("precision 0.9: set size", ("precision", "mean_set_size"), "max"),
    ("precision 0.9: met", ("precision", "feasible"), None),
    ("selective 0.9: error", ("selective", "realised_risk"), None),
    ("selective 0.9: coverage", ("selective", "coverage"), "max"),
)


def risk_control_table(records) -> str | None:
    """One dataset's label sets at the same guarantees, one row per configuration (raw and recalibrated)
    whose finished runs recorded ``risk_control`` (medians over repeats); the best set size and coverage
    in bold; ``None`` when no run did. ``records``: the records of one dataset."""
    groups = _by_configuration(records)
    if not groups:
        return None
    medians = {label: [np.median(v) if (v := _values(runs, path)) else None for _, path, _ in _COLUMNS]
               for label, runs in groups.items()}
    rows = []
    for label, runs in groups.items():
        cells = []
        for column, (_, path, best) in enumerate(_COLUMNS):
            cell = _median_cell(_values(runs, path))
            known = [m[column] for m in medians.values() if m[column] is not None]
            if best and known and min(known) != max(known) and medians[label][column] == (
                    min(known) if best == "min" else max(known)):
                cell = f"**{cell}**"
            cells.append(cell)
        rows.append([label] + cells + [_floor_cell(runs, 1), _floor_cell(runs, 5)])
    return _markdown_table(["model"] + [h for h, _, _ in _COLUMNS] + ["ECE@1 (floor)", "ECE@5 (floor)"], rows)


def overview(records) -> str:
    """Every dataset and configuration with ``risk_control`` in three tables, datasets as rows and
    configurations side by side: the mean set size at recall 0.9, at precision 0.9, and the coverage
    of selective top-1 at accuracy 0.9 (medians over repeats); ``records``: a suite's records."""
    datasets = list(dict.fromkeys(r["dataset"] for r in records if isinstance(r.get("risk_control"), dict)))
    labels = list(_by_configuration(records))
    parts = []
    for title, path in (("Mean set size at recall >= 0.9 (CRC; smaller is better)", ("recall", "mean_set_size")),
                        ("Mean set size at precision >= 0.9 (LTT, delta 0.1; larger is better)",
                         ("precision", "mean_set_size")),
                        ("Coverage of selective top-1 at accuracy >= 0.9 (LTT, delta 0.1; larger is better)",
                         ("selective", "coverage"))):
        rows = []
        for dataset in datasets:
            groups = _by_configuration([r for r in records if r["dataset"] == dataset])
            rows.append([dataset] + [_median_cell(_values(groups[label], path)) if label in groups else "–"
                                     for label in labels])
        parts += [f"{title}:", "", _markdown_table(["dataset"] + labels, rows), ""]
    return "\n".join(parts).rstrip()
