"""``bayesmlc bench --dataset NAME=TRAIN[,TEST]``: a suite's models on the user's own files.

Each ``--dataset`` adds a dataset ``NAME`` to the suite, beside the suite's own sets; ``--datasets
NAME ...`` then selects among all of them, so ``--dataset mine=a.txt --datasets mine`` runs the
suite's models on ``mine`` alone. The files are read in any format ``bayesmlc train`` reads. Without
``TEST`` the rows of ``TRAIN`` are split at random, 20% held out, by the seed of the first repeat
(``--seed``): the same seed gives the same split; the split is written in XC format to
``OUT/data/NAME/{train,test}.txt``. The user's sets get each configuration's plain parameters (no
per-dataset settings of the suite apply to them).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ..exceptions import BayesMLCError, ValidationError
from .suites import DatasetSpec, Suite

__all__ = ["parse_dataset_argument", "add_user_datasets", "TEST_FRACTION"]

#: the share of rows held out when ``--dataset`` names no test file
TEST_FRACTION = 0.2
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def parse_dataset_argument(text: str) -> tuple[str, Path, Path | None]:
    """``"NAME=TRAIN[,TEST]"`` to ``(name, train, test or None)``; the files must exist. A path that
    holds a comma is read whole when a file of that name exists."""
    option = f"--dataset {text}"
    name, sep, files = text.partition("=")
    if not sep or not name or not files:
        raise ValidationError(f"{option}: expected NAME=TRAIN[,TEST]")
    if not _NAME.fullmatch(name):
        raise ValidationError(f"{option}: NAME must be letters, digits, '_', '.' or '-' (it names a folder)")
    train, comma, test = files.partition(",")
    if comma and Path(files).is_file():
        train, comma, test = files, "", ""
    if comma and not test:
        raise ValidationError(f"{option}: nothing after the comma (give NAME=TRAIN or NAME=TRAIN,TEST)")
    paths = [Path(train)] + ([Path(test)] if test else [])
    for path in paths:
        if not path.is_file():
            raise ValidationError(f"{option}: {path}: no such file")
    return name, paths[0], paths[1] if test else None


def _split_files(name: str, train: Path, folder: Path, seed: int) -> tuple[Path, Path]:
    """Split ``train``'s rows (``TEST_FRACTION`` held out, by ``seed``) into ``folder/{train,test}.txt``."""
    from ..data.io import read_dataset, write_dataset
    from ..data.synthetic import split

    data = read_dataset(train)
    part_train, part_test = split(data, TEST_FRACTION, random_state=seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "train.txt", folder / "test.txt"
    write_dataset(part_train, paths[0])
    write_dataset(part_test, paths[1])
    return paths


def add_user_datasets(suite: Suite, arguments, out_dir, seed: int) -> Suite:
    """``suite`` with a dataset per ``--dataset`` argument appended (files split when no TEST is
    given); a one-line ValidationError naming the argument for a bad one."""
    if not arguments:
        return suite
    specs, names = [], set(suite.dataset_names)
    for text in arguments:
        name, train, test = parse_dataset_argument(text)
        if name in names:
            taken = "the suite has a dataset" if name in suite.dataset_names else "another --dataset is"
            raise ValidationError(f"--dataset {text}: {taken} named {name!r}; choose another NAME")
        names.add(name)
        if test is None:
            try:
                train, test = _split_files(name, train, Path(out_dir) / "data" / name, seed)
            except (BayesMLCError, OSError) as exc:
                raise ValidationError(f"--dataset {text}: {exc}") from None
        specs.append(DatasetSpec(name, files=(str(train), str(test))))
    return dataclasses.replace(suite, datasets=tuple(suite.datasets) + tuple(specs))
