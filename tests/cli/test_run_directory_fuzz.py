"""``train --out`` never loses a user's files (issue 32, points 1 and 2), fuzzed.

Hypothesis builds an ``--out`` folder of the user's (regular files of random bytes, subfolders, links
to files and folders inside and outside it, dangling links, FIFOs, an earlier run's files, files that
merely look like bayesmlc's temporaries, a stale temporary of a dead process), names it plainly,
through a link, through ``..``, through a link back up the tree, as a regular file or as a folder
that does not exist yet, writes a run into it with or without ``--overwrite``, and injects a failure
or a Ctrl-C at the k-th rename of the commit (or none). The property, checked against an oracle of
what the run may do: the outcome is success or a clean error (``CLIError``, the injected ``OSError``
or ``KeyboardInterrupt``) exactly when the oracle says; on anything but success every entry is as
it was (bytes, links, folders, FIFOs); on success only the run files of the folder changed (the new
run's, and an earlier run's gone under ``--overwrite``); no temporary of this process remains, and
stale ones of a dead process are cleaned once the folder is accepted.

The examples vary between runs (``derandomize=False``; hypothesis prints a failing example and the
seed that reproduces it), beside fixed ``@example`` cases; one fixed case runs the real command line.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import write_small_xc
from hypothesis import HealthCheck, event, example, given, note, settings
from hypothesis import strategies as st

import bayesmlc.cli.run_directory as run_directory
from bayesmlc.cli import CLIError
from bayesmlc.cli.run_directory import RUN_FILES, RunDirectory
from bayesmlc.safe_io import TEMPORARY_MARKER

ROOT = Path(__file__).resolve().parents[2]
#: names an entry of the user's folder may have: every run file, ordinary names, and names that look
#: like bayesmlc's temporaries without being one (never cleaned)
_NAMES = sorted(RUN_FILES) + ["notes.txt", ".hidden", "sub", "model.npz.bak", "Model.npz", "meta.json~", "run",
                              f".notes.{TEMPORARY_MARKER}-x", f"{TEMPORARY_MARKER}-1-abcdefgh",
                              f".run.{TEMPORARY_MARKER}-1-abc"]
_KINDS = ["file", "folder", "link_in_file", "link_in_folder", "link_out_file", "link_out_folder", "dangling", "fifo"]
#: how ``--out`` names the folder: refused before anything is written unless "folder", "link" or "new"
_TARGETS = ["folder", "link", "new", "dotdot", "link_up", "file"]


def _fuzz(max_examples: int) -> settings:
    """Examples that vary between runs; a failing one is printed with the seed that reproduces it."""
    return settings(max_examples=max_examples, deadline=None, derandomize=False, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _dead_pid() -> int:
    """A process id no process can have (above the kernel's largest)."""
    with open("/proc/sys/kernel/pid_max") as handle:
        return int(handle.read()) + 1000


# ---- the user's folder -------------------------------------------------------------------------
def _make_entry(folder: Path, outside: Path, name: str, kind: str, content: bytes) -> None:
    path = folder / name
    if kind == "file":
        path.write_bytes(content)
    elif kind == "folder":
        path.mkdir()
        (path / "inner.txt").write_bytes(content)
        (path / "model.npz").write_bytes(b"a run file's name inside a subfolder: " + content)
    elif kind == "link_in_file":
        path.symlink_to("kept.txt")
    elif kind == "link_in_folder":
        path.symlink_to("kept-folder")
    elif kind == "link_out_file":
        path.symlink_to(outside / "o.txt")
    elif kind == "link_out_folder":
        path.symlink_to(outside / "odir")
    elif kind == "dangling":
        path.symlink_to(outside / "nowhere")
    else:
        os.mkfifo(path)


def _build(root: Path, tree: dict, stale: bool) -> Path:
    """``root/real`` (the user's folder: ``tree`` plus a file and a folder that are always there, and
    a stale temporary of a dead process if ``stale``) and ``root/outside``; returns ``root/real``."""
    outside = root / "outside"
    (outside / "odir").mkdir(parents=True)
    (outside / "o.txt").write_bytes(b"outside")
    (outside / "odir" / "f.txt").write_bytes(b"outside folder")
    real = root / "real"
    (real / "kept-folder").mkdir(parents=True)
    (real / "kept.txt").write_bytes(b"kept")
    (real / "kept-folder" / "deep.bin").write_bytes(bytes(range(256)))
    for name, (kind, content) in tree.items():
        _make_entry(real, outside, name, kind, content)
    if stale:
        folder = real / f".run.{TEMPORARY_MARKER}-{_dead_pid()}-abcd1234"
        folder.mkdir()
        (folder / "model.npz").write_bytes(b"a killed run's")
    return real


def _is_marked_temporary(name: str) -> bool:
    """A whole name bayesmlc gives its temporaries (``.NAME.bayesmlc-tmp-PID-XXXXXXXX[.ext]``)."""
    head, _, tail = name.partition(f".{TEMPORARY_MARKER}-")
    pid, _, rest = tail.partition("-")
    return head.startswith(".") and len(head) > 1 and pid.isdigit() and len(rest.split(".")[0]) == 8


def _snapshot(root: Path) -> dict:
    """Every entry under ``root`` (links not followed, FIFOs not opened): relative path -> bytes,
    'folder', 'fifo' or 'link:TARGET'."""
    found = {}
    for folder, folders, files in os.walk(root):
        for name in folders + files:
            path = Path(folder) / name
            mode = os.lstat(path).st_mode
            key = str(path.relative_to(root))
            if stat.S_ISLNK(mode):
                found[key] = "link:" + os.readlink(path)
            elif stat.S_ISDIR(mode):
                found[key] = "folder"
            elif stat.S_ISFIFO(mode):
                found[key] = "fifo"
            else:
                found[key] = path.read_bytes()
    return found


def _without_stale(snapshot: dict) -> dict:
    return {k: v for k, v in snapshot.items() if not any(_is_marked_temporary(part) for part in Path(k).parts)}


def _out_argument(root: Path, real: Path, target: str) -> Path:
    """The ``--out`` path for ``target`` (see :data:`_TARGETS`), made as needed."""
    if target == "folder":
        return real
    if target == "link":
        (root / "link").symlink_to(real)
        return root / "link"
    if target == "new":
        return root / "fresh" / "run"
    if target == "dotdot":
        (real / "runs").mkdir()
        return real / "runs" / ".."
    if target == "link_up":
        (root / "up-holder").mkdir()
        (root / "up-holder" / "up").symlink_to(root)
        return root / "up-holder" / "up"
    (root / "a-file").write_bytes(b"not a folder")
    return root / "a-file"


# ---- the oracle ----------------------------------------------------------------------------------
def _n_renames(tree: dict, target: str, n_written: int) -> int:
    """The renames of a commit that goes through: the new folder's one, or the earlier run's files
    set aside and the new ones moved in."""
    return 1 if target == "new" else len([name for name in RUN_FILES if name in tree]) + n_written


def _expected_outcome(tree: dict, target: str, overwrite: bool, n_written: int, failure) -> tuple[str, int]:
    """What the commit must do: ("refused", 0), or ("failed" | "interrupted" | "committed", number of
    renames of the commit), from the rules of :class:`RunDirectory`."""
    if target in ("dotdot", "link_up", "file"):
        return "refused", 0
    earlier = [name for name in RUN_FILES if name in tree] if target != "new" else []
    if any(tree[name][0] != "file" for name in earlier):
        return "refused", 0  # a link, folder or FIFO where a run file goes
    if earlier and not overwrite:
        return "refused", 0
    n_moves = _n_renames(tree, target, n_written)
    if failure is not None and failure[1] <= n_moves:
        return ("failed" if failure[0] == "fail" else "interrupted"), n_moves
    return "committed", n_moves


def _commit(out: Path, overwrite: bool, written: dict, failure) -> str:
    """Write ``written`` as a run into ``out`` and commit it, ``failure`` = ("fail" | "sigint", k)
    injected at the k-th rename; returns the outcome ("refused", "failed", "interrupted",
    "committed"). Any other exception fails the test."""
    real_rename = run_directory._rename
    calls = []

    def rename(source, destination):
        calls.append(source)
        if failure is not None and len(calls) == failure[1]:
            if failure[0] == "fail":
                raise OSError(28, "No space left on device", str(destination))
            signal.raise_signal(signal.SIGINT)  # arrives between the moves
        real_rename(source, destination)

    try:
        run = RunDirectory(out, overwrite=overwrite)
    except CLIError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(f"--out {out}: "), str(exc)
        return "refused"
    for name, content in written.items():
        run.path(name).write_bytes(content)
    run_directory._rename = rename
    try:
        run.commit()
        return "committed"
    except CLIError as exc:
        return "refused:" + str(exc)  # not expected of a folder nothing else writes to: the oracle says so
    except OSError as exc:
        assert exc.errno == 28 and failure is not None and failure[0] == "fail", exc
        return "failed"
    except KeyboardInterrupt:
        assert failure is not None and failure[0] == "sigint"
        return "interrupted"
    finally:
        run_directory._rename = real_rename
        run.discard()


# ---- the property ---------------------------------------------------------------------------------
_USER_NAMES = [name for name in _NAMES if name not in RUN_FILES]


@st.composite
def _trees(draw) -> dict:
    """name -> (kind, bytes): the user's entries, maybe an earlier run (regular files at run-file
    names), and now and then a run-file name held by a link, folder or FIFO."""
    entries = st.tuples(st.sampled_from(_KINDS), st.binary(max_size=40))
    tree = draw(st.dictionaries(st.sampled_from(_USER_NAMES), entries, max_size=6))
    for name in draw(st.sets(st.sampled_from(sorted(RUN_FILES)), max_size=len(RUN_FILES))):
        tree[name] = ("file", draw(st.binary(max_size=40)))
    if draw(st.sampled_from([False, False, False, True])):
        tree[draw(st.sampled_from(sorted(RUN_FILES)))] = (draw(st.sampled_from(_KINDS[1:])), b"")
    return tree


_TREE = _trees()
_WRITTEN = st.dictionaries(st.sampled_from(sorted(RUN_FILES)), st.binary(max_size=40), min_size=1)
#: ("fail" | "sigint", k) or None, the kind picked by an integer modulo 3 (``sampled_from`` and ``one_of``
#: lean on one entry here)
_FAILURE = st.tuples(st.integers(0, 5), st.integers(1, 10**6)).map(
    lambda drawn: (("fail", drawn[1]), ("sigint", drawn[1]), None)[drawn[0] % 3])
#: ``--overwrite``, given more often than not (an earlier run without it is refused before the commit)
_OVERWRITE = st.integers(0, 5).map(lambda drawn: drawn % 3 != 2)
#: how ``--out`` names the folder, weighted towards the names that reach the commit
_TARGET = st.sampled_from(["folder"] * 3 + ["link"] * 2 + ["new"] * 2 + ["dotdot", "link_up", "file"])


def _check_commit(tree: dict, target: str, overwrite: bool, stale: bool, written: dict, failure) -> None:
    """The property for one example; ``failure``'s rename number is taken modulo one more than the
    commit's renames, so that most injected failures land inside the commit and some just after."""
    if failure is not None:
        failure = (failure[0], 1 + (failure[1] - 1) % (_n_renames(tree, target, len(written)) + 1))
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        real = _build(root, tree, stale)
        out = _out_argument(root, real, target)
        before = _snapshot(root)
        handler = signal.getsignal(signal.SIGINT)
        outcome = _commit(out, overwrite, written, failure)
        assert signal.getsignal(signal.SIGINT) is handler  # the commit restores the handler it found
        after = _snapshot(root)
        if target == "new" and after.get("fresh") == "folder" and "fresh/run" not in after:
            del after["fresh"]  # the parent the run folder was to go in: made before training, left empty
        expected, n_moves = _expected_outcome(tree, target, overwrite, len(written), failure)
        event(f"{target}: {outcome}")
        note(f"outcome {outcome}, expected {expected} ({n_moves} renames)")
        assert outcome == expected, (outcome, expected)
        mine = [k for k in after if f"{TEMPORARY_MARKER}-{os.getpid()}-" in k]
        assert not mine, f"temporaries left: {mine}"
        if expected in ("refused", "failed") or (expected == "interrupted" and target != "new"):
            assert _without_stale(after) == _without_stale(before)
            return
        if target == "new":  # one rename puts the whole run in place; a Ctrl-C during it comes after
            expected_after = dict(before, **{"fresh": "folder", "fresh/run": "folder"},
                                  **{f"fresh/run/{name}": content for name, content in written.items()})
        else:
            expected_after = {k: v for k, v in before.items() if k not in {f"real/{name}" for name in RUN_FILES}}
            expected_after.update({f"real/{name}": content for name, content in written.items()})
        assert _without_stale(after) == _without_stale(expected_after)
        if stale and target != "new":  # the folder was accepted: the dead process's temporary is gone
            assert not [k for k in after if _is_marked_temporary(Path(k).name)]


@_fuzz(200)
@given(tree=_TREE, target=_TARGET, overwrite=_OVERWRITE, stale=st.booleans(), written=_WRITTEN,
       failure=_FAILURE)
@example(tree={"model.npz": ("file", b"old"), "history.json": ("file", b"h"), "notes.txt": ("file", b"n")},
         target="folder", overwrite=True, stale=False, written={"model.npz": b"new", "meta.json": b"m"},
         failure=("fail", 4))  # the last move fails: the earlier run goes back, nothing of the user's moves
@example(tree={"meta.json": ("file", b"old"), "sub": ("folder", b"x")}, target="link", overwrite=True, stale=True,
         written={"meta.json": b"new"}, failure=("sigint", 2))
@example(tree={"meta.json": ("fifo", b"")}, target="folder", overwrite=True, stale=False,
         written={"meta.json": b"new"}, failure=None)
@example(tree={"notes.txt": ("file", b"keep")}, target="dotdot", overwrite=True, stale=False,
         written={"model.npz": b"new"}, failure=None)  # the probe's ``--out runs/..``
@example(tree={"model.npz": ("link_out_file", b"")}, target="folder", overwrite=True, stale=False,
         written={"model.npz": b"new"}, failure=None)
@example(tree={}, target="new", overwrite=False, stale=False, written={"model.npz": b"new"}, failure=("sigint", 1))
def test_any_folder_keeps_the_users_files_through_any_commit(tree, target, overwrite, stale, written, failure):
    _check_commit(tree, target, overwrite, stale, written, failure)


@pytest.mark.slow
@_fuzz(3000)
@given(tree=_TREE, target=_TARGET, overwrite=_OVERWRITE, stale=st.booleans(), written=_WRITTEN,
       failure=_FAILURE)
def test_many_folders_keep_the_users_files(tree, target, overwrite, stale, written, failure):
    """The property on many more examples (``-m slow``)."""
    _check_commit(tree, target, overwrite, stale, written, failure)


# ---- the command line on a fixed folder ----------------------------------------------------------
def _write_xc(path: Path, seed=0) -> Path:
    return write_small_xc(path, n=30, d=8, n_labels=3, seed=seed, features_per_row=3)


def test_train_overwrite_into_a_crowded_folder_keeps_everything_but_the_earlier_run(tmp_path):
    """The real command in a child process: a folder of every kind of entry, an earlier run, --out
    through a link and --overwrite. Exit 0; every entry of the user's is as it was; the run files are
    the new run's (history.json, which this run also writes, replaced; reliability.json, which it
    does not write, gone with the earlier run)."""
    tree = {name: (kind, f"{name} {kind}".encode()) for name, kind in [
        ("notes.txt", "file"), ("sub", "folder"), ("inside", "link_in_file"), ("inside-folder", "link_in_folder"),
        ("outside", "link_out_file"), ("outside-folder", "link_out_folder"), ("dangling", "dangling"),
        ("pipe", "fifo"), ("model.npz", "file"), ("reliability.json", "file"), ("history.json", "file"),
        (f".notes.{TEMPORARY_MARKER}-x", "file")]}
    real = _build(tmp_path, tree, stale=True)
    out = _out_argument(tmp_path, real, "link")
    train = _write_xc(tmp_path / "train.txt")
    before = _snapshot(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "bayesmlc", "train", "--model", "logistic", "--train", str(train), "--out", str(out),
         "--overwrite", "--quiet"], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    after = _snapshot(tmp_path)
    run_keys = {f"real/{name}" for name in RUN_FILES}
    assert {k: v for k, v in _without_stale(after).items() if k not in run_keys} == {
        k: v for k, v in _without_stale(before).items() if k not in run_keys}
    assert sorted(k for k in after if k in run_keys) == ["real/history.json", "real/meta.json", "real/model.npz"]
    assert after["real/model.npz"] != before["real/model.npz"] and after["real/model.npz"][:2] == b"PK"
    assert not [k for k in after if TEMPORARY_MARKER in Path(k).name and _is_marked_temporary(Path(k).name)]
