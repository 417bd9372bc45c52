"""``train --out`` never loses a user's files (issue 32, points 1 and 2).

Each test builds a folder of the user's files, runs or commits a run into it while a failure, a
Ctrl-C, a link, ``..`` or a non-regular file gets in the way, and compares the folder with a snapshot
taken before: every file of the user's must still be there with the same bytes.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import write_small_xc as _write_xc

import bayesmlc.cli.run_directory as run_directory
from bayesmlc.cli import CLIError, main
from bayesmlc.cli.run_directory import RunDirectory
from bayesmlc.exceptions import OutputPathError
from bayesmlc.safe_io import TEMPORARY_MARKER

ROOT = Path(__file__).resolve().parents[2]




def _snapshot(folder: Path) -> dict:
    """Every entry under ``folder`` (relative path -> bytes, or 'dir' / 'link:TARGET')."""
    found = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            found[key] = "link:" + os.readlink(path)
        elif path.is_dir():
            found[key] = "dir"
        else:
            found[key] = path.read_bytes()
    return found


def _user_folder(folder: Path, n_files=30) -> dict:
    """A folder of the user's: many files, a hidden one, a subfolder with files, and an earlier run."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        (folder / f"notes-{i}.txt").write_text(f"keep {i}\n")
    (folder / ".hidden").write_text("keep hidden\n")
    (folder / "sub").mkdir()
    (folder / "sub" / "data.txt").write_text("keep sub\n")
    return _snapshot(folder)


def _earlier_run(folder: Path) -> None:
    for name in ("model.npz", "meta.json", "history.json"):
        (folder / name).write_bytes(b"earlier " + name.encode())


def _write_run(run: RunDirectory) -> None:
    for name in ("model.npz", "meta.json", "metrics.json"):
        run.path(name).write_bytes(b"new " + name.encode())


def _no_temporaries(folder: Path) -> bool:
    return not [p for p in folder.rglob("*") if TEMPORARY_MARKER in p.name]


# ---- point 1: a failed commit leaves the folder as it was ------------------------------------------
def test_out_dot_dot_is_refused_before_training_and_keeps_the_folder(tmp_path, capsys, monkeypatch):
    """The probe's case: ``--out runs/..`` emptied the current folder into a run that then failed."""
    before = _user_folder(tmp_path / "work")
    train = _write_xc(tmp_path / "train.txt")
    (tmp_path / "work" / "runs").mkdir()
    before["runs"] = "dir"
    monkeypatch.chdir(tmp_path / "work")
    code = main(["train", "--model", "logistic", "--train", str(train), "--out", "runs/..", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "--out runs/..:" in err and "contains the path's own parent" in err, err
    assert _snapshot(tmp_path / "work") == before


@pytest.mark.parametrize("earlier", [False, True], ids=["no-earlier-run", "earlier-run-overwritten"])
def test_a_failure_at_every_move_of_the_commit_leaves_the_folder_as_it_was(tmp_path, monkeypatch, earlier):
    out = tmp_path / "out"
    _user_folder(out)
    if earlier:
        _earlier_run(out)
    before = _snapshot(out)
    real_rename = run_directory._rename
    n_moves = 3 + (3 if earlier else 0)
    for failing in range(1, n_moves + 1):
        calls = []

        def rename(source, destination):
            calls.append(source)
            if len(calls) == failing:
                raise OSError(28, "No space left on device", str(destination))
            real_rename(source, destination)

        monkeypatch.setattr(run_directory, "_rename", rename)
        run = RunDirectory(out, overwrite=True)
        _write_run(run)
        with pytest.raises(OSError, match="No space left"):
            run.commit()
        run.discard()
        assert _snapshot(out) == before, f"move {failing} failed and the folder changed"
        assert _no_temporaries(out) and _no_temporaries(tmp_path)
    # and with nothing failing, the run goes in and every file of the user's stays
    monkeypatch.setattr(run_directory, "_rename", real_rename)
    run = RunDirectory(out, overwrite=True)
    _write_run(run)
    run.commit()
    after = _snapshot(out)
    assert {k: v for k, v in after.items() if k not in run_directory.RUN_FILES} == {
        k: v for k, v in before.items() if k not in run_directory.RUN_FILES}
    assert after["model.npz"] == b"new model.npz" and "history.json" not in after  # no stale run file
    assert _no_temporaries(out)


def test_ctrl_c_at_every_move_of_the_commit_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _user_folder(out)
    _earlier_run(out)
    before = _snapshot(out)
    handler_before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the runner started in the background
    real_rename = run_directory._rename
    for step in range(1, 7):
        calls = []

        def rename(source, destination):
            calls.append(source)
            if len(calls) == step:
                signal.raise_signal(signal.SIGINT)  # arrives in the middle of the moves
            real_rename(source, destination)

        monkeypatch.setattr(run_directory, "_rename", rename)
        run = RunDirectory(out, overwrite=True)
        _write_run(run)
        with pytest.raises(KeyboardInterrupt):
            run.commit()
        run.discard()
        assert _snapshot(out) == before, f"Ctrl-C at move {step} changed the folder"
        assert _no_temporaries(out)
    assert signal.getsignal(signal.SIGINT) is handler_before  # the commit restores the handler it found


def test_train_interrupted_by_a_real_sigint_mid_commit_keeps_every_file(tmp_path):
    """End to end: the real CLI process, SIGINT sent to itself at the third move of the commit."""
    out = tmp_path / "out"
    _user_folder(out)
    _earlier_run(out)
    before = _snapshot(out)
    train = _write_xc(tmp_path / "train.txt")
    script = (
        "import os, signal, sys\n"
        "import bayesmlc.cli.run_directory as rd\n"
        "real, calls = rd._rename, []\n"
        "def rename(a, b):\n"
        "    calls.append(a)\n"
        "    if len(calls) == 3: os.kill(os.getpid(), signal.SIGINT)\n"
        "    real(a, b)\n"
        "rd._rename = rename\n"
        "from bayesmlc.cli import main\n"
        "sys.exit(main())\n")
    process = subprocess.run(
        [sys.executable, "-c", script, "train", "--model", "logistic", "--train", str(train), "--out", str(out),
         "--overwrite", "--quiet"], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=120, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert process.returncode == 130, process.stderr
    assert process.stderr.strip().splitlines()[-1] == "bayesmlc: interrupted"
    assert _snapshot(out) == before and _no_temporaries(out)


def test_a_failed_roll_back_names_the_folder_and_keeps_the_earlier_files(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    _earlier_run(out)
    real_rename = run_directory._rename
    calls = []

    def rename(source, destination):
        calls.append(source)
        if len(calls) >= 5:  # the fifth move fails, and so does every move back
            raise OSError(5, "Input/output error", str(destination))
        real_rename(source, destination)

    monkeypatch.setattr(run_directory, "_rename", rename)
    run = RunDirectory(out, overwrite=True)
    _write_run(run)
    with pytest.raises(OutputPathError, match="putting the earlier files back failed.*they are in"):
        run.commit()
    run.discard()
    # nothing is deleted: each earlier file is either in place or in the named temporary folder
    earlier = {p.name: p.read_bytes() for p in list(out.glob("*")) + list(out.glob(".*/.earlier/*"))
               if p.is_file() and p.read_bytes().startswith(b"earlier")}
    assert sorted(earlier) == ["history.json", "meta.json", "model.npz"]


# ---- point 2: links, devices, FIFOs -----------------------------------------------------------------
def test_out_link_writes_into_the_folder_it_points_to_and_moves_nothing_out(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    before = _user_folder(elsewhere)
    (tmp_path / "link").symlink_to(elsewhere)
    train = _write_xc(tmp_path / "train.txt")
    assert main(["train", "--model", "logistic", "--train", str(train), "--out", str(tmp_path / "link"),
                 "--quiet"]) == 0
    after = _snapshot(elsewhere)
    assert {k: v for k, v in after.items() if k in before} == before
    assert sorted(set(after) - set(before)) == ["history.json", "meta.json", "model.npz"]
    assert (tmp_path / "link").is_symlink() and _no_temporaries(tmp_path)


def test_out_link_back_up_the_tree_and_dangling_links_are_refused(tmp_path, capsys):
    before = _user_folder(tmp_path / "work")
    (tmp_path / "work" / "sub" / "up").symlink_to(tmp_path / "work")
    (tmp_path / "work" / "dangling").symlink_to(tmp_path / "nowhere")
    before = _snapshot(tmp_path / "work")
    train = _write_xc(tmp_path / "train.txt")
    for out, message in ((tmp_path / "work" / "sub" / "up", "contains the path's own parent"),
                         (tmp_path / "work" / "dangling", "which does not exist")):
        code = main(["train", "--model", "logistic", "--train", str(train), "--out", str(out), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert _snapshot(tmp_path / "work") == before


def test_a_fifo_in_a_run_files_place_is_refused_before_training(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "model.npz")
    train = _write_xc(tmp_path / "train.txt")
    code = main(["train", "--model", "logistic", "--train", str(train), "--out", str(out), "--overwrite", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "model.npz there is not a regular file" in err and "training" not in err, err
    assert (out / "model.npz").is_fifo() and sorted(p.name for p in out.iterdir()) == ["model.npz"]


def test_saving_over_a_fifo_or_a_folder_is_refused_and_leaves_it(tmp_path):
    from bayesmlc.linear import LogisticRegression

    rng = np.random.default_rng(0)
    X, Y = rng.random((30, 5)), (rng.random((30, 3)) < 0.4).astype(int)
    model = LogisticRegression().fit(X, Y)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder.npz").mkdir()
    for target, kind in ((tmp_path / "fifo", "a FIFO"), (tmp_path / "folder.npz", "a folder")):
        with pytest.raises(OutputPathError, match=f"is {kind}; bayesmlc only replaces regular files"):
            model.save(target)
    assert (tmp_path / "fifo").is_fifo() and (tmp_path / "folder.npz").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "folder.npz"]


def test_mlgpf_checkpoint_path_on_a_fifo_is_refused_before_fitting(tmp_path, capsys):
    os.mkfifo(tmp_path / "checkpoint")
    train = _write_xc(tmp_path / "train.txt")
    code = main(["train", "--model", "mlgpf", "--train", str(train), "--set", f"checkpoint_path={tmp_path / 'checkpoint'}",
                 "--set", "checkpoint_every=1", "--set", "n_inducing=5", "--set", "epochs=1", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "checkpoint_path" in err and "is a FIFO" in err, err
    assert (tmp_path / "checkpoint").is_fifo()


# ---- two runs into one folder --------------------------------------------------------------------
def test_the_second_of_two_concurrent_runs_is_refused_without_overwrite(tmp_path):
    out = tmp_path / "out"
    first, second = RunDirectory(out, overwrite=False), RunDirectory(out, overwrite=False)
    _write_run(first)
    _write_run(second)
    second.path("model.npz").write_bytes(b"second")
    first.commit()
    with pytest.raises(CLIError, match="already holds a run"):
        second.commit()
    second.discard()
    assert (out / "model.npz").read_bytes() == b"new model.npz" and _no_temporaries(tmp_path)


def test_a_commit_waits_for_no_one_and_says_another_run_is_writing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    run = RunDirectory(out, overwrite=False)
    _write_run(run)
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(CLIError, match="another bayesmlc run is writing there now"):
            run.commit()
    finally:
        os.close(fd)
    run.discard()
    assert sorted(p.name for p in out.iterdir()) == []
