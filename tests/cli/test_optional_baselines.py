"""The models of the ``[compare]`` extra without their package: a one-line error and exit 2 before
any data is read, and the ``[compare]`` mark in ``--help`` and ``info --models``."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from bayesmlc import models
from bayesmlc.cli import build_parser, main

#: the extra's models, as pyproject.toml's [compare] extra installs their packages
EXPECTED = {"napkinxc_plt": "napkinxc", "omikuji_parabel": "omikuji", "omikuji_bonsai": "omikuji"}


@pytest.fixture
def no_compare_packages(monkeypatch):
    """napkinxc and omikuji cannot be imported: ``None`` in ``sys.modules`` stops an import, and
    ``importlib.util.find_spec`` reports such a module as absent."""
    for package in set(EXPECTED.values()):
        monkeypatch.setitem(sys.modules, package, None)


@pytest.fixture
def data_never_read(monkeypatch):
    """Fail the test if a data file is read."""
    from bayesmlc.data import io

    def refuse(*args, **kwargs):
        raise AssertionError("a data file was read")

    for name in ("read_dataset", "read_train_test"):
        monkeypatch.setattr(io, name, refuse)


def test_the_registry_names_the_extras_models():
    assert dict(models.COMPARE_MODELS) == EXPECTED
    pyproject = Path(models.__file__).resolve().parents[1] / "pyproject.toml"
    extra = re.search(r'^compare = \[(.*)\]$', pyproject.read_text(encoding="utf-8"), re.MULTILINE).group(1)
    assert {re.match(r'"(\w+)', item.strip()).group(1) for item in extra.split(",")} == set(EXPECTED.values())


@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_train_without_the_package_is_one_line_and_exit_2_before_reading(model, tmp_path, capsys, no_compare_packages,
                                                                        data_never_read):
    train = tmp_path / "train.txt"
    train.write_text("2 2 1\n0 0:1\n0 1:1\n")
    assert main(["train", "--model", model, "--train", str(train), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"bayesmlc: error: --model {model}: optional package '{EXPECTED[model]}' is not installed")
    assert "pip install 'bayesmlc[compare]'" in err and "a bug" not in err
    assert not (tmp_path / "run").exists()


def test_a_package_that_is_found_but_does_not_import_is_refused_too(tmp_path, capsys, monkeypatch, data_never_read):
    real_import = models.importlib.import_module

    def broken(name, *args):
        if name == "napkinxc":
            raise ImportError("libstdc++.so.6: version GLIBCXX_3.4.32 not found")
        return real_import(name, *args)

    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name, *args: object())
    monkeypatch.setattr(models.importlib, "import_module", broken)
    assert main(["train", "--model", "napkinxc_plt", "--train", str(tmp_path / "absent.txt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not import (libstdc++.so.6" in err


def test_demo_without_the_package_is_one_line_and_exit_2(capsys, no_compare_packages):
    assert main(["demo", "--model", "omikuji_bonsai", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--model omikuji_bonsai: optional package 'omikuji' is not installed" in err


@pytest.mark.parametrize("command", ["train", "demo"])
def test_help_marks_exactly_the_extras_models(command):
    subparsers = next(action for action in build_parser()._actions if action.dest == "command")
    text = " ".join(subparsers.choices[command].format_help().split())
    marked = set(re.findall(r"(\w+) \[compare\]", text))
    assert marked == set(EXPECTED)
    assert "pip install 'bayesmlc[compare]'" in text


def test_info_lists_the_models_with_the_mark_and_what_is_missing(capsys, no_compare_packages):
    assert main(["info", "--models", "--json"]) == 0
    entries = {entry["model"]: entry for entry in json.loads(capsys.readouterr().out)}
    assert set(entries) == set(models.MODEL_CLASSES)
    assert {name for name, entry in entries.items() if entry["extra"] == "compare"} == set(EXPECTED)
    assert {name for name, entry in entries.items() if entry["unavailable"]} == set(EXPECTED)
    assert main(["info", "--models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    napkin = next(line for line in lines if line.startswith("napkinxc_plt "))
    assert napkin.startswith("napkinxc_plt [compare]") and "not installed: optional package 'napkinxc'" in napkin
    assert next(line for line in lines if line.startswith("logistic ")).endswith("available")
