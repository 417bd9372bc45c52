"""Presets: the recipes equal the documented ones, every figure is in the docs, the CLI and the
``Model.preset`` classmethod build them, and an ensemble preset saves, loads and predicts the same."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import write_dense_xc as _write_xc
import scipy.sparse as sp

from bayesmlc import BMLS, BNMC, MLGPF, LogisticRegression
from bayesmlc.base import MultiLabelEstimator
from bayesmlc.cli import main
from bayesmlc.ensemble import AveragingEnsemble
from bayesmlc.exceptions import ValidationError
from bayesmlc.presets import (PRESET_NAMES, PRESETS, Measurement, Preset, build_preset, format_presets, get_preset,
                              model_key)

DOCS = Path(__file__).resolve().parents[1] / "docs"

# MLGPF's best configuration as docs/benchmarks.md ("an AveragingEnsemble of two recipes") and
# docs/experiments.md describe it and as benchmarks/bench_mlgpf.py measured it (commit 6395a60, with the
# variational family named in 9bdd665): written out here, key by key, from those texts.
DOCUMENTED_PAIR = {
    "subspace": {"lr_decay": 0.5, "rank_by": "proba", "kl_weight": 0.5, "variational": "whitened",
                 "n_inducing": 400, "epochs": 15, "linear_term": False},
    "free": {"kernel": "linear+se", "ard": True, "inducing": "free", "n_inducing": 400, "n_latent": 30,
             "variational": "cholesky", "batch_size": 100, "batch_size_growth": 20, "batch_size_every": 10,
             "learning_rate": 0.005, "lr_decay": 0.5, "kl_weight": 0.5, "init_factors": "svd", "init_mean": "ridge",
             "idf_weighting": True, "standardize": False, "epochs": 100, "linear_term": False},
}
# the subspace paper's Table 3 settings (P=30, M=500, R=1000, batch 500), constant rates, 400 epochs
DOCUMENTED_MLGPF_PAPER = {"n_latent": 30, "n_inducing": 500, "kernel": "linear", "inducing": "subspace",
                          "subspace_rank": 1000, "batch_size": 500, "variational": "whitened",
                          "idf_weighting": False, "lr_decay": 0.0, "epochs": 400, "linear_term": False}
# the BMLS authors' demo (K=100, 200 burn-in, 250 samples thinned by 10) and BNMC-L (truncation 15, 2 passes)
DOCUMENTED_BMLS_PAPER = {"n_topics": 100, "schedule": "fixed", "n_burnin": 200, "n_draws": 250, "thin": 10}
DOCUMENTED_BNMC_PAPER = {"truncation": 15, "n_passes": 2, "classifier": "logistic"}


def test_best_mlgpf_preset_is_the_documented_pair():
    ensemble = MLGPF.preset("best")
    assert isinstance(ensemble, AveragingEnsemble) and not hasattr(ensemble, "estimators_")
    assert [name for name, _ in ensemble.estimators] == ["subspace", "free"]
    defaults = MLGPF().get_params()
    for name, member in ensemble.estimators:
        assert type(member) is MLGPF
        params = member.get_params()
        assert {k: params[k] for k in DOCUMENTED_PAIR[name]} == DOCUMENTED_PAIR[name], name
        # everything else is the estimator's default
        assert {k: v for k, v in params.items() if k not in DOCUMENTED_PAIR[name]} == \
            {k: v for k, v in defaults.items() if k not in DOCUMENTED_PAIR[name]}


def test_paper_presets_are_the_papers_settings():
    for cls, documented in ((MLGPF, DOCUMENTED_MLGPF_PAPER), (BMLS, DOCUMENTED_BMLS_PAPER),
                            (BNMC, DOCUMENTED_BNMC_PAPER)):
        params = cls.preset("paper").get_params()
        assert {k: params[k] for k in documented} == documented, cls.__name__


def test_benchmark_script_measures_the_preset_recipes():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_mlgpf.py"
    spec = importlib.util.spec_from_file_location("bench_mlgpf_for_test", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.PAIR == DOCUMENTED_PAIR
    pair = bench.pair_ensemble(3, {})
    assert pair.random_state == 3
    assert [(n, m.get_params()) for n, m in pair.estimators] == \
        [(n, m.get_params()) for n, m in MLGPF.preset("best").estimators]


def test_fast_mlgpf_is_the_defaults_with_at_most_half_the_epochs():
    """docs/presets.md: ``fast`` keeps the per-epoch work of the defaults (every training setting
    but the epochs) and runs at most half of their epochs ("auto": 40 where L > P or from 10,000 rows, 100
    otherwise); ``rank_by`` only changes prediction."""
    from bayesmlc.gp.initialisation import resolve_epochs

    fast, default = MLGPF.preset("fast").get_params(), MLGPF().get_params()
    changed = {key for key in default if fast[key] != default[key]}
    assert changed == {"epochs", "rank_by"}
    assert all(fast["epochs"] * 2 <= resolve_epochs(default["epochs"], term, rows, beyond)
               for term in (True, False) for rows in (None, 100, 10**6) for beyond in (True, False))
    assert fast["rank_by"] == "proba"


def test_overrides_and_the_ensembles_own_parameters():
    model = MLGPF.preset("fast", epochs=3, n_inducing=7)
    assert model.epochs == 3 and model.n_inducing == 7 and model.kl_weight == 0.5
    ensemble = MLGPF.preset("best", random_state=5, verbose=True, epochs=2, n_threads=1)
    assert ensemble.random_state == 5 and ensemble.verbose is True
    for _, member in ensemble.estimators:
        assert member.epochs == 2 and member.n_threads == 1 and member.verbose is True
        assert member.random_state is None  # the ensemble seeds its members
    assert BNMC.preset("fast").online is True and BMLS.preset("best").get_params() == BMLS().get_params()


def test_unknown_names_are_one_line_errors():
    with pytest.raises(ValidationError, match=r"unknown preset for mlgpf; valid presets: fast, paper, best"):
        MLGPF.preset("quick")
    # only the models with presets have the class method (bayesmlc.presets.HasPresets)
    assert not hasattr(LogisticRegression, "preset") and not hasattr(AveragingEnsemble, "preset")
    with pytest.raises(ValidationError, match="AveragingEnsemble has no presets; presets exist for bmls"):
        model_key(AveragingEnsemble)
    with pytest.raises(ValidationError, match="preset fast: model 'logistic' has no presets; presets exist for bmls"):
        get_preset("logistic", "fast")
    with pytest.raises(ValidationError, match="model 'logistic' has no presets"):
        build_preset("logistic", "fast")
    with pytest.raises(ValidationError, match=r"^preset quick: unknown preset for bnmc"):
        BNMC.preset("quick")


def test_every_preset_builds_with_valid_parameters():
    for model, presets in PRESETS.items():
        assert tuple(presets) == PRESET_NAMES
        for name, preset in presets.items():
            built = build_preset(model, name)
            assert isinstance(built, MultiLabelEstimator)
            assert preset.measured is not None


def _numbers(text: str) -> list[str]:
    return re.findall(r"\d[\d,]*\.\d+|\d{2,}[\d,]*", text)


def test_every_measured_figure_is_in_the_docs():
    """The figures are taken from the docs, never invented: every number of every measurement (and its
    commit and command) appears in docs/*.md (other than presets.md)."""
    # presets.md repeats the figures: the check is against the measurement records, not against it
    docs = "\n".join(path.read_text(encoding="utf-8") for path in DOCS.glob("*.md") if path.name != "presets.md")
    for model, presets in PRESETS.items():
        for name, preset in presets.items():
            measured = preset.measured
            for number in _numbers(measured.figures):
                assert number in docs, (model, name, number)
            for commit in re.findall(r"\b[0-9a-f]{7}\b", measured.commit):
                assert commit in docs, (model, name, commit)
            script_and_part = measured.command.split(" --")[0]  # the options are spelt out differently
            assert script_and_part in docs.replace("\n", " "), (model, name, measured.command)


def test_unmeasured_preset_says_so():
    preset = Preset("mlgpf", "fast", "x", params={})
    assert preset.measured_line() == "not measured"
    line = Preset("m", "n", "s", measured=Measurement("d", "P@1 1", "cmd", "vm", "abc1234")).measured_line()
    assert line == "d: P@1 1 (vm; `cmd`; commit abc1234)"


def test_info_presets_lists_every_preset(capsys):
    assert main(["info", "--presets"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == format_presets()
    for model, presets in PRESETS.items():
        for name in presets:
            assert f"{model} --preset {name}:" in out
    assert "64.20 / 40.29 / 29.87" in out and "member free:" in out
    assert main(["info", "--presets", "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert len(entries) == sum(len(p) for p in PRESETS.values())
    best = next(e for e in entries if e["model"] == "mlgpf" and e["preset"] == "best")
    assert best["ensemble"] == DOCUMENTED_PAIR and best["measured"]["commit"] == "6395a60"
    assert main(["info"]) == 2


# ---- the CLI -------------------------------------------------------------------------------------


@pytest.fixture
def tiny(tmp_path):
    rng = np.random.default_rng(1)
    X = (rng.random((90, 15)) < 0.35) * rng.integers(1, 3, size=(90, 15))
    Y = ((X @ rng.normal(size=(15, 4))) > 0.5).astype(int)
    Y[np.arange(90), np.argmax(X @ rng.normal(size=(15, 4)), axis=1)] = 1
    _write_xc(tmp_path / "train.txt", X[:70], Y[:70])
    _write_xc(tmp_path / "test.txt", X[70:], Y[70:])
    return tmp_path


TINY_MLGPF = ["--set", "epochs=2", "--set", "n_inducing=8", "--set", "n_latent=3", "--set", "batch_size=35"]


def test_cli_trains_with_a_preset_and_set_overrides(tiny, capsys):
    out = tiny / "run"
    assert main(["train", "--model", "mlgpf", "--preset", "fast", "--train", str(tiny / "train.txt"),
                 "--test", str(tiny / "test.txt"), *TINY_MLGPF, "--out", str(out), "--json", "--quiet"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    params = json.loads((out / "meta.json").read_text())["params"]
    for key, value in (("epochs", 2), ("n_inducing", 8), ("kl_weight", 0.5), ("rank_by", "proba"),
                       ("variational", "shared"), ("random_state", 0)):
        assert record["params"][key] == value and params[key] == value, key
    assert len(json.loads((out / "history.json").read_text())["epoch"]) == 2


def test_cli_refuses_bad_presets_before_work(tiny, capsys):
    train = str(tiny / "train.txt")
    assert main(["train", "--model", "mlgpf", "--preset", "nope", "--train", train, "--out", str(tiny / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "bayesmlc: error: --preset nope: unknown preset for mlgpf; valid presets: fast, paper, best"
    assert not (tiny / "x").exists()
    assert main(["train", "--model", "mlgpf", "--preset", "best", "--resume", "--train", train]) == 2
    assert "--resume trains a single model" in capsys.readouterr().err


def test_ensemble_preset_trains_saves_loads_and_predicts_the_same(tiny, capsys):
    out = tiny / "pair"
    assert main(["train", "--model", "mlgpf", "--preset", "best", "--train", str(tiny / "train.txt"),
                 "--test", str(tiny / "test.txt"), *TINY_MLGPF, "--out", str(out), "--json", "--quiet"]) == 0
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["metrics"]
    model = MultiLabelEstimator.load(out / "model.npz")
    assert isinstance(model, AveragingEnsemble) and list(model.named_estimators_) == ["subspace", "free"]
    assert [m.epochs for m in model.estimators_] == [2, 2]
    assert main(["evaluate", "--model-dir", str(out), "--test", str(tiny / "test.txt"), "--json"]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["metrics"]
    assert evaluated == pytest.approx(trained, rel=1e-6)

    # in Python: the same seed gives the same model; the loaded copy predicts what the fitted one does
    from bayesmlc.data.io import read_dataset

    train, test = read_dataset(tiny / "train.txt"), read_dataset(tiny / "test.txt")
    fitted = MLGPF.preset("best", epochs=2, n_inducing=8, n_latent=3, batch_size=35, random_state=0)
    fitted.fit(train.X, train.Y)
    fitted.save(tiny / "py.npz")
    loaded = AveragingEnsemble.load(tiny / "py.npz")
    np.testing.assert_array_equal(loaded.predict_proba(test.X), fitted.predict_proba(test.X))
    np.testing.assert_array_equal(fitted.predict_proba(test.X), model.predict_proba(sp.csr_matrix(test.X)))
    mean = sum(w * m.predict_proba(test.X) for w, m in zip(fitted.weights_, fitted.estimators_))
    np.testing.assert_allclose(fitted.predict_proba(test.X), mean, rtol=1e-6)
