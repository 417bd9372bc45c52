"""``train --out``: the run folder, written as a unit."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..safe_io import apply_umask_mode, remove_stale_temporaries, temporary_prefix
from .errors import CLIError

MODEL_FILE = "model.npz"
META_FILE = "meta.json"
METRICS_FILE = "metrics.json"
HISTORY_FILE = "history.json"
RELIABILITY_FILE = "reliability.json"
#: what ``train --out`` writes; a folder holding any of them holds a run
RUN_FILES = frozenset({MODEL_FILE, META_FILE, METRICS_FILE, HISTORY_FILE, RELIABILITY_FILE})


class RunDirectory:
    """The ``--out`` folder of a run, written as a unit.

    Created before training: a temporary sibling folder ``.NAME.tmp-PID-XXXX`` (so an unwritable or
    misnamed ``--out`` fails before any work is done). :meth:`path` names a file inside it;
    :meth:`commit` renames it to ``NAME``; :meth:`discard` removes it. A folder ``NAME`` that already
    holds a run (any of :data:`RUN_FILES`) is refused unless ``overwrite``; then the earlier run's
    files are dropped. Other files already in ``NAME`` (a harness's logs) are kept: they move into
    the new folder, open handles included, just before the rename. Temporary folders of runs that
    were killed are removed on creation.
    """

    def __init__(self, target, overwrite: bool):
        self.target = Path(target).absolute()
        if self.target.exists() or self.target.is_symlink():
            if not self.target.is_dir():
                raise CLIError(f"--out {target}: exists and is not a folder")
            earlier = sorted(entry.name for entry in self.target.iterdir() if entry.name in RUN_FILES)
            if earlier and not overwrite:
                raise CLIError(f"--out {target}: already holds a run ({', '.join(earlier)}); pass --overwrite "
                               "to replace it")
        self.target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.target.parent)
        self.folder = Path(tempfile.mkdtemp(dir=self.target.parent, prefix=temporary_prefix(self.target.name)))
        apply_umask_mode(self.folder, directory=True)

    def path(self, name: str) -> Path:
        return self.folder / name

    def commit(self) -> None:
        aside = None
        if self.target.exists():
            for entry in self.target.iterdir():
                if entry.name not in RUN_FILES and not (self.folder / entry.name).exists():
                    os.replace(entry, self.folder / entry.name)
            aside = Path(tempfile.mkdtemp(dir=self.target.parent, prefix=temporary_prefix(self.target.name)))
            os.replace(self.target, aside / "earlier")
        os.replace(self.folder, self.target)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
