"""The command line, end to end, on small files written here and on the real Bibtex set."""

import json

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn import metrics as skm

from bayesmlc.cli import main
from bayesmlc.exceptions import ValidationError
from bayesmlc.parameters import parse_set_values
from bayesmlc.linear import LogisticRegression

from conftest import shared_dataset_dir

METRIC_KEYS = {f"{m}@{k}" for m in ("P", "nDCG", "PSP", "PSnDCG", "ECE", "Brier") for k in (1, 3, 5)} | {
    "AUC_micro", "AUC_macro", "AUC_instance", "F1_example", "F1_micro", "F1_macro", "exact_match", "hamming_loss", "ECE", "AURC",
}


def _write_xc(path, X, Y):
    X, Y = sp.csr_matrix(X), sp.csr_matrix(Y)
    lines = [f"{X.shape[0]} {X.shape[1]} {Y.shape[1]}"]
    for i in range(X.shape[0]):
        labels = ",".join(str(j) for j in Y[i].indices)
        feats = " ".join(f"{j}:{v:g}" for j, v in zip(X[i].indices, X[i].data))
        lines.append(f"{labels} {feats}")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def tiny_files(tmp_path):
    rng = np.random.default_rng(0)
    X = (rng.random((160, 20)) < 0.3) * rng.integers(1, 4, size=(160, 20))
    W = rng.normal(size=(20, 5))
    Y = ((X @ W + rng.normal(size=(160, 5))) > 1.0).astype(int)
    Y[np.arange(160), np.argmax(X @ W, axis=1)] = 1
    _write_xc(tmp_path / "train.txt", X[:120], Y[:120])
    _write_xc(tmp_path / "test.txt", X[120:], Y[120:])
    return tmp_path


def _last_json(capsys):
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


def test_a_test_set_above_the_score_limit_is_scored_in_blocks_with_its_aucs_on_a_named_subset(tiny_files, capsys,
                                                                                                  monkeypatch):
    from bayesmlc import evaluation, metrics
    from bayesmlc.data.io import read_dataset

    monkeypatch.setattr(evaluation, "MAX_EVALUATION_ENTRIES", 100)  # 40 test rows x 5 labels = 200 scores: blocks of 20
    out = tiny_files / "run"
    assert main(["train", "--model", "logistic", "--train", str(tiny_files / "train.txt"), "--test",
                 str(tiny_files / "test.txt"), "--out", str(out), "--json", "--quiet"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out.strip().splitlines()[-1])
    assert record["evaluated_rows"] == 40 and record["auc_rows"] == 20
    assert "test.txt: 40 rows x 5 labels" in captured.err and "the AUCs over 20 rows drawn at random (seed 0)" in captured.err
    # every figure but the AUCs is that of all 40 rows; the AUCs those of the seeded 20, computed here
    model, test, train = (LogisticRegression.load(out / "model.npz"), read_dataset(tiny_files / "test.txt"),
                          read_dataset(tiny_files / "train.txt"))
    inv = metrics.inverse_propensity(train.Y)
    every = metrics.evaluate(test.Y, scores=model.decision_function(test.X), proba=model.predict_proba(test.X),
                             Y_pred=model.predict(test.X), inv_propensity=inv)
    rows = np.sort(np.random.default_rng(0).choice(40, 20, replace=False))
    X, Y = test.X[rows], test.Y[rows]
    seeded = metrics.evaluate(Y, scores=model.decision_function(X), proba=model.predict_proba(X),
                              Y_pred=model.predict(X), inv_propensity=inv)
    for key, value in every.items():
        expected = seeded[key] if key.startswith("AUC") else value
        assert record["metrics"][key] == pytest.approx(expected, abs=1e-12), key
    reliability = json.loads((out / "reliability.json").read_text())
    expected_curves = metrics.calibration_curves(test.Y, model.predict_proba(test.X),
                                                 scores=model.decision_function(test.X))
    assert reliability["top1"]["counts"] == expected_curves["top1"]["counts"]
    np.testing.assert_allclose(reliability["risk_coverage"]["risk"], expected_curves["risk_coverage"]["risk"])
    assert main(["evaluate", "--model-dir", str(out), "--test", str(tiny_files / "test.txt"), "--json"]) == 0
    again = _last_json(capsys)
    assert again["metrics"] == record["metrics"] and again["auc_rows"] == 20


def test_train_json_line_evaluate_and_predict(tiny_files, capsys):
    out = tiny_files / "run"
    code = main(["train", "--model", "logistic", "--train", str(tiny_files / "train.txt"), "--test",
                 str(tiny_files / "test.txt"), "--set", "C=2.0", "--out", str(out), "--json", "--quiet"])
    assert code == 0
    record = _last_json(capsys)
    assert set(record) == {"model", "dataset", "params", "metrics", "train_seconds", "predict_seconds", "peak_rss_mb", "device",
                           "threads", "evaluated_rows", "auc_rows"}
    assert record["evaluated_rows"] == record["auc_rows"] == 40  # every test row
    assert record["params"]["C"] == 2.0 and record["device"] == "cpu"
    assert set(record["metrics"]) == METRIC_KEYS
    assert all(0.0 <= v <= 1.0 for v in record["metrics"].values())
    for name in ("model.npz", "meta.json", "history.json", "metrics.json", "reliability.json"):
        assert (out / name).exists(), name

    assert main(["evaluate", "--model-dir", str(out), "--test", str(tiny_files / "test.txt"), "--json"]) == 0
    again = _last_json(capsys)
    for key, value in record["metrics"].items():
        assert again["metrics"][key] == pytest.approx(value, abs=1e-9), key

    assert main(["predict", "--model-dir", str(out), "--input", str(tiny_files / "test.txt"), "--top-k", "2"]) == 0
    header, *lines = capsys.readouterr().out.strip().splitlines()
    assert header.startswith("#") and "label:probability" in header
    assert len(lines) == 40 and all(len(line.split()) == 2 for line in lines)
    # the printed top label is the model's arg-max, with its predict_proba value
    model = LogisticRegression.load(out / "model.npz")
    from bayesmlc.data.io import read_dataset

    test = read_dataset(tiny_files / "test.txt")
    best = np.argmax(model.decision_function(test.X), axis=1)
    assert [int(line.split()[0].split(":")[0]) for line in lines] == best.tolist()
    proba = model.predict_proba(test.X)
    printed = [float(line.split()[0].split(":")[1]) for line in lines]
    np.testing.assert_allclose(printed, proba[np.arange(40), best], rtol=1e-5)
    # --scores: the raw decision_function values, said so in the header
    assert main(["predict", "--model-dir", str(out), "--input", str(tiny_files / "test.txt"), "--top-k", "2",
                 "--scores"]) == 0
    header, *lines = capsys.readouterr().out.strip().splitlines()
    assert "label:score" in header and "raw" in header
    scores = model.decision_function(test.X)
    np.testing.assert_allclose([float(line.split()[0].split(":")[1]) for line in lines],
                               scores[np.arange(40), best], rtol=1e-5)
    # --json: one JSON object per row (so the last line is JSON), no header
    assert main(["predict", "--model-dir", str(out), "--input", str(tiny_files / "test.txt"), "--top-k", "2",
                 "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert len(rows) == 40 and [row["labels"][0] for row in rows] == best.tolist()
    np.testing.assert_allclose([row["probabilities"][0] for row in rows], proba[np.arange(40), best], rtol=1e-5)
    # --quiet: no header
    assert main(["predict", "--model-dir", str(out), "--input", str(tiny_files / "test.txt"), "--quiet"]) == 0
    assert not capsys.readouterr().out.startswith("#")


def test_propensity_constants_come_from_the_option_never_from_the_folder_name(tiny_files, capsys):
    """A training file in a folder named like a registered set with its own constants (WikiLSHTC-325K:
    A=0.5, B=0.4) gets the defaults; --propensity takes two numbers or a registered set's name."""
    from bayesmlc import metrics
    from bayesmlc.data.io import read_dataset

    folder = tiny_files / "wikilshtc-325k"
    folder.mkdir()
    for name in ("train.txt", "test.txt"):
        (folder / name).write_bytes((tiny_files / name).read_bytes())
    train, test = read_dataset(folder / "train.txt"), read_dataset(folder / "test.txt")
    base = ["train", "--model", "logistic", "--train", str(folder / "train.txt"), "--test", str(folder / "test.txt"),
            "--json", "--quiet"]
    for option, (a, b) in (([], (0.55, 1.5)), (["--propensity", "0.5,0.4"], (0.5, 0.4)),
                           (["--propensity", "wikilshtc-325k"], (0.5, 0.4)), (["--propensity", "2,3"], (2.0, 3.0))):
        out = tiny_files / f"run-{len(option)}-{option[-1] if option else ''}"
        assert main(base + option + ["--out", str(out)]) == 0
        record = _last_json(capsys)
        assert json.loads((out / "meta.json").read_text())["propensity"] == {"A": a, "B": b}
        model = LogisticRegression.load(out / "model.npz")
        expected = metrics.psprecision_at_k(test.Y, model.decision_function(test.X), k=3,
                                            propensities=metrics.inverse_propensity(train.Y, A=a, B=b))
        assert record["metrics"]["PSP@3"] == pytest.approx(expected, abs=1e-12), option
    for bad in ("nope", "0.5", "0,1", "a,b"):
        with pytest.raises(SystemExit) as stop:
            main(base + ["--propensity", bad])
        assert stop.value.code == 2 and "--propensity" in capsys.readouterr().err


def test_errors_exit_with_code_two(tiny_files, capsys):
    train = str(tiny_files / "train.txt")
    assert main(["train", "--model", "logistic", "--train", train, "--set", "bogus=1", "--quiet"]) == 2
    assert "unknown parameter" in capsys.readouterr().err
    assert main(["train", "--model", "logistic", "--train", str(tiny_files / "missing.txt"), "--quiet"]) == 2
    assert "missing.txt" in capsys.readouterr().err
    bad = tiny_files / "bad.txt"
    bad.write_text("2 3 2\n0 0:1\n1 5:1\n")
    assert main(["info", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.txt" in err and ":3" in err
    assert main(["evaluate", "--model-dir", str(tiny_files / "nothing"), "--test", train]) == 2
    assert "no model.npz" in capsys.readouterr().err
    assert main(["train", "--model", "logistic", "--train", train, "--distributed", "--quiet"]) == 2
    assert "only --model mlgpf or bnmc trains data-parallel, not logistic" in capsys.readouterr().err
    assert main(["train", "--model", "logistic", "--train", train, "--resume", "--quiet"]) == 2
    assert "only --model mlgpf writes checkpoints" in capsys.readouterr().err


def test_parse_set_values():
    assert parse_set_values(["a=3", "b=0.5", "c=true", "d=none", "e=linear+se", "f=[1, 2]"], set("abcdef")) == {
        "a": 3, "b": 0.5, "c": True, "d": None, "e": "linear+se", "f": [1, 2]}
    with pytest.raises(ValidationError, match="key=value"):
        parse_set_values(["novalue"], {"a"})


def test_info_prints_statistics(tiny_files, capsys):
    assert main(["info", str(tiny_files / "train.txt"), "--json"]) == 0
    stats = _last_json(capsys)
    assert stats["n_samples"] == 120 and stats["n_features"] == 20 and stats["n_labels"] == 5


def test_logistic_on_bibtex_xc_metrics_match_scikit_learn(capsys, tmp_path):
    folder = shared_dataset_dir("bibtex_xc")
    code = main(["train", "--model", "logistic", "--train", str(folder / "train.txt"), "--test",
                 str(folder / "test.txt"), "--out", str(tmp_path / "run"), "--json", "--quiet"])
    assert code == 0
    record = _last_json(capsys)
    from bayesmlc.data.io import read_dataset

    test = read_dataset(folder / "test.txt")
    model = LogisticRegression.load(tmp_path / "run" / "model.npz")
    Y = test.Y.toarray()
    scores = model.decision_function(test.X)
    predicted = model.predict(test.X).toarray()
    m = record["metrics"]
    assert m["P@1"] > 0.55  # one-vs-rest logistic reaches about 0.62 here (the BMLS paper's baseline table)
    assert m["AUC_micro"] == pytest.approx(skm.roc_auc_score(Y.ravel(), scores.ravel()), abs=1e-6)
    has_both = (Y.sum(0) > 0) & (Y.sum(0) < len(Y))
    assert m["AUC_macro"] == pytest.approx(skm.roc_auc_score(Y[:, has_both], scores[:, has_both], average="macro"), abs=1e-6)
    rows = (Y.sum(1) > 0) & (Y.sum(1) < Y.shape[1])
    assert m["AUC_instance"] == pytest.approx(skm.roc_auc_score(Y[rows], scores[rows], average="samples"), abs=1e-6)
    assert m["F1_micro"] == pytest.approx(skm.f1_score(Y, predicted, average="micro"), abs=1e-9)
    assert m["F1_macro"] == pytest.approx(skm.f1_score(Y, predicted, average="macro", zero_division=0), abs=1e-9)
    assert m["exact_match"] == pytest.approx(skm.accuracy_score(Y, predicted), abs=1e-12)
    assert m["hamming_loss"] == pytest.approx(skm.hamming_loss(Y, predicted), abs=1e-12)
    assert m["F1_example"] == pytest.approx(skm.f1_score(Y, predicted, average="samples", zero_division=1.0), abs=1e-9)


def test_predict_into_a_closed_pipe_stops_quietly(tiny_files):
    import subprocess
    import sys

    out = tiny_files / "run"
    assert main(["train", "--model", "logistic", "--train", str(tiny_files / "train.txt"), "--out", str(out), "--quiet"]) == 0
    many = tiny_files / "many.txt"
    rows = (tiny_files / "test.txt").read_text().splitlines()
    many.write_text("\n".join([f"{40 * 500} 20 5"] + rows[1:] * 500) + "\n")
    shell = f"{sys.executable} -m bayesmlc predict --model-dir {out} --input {many} --top-k 2 | head -1"
    result = subprocess.run(["bash", "-o", "pipefail", "-c", shell], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and len(result.stdout.splitlines()) == 1


def test_evaluate_reads_an_ensemble_saved_from_python(tiny_files, capsys):
    from bayesmlc.baselines import KNNBaseline
    from bayesmlc.data.io import read_dataset
    from bayesmlc.ensemble import AveragingEnsemble
    from bayesmlc.metrics import precision_at_k

    train, test = read_dataset(tiny_files / "train.txt"), read_dataset(tiny_files / "test.txt")
    ensemble = AveragingEnsemble([("lr", LogisticRegression(device="cpu")), ("knn", KNNBaseline(n_neighbors=5))])
    ensemble.fit(train.X, train.Y).save(tiny_files / "pair" / "model.npz")
    assert main(["evaluate", "--model-dir", str(tiny_files / "pair"), "--test", str(tiny_files / "test.txt"), "--json"]) == 0
    record = _last_json(capsys)
    expected = precision_at_k(test.Y, ensemble.decision_function(test.X), k=1)
    assert record["metrics"]["P@1"] == pytest.approx(expected, abs=1e-9)
