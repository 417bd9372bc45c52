"""Reading and writing datasets: one entry point for every supported file format.

>>> from bayesmlc.data.io import read_dataset                             # doctest: +SKIP
>>> train = read_dataset("bibtex/train.txt")                             # doctest: +SKIP
>>> train.n_samples, train.n_features, train.n_labels                     # doctest: +SKIP
(4880, 1836, 159)

Formats (by extension, or ``format=``):

========== ======================================== =========================================
format     extensions                               notes
========== ======================================== =========================================
``xc``     ``.txt``, ``.xc``                        Extreme Classification text, ``N D L`` header
``arff``   ``.arff``                                Mulan/MEKA, dense or sparse, Mulan ``.xml``
``svmlight`` ``.svm``, ``.svmlight``, ``.libsvm``   multi-label, 1-based features by default
``mat``    ``.mat``                                 MATLAB, ``variables={"X": ..., "Y": ...}``
``npz``    ``.npz``                                 bayesmlc's binary dataset file / cache
========== ======================================== =========================================

See ``docs/data-formats.md`` for each format with an example.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Optional, Tuple, Union

import scipy.sparse as sp

from ..exceptions import DataFormatError, ValidationError
from . import read_warnings
from .dataset import Dataset
from .formats.sparse_text import DEFAULT_CHUNK_BYTES

__all__ = ["read_dataset", "write_dataset", "read_train_test", "conform_widths", "infer_format", "FORMATS",
           "read_names"]

FORMATS = ("xc", "arff", "svmlight", "mat", "npz")
_EXTENSIONS = {
    ".txt": "xc", ".xc": "xc", ".arff": "arff", ".svm": "svmlight", ".svmlight": "svmlight",
    ".libsvm": "svmlight", ".mat": "mat", ".npz": "npz",
}
#: options each format accepts (besides ``cache``/``sha256``/``chunk_bytes``)
_FORMAT_OPTIONS = {
    "xc": {"label_names_file", "feature_names_file"},
    "arff": {"n_labels", "label_names_file"},
    "svmlight": {"n_labels", "n_features", "zero_based", "label_names_file", "feature_names_file"},
    "mat": {"variables", "label_names_file", "feature_names_file"},
    "npz": set(),
}
_TEXT_FORMATS = ("xc", "arff", "svmlight")
#: files up to this size get a sha256 in ``Dataset.source`` unless ``sha256=False``
SHA256_DEFAULT_MAX_BYTES = 64 * 1024 * 1024
PathLike = Union[str, os.PathLike]


def infer_format(path: PathLike) -> str:
    """The format name for a file extension (``.txt`` -> ``"xc"``, ...); DataFormatError if unknown."""
    suffix = Path(path).suffix.lower()
    if suffix not in _EXTENSIONS:
        known = ", ".join(sorted(_EXTENSIONS))
        raise DataFormatError(f"cannot tell the format from the extension {suffix or '(none)'!r} (known: {known}); "
                              f"pass format= one of {FORMATS}", path=path)
    return _EXTENSIONS[suffix]


def _check_format(format: Optional[str], path) -> str:
    if format is None:
        return infer_format(path)
    if format not in FORMATS:
        raise ValidationError(f"format={format!r} is not one of {FORMATS}")
    return format


def read_names(path: PathLike, expected: int, what: str) -> list:
    """Names, one per line, from ``path``; exactly ``expected`` of them or a DataFormatError."""
    try:
        names = Path(path).read_text(encoding="utf-8-sig", errors="replace").splitlines()
    except OSError as exc:
        raise DataFormatError(f"cannot read the {what} names file: {exc.strerror or exc}", path=path) from None
    if len(names) != expected:
        raise DataFormatError(f"has {len(names)} {what} names (lines) but the data has {expected} {what}s", path=path)
    return names


def _companions(path: Path, fmt: str, options: dict) -> dict:
    """Name files to read: explicit ones, or ``labels.txt``/``features.txt`` beside an XC file."""
    found = {}
    for key, default in (("label_names_file", "labels.txt"), ("feature_names_file", "features.txt")):
        if options.get(key) is not None:
            if fmt != "arff" or key != "label_names_file":
                found[key] = (Path(options[key]), True)
        elif fmt == "xc" and (path.parent / default).is_file() and path.name != default:
            found[key] = (path.parent / default, False)
    return found


def _attach_names(dataset: Dataset, companions: dict) -> Dataset:
    for key, (names_path, explicit) in companions.items():
        what, size = ("label", dataset.n_labels) if key == "label_names_file" else ("feature", dataset.n_features)
        try:
            names = read_names(names_path, size, what)
        except DataFormatError as exc:
            if explicit:
                raise
            read_warnings.warn(f"ignoring {names_path}: {exc.reason}", stacklevel=4)
            continue
        setattr(dataset, what + "_names", names)  # length checked by read_names
    return dataset


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _parse(path: Path, fmt: str, options: dict, chunk_bytes: int) -> Dataset:
    if fmt == "xc":
        from .formats.xc import read_xc

        X, Y = read_xc(path, chunk_bytes=chunk_bytes)
        dataset = Dataset(X=X, Y=Y)
    elif fmt == "svmlight":
        from .formats.svmlight import read_svmlight

        X, Y = read_svmlight(path, zero_based=bool(options.get("zero_based", False)),
                             n_features=options.get("n_features"), n_labels=options.get("n_labels"),
                             chunk_bytes=chunk_bytes)
        dataset = Dataset(X=X, Y=Y)
    elif fmt == "arff":
        from .formats.arff import read_arff

        dataset = read_arff(path, n_labels=options.get("n_labels"), label_names_file=options.get("label_names_file"))
    elif fmt == "mat":
        from .formats.matlab import read_mat

        dataset = read_mat(path, options.get("variables"))
    else:
        from .formats.cache import load_npz

        dataset, _ = load_npz(path)
        return dataset
    return _attach_names(dataset, _companions(path, fmt, options))


def read_dataset(path: PathLike, format: Optional[str] = None, *, n_labels: Optional[int] = None,
                 label_names_file: Optional[PathLike] = None, variables: Optional[Mapping[str, str]] = None,
                 n_features: Optional[int] = None, cache: Union[bool, PathLike] = False,
                 zero_based: Optional[bool] = None, feature_names_file: Optional[PathLike] = None,
                 sha256: Optional[bool] = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Dataset:
    """Read a multi-label dataset file into a :class:`Dataset`.

    Parameters
    ----------
    path:
        The file. Its extension picks the format unless ``format`` is given.
    format:
        ``"xc"``, ``"arff"``, ``"svmlight"``, ``"mat"`` or ``"npz"``.
    n_labels:
        ARFF: the last ``n_labels`` attributes are the labels (when there is no Mulan ``.xml``).
        svmlight: the label width (default: largest label + 1).
    label_names_file:
        ARFF: the Mulan ``.xml`` naming the labels (default: found next to the file).
        XC/svmlight/mat: a text file with one label name per line (XC default: ``labels.txt`` next
        to the file, used when its line count matches L).
    feature_names_file:
        XC/svmlight/mat: one feature name per line (XC default: ``features.txt`` next to the file).
    variables:
        mat: ``{"X": name, "Y": name[, "label_mask": name]}``; default ``{"X": "X", "Y": "Y"}``.
    n_features:
        svmlight: the feature width (default: largest index + 1).
    zero_based:
        svmlight: feature indices start at 0 (default ``False``: at 1, as libsvm files do).
    cache:
        Text formats: ``True`` keeps a parsed copy ``<file>.bayesmlc.npz`` next to the file (or in
        ``$BAYESMLC_CACHE_DIR``/``~/.cache/bayesmlc`` when writing there fails); a folder path
        keeps it there. Reused while the file's size and modification time are unchanged.
    sha256:
        Record the file's sha256 in ``Dataset.source``; default: for files up to 64 MiB.
    chunk_bytes:
        XC/svmlight: bytes parsed per chunk (memory is the output plus about 10 times this).

    Returns
    -------
    Dataset
        ``source`` holds ``path`` (absolute), ``format``, ``size_bytes`` and, when computed,
        ``sha256`` (and ``cache``/``from_cache`` with a cache).

    Raises
    ------
    DataFormatError
        The file cannot be parsed; the message names the file, the 1-based line and the problem.
    ValidationError
        An option does not apply to the format.
    """
    path = Path(path)
    fmt = _check_format(format, path)
    given = {"n_labels": n_labels, "label_names_file": label_names_file, "variables": variables,
             "n_features": n_features, "zero_based": zero_based, "feature_names_file": feature_names_file}
    given = {key: value for key, value in given.items() if value is not None}
    unexpected = sorted(set(given) - _FORMAT_OPTIONS[fmt])
    if unexpected:
        allowed = sorted(_FORMAT_OPTIONS[fmt]) or "none"
        raise ValidationError(f"option(s) {unexpected} do not apply to format {fmt!r} (it takes: {allowed})")
    if cache and fmt not in _TEXT_FORMATS:
        raise ValidationError(f"cache= applies to the text formats {_TEXT_FORMATS}, not {fmt!r}")
    if not path.is_file():
        raise DataFormatError("no such file" if not path.exists() else "not a regular file", path=path)
    size = path.stat().st_size

    def parse() -> Dataset:
        dataset = _parse(path, fmt, given, chunk_bytes)
        source = {"path": str(path.resolve()), "format": fmt, "size_bytes": size}
        if sha256 or (sha256 is None and size <= SHA256_DEFAULT_MAX_BYTES):
            source["sha256"] = _sha256(path)
        if fmt == "svmlight":
            source["n_features_inferred"] = n_features is None
            source["n_labels_inferred"] = n_labels is None
        if fmt == "npz":
            source = {**dataset.source, "loaded_from": str(path.resolve())}
        dataset.source = source
        return dataset

    if cache:
        from .formats.cache import cached_read

        dependencies = [path] + [p for p, _ in _companions(path, fmt, given).values()]
        if fmt == "arff":
            from .formats.arff import find_mulan_xml

            xml = Path(label_names_file) if label_names_file is not None else (
                None if n_labels is not None else find_mulan_xml(path))
            dependencies += [xml] if xml is not None and xml.exists() else []
        options = {"format": fmt, **given, "sha256": sha256}
        return cached_read(path, dependencies, options, parse, cache)
    return parse()


def write_dataset(dataset: Dataset, path: PathLike, format: Optional[str] = None, *,
                  value_format: Optional[str] = None, zero_based: bool = False,
                  variables: Optional[Mapping[str, str]] = None, write_names: bool = False) -> Path:
    """Write ``dataset`` to ``path`` in the format of its extension (or ``format``).

    ``xc``: header and rows; with the default ``value_format=None`` each value is the shortest
    decimal reading back to the same float32, so :func:`read_dataset` returns identical matrices
    (``value_format="%.6f"`` and the like are applied as given). ``write_names=True`` also writes
    ``labels.txt``/``features.txt`` beside the file. ``svmlight``: 1-based features unless
    ``zero_based``. ``arff``: sparse Mulan ARFF plus ``<stem>.xml``. ``mat``: sparse ``X``/``Y``
    (names from ``variables``). ``npz``: everything, including names and provenance.

    A label mask can only be stored by ``arff``, ``mat`` and ``npz``; writing a dataset with a mask
    to ``xc`` or ``svmlight`` raises :class:`DataFormatError` rather than losing it.
    """
    path = Path(path)
    fmt = _check_format(format, path)
    if dataset.label_mask is not None and fmt in ("xc", "svmlight"):
        raise DataFormatError(f"the {fmt} format cannot store a label mask (unobserved labels); "
                              "write arff, mat or npz instead", path=path)
    if fmt == "xc":
        from .formats.xc import write_xc

        write_xc(path, dataset.X, dataset.Y, value_format=value_format)
        if write_names:
            for names, filename in ((dataset.label_names, "labels.txt"), (dataset.feature_names, "features.txt")):
                if names is not None:
                    (path.parent / filename).write_text("".join(f"{n}\n" for n in names), encoding="utf-8")
    elif fmt == "svmlight":
        from .formats.svmlight import write_svmlight

        write_svmlight(path, dataset.X, dataset.Y, zero_based=zero_based, value_format=value_format)
    elif fmt == "arff":
        from .formats.arff import write_arff

        write_arff(path, dataset)
    elif fmt == "mat":
        from .formats.matlab import write_mat

        write_mat(path, dataset, variables)
    else:
        from .formats.cache import save_npz

        save_npz(dataset, path)
    return path


def _pad_labels(dataset: Dataset, n_labels: int) -> Dataset:
    Y = sp.csr_matrix((dataset.Y.data, dataset.Y.indices, dataset.Y.indptr), shape=(dataset.n_samples, n_labels))
    names = None if dataset.label_names is None else list(dataset.label_names) + [
        f"label{j}" for j in range(dataset.n_labels, n_labels)]
    return replace(dataset, Y=Y, label_names=names)


def conform_widths(dataset: Dataset, n_features: Optional[int], n_labels: Optional[int], path: PathLike,
                   reference: str) -> Dataset:
    """``dataset`` (read from ``path``) with ``n_features`` features and ``n_labels`` labels (``None``:
    leave that width alone), by the rule :func:`read_train_test` applies to a test file: a narrower
    width the reader inferred (svmlight without ``n_features``/``n_labels``) is padded with empty
    columns; any other difference is a :class:`DataFormatError` naming both widths. ``reference``
    says where the expected widths come from (``"the model was trained with"``).
    """
    for what, attr, flag, width in (("features", "n_features", "n_features_inferred", n_features),
                                    ("labels", "n_labels", "n_labels_inferred", n_labels)):
        have = getattr(dataset, attr)
        if width is None or have == width:
            continue
        inferred = bool(dataset.source.get(flag))
        if inferred and have < width:
            dataset = dataset.with_features_width(width) if attr == "n_features" else _pad_labels(dataset, width)
            dataset.source = {**dataset.source, f"{attr}_padded_from": have}
            continue
        symbol = "D" if attr == "n_features" else "L"
        raise DataFormatError(f"width mismatch: the file has {symbol}={have} {what} but {reference} {symbol}={width}"
                              + (" (it uses indices beyond that width)" if inferred else ""), path=path)
    return dataset


def read_train_test(train_path: PathLike, test_path: PathLike, format: Optional[str] = None, **options
                    ) -> Tuple[Dataset, Dataset]:
    """Read a training and a test file and make their widths agree.

    Declared widths (an XC header, ARFF attributes, .mat/.npz shapes, svmlight ``n_features``) must
    match: a different D or L is a :class:`DataFormatError` naming both files. A width the reader
    inferred (svmlight without ``n_features``/``n_labels``) is padded up to the training width when
    the test file is narrower; a test file wider than the training file is an error.
    Keyword options are passed to :func:`read_dataset` for both files.
    """
    train = read_dataset(train_path, format, **options)
    test = read_dataset(test_path, format, **options)
    for what, attr, flag in (("features", "n_features", "n_features_inferred"),
                             ("labels", "n_labels", "n_labels_inferred")):
        n_train, n_test = getattr(train, attr), getattr(test, attr)
        if n_train == n_test:
            continue
        inferred = bool(test.source.get(flag)) and bool(train.source.get(flag))
        if inferred and n_test < n_train:
            test = test.with_features_width(n_train) if attr == "n_features" else _pad_labels(test, n_train)
            test.source = {**test.source, f"{attr}_padded_from": n_test}
            continue
        symbol = "D" if attr == "n_features" else "L"
        raise DataFormatError(
            f"train/test width mismatch: {train_path} has {symbol}={n_train} {what} but {test_path} has "
            f"{symbol}={n_test}" + (" (the test file uses indices beyond the training width)" if inferred else ""),
            path=test_path,
        )
    return train, test
