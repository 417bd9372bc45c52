"""``train --out``: the run folder, written so that the user's files are never at risk.

The run is written into a marked temporary folder (``.NAME.bayesmlc-tmp-PID-XXXXXXXX``, see
:func:`bayesmlc.safe_io.temporary_prefix`) and moved into place only when all of it is written:

* a new ``--out`` folder appears whole, by one rename of the temporary folder;
* into an existing folder, the new run's files move in (never the folder's files out); an earlier
  run's files, replaced only with ``--overwrite``, are set aside first and put back if any move fails
  or Ctrl-C arrives, so on every failure the folder is as it was. Files that are not run files are
  never moved, renamed or removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

from ..exceptions import OutputPathError
from ..safe_io import apply_umask_mode, remove_stale_temporaries, temporary_prefix
from .errors import CLIError

MODEL_FILE = "model.npz"
META_FILE = "meta.json"
METRICS_FILE = "metrics.json"
HISTORY_FILE = "history.json"
RELIABILITY_FILE = "reliability.json"
#: what ``train --out`` writes; a folder holding any of them holds a run
RUN_FILES = frozenset({MODEL_FILE, META_FILE, METRICS_FILE, HISTORY_FILE, RELIABILITY_FILE})
#: the name the temporary folder of a run written into an existing folder stands in for
STAGING_NAME = "run"


class RunDirectory:
    """The ``--out`` folder of a run, written as a unit and never at the expense of the user's files.

    Created before training, so that an unusable ``--out`` fails before any work: a path whose parent
    lies inside the folder it names (``runs/..``, or a link back up the tree), a dangling link,
    something that is not a folder, a run file position held by something that is not a regular file
    (a FIFO, a device, a folder), or a folder that already holds a run (any of :data:`RUN_FILES`)
    without ``overwrite``. A link to a folder is followed: the run is written into the folder it
    points to. :meth:`path` names a file of the run; :meth:`commit` moves the run into place;
    :meth:`discard` removes what this run wrote. Temporaries of killed runs are removed on creation
    (only marked ones: :func:`bayesmlc.safe_io.remove_stale_temporaries`).

    Parameters
    ----------
    target:
        The ``--out`` path.
    overwrite:
        Whether an earlier run in ``target`` may be replaced (its run files only).
    """

    def __init__(self, target, overwrite: bool):
        self.option = f"--out {target}"
        self.overwrite = overwrite
        self.target = _resolved_target(Path(target), self.option)
        self._unrestored = None  # the folder holding earlier run files a failed roll-back left
        if self.target.exists():
            self._check_target()
            remove_stale_temporaries(self.target)
            self.folder = Path(tempfile.mkdtemp(dir=self.target, prefix=temporary_prefix(STAGING_NAME)))
        else:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(self.target.parent)
            self.folder = Path(tempfile.mkdtemp(dir=self.target.parent, prefix=temporary_prefix(self.target.name)))
        apply_umask_mode(self.folder, directory=True)

    def path(self, name: str) -> Path:
        """Where the run's file ``name`` is written before :meth:`commit`."""
        return self.folder / name

    def commit(self) -> None:
        """Move the run into place. On failure or Ctrl-C the target is as it was and the error (or
        KeyboardInterrupt) propagates; :meth:`discard` then removes the temporary folder."""
        with _interrupts_deferred() as interrupted:
            if self.folder.parent != self.target:
                if interrupted():
                    return  # nothing moved yet: the KeyboardInterrupt follows
                if self._rename_new_folder():
                    self.folder = None
                    return
            with _locked(self.target, self.option):
                self._check_target()
                self._move_into_target(interrupted)
            shutil.rmtree(self.folder, ignore_errors=True)  # the earlier run's files, replaced
            self.folder = None

    def discard(self) -> None:
        """Remove the temporary folder (and with it only files this run wrote), unless the run was
        committed or a failed roll-back left earlier run files in it: those stay, and the error named
        the folder."""
        if self.folder is not None and self._unrestored is None:
            shutil.rmtree(self.folder, ignore_errors=True)

    # ---- internals ----------------------------------------------------------------------------------
    def _check_target(self) -> None:
        """Refuse a target that is not a folder, run-file positions held by non-regular files, and an
        earlier run without ``overwrite``."""
        if not self.target.is_dir():
            raise CLIError(f"{self.option}: exists and is not a folder")
        earlier = []
        for name in sorted(RUN_FILES):
            entry = self.target / name
            if entry.is_symlink() or entry.exists():
                if entry.is_symlink() or not entry.is_file():
                    raise CLIError(f"{self.option}: {name} there is not a regular file; bayesmlc will not replace it")
                earlier.append(name)
        if earlier and not self.overwrite:
            raise CLIError(f"{self.option}: already holds a run ({', '.join(earlier)}); pass --overwrite to replace it")

    def _rename_new_folder(self) -> bool:
        """Rename the temporary folder to a target that does not exist (or is an empty folder made
        meanwhile); False when the target is now a non-empty folder (another run got there first)."""
        try:
            _rename(self.folder, self.target)
        except OSError:
            if not self.target.is_dir():
                raise
            return False
        self.folder = self.target
        return True

    def _move_into_target(self, interrupted) -> None:
        """Set the earlier run's files aside, move the new ones in; undo every move on any failure or
        a deferred Ctrl-C."""
        aside = self.folder / ".earlier"
        aside.mkdir()
        moves = []
        try:
            for name in sorted(RUN_FILES):
                if os.path.lexists(self.target / name):
                    _move(self.target / name, aside / name, moves)
            for entry in sorted(self.folder.iterdir()):
                if entry != aside:
                    if os.path.lexists(self.target / entry.name):
                        raise OutputPathError(f"{self.option}: {entry.name} appeared there while the run was written")
                    _move(entry, self.target / entry.name, moves)
            if interrupted():
                raise KeyboardInterrupt  # before the point of no return: undo
        except BaseException as exc:
            self._roll_back(moves, exc)
            raise

    def _roll_back(self, moves, exc) -> None:
        for source, destination in reversed(moves):
            try:
                _rename(destination, source)
            except OSError as failure:
                self._unrestored = self.folder
                raise OutputPathError(
                    f"{self.option}: the run could not be written ({exc or type(exc).__name__}) and putting the "
                    f"earlier files back failed ({failure.strerror or failure}); they are in {self.folder}") from exc


def _resolved_target(given: Path, option: str) -> Path:
    """The real folder ``given`` names (links and ``..`` resolved), refusing paths whose own parent
    would lie inside it and dangling links."""
    absolute = Path.cwd() / given
    if absolute.is_symlink() and not absolute.exists():
        raise CLIError(f"{option}: is a link to {os.readlink(absolute)}, which does not exist")
    real = Path(os.path.realpath(absolute))
    parent = Path(os.path.realpath(absolute.parent))
    if parent == real or real in parent.parents:
        raise CLIError(f"{option}: names {real}, a folder that contains the path's own parent; name the folder "
                       "itself (without '..' or a link back up the tree)")
    if real.exists() and not real.is_dir():
        raise CLIError(f"{option}: exists and is not a folder")
    return real


def _rename(source: Path, destination: Path) -> None:
    """Every rename of a run's commit and roll-back (one place, so tests can inject failures)."""
    os.rename(source, destination)


def _move(source: Path, destination: Path, moves: list) -> None:
    _rename(source, destination)
    moves.append((source, destination))


@contextlib.contextmanager
def _locked(folder: Path, option: str):
    """Hold an exclusive lock on ``folder`` (two runs committing into it one after the other, never
    at once)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise CLIError(f"{option}: another bayesmlc run is writing there now") from None
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _interrupts_deferred():
    """Record SIGINT and SIGTERM instead of acting on them while the block runs; yields a function
    telling whether one arrived. Afterwards the earlier handlers are restored and, unless the block
    raised, a recorded SIGTERM is sent again and a recorded SIGINT raised as KeyboardInterrupt. Outside
    the main thread, where handlers cannot be set, signals act as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    received = []
    previous = {sig: signal.signal(sig, lambda number, frame: received.append(number))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: bool(received)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if signal.SIGTERM in received:
        os.kill(os.getpid(), signal.SIGTERM)
    if signal.SIGINT in received:
        raise KeyboardInterrupt
