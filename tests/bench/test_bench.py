"""The benchmark harness on tiny suites: JSON records, report tables, skips, failures, plots, and the
kNN baseline against a brute-force computation; one end-to-end run through the real CLI."""

import json
import stat

import numpy as np
import pytest
from conftest import write_dense_xc as _write_xc
import scipy.sparse as sp

from bayesmlc import baselines
from bayesmlc.baselines import KNNBaseline, missing_dependency
from bayesmlc.bench.cli import main as bench_main
from bayesmlc.bench.plots import make_plots
from bayesmlc.bench.report import format_cell, render_report, splice_into_document
from bayesmlc.bench.runner import (
    CLIRunner, RunFailure, RunSpec, epoch_timing, plan_runs, read_results, run_suite,
)
from bayesmlc.bench.suites import SUITES, DatasetSpec, ModelConfig, Suite
from bayesmlc.persistence import write_npz_atomically
from bayesmlc.exceptions import ValidationError

# ---- a tiny suite with a fake "run one" ---------------------------------------------------------
TINY = Suite(
    "tiny", "two fake datasets",
    (DatasetSpec("alpha"), DatasetSpec("beta")),
    (ModelConfig("logistic", "default"), ModelConfig("slowmodel", "small", {"n_epochs": 3, "name": "x y"}),
     ModelConfig("napkinxc_plt", "default"), ModelConfig("brokenmodel", "default")),
    timeout_s=30.0,
)

# P@1 and training seconds the fake runner reports, per (dataset, model, seed)
FAKE = {
    ("alpha", "logistic", 0): (0.60, 1.0), ("alpha", "logistic", 1): (0.64, 3.0), ("alpha", "logistic", 2): (0.62, 2.0),
    ("alpha", "slowmodel", 0): (0.70, 10.0), ("alpha", "slowmodel", 1): (0.50, 4.0), ("alpha", "slowmodel", 2): (0.66, 7.0),
    ("beta", "logistic", 0): (0.30, 0.5), ("beta", "logistic", 1): (0.30, 0.5), ("beta", "logistic", 2): (0.30, 0.5),
    ("beta", "slowmodel", 0): (0.40, 5.0), ("beta", "slowmodel", 1): (0.40, 5.0), ("beta", "slowmodel", 2): (0.40, 5.0),
}


def fake_run_one(spec: RunSpec, run_dir):
    if spec.model == "brokenmodel":
        raise RunFailure("exit code 2", stderr_tail="Traceback ...\nValueError: broken on purpose", returncode=2)
    p1, seconds = FAKE[(spec.dataset, spec.model, spec.seed)]
    history = {"wall_time": [0.1, 0.2, 0.3, 0.4], "objective": [-9.0, -5.0, -4.0, -3.5], "epoch": [1, 1, 2, 2]}
    (run_dir / "history.json").write_text(json.dumps(history))
    reliability = {"bin_centers": [0.25, 0.75], "mean_predicted": [0.2, 0.8], "observed": [0.1, 0.7], "counts": [30, 10],
                   "top1": {"bin_centers": [0.25, 0.75], "mean_predicted": [None, 0.8], "observed": [None, 0.6],
                            "counts": [0, 10]},
                   "top5": {"bin_centers": [0.25, 0.75], "mean_predicted": [0.3, 0.7], "observed": [0.2, 0.5],
                            "counts": [30, 20]},
                   "risk_coverage": {"coverage": [0.5, 1.0], "risk": [0.2, 1 - p1]}}
    (run_dir / "reliability.json").write_text(json.dumps(reliability))
    metrics = {"P@1": p1, "AUC_micro": 0.9, "ECE": 0.05, "ECE@1": 0.2, "AURC": 0.3}
    if spec.calibrate is not None:  # what a calibrated run reports and saves
        metrics.update({"ECE@1": 0.1, "AURC": 0.25})
        write_npz_atomically(run_dir / "model.npz", {"state": {"calibration_seconds_": 0.25, "fit_seconds_": 0.75}}, {})
    return {"model": spec.model, "dataset": spec.dataset, "params": dict(spec.params),
            "metrics": metrics, "train_seconds": seconds,
            "predict_seconds": 0.1, "peak_rss_mb": 100.0, "device": "cpu"}


def _availability(model):
    return missing_dependency(model)


@pytest.fixture
def no_napkinxc(monkeypatch):
    """Pretend the optional napkinxc package is not installed."""
    real_find_spec = baselines.importlib.util.find_spec
    monkeypatch.setattr(baselines.importlib.util, "find_spec",
                        lambda name, *a: None if name == "napkinxc" else real_find_spec(name, *a))


@pytest.fixture
def tiny_data_root(tmp_path):
    root = tmp_path / "datasets"
    for name, n in (("alpha", 30), ("beta", 40)):
        (root / name).mkdir(parents=True)
        (root / name / "train.txt").write_text(f"{n} 7 3\n")
        (root / name / "test.txt").write_text("10 7 3\n")
    return root


@pytest.fixture
def tiny_records(tmp_path, tiny_data_root, no_napkinxc):
    out = tmp_path / "bench"
    records = run_suite(TINY, out, repeats=3, seed=0, data_root=tiny_data_root, run_one=fake_run_one,
                        availability=_availability, threads=1, log=lambda message: None)
    return out, records


def test_records_one_json_line_per_run_with_environment(tiny_records):
    out, records = tiny_records
    on_disk = read_results(out / "results.jsonl")
    assert on_disk == json.loads(json.dumps(records))
    assert len(records) == 2 * 4 * 3
    ok = [r for r in records if r["status"] == "ok"]
    assert len(ok) == 2 * 2 * 3
    for record in ok:
        p1, seconds = FAKE[(record["dataset"], record["model"], record["seed"])]
        assert record["metrics"]["P@1"] == p1 and record["train_seconds"] == seconds
        assert record["seed"] == record["repeat"]  # seed 0 + repeat index
        assert record["threads"] == 1
        assert {"platform", "cpu", "cpu_count", "memory_gb", "gpu"} <= set(record["machine"])
        assert record["versions"]["numpy"] == np.__version__
        assert "git" in record and "load_avg_1m" in record and record["device"] == "cpu"
        assert record["dataset_shape"]["n_train"] == {"alpha": 30, "beta": 40}[record["dataset"]]
        assert record["dataset_shape"]["n_test"] == 10 and record["dataset_shape"]["n_labels"] == 3
        # history: 4 entries over epochs 1..2, (0.4 - 0.1) s / (2 - 1) epoch
        assert record["n_epochs"] == 2 and record["seconds_per_epoch"] == pytest.approx(0.3)
    slow = next(r for r in ok if r["model"] == "slowmodel")
    assert slow["settings"] == {"n_epochs": 3, "name": "x y"} and slow["baseline"] is False
    assert next(r for r in ok if r["model"] == "logistic")["baseline"] is True


def test_missing_optional_baseline_is_skipped_and_a_failure_is_recorded(tiny_records):
    _, records = tiny_records
    skipped = [r for r in records if r["model"] == "napkinxc_plt"]
    assert len(skipped) == 6 and all(r["status"] == "skipped" for r in skipped)
    assert "napkinxc" in skipped[0]["reason"] and "bayesmlc[compare]" in skipped[0]["reason"]
    failed = [r for r in records if r["model"] == "brokenmodel"]
    assert len(failed) == 6 and all(r["status"] == "failed" for r in failed)
    assert failed[0]["reason"] == "exit code 2" and failed[0]["returncode"] == 2
    assert failed[0]["stderr_tail"].endswith("ValueError: broken on purpose")


def _row(markdown: str, section: str, label: str) -> list[str]:
    """Cells of the first table row starting with ``label`` after the heading ``section``."""
    text = markdown[markdown.index(section):]
    line = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_report_tables_medians_spreads_ratios_and_published_rows(tiny_records):
    _, records = tiny_records
    text = render_report(records, suite="tiny", command="bayesmlc bench --suite tiny")
    # alpha, logistic: P@1 60, 64, 62 -> median 62.00, half range 2.00; train 1, 3, 2 s -> 2 ±1
    ranking = _row(text, "## alpha", "logistic (default)")
    assert ranking[1:3] == ["3/3", "62.00 ±2.00"]
    ranking = _row(text, "## alpha", "slowmodel (small)")
    assert ranking[2] == "66.00 ±10.00"
    other = _row(text, "Probabilities and cost", "slowmodel (small)")
    # columns: AUC micro, AUC macro, F1, exact, ECE all pairs, ECE@1, ECE@5, AURC, train s, predict s,
    # peak MB, run s, run CPU s, ratio
    assert other[2] == "0.9000 ±0.0000" and other[3] == "–" and other[6] == "0.0500 ±0.0000"
    assert other[7] == "0.2000 ±0.0000" and other[8] == "–" and other[9] == "0.3000 ±0.0000"
    assert other[10] == "7 ±3"
    # ratios to the fastest baseline's median (2 s): 10/2, 4/2, 7/2 -> 3.5 ±1.5
    assert other[15] == "3.5 ±1.5×"
    assert _row(text, "Probabilities and cost", "logistic (default)")[15] == "1 ±0.5×"
    # beta: identical repeats show a zero spread; 5 s / 0.5 s = 10x
    beta = text[text.index("## beta"):]
    assert _row(beta, "Ranking", "slowmodel (small)")[2] == "40.00 ±0.00"
    assert _row(beta, "Probabilities and cost", "slowmodel (small)")[15] == "10 ±0×"
    assert "Calibration, raw and recalibrated" not in text  # no calibrated runs, no calibration table
    assert "fastest baseline: logistic (default)" in beta
    # not completed: skipped optional baseline and failed model are listed with their reasons
    done = text[text.index("## Runs not completed"):]
    assert "alpha/napkinxc_plt-default/r0 | skipped" in done
    assert "alpha/brokenmodel-default/r2 | failed | exit code 2 | `ValueError: broken on purpose`" in done
    assert "bayesmlc bench --suite tiny" in text


def test_calibrated_runs_are_planned_run_and_reported_side_by_side(tmp_path, tiny_data_root, no_napkinxc):
    runs = plan_runs(TINY, tmp_path, datasets=["alpha"], models=["logistic"], calibrate=["isotonic", "platt"],
                     data_root=tiny_data_root)
    assert [(r.config, r.calibrate) for r in runs] == [("default", None), ("default+isotonic", "isotonic"),
                                                       ("default+platt", "platt")]
    command = CLIRunner(threads=1).command(runs[1], tmp_path)
    assert command[-2:] == ["--calibrate", "isotonic"] and "--calibrate" not in CLIRunner(threads=1).command(runs[0], tmp_path)
    with pytest.raises(ValidationError, match="--calibrate beta"):
        plan_runs(TINY, tmp_path, calibrate=["beta"], data_root=tiny_data_root)
    out = tmp_path / "bench"
    records = run_suite(TINY, out, repeats=2, data_root=tiny_data_root, run_one=fake_run_one, availability=_availability,
                        threads=1, log=lambda message: None, calibrate=("isotonic",), datasets=["alpha"])
    calibrated = [r for r in records if r.get("calibrate") == "isotonic" and r["status"] == "ok"]
    assert {r["config"] for r in calibrated} == {"default+isotonic", "small+isotonic"}
    assert all(r["calibration_seconds"] == 0.25 and r["calibrated_fit_seconds"] == 0.75 for r in calibrated)
    text = render_report(records, suite="tiny")
    table = text[text.index("Calibration, raw and recalibrated"):]
    # model, method, P@1 raw, P@1 cal, P@5 raw, P@5 cal, ECE@1 raw, ECE@1 cal, ECE@5 raw, ECE@5 cal, AURC raw,
    # AURC cal, train s raw, train s cal, calibration s
    row = _row(table, "Calibration", "slowmodel (small)")
    assert row[1] == "isotonic" and row[2] == "60.00 ±10.00" and row[3] == "60.00 ±10.00"
    assert row[6] == "**0.2000 ±0.0000**" and row[7] == "**0.1000 ±0.0000**" and row[8] == "–"
    assert row[10] == "**0.3000 ±0.0000**" and row[11] == "**0.2500 ±0.0000**"
    assert row[12] == "7 ±3" and row[14] == "0.25 ±0"
    # calibrated configurations stay out of the ranking table and of the fastest-baseline choice
    ranking = text[text.index("Ranking"):text.index("Probabilities and cost")]
    assert "+isotonic" not in ranking
    plots = make_plots(records, out)
    assert ("alpha: risk-coverage curves", "plots/alpha-risk-coverage.png") in plots["alpha"]


def test_calibration_folds_reach_the_runs_records_resume_keys_and_report(tmp_path, tiny_data_root, no_napkinxc):
    runs = plan_runs(TINY, tmp_path, datasets=["alpha"], models=["logistic"], calibrate=["isotonic"],
                     calibration_folds=5, data_root=tiny_data_root)
    assert [(r.config, r.calibrate, r.calibration_folds) for r in runs] == [
        ("default", None, None), ("default+isotonic-cv5", "isotonic", 5)]
    assert CLIRunner(threads=1).command(runs[1], tmp_path)[-4:] == ["--calibrate", "isotonic", "--calibration-folds", "5"]
    assert "--calibration-folds" not in CLIRunner(threads=1).command(runs[0], tmp_path)
    # a 20%-split run, a 5-fold and a 3-fold run are three runs, in three folders
    split, three = (plan_runs(TINY, tmp_path, datasets=["alpha"], models=["logistic"], calibrate=["isotonic"],
                              calibration_folds=folds, data_root=tiny_data_root)[1] for folds in (None, 3))
    assert len({split.run_id, three.run_id, runs[1].run_id}) == 3
    for folds, message in ((3, "--calibration-folds: only with --calibrate"), (1, "needs at least 2 folds, got 1")):
        with pytest.raises(ValidationError, match=message):
            plan_runs(TINY, tmp_path, calibrate=["isotonic"] if folds == 1 else (), calibration_folds=folds,
                      data_root=tiny_data_root)

    out, calls = tmp_path / "bench", []

    def counting_run_one(spec, run_dir):
        calls.append((spec.run_id, spec.calibration_folds))
        return fake_run_one(spec, run_dir)

    def run(folds, resume=True):
        calls.clear()
        return run_suite(TINY, out, data_root=tiny_data_root, run_one=counting_run_one, availability=_availability,
                         threads=1, log=lambda message: None, calibrate=("isotonic",), datasets=["alpha"],
                         models=["slowmodel"], calibration_folds=folds, resume=resume)

    run(None, resume=False)
    assert calls == [("alpha/slowmodel-small/r0", None), ("alpha/slowmodel-small+isotonic/r0", None)]
    # --resume with folds: the raw run is kept, the 20%-split run is not taken for the cross-fitted one
    records = run(5)
    assert calls == [("alpha/slowmodel-small+isotonic-cv5/r0", 5)]
    assert run(5) and calls == []  # finished: nothing reruns
    run(3)
    assert calls == [("alpha/slowmodel-small+isotonic-cv3/r0", 3)]
    crossed = next(r for r in records if r["config"] == "small+isotonic-cv5")
    assert crossed["calibrate"] == "isotonic" and crossed["calibration_folds"] == 5
    assert crossed["calibrated_fit_seconds"] == 0.75
    assert next(r for r in records if r["config"] == "small")["calibration_folds"] is None

    # the report: the cross-fitted rows are paired with their raw run and described as cross-fitted
    only_crossed = [r for r in records if r["config"] != "small+isotonic"]
    text = render_report(only_crossed, suite="tiny")
    sentence = next(line for line in text.splitlines() if line.startswith("Calibration, raw and recalibrated"))
    assert "by 5-fold cross-fitting" in sentence and "then the model refitted on all rows" in sentence
    assert "includes 6 fits" in sentence and "20% held-out" not in sentence
    row = _row(text, "Calibration", "slowmodel (small)")
    assert row[1] == "isotonic, 5 folds" and row[2] == "70.00" and row[7] == "**0.1000**"
    # the 20%-split sentence is unchanged, and a resumed suite that mixes both says both, row by row
    split_only = render_report([r for r in records if r["config"] != "small+isotonic-cv5"], suite="tiny")
    assert ("Calibration, raw and recalibrated on 20% held-out training rows (`cal`: the model fitted on the other "
            "80%; ECE@k") in split_only and "cross-fitting" not in split_only
    assert _row(split_only, "Calibration", "slowmodel (small)")[1] == "isotonic"
    mixed = render_report(records, suite="tiny")
    assert "on 20% held-out training rows or by 5-fold cross-fitting" in mixed
    assert sorted(line.split("|")[2].strip() for line in mixed.splitlines()
                  if line.startswith("| slowmodel (small) | iso")) == ["isotonic", "isotonic, 5 folds"]


@pytest.mark.parametrize("extra, message", [
    (["--calibration-folds", "3"], "--calibration-folds: only with --calibrate"),
    (["--calibrate", "isotonic", "--calibration-folds", "1"], "--calibration-folds: needs at least 2 folds, got 1"),
])
def test_bench_cli_refuses_calibration_folds_without_calibrate_or_below_two(tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    assert bench_main(["--suite", "quick", "--out", str(out), "--quiet", "--no-plots"] + extra) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"bayesmlc bench: error: {message}" + (
        " (it sets how the calibration maps are fitted)" if "only with" in message else "")
    assert not out.exists()  # refused before any run


def test_report_marks_published_numbers():
    record = {"run_id": "scene/logistic-default/r0", "dataset": "scene", "model": "logistic", "config": "default",
              "baseline": True, "status": "ok", "metrics": {"P@1": 0.5, "F1_example": 0.6}, "train_seconds": 1.0}
    text = render_report([record], suite="x")
    row = _row(text, "Probabilities and cost", "BNMC-S *(published)*")
    assert row[1] == "–" and row[4] == "70.40" and row[5] == "66.20"  # F1 example and exact match, %
    ranking = _row(text, "Ranking", "cosine kNN vote *(reference run)*")
    assert ranking[2] == "76.00"
    assert _row(text, "Ranking", "logistic (default)")[2] == "50.00"


def test_format_cell():
    assert format_cell([], "pct") == "–"
    assert format_cell([0.5], "pct") == "50.00"
    assert format_cell([0.1, 0.3, 0.2, 0.9], "frac") == "0.2500 ±0.4000"
    assert format_cell([250.0, 150.0], "sec") == "200 ±50"


def test_plots_are_written_and_embedded(tiny_records):
    out, records = tiny_records
    plots = make_plots(records, out)
    assert set(plots) == {"alpha", "beta"}
    for dataset, entries in plots.items():
        assert [path for _, path in entries] == [f"plots/{dataset}-{kind}.png" for kind in
                                                 ("objective", "p1-time", "reliability", "risk-coverage")]
        for _, path in entries:
            assert (out / path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = render_report(records, suite="tiny", plots=plots)
    assert "![alpha: reliability diagrams](plots/alpha-reliability.png)" in text


def test_report_spliced_into_a_document_keeps_hand_text_and_replaces_only_its_own_region(tiny_records):
    out, records = tiny_records
    report = render_report(records, suite="tiny", plots={"alpha": [("alpha: a plot", "plots/alpha-objective.png")]})
    document = "# Benchmarks\n\nHand-written text.\n"
    first = splice_into_document(document, "tiny", report, plots_folder="benchmarks-tiny")
    assert first.startswith(document)
    assert "## Benchmarks from the harness: the `tiny` suite" in first
    assert "\n### alpha\n" in first and "\n## alpha\n" not in first  # dataset headings demoted below the section
    assert "# bayesmlc benchmark" not in first  # the report's own title is dropped
    assert "](benchmarks-tiny/alpha-objective.png)" in first and "](plots/" not in first
    # a second suite's region and edits outside the markers survive a rerun; the old region is replaced
    edited = first.replace("Hand-written text.", "Edited text.") + "\n## Afterword\n"
    edited = splice_into_document(edited, "other", "# t\n\nother suite\n", plots_folder="benchmarks-other")
    again = splice_into_document(edited, "tiny", report.replace("alpha", "gamma"), plots_folder="benchmarks-tiny")
    assert "Edited text." in again and "## Afterword" in again and "other suite" in again
    assert "### gamma" in again and "### alpha" not in again
    assert again.count("the `tiny` suite") == 1


@pytest.mark.parametrize("with_plots, kept", [(True, ["alpha-objective.png"]), (False, ["old.png"])])
def test_doc_option_replaces_the_plot_folder_beside_the_document_unless_without_plots(tmp_path, tiny_records,
                                                                                      with_plots, kept):
    # with plots, the folder beside the document becomes OUT's plots; with --no-plots (None) the report
    # links no plots, so the folder (which another document of the same suite may use) keeps its
    # files and OUT's old plots are not copied
    from bayesmlc.bench.cli import _write_into_document

    out, records = tiny_records
    (out / "plots").mkdir()
    (out / "plots" / "alpha-objective.png").write_bytes(b"png")
    (out / "report.md").write_text(render_report(records, suite="tiny"))
    document = tmp_path / "docs" / "benchmarks.md"
    (document.parent / "benchmarks-tiny").mkdir(parents=True)
    (document.parent / "benchmarks-tiny" / "old.png").write_bytes(b"old")
    _write_into_document(document, "tiny", out / "report.md", out / "plots" if with_plots else None)
    assert sorted(p.name for p in (document.parent / "benchmarks-tiny").iterdir()) == kept
    assert "### alpha" in document.read_text() and ".png" not in document.read_text()


def test_scale_plot_and_table(tmp_path):
    records = []
    for n, seconds in ((100, 1.0), (400, 4.0)):
        for model in ("logistic", "mlgpf"):
            records.append({"run_id": f"n{n}/{model}", "dataset": f"n{n}", "model": model, "config": "speed",
                            "status": "ok", "metrics": {}, "train_seconds": seconds * (3 if model == "mlgpf" else 1),
                            "seconds_per_epoch": seconds / 2, "n_epochs": 2, "peak_rss_mb": 50.0 + n,
                            "dataset_shape": {"n_train": n, "n_test": 10, "n_features": 20, "n_labels": 5}})
    plots = make_plots(records, tmp_path, quality=False)
    assert (tmp_path / "plots" / "scale.png").stat().st_size > 0
    text = render_report(records, suite="scale", quality=False, plots=plots)
    assert "### n400 (N=400, D=20, L=5)" in text
    assert _row(text[text.index("### n400"):], "### n400", "mlgpf (speed)")[2:] == ["2", "2", "12", "–", "450", "–", "–", "3×"]


@pytest.mark.parametrize("suite_name", sorted(SUITES))
def test_suite_settings_are_valid_model_parameters(suite_name):
    from bayesmlc.baselines import REGISTRY_ENTRIES
    from bayesmlc.models import MODEL_CLASSES, get_model_class

    for config in SUITES[suite_name].configs:
        if config.model in REGISTRY_ENTRIES:
            cls = getattr(baselines, REGISTRY_ENTRIES[config.model].partition(":")[2])
        elif config.model in MODEL_CLASSES:
            if missing_dependency(config.model) is not None:  # an optional baseline not installed here
                continue
            cls = get_model_class(config.model)
        else:
            pytest.fail(f"suite {suite_name}: model {config.model!r} is neither registered nor a bench baseline")
        valid = set(cls().get_params())
        for dataset in SUITES[suite_name].dataset_names:
            unknown = set(config.params_for(dataset)) - valid
            assert not unknown, f"{suite_name}/{config.model}-{config.config} on {dataset}: unknown {unknown}"


def test_epoch_timing_units():
    assert epoch_timing({"wall_time": [], "objective": []}) == (None, None)
    # per logged entry: 4 entries, 0.5 s from the first to the last over 3 steps
    n, per = epoch_timing({"wall_time": [1.0, 1.2, 1.3, 1.5], "objective": [0, 0, 0, 0]})
    assert n == 4 and per == pytest.approx(0.5 / 3)
    n, per = epoch_timing({"wall_time": [2.0, 4.0, 6.0], "objective": [0, 0, 0], "sweep": [1, 2, 3]})
    assert n == 3 and per == pytest.approx(2.0)
    assert epoch_timing({"wall_time": [3.0], "objective": [0.0]}) == (1, 3.0)


def test_plan_runs_selection_and_errors(tmp_path):
    runs = plan_runs(SUITES["quick"], tmp_path, datasets=["scene"], models=["logistic", "knn"], repeats=2, seed=5)
    assert [(r.dataset, r.model, r.seed) for r in runs] == [
        ("scene", "logistic", 5), ("scene", "logistic", 6), ("scene", "knn", 5), ("scene", "knn", 6)]
    assert runs[0].params == {"standardize": True} and runs[0].baseline
    with pytest.raises(Exception, match="not in suite 'quick'"):
        plan_runs(SUITES["quick"], tmp_path, datasets=["bibtex"])
    with pytest.raises(Exception, match="--repeats"):
        plan_runs(SUITES["quick"], tmp_path, repeats=0)
    # MODEL:CONFIG keeps one configuration of a model; MODEL keeps all of them
    standard = SUITES["standard"]
    runs = plan_runs(standard, tmp_path, datasets=["scene"], models=["mlgpf:default", "bnmc", "knn"])
    assert [(r.model, r.config) for r in runs] == [
        ("knn", "default"), ("bnmc", "paper-L"), ("bnmc", "paper-S"), ("bnmc", "default"), ("mlgpf", "default")]
    with pytest.raises(Exception, match="no configuration 'fast' of mlgpf; it has default, paper"):
        plan_runs(standard, tmp_path, models=["mlgpf:fast"])
    with pytest.raises(Exception, match="not in suite"):
        plan_runs(standard, tmp_path, models=["nope:default"])


def test_cli_runner_set_values_round_trip_through_the_cli_parser(tmp_path):
    from bayesmlc.parameters import parse_set_values

    params = {"C": 2.0, "max_iter": 7, "name": "two words", "flag": True, "nothing": None, "sizes": [1, 2]}
    spec = RunSpec("s", "d", "logistic", "c", params, 3, 0, True, 5.0, tmp_path / "train.txt", tmp_path / "test.txt")
    command = CLIRunner(threads=2, device="cpu").command(spec, tmp_path / "run")
    pairs = [command[i + 1] for i, token in enumerate(command) if token == "--set"]
    assert parse_set_values(pairs, params.keys()) == params
    assert command[command.index("--seed") + 1] == "3" and command[-2:] == ["--device", "cpu"]
    assert CLIRunner(threads=2).environment()["OMP_NUM_THREADS"] == "2"


def test_cli_runner_gives_a_registered_set_its_propensity_constants_by_name(tmp_path):
    """A real registered set passes its registry name to --propensity (so WikiLSHTC-325K gets A=0.5,
    B=0.4 wherever its files lie); synthetic sets and a user's files pass nothing: the defaults."""
    from bayesmlc.cli import build_parser

    def command(name, dataset_spec):
        spec = RunSpec("s", name, "logistic", "c", {}, 0, 0, True, 5.0, tmp_path / "a" / "train.txt",
                       tmp_path / "a" / "test.txt", dataset_spec=dataset_spec)
        return CLIRunner(threads=1).command(spec, tmp_path / "run")

    registered = command("wikilshtc-325k", DatasetSpec("wikilshtc-325k"))
    assert registered[registered.index("--propensity") + 1] == "wikilshtc-325k"
    assert build_parser().parse_args(registered[3:]).propensity == (0.5, 0.4)
    for name, dataset_spec in (("eurlex-4k-0.1", DatasetSpec("eurlex-4k-0.1", {"preset": "eurlex-4k", "scale": 0.1})),
                               ("bibtex", DatasetSpec("bibtex", files=("x/train.txt", "x/test.txt"))),
                               ("mine", DatasetSpec("mine"))):
        assert "--propensity" not in command(name, dataset_spec), name


def _fake_python(tmp_path, body: str) -> str:
    path = tmp_path / "fake-python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.mark.parametrize("body, status, reason, tail", [
    ("sleep 10", "timeout", "timed out after 0.5 s", ""),
    ("echo oops >&2; exit 3", "failed", "exit code 3", "oops"),
    ("echo 'not json'", "failed", "the last stdout line is not the CLI's JSON record", ""),
])
def test_cli_runner_failures_are_recorded(tmp_path, tiny_data_root, body, status, reason, tail):
    suite = Suite("t", "", (DatasetSpec("alpha"),), (ModelConfig("logistic", "default"),), timeout_s=0.5)
    records = run_suite(suite, tmp_path / "out", data_root=tiny_data_root, threads=1, log=lambda m: None,
                        run_one=CLIRunner(threads=1, python=_fake_python(tmp_path, body)))
    (record,) = records
    assert record["status"] == status and record["reason"].startswith(reason)
    assert record["stderr_tail"].strip() == tail


def test_a_run_records_its_wall_and_cpu_seconds_and_the_threads_it_chose(tmp_path, tiny_data_root, monkeypatch):
    """A child that burns 0.4 s of CPU (by its own clock, which it prints) and says it used 1 thread:
    the record holds at least that CPU time (the child's interpreter start adds some), its wall time,
    and, with no --threads, the child's count; the child's environment sets no thread count."""
    import sys

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    script = tmp_path / "burn.py"
    script.write_text("import json, os, time\n"
                      "while time.process_time() < 0.4:\n    pass\n"
                      "print(json.dumps({'metrics': {}, 'threads': 1, 'own_cpu': time.process_time(),\n"
                      "                  'omp': os.environ.get('OMP_NUM_THREADS')}))\n")
    body = f"exec {sys.executable} {script}"
    suite = Suite("t", "", (DatasetSpec("alpha"),), (ModelConfig("logistic", "default"),), timeout_s=60)
    (record,) = run_suite(suite, tmp_path / "out", data_root=tiny_data_root, log=lambda m: None,
                          run_one=CLIRunner(python=_fake_python(tmp_path, body)))
    assert record["status"] == "ok" and record["omp"] is None
    assert record["own_cpu"] <= record["cpu_seconds"] <= record["own_cpu"] + 5.0
    assert record["wall_seconds"] >= record["cpu_seconds"] - 0.05  # one thread: CPU cannot outrun the clock
    assert record["threads"] == 1 and record["threads_requested"] is None
    text = render_report([record], suite="t", command="bayesmlc bench --suite t")
    assert "threads per run: one per idle core when each run started (1 chosen)" in text
    row = _row(text, "Probabilities and cost", "logistic (default)")
    assert row[13] == format_cell([record["wall_seconds"]], "sec") and row[14] == format_cell([record["cpu_seconds"]], "sec")


def test_missing_dataset_is_skipped_with_its_path(tmp_path):
    suite = Suite("t", "", (DatasetSpec("nowhere"),), (ModelConfig("logistic", "default"),))
    (record,) = run_suite(suite, tmp_path / "out", data_root=tmp_path, run_one=fake_run_one, log=lambda m: None)
    assert record["status"] == "skipped" and str(tmp_path / "nowhere" / "train.txt") in record["reason"]


def test_excluded_pair_is_skipped_and_resume_reruns_only_what_did_not_finish(tmp_path, tiny_data_root):
    suite = Suite("t", "", (DatasetSpec("alpha"), DatasetSpec("beta")),
                  (ModelConfig("logistic", "default", exclude={"beta": "too big here"}),
                   ModelConfig("brokenmodel", "default")))
    calls = []

    def counting_run_one(spec, run_dir):
        calls.append(spec.run_id)
        return fake_run_one(spec, run_dir)

    first = run_suite(suite, tmp_path / "out", data_root=tiny_data_root, run_one=counting_run_one,
                      availability=lambda model: None, log=lambda m: None)
    assert [(r["run_id"], r["status"]) for r in first] == [
        ("alpha/logistic-default/r0", "ok"), ("alpha/brokenmodel-default/r0", "failed"),
        ("beta/logistic-default/r0", "skipped"), ("beta/brokenmodel-default/r0", "failed")]
    assert first[2]["reason"] == "too big here"
    assert calls == ["alpha/logistic-default/r0", "alpha/brokenmodel-default/r0", "beta/brokenmodel-default/r0"]
    calls.clear()
    again = run_suite(suite, tmp_path / "out", data_root=tiny_data_root, run_one=counting_run_one, resume=True,
                      availability=lambda model: None, log=lambda m: None)
    assert calls == ["alpha/brokenmodel-default/r0", "beta/brokenmodel-default/r0"]
    assert again[0] == first[0]
    assert [r["run_id"] for r in read_results(tmp_path / "out" / "results.jsonl")] == [r["run_id"] for r in first]


def test_missing_dependency_reason(no_napkinxc):
    assert "pip install 'bayesmlc[compare]'" in missing_dependency("napkinxc_plt")
    assert missing_dependency("knn") is None and missing_dependency("logistic") is None


# ---- the kNN baseline -----------------------------------------------------------------------------
def test_knn_matches_brute_force_cosine_vote():
    rng = np.random.default_rng(3)
    X_train = sp.random(60, 15, density=0.3, random_state=1, format="csr", dtype=np.float32)
    Y_train = (rng.random((60, 4)) < 0.3).astype(np.float32)
    Y_train[:4] = np.eye(4)  # every label has a positive
    X_test = sp.random(9, 15, density=0.3, random_state=2, format="csr", dtype=np.float32)
    model = KNNBaseline(n_neighbors=5).fit(X_train, Y_train)
    proba = model.predict_proba(X_test)

    def unit(matrix):
        dense = matrix.toarray().astype(np.float64)
        norms = np.linalg.norm(dense, axis=1, keepdims=True)
        return dense / np.where(norms == 0, 1, norms)

    similarity = unit(X_test) @ unit(X_train).T
    prior = (Y_train.sum(0) + 0.5) / (60 + 1.0)
    for i in range(9):
        top = np.argsort(-similarity[i], kind="stable")[:5]
        weights = np.maximum(similarity[i, top], 0)
        expected = weights @ Y_train[top] / weights.sum() if weights.sum() > 0 else prior
        np.testing.assert_allclose(proba[i], expected, rtol=1e-5, atol=1e-6)
    # uniform weighting on neighbours: plain fraction of the 5 neighbours carrying each label
    uniform = KNNBaseline(n_neighbors=5, weighting="uniform").fit(X_train, Y_train).predict_proba(X_test)
    top = np.argsort(-similarity[0], kind="stable")[:5]
    np.testing.assert_allclose(uniform[0], Y_train[top].mean(0), atol=1e-6)


def test_knn_missing_labels_vote_among_observed_neighbours_and_round_trips(tmp_path):
    X = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    Y = np.array([[1, 0], [0, 1], [0, 1], [0, 1]])
    mask = np.array([[1, 1], [0, 1], [1, 1], [1, 1]])  # row 1's label 0 is unobserved
    model = KNNBaseline(n_neighbors=2, weighting="uniform", standardize=False).fit(X, Y, label_mask=mask)
    proba = model.predict_proba(np.array([[1.0, 0.05]]))
    # neighbours rows 0 and 1: label 0 observed only at row 0 (a positive) -> 1.0; label 1: 1 of 2 -> 0.5
    np.testing.assert_allclose(proba, [[1.0, 0.5]], atol=1e-6)
    model.save(tmp_path / "knn.npz")
    loaded = KNNBaseline.load(tmp_path / "knn.npz")
    np.testing.assert_array_equal(loaded.predict_proba(X), model.predict_proba(X))


def test_knn_standardises_dense_features_automatically():
    rng = np.random.default_rng(0)
    X = 5.0 + rng.random((30, 4))  # all-positive dense features: raw cosines are all near 1
    Y = (rng.random((30, 3)) < 0.4).astype(float)
    Y[:3] = np.eye(3)
    model = KNNBaseline(n_neighbors=3).fit(X, Y)
    np.testing.assert_allclose(model.preprocessor_.mean_, X.mean(0), rtol=1e-5)
    np.testing.assert_allclose(model.preprocessor_.scale_, X.std(0), rtol=1e-5)
    assert KNNBaseline(standardize="auto").fit(sp.random(30, 40, density=0.05, random_state=0), Y).preprocessor_.mean_ is None


@pytest.mark.skipif(missing_dependency("napkinxc_plt") is not None, reason="napkinxc not installed")
def test_napkinxc_plt_learns_and_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    X = (rng.random((200, 12)) < 0.4) * rng.random((200, 12))
    Y = (X @ rng.normal(size=(12, 4)) > 0.3).astype(float)
    model = baselines.NapkinXCPLT(random_state=0).fit(X[:150], Y[:150])
    scores = model.decision_function(X[150:])
    base_rate = Y[150:].mean()
    assert Y[150:][np.arange(50), scores.argmax(1)].mean() > base_rate + 0.2
    model.save(tmp_path / "plt.npz")
    np.testing.assert_array_equal(baselines.NapkinXCPLT.load(tmp_path / "plt.npz", allow_native=True).decision_function(X[150:]), scores)


@pytest.mark.skipif(missing_dependency("napkinxc_plt") is not None, reason="napkinxc not installed")
@pytest.mark.parametrize("name", ["napkinxc_plt", "omikuji_parabel"])
def test_tree_baselines_score_the_top_100_labels_by_default(name):
    """With more labels than DEFAULT_PREDICT_TOP_K, a row scores at most that many (the rest 0); napkinXC's
    top-k search is exact, so its 100 are the 100 best of scoring every label, with the same values;
    on L <= 100 labels the default scores every label, beam included (omikuji: as predict_top_k=None)."""
    if missing_dependency(name) is not None:
        pytest.skip(f"{name}: optional package missing")
    from bayesmlc.models import get_model_class

    rng = np.random.default_rng(2)
    X = sp.csr_matrix((rng.random((300, 20)) < 0.3) * rng.random((300, 20)))
    Y = (np.asarray(X @ rng.normal(size=(20, 140))) + rng.normal(size=(300, 140)) > 1.2).astype(np.float32)
    Y[np.arange(300), rng.integers(0, 140, 300)] = 1.0
    model = get_model_class(name)(n_threads=1).fit(X[:250], Y[:250])
    assert model.predict_top_k == baselines.DEFAULT_PREDICT_TOP_K == 100
    top = model.predict_proba(X[250:])
    scored = (top > 0).sum(axis=1)
    every = model.set_params(predict_top_k=None).predict_proba(X[250:])
    if name == "napkinxc_plt":
        np.testing.assert_array_equal(scored, 100)
        kept = top > 0
        np.testing.assert_array_equal(top[kept], every[kept])
        for row_top, row_every in zip(top, every):  # the 100 kept are the 100 best (up to ties)
            assert row_every[row_top > 0].min() >= np.sort(row_every)[-100] - 1e-7
    else:  # omikuji's default beam of 10 reaches fewer than 100 labels here, always the 5 the metrics rank
        assert np.all((scored >= 5) & (scored <= 100)) and (every > 0).sum(axis=1).min() > scored.max()
    small = get_model_class(name)(n_threads=1).fit(X[:250], Y[:250, :30])
    np.testing.assert_array_equal(small.predict_proba(X[250:]), small.set_params(predict_top_k=None).predict_proba(X[250:]))


def test_xc_file_for_omikuji_round_trips_and_fills_empty_rows(tmp_path):
    from bayesmlc.data.io import read_dataset

    X = sp.csr_matrix(np.array([[0.5, 0.0, 2.25], [0.0, 0.0, 0.0], [0.0, 1e-7, 0.0]], dtype=np.float32))
    Y = sp.csr_matrix(np.array([[1, 0], [0, 1], [0, 0]], dtype=np.float32))
    baselines._write_xc_file(str(tmp_path / "d.txt"), X, Y)
    lines = (tmp_path / "d.txt").read_text().splitlines()
    assert lines == ["3 3 2", "0 0:0.5 2:2.25", "1 0:0", " 1:1.00000001e-07"]
    data = read_dataset(tmp_path / "d.txt")
    np.testing.assert_array_equal(data.X.toarray(), X.toarray())
    np.testing.assert_array_equal(data.Y.toarray(), Y.toarray())


@pytest.mark.skipif(missing_dependency("omikuji_parabel") is not None, reason="omikuji not installed")
def test_omikuji_trains_with_featureless_rows_and_round_trips(tmp_path):
    rng = np.random.default_rng(1)
    X = (rng.random((120, 10)) < 0.3) * 1.0
    X[:5] = 0.0  # rows without features
    Y = (X @ rng.normal(size=(10, 3)) > 0.2).astype(float)
    Y[np.arange(120), np.arange(120) % 3] = 1
    model = baselines.OmikujiParabel(n_threads=1).fit(X[:90], Y[:90])
    scores = model.decision_function(X[90:])
    assert scores.shape == (30, 3) and np.all((scores >= 0) & (scores <= 1))
    model.save(tmp_path / "omikuji.npz")
    # omikuji stores its weights in its own format: reloaded scores agree to float32 rounding
    np.testing.assert_allclose(baselines.OmikujiParabel.load(tmp_path / "omikuji.npz", allow_native=True).decision_function(X[90:]),
                               scores, rtol=1e-6, atol=1e-7)


# ---- end to end through the real CLI ----------------------------------------------------------------


@pytest.fixture
def toy_e2e(tmp_path, monkeypatch):
    """A 90 + 30-row toy set under ``tmp_path/data/toy`` and a one-configuration suite ``e2e`` (logistic);
    returns ``(X, Y)``."""
    pytest.importorskip("bayesmlc.cli")
    pytest.importorskip("bayesmlc.data.io", reason="the data readers have not landed yet")
    rng = np.random.default_rng(0)
    X = (rng.random((120, 10)) < 0.4) * rng.integers(1, 3, size=(120, 10))
    Y = (X @ rng.normal(size=(10, 4)) > 0.5).astype(int)
    Y[np.arange(120), np.arange(120) % 4] = 1
    (tmp_path / "data" / "toy").mkdir(parents=True)
    _write_xc(tmp_path / "data" / "toy" / "train.txt", X[:90], Y[:90])
    _write_xc(tmp_path / "data" / "toy" / "test.txt", X[90:], Y[90:])
    suite = Suite("e2e", "", (DatasetSpec("toy"),), (ModelConfig("logistic", "c2", {"C": 2.0, "max_iter": 30}),),
                  timeout_s=120)
    monkeypatch.setitem(SUITES, "e2e", suite)
    return X, Y


def test_end_to_end_with_the_real_cli(tmp_path, toy_e2e):
    X, Y = toy_e2e
    out = tmp_path / "out"
    code = bench_main(["--suite", "e2e", "--out", str(out), "--data-root", str(tmp_path / "data"), "--threads", "1",
                       "--quiet", "--no-plots"])
    assert code == 0
    (record,) = read_results(out / "results.jsonl")
    assert record["status"] == "ok" and record["params"]["C"] == 2.0 and record["params"]["random_state"] == 0
    assert record["threads"] == 1 and record["dataset_shape"] == {"n_train": 90, "n_test": 30, "n_features": 10,
                                                                  "n_labels": 4}
    assert (out / record["run_dir"] / "model.npz").exists() and record["n_epochs"] >= 1
    # the record's P@1 is that of the saved model's scores on the test file, computed here independently
    from bayesmlc.base import MultiLabelEstimator

    model = MultiLabelEstimator.load(out / record["run_dir"] / "model.npz")
    best = model.decision_function(X[90:].astype(float)).argmax(axis=1)
    assert record["metrics"]["P@1"] == pytest.approx(Y[90:][np.arange(30), best].mean())
    report = (out / "report.md").read_text()
    assert _row(report, "## toy", "logistic (c2)")[2] == f"{100 * record['metrics']['P@1']:.2f}"


def test_calibration_folds_end_to_end_fit_a_cross_fitted_wrapper(tmp_path, toy_e2e):
    from bayesmlc.base import MultiLabelEstimator
    from bayesmlc.calibration import CalibratedClassifier

    out = tmp_path / "out"
    code = bench_main(["--suite", "e2e", "--out", str(out), "--data-root", str(tmp_path / "data"), "--threads", "1",
                       "--quiet", "--no-plots", "--calibrate", "isotonic", "--calibration-folds", "3"])
    assert code == 0
    raw, crossed = read_results(out / "results.jsonl")
    assert (raw["config"], crossed["config"]) == ("c2", "c2+isotonic-cv3") and crossed["calibration_folds"] == 3
    model = MultiLabelEstimator.load(out / crossed["run_dir"] / "model.npz")
    # cross-fitted: cv=3, the maps saw every one of the 90 training rows (a 20% split: 18 of them)
    assert isinstance(model, CalibratedClassifier) and model.cv == 3 and model.method == "isotonic"
    np.testing.assert_array_equal(model.calibration_rows_, np.arange(90))
    assert crossed["calibrated_fit_seconds"] > 0 and crossed["calibration_seconds"] > 0
    report = (out / "report.md").read_text()
    assert "--calibrate isotonic --calibration-folds 3 --threads 1" in report
    assert "recalibrated by 3-fold cross-fitting" in report
