"""What the CLI's help promises: every option documents its default, every example in a subcommand's
help parses, predict prints what its header says, the demo shows a model beside a trivial baseline,
and --threads / the load back-off reach torch."""

import json
import os
import shlex

import numpy as np
import pytest
import torch

from bayesmlc import cli, threads
from bayesmlc.cli import build_parser, main
from bayesmlc.data.io import read_dataset
from bayesmlc.data.synthetic import make_multilabel
from bayesmlc.linear import LogisticRegression

from test_cli import _write_xc


def _subcommands():
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return parser, subparsers.choices


def _options(subparser):
    for action in subparser._actions:
        if action.dest in ("help", "version"):
            continue
        yield action


def test_every_option_has_help_naming_its_default_or_saying_it_is_required():
    _, commands = _subcommands()
    assert set(commands) >= {"train", "evaluate", "predict", "info", "demo", "topics", "plot-history"}
    for name, subparser in commands.items():
        if name == "bench":  # its options come from bayesmlc.bench.cli, checked there
            continue
        for action in _options(subparser):
            where = f"{name} {'/'.join(action.option_strings) or action.dest}"
            assert action.help and "\n" not in action.help, where
            if action.required or not action.option_strings:
                assert "required" in action.help, where
            else:
                assert "default" in action.help, where


def test_every_subcommand_has_an_example_that_parses():
    parser, commands = _subcommands()
    for name, subparser in commands.items():
        epilog = subparser.epilog or ""
        assert epilog.startswith("example"), name
        examples = [line.strip() for line in epilog.splitlines() if line.strip().startswith("bayesmlc ")]
        assert examples, name
        for example in examples:
            args = parser.parse_args(shlex.split(example)[1:])
            assert args.command == name, example
        # the help shows the example on one line, as written
        assert examples[0] in subparser.format_help()


def test_demo_takes_no_input_format(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--format", "xc"])
    assert stop.value.code == 2
    assert "unrecognized arguments: --format" in capsys.readouterr().err


def test_demo_shows_the_model_beside_the_label_frequency_baseline(capsys):
    assert main(["demo", "--model", "logistic", "--n-samples", "400", "--json", "--quiet", "--threads", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    record = json.loads(out[-1])
    model, baseline = record["metrics"], record["baseline_metrics"]
    assert set(baseline) == set(model)
    # the baseline, computed here on the same data: every row's top label is the most frequent
    # training label (ties to the lowest index), so P@1 is the share of test rows that carry it
    data = make_multilabel(400, cli.DEMO_FEATURES, cli.DEMO_LABELS, feature_kind="binary", random_state=0)
    Y = data.Y.toarray()
    test_rows, train_rows = Y[:100], Y[100:]
    top = int(np.argmax(train_rows.mean(axis=0)))
    assert baseline["P@1"] == pytest.approx(test_rows[:, top].mean(), abs=1e-12)
    top5 = np.argsort(-train_rows.mean(axis=0), kind="stable")[:5]
    assert baseline["P@5"] == pytest.approx(test_rows[:, top5].sum(axis=1).mean() / 5, abs=1e-12)
    assert baseline["F1_micro"] == 0.0  # no label is above one half: nothing is predicted
    # a real model beats it
    assert model["P@1"] > baseline["P@1"] + 0.2 and model["nDCG@5"] > baseline["nDCG@5"] + 0.2

    assert main(["demo", "--model", "logistic", "--n-samples", "400", "--quiet", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("logistic on synthetic demo data: 300 train / 100 test rows")
    assert lines[2].split() == ["logistic", "baseline"]
    p1 = next(line for line in lines if line.startswith("P@1 "))
    assert [float(v) for v in p1.split()[1:]] == pytest.approx([model["P@1"], baseline["P@1"]], abs=5e-5)


def test_demo_refuses_too_few_rows(capsys):
    assert main(["demo", "--n-samples", "20", "--quiet"]) == 2
    assert "at least 100 rows" in capsys.readouterr().err


def test_demo_gives_mlgpf_its_demo_epochs_unless_set(monkeypatch):
    built = []
    real_build = cli.build_model

    def spy(name, settings, *rest):
        model = real_build(name, settings, *rest)
        built.append(model)
        raise KeyboardInterrupt  # stop before fitting: only the settings matter here

    monkeypatch.setattr(cli.commands.demo, "build_model", spy)
    assert main(["demo", "--quiet", "--threads", "1"]) == cli.EXIT_INTERRUPTED
    assert main(["demo", "--quiet", "--threads", "1", "--set", "epochs=3"]) == cli.EXIT_INTERRUPTED
    assert [m.epochs for m in built] == [cli.DEMO_SETTINGS["mlgpf"]["epochs"], 3]


@pytest.fixture
def fitted_run(tmp_path):
    rng = np.random.default_rng(1)
    X = (rng.random((150, 12)) < 0.4) * rng.integers(1, 3, size=(150, 12))
    Y = ((X @ rng.normal(size=(12, 6)) + rng.normal(size=(150, 6))) > 0.8).astype(int)
    Y[np.arange(150), rng.integers(0, 6, 150)] = 1
    _write_xc(tmp_path / "train.txt", X[:110], Y[:110])
    _write_xc(tmp_path / "test.txt", X[110:], Y[110:])
    out = tmp_path / "run"
    assert main(["train", "--model", "logistic", "--train", str(tmp_path / "train.txt"), "--out", str(out),
                 "--quiet", "--threads", "1"]) == 0
    test = read_dataset(tmp_path / "test.txt")
    return out, tmp_path / "test.txt", LogisticRegression.load(out / "model.npz"), test


def test_predict_prints_every_top_k_probability_or_score_of_the_model(fitted_run, capsys):
    out, test_path, model, test = fitted_run
    capsys.readouterr()
    proba, scores = model.predict_proba(test.X), model.decision_function(test.X)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :4]
    rows = np.arange(test.n_samples)[:, None]

    assert main(["predict", "--model-dir", str(out), "--input", str(test_path), "--top-k", "4", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(records) == test.n_samples and all(set(r) == {"labels", "probabilities"} for r in records)
    labels = np.array([r["labels"] for r in records])
    printed = np.array([r["probabilities"] for r in records])
    assert np.all((printed >= 0) & (printed <= 1))
    np.testing.assert_allclose(np.sort(scores[rows, labels], axis=1)[:, ::-1], scores[rows, order], rtol=1e-6)
    np.testing.assert_allclose(printed, proba[rows, labels], rtol=1e-6)

    assert main(["predict", "--model-dir", str(out), "--input", str(test_path), "--top-k", "4", "--scores",
                 "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == test.n_samples  # --quiet: no header
    pairs = [[pair.split(":") for pair in line.split()] for line in lines]
    np.testing.assert_array_equal([[int(label) for label, _ in row] for row in pairs], labels)
    np.testing.assert_allclose([[float(value) for _, value in row] for row in pairs], scores[rows, labels], rtol=1e-5)


def test_top_k_and_threads_must_be_positive(fitted_run, capsys):
    out, test_path, _, _ = fitted_run
    for option in (["--top-k", "0"], ["--threads", "0"], ["--threads", str(cli.max_threads() + 1)]):
        with pytest.raises(SystemExit) as stop:
            main(["predict", "--model-dir", str(out), "--input", str(test_path), *option])
        assert stop.value.code == 2
        assert option[0] in capsys.readouterr().err


def test_threads_reach_torch_and_a_busy_machine_backs_off(fitted_run, capsys, monkeypatch):
    out, test_path, _, _ = fitted_run
    capsys.readouterr()
    before = torch.get_num_threads()
    seen = []

    def train_records_threads(args):
        seen.append(torch.get_num_threads())
        return real_train(args)

    real_train = cli.cmd_train
    monkeypatch.setattr(cli.parser, "cmd_train", train_records_threads)
    for name in threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(threads, "current_load", lambda: os.getloadavg()[0])
    train = ["train", "--model", "logistic", "--train", str(test_path.parent / "train.txt"), "--json"]
    assert main(train + ["--threads", "3"]) == 0
    assert "cores busy" not in capsys.readouterr().err
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    assert main(train) == 0
    # the training progress line says so
    assert "labels; 1 thread: other processes keep 64.0 of 4 cores busy (--threads N to choose)" in capsys.readouterr().err
    assert main(train + ["--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert main(train + ["--threads", "2"]) == 0  # an explicit count is kept under any load
    assert "cores busy" not in capsys.readouterr().err
    # an error stays one line under load
    assert main(train[:-1] + ["--out", str(test_path)]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1
    assert seen == [3, 1, 1, 2, 1]
    assert torch.get_num_threads() == before  # the command's count ends with it


def test_plot_history_without_matplotlib_is_one_line(tmp_path, capsys, monkeypatch):
    import builtins

    (tmp_path / "history.json").write_text(json.dumps({"epoch": [1, 2], "elbo": [-2.0, -1.0], "wall_time": [1.0, 2.0]}))
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert main(["plot-history", "--model-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs matplotlib" in err and "pip install matplotlib" in err
