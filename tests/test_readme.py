"""The README's and docs/cli.md's commands and examples, run as written in a scratch folder, with their
outputs checked; the README's figures checked against the reports they quote.

The bash blocks run through bash itself, with ``bayesmlc`` replaced by a shell function that records
each call's arguments (expanded by bash: variables, ``~``, continuation lines, comments); the
recorded calls then run in order through :func:`bayesmlc.cli.main`. The Python blocks run with
``exec``. The data folder (``$BAYESMLC_DATA``) holds a small synthetic stand-in for ``bibtex_xc``
by default, so the examples run in seconds; ``-m slow`` runs them on the real set from
``../shared/datasets`` when it is there, the benchmark suite included. The pip commands are not run:
their text is checked against ``.ci/run`` and ``pyproject.toml``.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest

from bayesmlc.cli import main
from bayesmlc.data.io import write_dataset
from bayesmlc.data.synthetic import make_multilabel

from conftest import REPO_ROOT, SHARED_DATASETS

README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
CLI_DOC = (REPO_ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
#: the generated report the README's results table and calibration figures quote
CALIBRATION_REPORT = (REPO_ROOT / "docs" / "benchmarks-calibration.md").read_text(encoding="utf-8")
RECORD_SEPARATOR = "\x1e"


def code_blocks(language: str, text: str = README) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.M | re.S)


def recorded_calls(block: str, env: dict) -> list[list[str]]:
    """The argument lists of the ``bayesmlc`` calls in a bash block, as bash expands them."""
    script = f"bayesmlc() {{ printf '%s\\0' \"$@\"; printf '{RECORD_SEPARATOR}'; }}\nset -e\n{block}"
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    return [call.split("\0")[:-1] for call in out.split(RECORD_SEPARATOR)[:-1]]


def readme_demo_figures() -> dict:
    """The demo's P@1, the baseline's and the seconds the README states."""
    found = re.search(r"P@1 (\d\.\d+) against (\d\.\d+)\. It takes (\d+(?:\.\d+)?) s", README)
    assert found, "the README states the demo's P@1, the baseline's and its time"
    return {"p1": float(found[1]), "baseline_p1": float(found[2]), "seconds": float(found[3])}


# ---- the opening commands ------------------------------------------------------------------------
def test_the_readme_opens_with_the_install_and_the_test_commands():
    install, test = (block.strip() for block in code_blocks("bash")[:2])
    assert re.fullmatch(r"python -m pip install torch==[\d.]+ -e \. && bayesmlc demo", install)
    ci_lines = [line for line in (REPO_ROOT / ".ci" / "run").read_text().splitlines()
                if line and not line.startswith(("#", "set ", "cd "))]
    assert ci_lines[0] == test  # .ci/run runs exactly the README's test command first (then the floors run)
    assert re.fullmatch(r'python -m pip install -q torch==[\d.]+ -e "\.\[test,dask\]" && python -m pytest -q', test)
    pins = set(re.findall(r"torch==([\d.]+)", install + test))
    assert len(pins) == 1
    pin = pins.pop()
    assert f"`torch=={pin}` is the PyTorch release the project is tested with" in README
    # the CPU build: the same release from PyTorch's own CPU index, the command its docs give
    assert f"`python -m pip install torch=={pin} --index-url https://download.pytorch.org/whl/cpu`" in README
    dependencies = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (bound,) = [d.split(">=")[1] for d in dependencies if d.startswith("torch>=")]
    assert f"torch >= {bound}, CPU or CUDA" in README
    assert any(d.startswith("matplotlib") for d in dependencies)  # plot-history works after the plain install
    # nothing outside the repository
    assert "../shared" not in README and "/work/" not in README


def test_the_demo_prints_what_the_readme_says(capsys):
    (call,) = recorded_calls(code_blocks("bash")[0].split("&&")[1], {"PATH": "/usr/bin:/bin"})
    assert call == ["demo"]
    assert main(call) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("mlgpf on synthetic demo data: 1500 train / 500 test rows, 500 features, 40 labels")
    assert lines[2].split() == ["mlgpf", "baseline"]
    model_p1, baseline_p1 = (float(v) for v in next(line for line in lines if line.startswith("P@1 ")).split()[1:])
    stated = readme_demo_figures()
    assert model_p1 == pytest.approx(stated["p1"], abs=0.02)  # thread counts change the rounding, not more
    assert baseline_p1 == pytest.approx(stated["baseline_p1"], abs=1e-9)  # label counts: exact
    assert stated["seconds"] < 30


# ---- the examples on bibtex_xc ---------------------------------------------------------------------
def _stand_in_data_home(folder: Path) -> Path:
    """A data folder whose ``bibtex_xc`` is a small synthetic set with label and feature names."""
    data = make_multilabel(400, 120, 12, feature_kind="binary", random_state=3)
    data.label_names = [f"tag_{j}" for j in range(data.n_labels)]
    data.feature_names = [f"word_{j}" for j in range(data.n_features)]
    target = folder / "bibtex_xc"
    target.mkdir(parents=True)
    write_dataset(data.subset(np.arange(100, 400)), target / "train.txt", write_names=True)
    write_dataset(data.subset(np.arange(100)), target / "test.txt")
    return folder


def _run_calls(calls: list[list[str]], work: Path, train, test, capsys, with_bench: bool) -> None:
    """Run recorded ``bayesmlc`` calls in order through :func:`main`, checking each output."""
    capsys.readouterr()
    for call in calls:
        if call[0] == "bench" and not with_bench:
            from bayesmlc.cli import build_parser

            assert Path(build_parser().parse_args(call).data_root).is_dir()
            continue
        assert main(call) == 0, call
        out = capsys.readouterr().out
        check = CHECKS.get(" ".join(call[:2]) if call[0] in ("train", "predict") or call[1:] == ["--presets"] else call[0])
        if check is not None:
            check(call, out, work, train, test)


def _run_examples(data_home: Path, work: Path, monkeypatch, capsys, with_bench: bool) -> None:
    monkeypatch.setenv("BAYESMLC_DATA", str(data_home))
    monkeypatch.chdir(work)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "BAYESMLC_DATA": str(data_home)}
    data = data_home / "bibtex_xc"

    # the README's Python example: BNMC, its top 5 labels, metrics, a saved model
    (python_block,) = code_blocks("python")
    namespace: dict = {}
    exec(compile(python_block, "README.md (python)", "exec"), namespace)
    train, test, model = namespace["train"], namespace["test"], namespace["model"]
    metrics = eval(capsys.readouterr().out.strip(), {"nan": float("nan")})  # the printed dict of metrics
    assert {"P@1", "P@5", "AUC_micro", "ECE"} <= set(metrics)
    assert 0.0 <= metrics["P@1"] <= 1.0
    labels, scores = namespace["labels"], namespace["scores"]
    assert labels.shape == scores.shape == (test.n_samples, 5)
    assert np.all(np.diff(scores, axis=1) <= 0)  # best first
    from bayesmlc import BNMC

    saved = BNMC.load(work / "bibtex-bnmc.npz")
    np.testing.assert_allclose(saved.predict_proba(test.X), model.predict_proba(test.X), rtol=1e-6)

    # the README's command-line example
    (readme_block,) = [block for block in code_blocks("bash") if "bayesmlc train" in block]
    calls = recorded_calls(readme_block, env)
    assert [call[:2] for call in calls] == [["train", "--model"], ["predict", "--model-dir"]]
    _run_calls(calls, work, train, test, capsys, with_bench)

    # docs/cli.md: every command
    (cli_block,) = code_blocks("bash", CLI_DOC)
    calls = recorded_calls(cli_block, env)
    assert [call[0] for call in calls] == ["info", "train", "evaluate", "predict", "predict", "train", "topics",
                                           "train", "plot-history", "bench", "info"]
    assert calls[0] == ["info", str(data / "train.txt")]
    assert all(call[call.index("--data-root") + 1] == str(data_home) for call in calls if call[0] == "bench")
    _run_calls(calls, work, train, test, capsys, with_bench)

    # docs/cli.md: threads from Python
    (threads_block,) = code_blocks("python", CLI_DOC)
    namespace = {}
    exec(compile(threads_block, "docs/cli.md (python)", "exec"), namespace)
    assert namespace["model"].predict_proba(test.X).shape == (test.n_samples, test.n_labels)


def _check_info(call, out, work, train, test):
    assert str(train.n_samples) in out and str(train.n_labels) in out


def _check_presets(call, out, work, train, test):
    from bayesmlc.presets import PRESETS

    listed = {tuple(line.split()[:3]) for line in out.splitlines() if " --preset " in line}
    assert listed == {(model, "--preset", f"{name}:") for model, named in PRESETS.items() for name in named}


def _check_train(call, out, work, train, test):
    run = work / call[call.index("--out") + 1]
    assert (run / "model.npz").exists() and (run / "meta.json").exists() and (run / "history.json").exists()
    assert (run / "metrics.json").exists() == ("--test" in call)  # as docs/cli.md lists the run folder
    if "--json" in call:
        record = json.loads(out.strip().splitlines()[-1])
        assert record["model"] == call[call.index("--model") + 1]
        for setting in call[call.index("--set") + 1:call.index("--set") + 2] if "--set" in call else []:
            key, value = setting.split("=")
            assert record["params"][key] == json.loads(value)
        assert all(0.0 <= v <= 1.0 for v in record["metrics"].values() if v is not None)


def _check_evaluate(call, out, work, train, test):
    rows = dict(line.split() for line in out.strip().splitlines())
    at_training = json.loads((work / call[call.index("--model-dir") + 1] / "metrics.json").read_text())
    assert float(rows["P@1"]) == pytest.approx(at_training["P@1"], abs=5e-5)


def _check_predict(call, out, work, train, test):
    lines = out.strip().splitlines()
    if "--json" in call:
        rows = [json.loads(line) for line in lines]
        assert len(rows) == test.n_samples
        assert all(len(r["labels"]) == 5 and all(0.0 <= p <= 1.0 for p in r["probabilities"]) for r in rows)
        return
    header, *rows = lines
    assert header.startswith("#") and "label:probability" in header and len(rows) == test.n_samples
    names = set(train.label_names)
    for row in rows:
        pairs = [pair.rsplit(":", 1) for pair in row.split()]
        assert len(pairs) == 5 and all(name in names and 0.0 <= float(p) <= 1.0 for name, p in pairs)


def _check_topics(call, out, work, train, test):
    assert "topic" in out.lower() and any(name in out for name in train.label_names)


def _check_plot(call, out, work, train, test):
    png = Path(out.strip())
    assert png == Path(call[call.index("--model-dir") + 1]) / "history.png"
    assert (work / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _check_bench(call, out, work, train, test):
    assert (work / call[call.index("--out") + 1] / "report.md").exists()


CHECKS = {"info": _check_info, "info --presets": _check_presets, "train --model": _check_train, "evaluate": _check_evaluate,
          "predict --model-dir": _check_predict, "topics": _check_topics, "plot-history": _check_plot,
          "bench": _check_bench}


@pytest.mark.filterwarnings("ignore:.*differs from the (registry's verified|published) Bibtex")
def test_the_readme_examples_run_on_a_stand_in_for_bibtex(tmp_path, monkeypatch, capsys):
    data_home = _stand_in_data_home(tmp_path / "data")
    work = tmp_path / "work"
    work.mkdir()
    _run_examples(data_home, work, monkeypatch, capsys, with_bench=False)


@pytest.mark.slow
def test_the_readme_examples_run_on_the_real_bibtex_with_the_bench(tmp_path, monkeypatch, capsys):
    if not (SHARED_DATASETS / "bibtex_xc" / "train.txt").exists():
        pytest.skip(f"bibtex_xc not found in {SHARED_DATASETS}")
    work = tmp_path / "work"
    work.mkdir()
    _run_examples(SHARED_DATASETS, work, monkeypatch, capsys, with_bench=True)


# ---- the README's figures and claims ---------------------------------------------------------------
#: the README's model names -> the report's configuration names
REPORT_NAMES = {"MLGPF": "mlgpf (default)", "BMLS": "bmls (default)", "BNMC": "bnmc (default)",
                "logistic": "logistic (default)", "omikuji Parabel": "omikuji_parabel (default)"}


def report_row(dataset: str, model: str, table: int) -> list[str]:
    """Cells of ``model``'s row in the generated report's ``table``-th table of ``dataset`` (0: ranking,
    1: probabilities and cost, 2: raw against calibrated)."""
    generated = CALIBRATION_REPORT[CALIBRATION_REPORT.index("<!-- begin: generated"):]
    section = generated.split(f"\n### {dataset}\n", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith(f"| {REPORT_NAMES[model]} |")]
    return [cell.strip().strip("*") for cell in rows[table].strip("|").split("|")]


def report_header(dataset: str, table: int) -> list[str]:
    generated = CALIBRATION_REPORT[CALIBRATION_REPORT.index("<!-- begin: generated"):]
    section = generated.split(f"\n### {dataset}\n", 1)[1].split("\n### ", 1)[0]
    headers = [line for line in section.splitlines() if line.startswith("| model |")]
    return [cell.strip() for cell in headers[table].strip("|").split("|")]


def readme_results() -> dict:
    """{(model, dataset): (P@1, ECE@1, train s)} as the README's results table states them."""
    table = README[README.index("## Results"):README.index("## Documentation")]
    header, _, *rows = [line for line in table.splitlines() if line.startswith("|")]
    datasets = [cell.split()[0] for cell in header.strip("|").split("|")[1::3]]
    results = {}
    for row in rows:
        model, *cells = (cell.strip() for cell in row.strip("|").split("|"))
        for i, dataset in enumerate(datasets):
            results[model, dataset] = tuple(cells[3 * i:3 * i + 3])
    return results


def test_the_results_table_quotes_the_report_it_links():
    results = readme_results()
    assert {dataset for _, dataset in results} == {"bibtex_xc", "goemotions"}
    assert {"MLGPF", "BMLS", "BNMC"} <= {model for model, _ in results}
    for (model, dataset), (p1, ece1, seconds) in results.items():
        ranking, probabilities = report_row(dataset, model, 0), report_row(dataset, model, 1)
        p1_column = report_header(dataset, 0).index("P@1")
        ece_column, seconds_column = (report_header(dataset, 1).index(name) for name in ("ECE@1", "train s"))
        assert (p1, ece1, seconds) == (ranking[p1_column], probabilities[ece_column],
                                       probabilities[seconds_column]), (model, dataset)


def test_the_calibration_sentence_holds_in_the_report():
    results = readme_results()
    # "BNMC ... is well calibrated raw; MLGPF, BMLS and logistic regression are less so"
    for dataset in ("bibtex_xc", "goemotions"):
        raw = {model: float(results[model, dataset][1]) for model in ("MLGPF", "BMLS", "BNMC", "logistic")}
        assert min(raw, key=raw.get) == "BNMC", dataset
    # "... which brings bibtex_xc's ECE@1 to A, B and C" for MLGPF, BMLS and logistic, with isotonic maps
    found = re.search(r"brings\s+bibtex_xc's ECE@1 to (\d\.\d+), (\d\.\d+) and (\d\.\d+)", README)
    assert found, "the README gives the recalibrated ECE@1 of MLGPF, BMLS and logistic regression"
    header = report_header("bibtex_xc", 2)
    for model, stated in zip(("MLGPF", "BMLS", "logistic"), found.groups()):
        row = report_row("bibtex_xc", model, 2)
        assert row[header.index("calibration")] == "isotonic"
        assert row[header.index("ECE@1 cal")] == stated, model
        assert float(stated) < float(row[header.index("ECE@1 raw")])


def test_the_threads_import_in_the_readme_works_as_written():
    """``from bayesmlc.threads import use_threads`` then ``with use_threads(1):`` (issue: the older text
    used ``bayesmlc.threads`` after a bare ``import bayesmlc``, an AttributeError)."""
    (statement,) = set(re.findall(r"`(from bayesmlc\.threads import use_threads)`", README))
    (block,) = set(re.findall(r"`with (use_threads\(1\)):`", README))
    namespace: dict = {}
    exec(statement, namespace)
    import torch

    before = torch.get_num_threads()
    with eval(block, namespace):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_the_same_seed_and_thread_count_give_the_same_demo(capsys):
    """The README's reproducibility sentence, through the command line: same seed, same thread count,
    the same figures."""
    call = ["demo", "--n-samples", "400", "--threads", "1", "--seed", "3", "--json", "--quiet"]
    records = []
    for _ in range(2):
        assert main(call) == 0
        records.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["metrics"])
    assert records[0] == records[1]


@pytest.mark.parametrize("name, params", [
    ("BNMC", {"n_passes": 2}),
    ("BMLS", {"n_topics": 10, "max_sweeps": 60}),
])
def test_the_same_seed_and_thread_count_give_the_same_probabilities(name, params):
    """The same sentence for the other two models, from Python inside ``use_threads(1)``."""
    import bayesmlc
    from bayesmlc.threads import use_threads

    data = make_multilabel(300, 60, 8, feature_kind="binary", random_state=5)
    train, test = data.subset(np.arange(200)), data.subset(np.arange(200, 300))
    probabilities = []
    for _ in range(2):
        with use_threads(1):
            model = getattr(bayesmlc, name)(random_state=7, **params).fit(train.X, train.Y)
            probabilities.append(model.predict_proba(test.X))
    np.testing.assert_array_equal(probabilities[0], probabilities[1])
