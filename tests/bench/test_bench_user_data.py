"""``bayesmlc bench --dataset NAME=TRAIN[,TEST]``: the user's files beside or instead of a suite's
sets, a deterministic split when no test file is given, and errors that name the bad argument."""

import json

import numpy as np
import pytest
from conftest import write_dense_xc as _write_xc

from bayesmlc.bench.cli import main as bench_main
from bayesmlc.bench.runner import plan_runs
from bayesmlc.bench.suites import SUITES
from bayesmlc.bench.user_data import TEST_FRACTION, add_user_datasets, parse_dataset_argument
from bayesmlc.data.io import read_dataset
from bayesmlc.exceptions import ValidationError
from bayesmlc.metrics import precision_at_k
from bayesmlc.models import get_model_class


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(3)
    X = (rng.random((50, 12)) < 0.4) * rng.integers(1, 4, size=(50, 12))
    Y = (X @ rng.normal(size=(12, 4)) > 0.5).astype(int)
    Y[np.arange(50), np.argmax(X[:, :4], axis=1)] = 1
    _write_xc(tmp_path / "all.txt", X, Y)
    _write_xc(tmp_path / "train.txt", X[:40], Y[:40])
    _write_xc(tmp_path / "test.txt", X[40:], Y[40:])
    return tmp_path


def _rows(path):
    return sorted(path.read_text().splitlines()[1:])


def test_parse_and_errors_name_the_argument(files):
    train, test = files / "train.txt", files / "test.txt"
    assert parse_dataset_argument(f"mine={train}") == ("mine", train, None)
    assert parse_dataset_argument(f"my-set.v2={train},{test}") == ("my-set.v2", train, test)
    comma = files / "a,b.txt"
    comma.write_text((files / "all.txt").read_text())
    assert parse_dataset_argument(f"c={comma}") == ("c", comma, None)
    for text, message in ((f"{train}", "expected NAME=TRAIN"), ("mine=", "expected NAME=TRAIN"),
                          (f"../up={train}", "NAME must be"), (f"mine={train},", "nothing after the comma"),
                          (f"mine={files / 'nope.txt'}", "nope.txt: no such file"),
                          (f"mine={train},{files / 'gone.txt'}", "gone.txt: no such file")):
        with pytest.raises(ValidationError, match="^--dataset " + text.replace(".", r"\.").replace("(", r"\(")):
            parse_dataset_argument(text)
        with pytest.raises(ValidationError, match=message):
            parse_dataset_argument(text)


def test_name_clashes_and_unreadable_files(files, tmp_path):
    quick = SUITES["quick"]
    with pytest.raises(ValidationError, match=r"--dataset scene=.*the suite has a dataset named 'scene'"):
        add_user_datasets(quick, [f"scene={files / 'train.txt'}"], tmp_path / "out", 0)
    with pytest.raises(ValidationError, match=r"--dataset a=.*another --dataset is named 'a'"):
        add_user_datasets(quick, [f"a={files / 'train.txt'}", f"a={files / 'all.txt'}"], tmp_path / "out", 0)
    broken = files / "broken.txt"
    broken.write_text("3 5 2\n0 1:1\nnot a row\n")
    with pytest.raises(ValidationError, match=r"^--dataset bad=\S+broken\.txt: "):
        add_user_datasets(quick, [f"bad={broken}"], tmp_path / "out", 0)


def test_split_is_deterministic_and_keeps_every_row(files, tmp_path):
    quick = SUITES["quick"]
    suite = add_user_datasets(quick, [f"mine={files / 'all.txt'}"], tmp_path / "a", 0)
    assert suite.dataset_names == quick.dataset_names + ["mine"]
    train, test = (tmp_path / "a" / "data" / "mine" / name for name in ("train.txt", "test.txt"))
    assert suite.dataset("mine").files == (str(train), str(test))
    assert read_dataset(test).n_samples == round(TEST_FRACTION * 50) and read_dataset(train).n_samples == 40
    assert sorted(_rows(train) + _rows(test)) == _rows(files / "all.txt")  # a partition of the rows
    add_user_datasets(quick, [f"mine={files / 'all.txt'}"], tmp_path / "b", 0)
    add_user_datasets(quick, [f"mine={files / 'all.txt'}"], tmp_path / "c", 1)
    same = tmp_path / "b" / "data" / "mine" / "test.txt"
    other = tmp_path / "c" / "data" / "mine" / "test.txt"
    assert same.read_text() == test.read_text() and other.read_text() != test.read_text()


def test_beside_the_suites_sets_by_default(files, tmp_path):
    suite = add_user_datasets(SUITES["quick"], [f"given={files / 'train.txt'},{files / 'test.txt'}"], tmp_path, 0)
    runs = plan_runs(suite, tmp_path, models=["knn"])
    assert [r.dataset for r in runs] == SUITES["quick"].dataset_names + ["given"]
    mine = runs[-1]
    assert (mine.train_path, mine.test_path) == (files / "train.txt", files / "test.txt")
    assert mine.params == {} and mine.model == "knn"
    only = plan_runs(suite, tmp_path, datasets=["given"], models=["knn", "logistic"])
    assert [(r.dataset, r.model) for r in only] == [("given", "logistic"), ("given", "knn")]


def test_bench_runs_the_suites_models_on_the_users_files(files, tmp_path, capsys):
    out = tmp_path / "bench"
    code = bench_main(["--suite", "quick", "--dataset", f"mine={files / 'all.txt'}",
                       "--dataset", f"given={files / 'train.txt'},{files / 'test.txt'}",
                       "--datasets", "mine", "given", "--models", "knn", "--out", str(out), "--no-plots", "--quiet",
                       "--threads", "1"])
    assert code == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["dataset"], r["model"], r["status"]) for r in records] == [("mine", "knn", "ok"), ("given", "knn", "ok")]
    knn = get_model_class("knn")
    for record, (train_path, test_path) in zip(records, ((out / "data" / "mine" / "train.txt",
                                                         out / "data" / "mine" / "test.txt"),
                                                        (files / "train.txt", files / "test.txt"))):
        train, test = read_dataset(train_path), read_dataset(test_path)
        expected = precision_at_k(test.Y, knn(random_state=0).fit(train.X, train.Y).decision_function(test.X), k=1)
        assert record["metrics"]["P@1"] == pytest.approx(expected, abs=1e-9)
    report = (out / "report.md").read_text()
    assert "--dataset mine=" in report and "## mine" in report and "## given" in report


def test_bench_bad_dataset_argument_exits_2(files, tmp_path, capsys):
    assert bench_main(["--suite", "quick", "--dataset", "mine", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == "bayesmlc bench: error: --dataset mine: expected NAME=TRAIN[,TEST]"
    assert bench_main(["--suite", "quick", "--dataset", f"m={files / 'all.txt'}", "--datasets", "nope",
                       "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "--datasets nope: not in suite 'quick'" in capsys.readouterr().err
