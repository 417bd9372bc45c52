"""Checkpoints are untrusted input (issue 32, point 3): ``--resume`` reads a checkpoint like a model
file. Each crafted checkpoint is resumed in a child process (a corrupt Adam state used to crash the
interpreter: exit 139 or 134) through the command line, which must end with one line and exit 2
naming the file and the field at fault, before any training step."""

from __future__ import annotations

import copy
import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import write_small_xc as _write_xc
import torch

from bayesmlc.cli import main
from bayesmlc.gp.training import load_checkpoint, save_checkpoint
from bayesmlc.persistence import write_npz_atomically

ROOT = Path(__file__).resolve().parents[2]
_RESUMED = itertools.count()
SETTINGS = ("n_inducing=6", "n_latent=3", "random_state=0", "lr_decay=0", "checkpoint_every=1")




def _arguments(folder: Path, checkpoint: Path, out: str, *extra: str, epochs: int = 3) -> list:
    """``bayesmlc train --model mlgpf`` with checkpoints at ``checkpoint``, into ``folder / out``."""
    argv = ["train", "--model", "mlgpf", "--train", str(folder / "train.txt"), "--out", str(folder / out), "--quiet",
            "--set", f"checkpoint_path={checkpoint}", *extra]
    for setting in SETTINGS + (f"epochs={epochs}",):
        argv += ["--set", setting]
    return argv


def _train(folder: Path, checkpoint: Path, out: str, *extra: str, epochs: int = 3) -> subprocess.CompletedProcess:
    """The command of :func:`_arguments` in a child process (a crash is its exit code)."""
    environment = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "bayesmlc", *_arguments(folder, checkpoint, out, *extra, epochs=epochs)],
                          capture_output=True, text=True, timeout=300, cwd=folder, env=environment)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A folder with training data and the checkpoint of a finished 2-epoch run, and its payload."""
    folder = tmp_path_factory.mktemp("checkpoints")
    _write_xc(folder / "train.txt")
    checkpoint = folder / "written.npz"
    assert main(_arguments(folder, checkpoint, "first", epochs=2)) == 0
    return folder, checkpoint, load_checkpoint(checkpoint)


def _resume_fails(folder: Path, checkpoint: Path, *expected: str, capsys=None, epochs: int = 3) -> str:
    """Resume from ``checkpoint`` (in this process with ``capsys``, else in a child process) and
    check the one-line error, exit 2, naming the file and holding each of ``expected``."""
    out = f"resumed-{next(_RESUMED)}"  # each its own: a resume that wrongly succeeds leaves a run there
    if capsys is None:
        done = _train(folder, checkpoint, out, "--resume", epochs=epochs)
        code, err = done.returncode, done.stderr
    else:
        code = main(_arguments(folder, checkpoint, out, "--resume", epochs=epochs))
        err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, (code, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("bayesmlc: error: ") and str(checkpoint) in lines[0], err
    for text in expected:
        assert text in lines[0], lines[0]
    assert not (folder / out).exists()
    return lines[0]


def _crafted(folder: Path, payload: dict, name: str) -> Path:
    path = folder / f"{name}.npz"
    save_checkpoint(path, payload)
    return path


def test_the_written_checkpoint_resumes(written):
    folder, checkpoint, _ = written
    resumed = folder / "copy.npz"
    resumed.write_bytes(checkpoint.read_bytes())
    assert main(_arguments(folder, resumed, "resumed-ok", "--resume")) == 0
    assert load_checkpoint(resumed)["epoch"] == 3


def _first_trained(payload: dict) -> tuple[str, str]:
    """The optimizer index of the first parameter whose Adam state is saved, and that state's key."""
    index = sorted(payload["optimizer"]["state"], key=int)[0]
    return index, f"optimizer.state[{index}]"


@pytest.mark.parametrize("change, field", [
    ("grow", "exp_avg"),        # more entries than the parameter: Adam's fused step wrote out of bounds
    ("shrink", "exp_avg_sq"),   # fewer
    ("transpose", "exp_avg"),   # same count, other shape
])
def test_adam_state_of_the_wrong_shape_is_refused_before_any_step(written, change, field):
    folder, _, payload = written
    payload = copy.deepcopy(payload)
    index, name = _first_trained(payload)
    state = payload["optimizer"]["state"][index][field]
    state = {"grow": torch.zeros(state.numel() * 4096 + 7),
             "shrink": torch.zeros(max(state.numel() - 1, 0)),
             "transpose": torch.zeros(tuple(reversed(state.shape)) + (2,))}[change]
    payload["optimizer"]["state"][index][field] = state
    _resume_fails(folder, _crafted(folder, payload, f"adam-{change}"), f"{name}.{field}", "shape")


@pytest.mark.parametrize("mutate, expected", [
    (lambda p: p["optimizer"]["state"].update({"999": {}}), "optimizer.state"),
    (lambda p: p["optimizer"].update(param_groups=[{"params": [0]}]), "optimizer.param_groups"),
    (lambda p: p["optimizer"]["state"][sorted(p["optimizer"]["state"], key=int)[0]].update(
        exp_avg_sq=-p["optimizer"]["state"][sorted(p["optimizer"]["state"], key=int)[0]]["exp_avg_sq"] - 1), ">= 0"),
    (lambda p: p["optimizer"]["state"][sorted(p["optimizer"]["state"], key=int)[0]].update(
        step=torch.tensor(float("nan"))), ".step"),
    (lambda p: p["optimizer"]["state"][sorted(p["optimizer"]["state"], key=int)[0]].update(
        max_exp_avg_sq=torch.zeros(1)), "must hold exactly"),
    (lambda p: p.update(epoch=-5), "epoch must be an integer >= 0"),
    (lambda p: p.update(epoch=10**30), "epoch"),
    (lambda p: p.update(epoch=2.5), "epoch"),
    (lambda p: p.pop("params"), "missing params"),
    (lambda p: p.update(jitter=float("inf")), "jitter"),
    (lambda p: p.update(rng_state={"bit_generator": "PCG64", "state": "x"}), "rng_state"),
    (lambda p: p["history"]["epoch"].append(3), "history['epoch']"),
    (lambda p: p.update(val_rows=np.array([40])), "val_rows"),
    (lambda p: p["parameters"].update(Phi=p["parameters"]["Phi"][:2]), "parameters['Phi']"),
    (lambda p: p["parameters"].update(bias=p["parameters"]["bias"].to(torch.int64)), "floating-point"),
    (lambda p: p["parameters"].update(extra=torch.zeros(2)), "parameters"),
    (lambda p: p.update(best_state={"Phi": torch.zeros(2)}), "best_state"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_crafted_checkpoint_field_is_refused_with_one_line(written, mutate, expected, capsys):
    folder, _, payload = written
    payload = copy.deepcopy(payload)
    mutate(payload)
    _resume_fails(folder, _crafted(folder, payload, "field"), expected, capsys=capsys)


def test_nan_parameters_are_refused_even_with_no_epochs_left(written, capsys):
    """A checkpoint at its last epoch trains no further: its parameters went straight into the model
    file, which then could not be loaded."""
    folder, _, payload = written
    payload = copy.deepcopy(payload)
    payload["parameters"]["variational.mean"] = torch.full_like(payload["parameters"]["variational.mean"], np.nan)
    _resume_fails(folder, _crafted(folder, payload, "nan"), "variational.mean", "finite", capsys=capsys, epochs=2)


@pytest.mark.parametrize("meta, expected", [
    ({"format": "bayesmlc-mlgpf-checkpoint", "version": "x", "payload": {}}, "version"),
    ({"format": "bayesmlc-mlgpf-checkpoint", "version": 1, "payload": [1, 2]}, "payload"),
    ({"format": "bayesmlc-mlgpf-checkpoint", "version": 1, "payload": {}}, "missing params"),
    ({"format": "bayesmlc-mlgpf-checkpoint", "version": 7, "payload": {}}, "newer"),
    ({"format": "something else", "version": 1, "payload": {}}, "not an MLGPF checkpoint"),
], ids=["version-x", "list-payload", "empty-payload", "newer", "format"])
def test_malformed_checkpoint_document_is_refused(written, meta, expected, capsys):
    folder, _, _ = written
    path = folder / "document.npz"
    write_npz_atomically(path, meta, {})
    _resume_fails(folder, path, expected, capsys=capsys)
