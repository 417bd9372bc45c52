"""Registry of public multi-label benchmark sets: lookup, loading and verified download.

The catalogue itself is data, ``catalogue.json`` beside this module (shipped as package data): every
record holds what the literature publishes about a set (rows in the train and test split, features D,
labels L, average labels per row), the split convention, the constants (A, B) of Jain et al.'s
propensity model, and, for the sets with verified copies, the size and sha256 of every file so that a
download or a local copy can be checked. This module reads it into :class:`DatasetInfo` records.

Propensity constants. Jain, Prabhu and Varma, "Extreme multi-label loss functions for recommendation,
tagging, ranking & other missing label applications", KDD 2016, define p_l = 1 / (1 + C (N_l + B)^-A),
C = (ln N - 1)(B + 1)^A, with A = 0.55, B = 1.5 for every data set except Wikipedia-LSHTC (A = 0.5,
B = 0.4) and Amazon (A = 0.6, B = 2.6). The reference tools apply the non-default pairs only to the
Wikipedia-LSHTC/Wikipedia-500K and Amazon-670K/Amazon-3M sets: ``pyxclib`` (kunaldahiya/pyxclib,
``compute_inv_propensity``: "Wikpedia-500K: 0.5/0.4, Amazon-670K, Amazon-3M: 0.6/2.6, Others:
0.55/1.5") and napkinXC (mwydmuch/napkinXC, ``experiments/calculate_Jain_et_al_inv_ps.py``, which
keys on the ``wikiLSHTC``/``WikipediaLarge-500K`` and ``amazon``/``amazon-3M`` folders, while
AmazonCat-13K lives in ``amazonCat``). So AmazonCat-13K and Wiki10-31K use the default pair here.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.error
import urllib.request
import warnings
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Optional, Tuple

from ..exceptions import DatasetNotFoundError, DownloadError, ValidationError
from ..safe_io import remove_stale_temporaries, temporary_prefix

__all__ = [
    "DataFile",
    "DatasetInfo",
    "DEFAULT_PROPENSITY",
    "DownloadError",
    "DatasetNotFoundError",
    "REGISTRY",
    "XC_REPOSITORY_URL",
    "MULAN_URL",
    "get_info",
    "list_datasets",
    "data_home",
    "dataset_folder",
    "load",
    "download",
    "file_sha256",
]

XC_REPOSITORY_URL = "http://manikvarma.org/downloads/XC/XMLRepository.html"
MULAN_URL = "http://mulan.sourceforge.net/datasets-mlc.html"
JAIN_2016 = "Jain, Prabhu, Varma, KDD 2016 (propensity model); pyxclib and napkinXC defaults"

_DEFAULT_A, _DEFAULT_B = 0.55, 1.5
#: (A, B) of a data set the registry does not name (Jain et al.'s pair for most sets)
DEFAULT_PROPENSITY = (_DEFAULT_A, _DEFAULT_B)


@dataclass(frozen=True)
class DataFile:
    """One file of a staged data set: name in the data set's folder, size in bytes, sha256, URL.

    ``url`` is None when no public copy of this exact file is known (then :func:`download` needs a
    ``base_url`` mirror). ``required=False`` marks the label/feature name files, which :func:`load`
    does not need.
    """

    name: str
    size: int
    sha256: str
    url: Optional[str] = None
    required: bool = True


@dataclass(frozen=True)
class DatasetInfo:
    """What is known about a public multi-label data set.

    Attributes
    ----------
    name: registry key (lower case), e.g. ``"eurlex-4k"``.
    title: the name used in the literature, e.g. ``"EURLex-4K"``.
    n_train, n_test, n_features, n_labels: published shape of the standard split.
    labels_per_row: published average number of labels per row.
    feature_kind: what the features are.
    split: the split convention (whose train/test partition the numbers refer to).
    source: where the data originally comes from, as text.
    source_url: page to get the original files from.
    propensity_a, propensity_b: constants (A, B) of Jain et al.'s propensity model for this set.
    files: verified files of the XC-text conversion (empty when no checksummed copy is known).
    train_names, test_names: file names :func:`load` accepts for each split, first match wins.
    notes: anything a user must know (reconstructed files, unusual splits).
    """

    name: str
    title: str
    n_train: int
    n_test: int
    n_features: int
    n_labels: int
    labels_per_row: float
    feature_kind: str
    split: str
    source: str
    source_url: str
    propensity_a: float = _DEFAULT_A
    propensity_b: float = _DEFAULT_B
    propensity_source: str = JAIN_2016
    files: Tuple[DataFile, ...] = ()
    train_names: Tuple[str, ...] = ("train.txt",)
    test_names: Tuple[str, ...] = ("test.txt",)
    notes: str = ""
    aliases: Tuple[str, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict:
        """Plain-Python description (for JSON)."""
        out = asdict(self)
        out["files"] = [asdict(f) for f in self.files]
        out.pop("aliases")
        return out

    @property
    def downloadable(self) -> bool:
        """Whether checksummed files are recorded (download then works with a URL or a mirror)."""
        return bool(self.files)


#: The catalogue file, shipped with the package: one record per data set, a field left out takes the default
#: of :class:`DatasetInfo` / :class:`DataFile`.
CATALOGUE_FILE = "catalogue.json"
_CATALOGUE_FORMAT = ("bayesmlc-dataset-catalogue", 1)


def _read_catalogue() -> list:
    """The :class:`DatasetInfo` records of ``catalogue.json``, in file order."""
    document = json.loads(resources.files(__package__).joinpath(CATALOGUE_FILE).read_text(encoding="utf-8"))
    if (document.get("format"), document.get("format_version")) != _CATALOGUE_FORMAT:
        raise ValueError(f"{CATALOGUE_FILE} is not a {_CATALOGUE_FORMAT[0]} version {_CATALOGUE_FORMAT[1]} file")
    entries = []
    for record in document["datasets"]:
        fields = dict(record)
        try:
            fields["files"] = tuple(DataFile(**entry) for entry in fields.get("files", ()))
            for key in ("train_names", "test_names", "aliases"):
                if key in fields:
                    fields[key] = tuple(fields[key])
            entries.append(DatasetInfo(**fields))
        except TypeError as exc:  # a missing or unknown field
            raise ValueError(f"{CATALOGUE_FILE}, record {record.get('name')!r}: {exc}") from None
    return entries


_ENTRIES = _read_catalogue()

#: All known data sets by registry key.
REGISTRY = {info.name: info for info in _ENTRIES}
_ALIASES = {alias: info.name for info in _ENTRIES for alias in info.aliases}


def _key(name: str) -> str:
    if not isinstance(name, str):
        raise ValidationError(f"dataset name must be a string, got {name!r}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in REGISTRY:
        squashed = key.replace("-", "").replace("_", "")
        matches = [k for k in REGISTRY if k.replace("-", "").replace("_", "") == squashed]
        if len(matches) != 1:
            raise ValidationError(f"unknown dataset {name!r}; known datasets: {', '.join(REGISTRY)}")
        key = matches[0]
    return key


def list_datasets() -> list:
    """Registry keys of every known data set, in registry order."""
    return list(REGISTRY)


def get_info(name: str) -> DatasetInfo:
    """The :class:`DatasetInfo` of a data set (name case-insensitive; ``EURLex-4K``, ``eurlex`` work)."""
    return REGISTRY[_key(name)]


#: the environment variable naming the data root, read by the registry and the benchmark harness
DATA_ROOT_VARIABLE = "BAYESMLC_DATA"
#: the harness's former variable, still read (with a DeprecationWarning) where the other is unset
DEPRECATED_DATA_ROOT_VARIABLE = "BAYESMLC_SHARED_DATASETS"
DEFAULT_DATA_HOME = "~/.cache/bayesmlc"


def data_home(data_home=None) -> Path:
    """The data root: the folder holding one folder per data set (``<data_home>/<name>/``), where
    :func:`load` and :func:`download` keep the registry's sets and ``bayesmlc bench`` reads its real
    ones. ``data_home`` if given, else ``$BAYESMLC_DATA``, else ``$BAYESMLC_SHARED_DATASETS`` (the
    harness's former variable, with a DeprecationWarning), else ``~/.cache/bayesmlc``."""
    if data_home is not None:
        return Path(data_home).expanduser()
    env = os.environ.get(DATA_ROOT_VARIABLE)
    if env:
        return Path(env).expanduser()
    former = os.environ.get(DEPRECATED_DATA_ROOT_VARIABLE)
    if former:
        warnings.warn(f"${DEPRECATED_DATA_ROOT_VARIABLE} is deprecated: set ${DATA_ROOT_VARIABLE}, the one data root "
                      "of the registry and the benchmark harness", DeprecationWarning, stacklevel=2)
        return Path(former).expanduser()
    return Path(DEFAULT_DATA_HOME).expanduser()


def dataset_folder(name: str, data_home_=None) -> Path:
    """Folder of a data set inside the cache folder: ``<data_home>/<registry key>``."""
    return data_home(data_home_) / _key(name)


def file_sha256(path, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk_size), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------------
def _how_to_get(info: Optional[DatasetInfo], folder: Path) -> str:
    if info is None:
        return f"put the XC-format files train.txt and test.txt in {folder}"
    lines = [f"To get {info.title}:"]
    if info.downloadable:
        lines.append(f"  bayesmlc.datasets.download({info.name!r}) with a URL or base_url mirror of the files "
                     f"({', '.join(f.name for f in info.files)}), or")
    lines.append(f"  download the original from {info.source_url} and save it in Extreme Classification text "
                 f"format as {folder / info.train_names[0]} and {folder / info.test_names[0]}, or")
    lines.append("  pass path= to the folder or file that holds them.")
    return "\n".join(lines)


def _find(folder: Path, names) -> Optional[Path]:
    for candidate in names:
        if (folder / candidate).is_file():
            return folder / candidate
    return None


def _read_split(path: Path, info: Optional[DatasetInfo], split: str, cache, n_features: Optional[int] = None):
    from .io import read_dataset

    # read_dataset also picks up labels.txt / features.txt beside the file as names.
    dataset = read_dataset(path, cache=cache)
    if n_features is not None and dataset.n_features < n_features:
        dataset = dataset.with_features_width(n_features)
    source = dict(dataset.source)
    source["split"] = split
    if info is not None:
        source["dataset"] = info.name
        expected_rows = info.n_train if split == "train" else info.n_test
        published = (expected_rows, info.n_features, info.n_labels)
        recorded = {entry.name: entry.sha256 for entry in info.files}
        if "sha256" in source and recorded.get(path.name, source["sha256"]) != source["sha256"]:
            warnings.warn(
                f"{path}: sha256 {source['sha256']} differs from the registry's verified {info.title} "
                f"{path.name} ({recorded[path.name]}); results may not compare with published ones",
                stacklevel=3,
            )
        if (dataset.n_samples, dataset.n_features, dataset.n_labels) != published:
            warnings.warn(
                f"{path}: shape {dataset.n_samples} x {dataset.n_features} x {dataset.n_labels} differs from "
                f"the published {info.title} {split} split {published[0]} x {published[1]} x {published[2]}",
                stacklevel=3,
            )
    return replace(dataset, source=source)


def load(name: Optional[str] = None, split: str = "train", data_home=None, path=None, cache=False):
    """Load a data set's train split, test split, or both, from the cache folder or a given path.

    Parameters
    ----------
    name:
        Registry key (see :func:`list_datasets`); may be None when ``path`` is given.
    split:
        ``"train"``, ``"test"`` or ``"both"`` (returns ``(train, test)``, test padded to train's width).
    data_home:
        Cache folder; default ``$BAYESMLC_DATA`` or ``~/.cache/bayesmlc``. Files are looked for in
        ``<data_home>/<name>/`` under the names in the registry entry (``train.txt``, ``test.txt``,
        or the XC repository's own names such as ``eurlex_train.txt``).
    path:
        A folder holding the files (used instead of the cache), or one data file (then ``split`` must
        not be ``"both"``).
    cache:
        Passed to :func:`~bayesmlc.data.io.read_dataset`: ``True`` keeps a parsed ``.npz`` copy next to
        each text file so that a large set is parsed once.

    Returns
    -------
    Dataset or (Dataset, Dataset)
        Read by :func:`bayesmlc.data.io.read_dataset` (which takes names from ``labels.txt`` /
        ``features.txt`` beside the data); ``source`` records the path, split and registry name.

    Raises
    ------
    DatasetNotFoundError
        When a file is missing; the message says where it looked and how to get the data.
    """
    if split not in ("train", "test", "both"):
        raise ValidationError(f"split must be 'train', 'test' or 'both', got {split!r}")
    if name is None and path is None:
        raise ValidationError("load() needs a dataset name or a path")
    info = get_info(name) if name is not None else None
    train_names = info.train_names if info else ("train.txt",)
    test_names = info.test_names if info else ("test.txt",)

    if path is not None:
        path = Path(path).expanduser()
        if path.is_file():
            if split == "both":
                raise ValidationError(f"path={str(path)!r} is a single file; split='both' needs a folder")
            return _read_split(path, info, split, cache)
        folder = path
    else:
        folder = dataset_folder(name, data_home)

    wanted = ("train", "test") if split == "both" else (split,)
    found = {}
    for part in wanted:
        names = train_names if part == "train" else test_names
        hit = _find(folder, names)
        if hit is None:
            looked = ", ".join(str(folder / n) for n in names)
            raise DatasetNotFoundError(
                f"no {part} file for {info.title if info else 'this dataset'}: looked for {looked}\n"
                + _how_to_get(info, folder)
            )
        found[part] = hit
    if split != "both":
        return _read_split(found[split], info, split, cache)
    train = _read_split(found["train"], info, "train", cache)
    test = _read_split(found["test"], info, "test", cache, n_features=train.n_features)
    if test.n_features > train.n_features:
        train = train.with_features_width(test.n_features)
    return train, test


# --------------------------------------------------------------------------------------------------
# downloading
# --------------------------------------------------------------------------------------------------
def _matches(path: Path, entry: DataFile) -> bool:
    return path.is_file() and path.stat().st_size == entry.size and file_sha256(path) == entry.sha256


def _fetch(url: str, entry: DataFile, folder: Path, progress: bool, timeout: float) -> Path:
    """Stream ``url`` into a temporary file in ``folder``; verify size and sha256; move it into place."""
    from tqdm.auto import tqdm

    target = folder / entry.name
    remove_stale_temporaries(folder)  # what a killed download left behind
    handle, temp_name = tempfile.mkstemp(dir=folder, prefix=temporary_prefix(entry.name), suffix=".part")
    temp = Path(temp_name)
    digest = hashlib.sha256()
    received = 0
    try:
        with os.fdopen(handle, "wb") as out:
            try:
                response = urllib.request.urlopen(url, timeout=timeout)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                raise DownloadError(f"cannot download {entry.name} from {url}: {exc}") from None
            with response, tqdm(total=entry.size, unit="B", unit_scale=True, desc=entry.name,
                                disable=not progress, leave=False) as bar:
                while True:
                    try:
                        block = response.read(1 << 16)
                    except OSError as exc:  # connection reset, read timeout
                        raise DownloadError(f"transfer of {entry.name} from {url} failed: {exc}") from None
                    if not block:
                        break
                    out.write(block)
                    digest.update(block)
                    received += len(block)
                    bar.update(len(block))
                    if received > entry.size:  # wrong file: stop instead of filling the disk
                        break
        if received != entry.size:
            raise DownloadError(
                f"{entry.name} from {url}: size {received}{'+' if received > entry.size else ''} bytes, "
                f"expected {entry.size}; sha256 of what arrived {digest.hexdigest()}, expected {entry.sha256}"
            )
        if digest.hexdigest() != entry.sha256:
            raise DownloadError(
                f"{entry.name} from {url}: sha256 mismatch: got {digest.hexdigest()}, expected {entry.sha256}"
            )
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return target


def download(name: str, data_home=None, base_url: Optional[str] = None, force: bool = False,
             progress: bool = True, timeout: float = 60.0) -> Path:
    """Download a data set's files into ``<data_home>/<name>/``, verifying size and sha256 of each.

    Parameters
    ----------
    name:
        Registry key of a data set with recorded files (``get_info(name).files`` not empty).
    data_home:
        Cache folder (see :func:`data_home`).
    base_url:
        Mirror to fetch from: each file is requested as ``base_url + "/" + file name``. Without it each
        file's registry URL is used, and a file without one is an error that says so.
    force:
        Download again even when a verified copy is already present.
    progress:
        Show a tqdm progress bar per file on stderr.
    timeout:
        Seconds to wait on the connection.

    Each file is written to a temporary file beside its target and moved into place only after its
    size and sha256 match; on a mismatch the temporary file is deleted and :class:`DownloadError` names
    the file and both hashes. Files already present and verified are kept (unless ``force``); a present
    file that does not verify is replaced. A missing optional name file (labels.txt, features.txt) on
    the server is skipped with a warning. Only the standard library (urllib) talks to the network.

    Returns
    -------
    Path
        The data set's folder, ready for :func:`load`.
    """
    info = get_info(name)
    folder = dataset_folder(info.name, data_home)
    if not info.files:
        raise DownloadError(
            f"no checksummed files are recorded for {info.title}, so it cannot be downloaded and verified "
            f"automatically.\n" + _how_to_get(info, folder)
        )
    plan = []
    for entry in info.files:
        url = base_url.rstrip("/") + "/" + entry.name if base_url else entry.url
        if url is None and entry.required:
            raise DownloadError(
                f"{info.title}: no public URL is known for {entry.name} (its sha256 is {entry.sha256}); pass "
                f"base_url= pointing to a mirror that serves it, or see {info.source_url}"
            )
        plan.append((entry, url))
    folder.mkdir(parents=True, exist_ok=True)
    for entry, url in plan:
        target = folder / entry.name
        if not force and target.exists():
            if _matches(target, entry):
                continue
            warnings.warn(f"{target} does not match the registry's size/sha256; downloading it again", stacklevel=2)
        if url is None:
            warnings.warn(f"{info.title}: no URL for optional file {entry.name}; skipped", stacklevel=2)
            continue
        try:
            _fetch(url, entry, folder, progress, timeout)
        except DownloadError as exc:
            if entry.required or "HTTP Error 404" not in str(exc):
                raise
            warnings.warn(f"optional file {entry.name} not found at {url}; skipped", stacklevel=2)
    return folder

