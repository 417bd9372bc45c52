"""Binary ``.npz`` dataset files and the parse-once cache of text files.

A dataset ``.npz`` holds the CSR parts of X, Y and the optional label mask, the names (fixed-width
unicode arrays) and a JSON record (provenance, format version, and for a cache the size and mtime
of the files it was parsed from). It is written with :func:`numpy.savez` and read with
``allow_pickle=False``, so loading one never runs code.

The cache: ``read_dataset(path, cache=True)`` parses a text file once and stores
``<file>.bayesmlc.npz`` next to it (or, when writing there fails, in ``$BAYESMLC_CACHE_DIR`` or
``~/.cache/bayesmlc``); ``cache=DIR`` stores it in ``DIR``. It is reused while the recorded size
and modification time of the source (and of the companion name files) still match and it was made
with the same reader options; otherwise the text is parsed again and the cache rewritten.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp

from ...exceptions import DataFormatError
from ...safe_io import (LazyNpz, check_file_width, check_width, checked_csr, error_factory, make_temporary_file,
                        remove_stale_temporaries)
from .. import read_warnings
from ..dataset import Dataset

__all__ = ["save_npz", "load_npz", "cached_read", "cache_files_for", "NPZ_FORMAT_VERSION"]

NPZ_FORMAT_VERSION = 1
_SUFFIX = ".bayesmlc.npz"


def _csr_parts(prefix: str, matrix: sp.csr_matrix, with_data: bool) -> dict:
    parts = {f"{prefix}_indices": matrix.indices, f"{prefix}_indptr": matrix.indptr,
             f"{prefix}_shape": np.asarray(matrix.shape, dtype=np.int64)}
    if with_data:
        parts[f"{prefix}_data"] = matrix.data
    return parts


def save_npz(dataset: Dataset, path, *, record: Optional[dict] = None) -> Path:
    """Write ``dataset`` to ``path`` (an ``.npz``), atomically (a temporary file, then a rename), with
    the permissions the umask gives a new file. Temporaries a killed writer left in the folder are
    removed first."""
    path = Path(path)
    arrays = {"format_version": np.asarray(NPZ_FORMAT_VERSION, dtype=np.int64)}
    arrays.update(_csr_parts("X", dataset.X, True))
    arrays.update(_csr_parts("Y", dataset.Y, False))
    if dataset.label_mask is not None:
        arrays.update(_csr_parts("mask", dataset.label_mask, False))
    for key, names in (("feature_names", dataset.feature_names), ("label_names", dataset.label_names)):
        if names is not None:
            arrays[key] = np.asarray([str(n) for n in names], dtype=str) if len(names) else np.zeros(0, dtype="<U1")
    meta = {"source": dataset.source, **(record or {})}
    arrays["meta"] = np.asarray(json.dumps(meta, default=str))
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent)
    handle, tmp = make_temporary_file(path.parent, path.name, suffix=".npz")
    try:
        with os.fdopen(handle, "wb") as stream:
            np.savez(stream, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _fail(path):
    return error_factory(DataFormatError, path=path)


def csr_from_members(contents, prefix: str, path, width_bytes: int | None = None) -> sp.csr_matrix:
    """The CSR matrix stored as ``{prefix}_indices``, ``_indptr``, ``_shape`` and (optional: binary
    when absent) ``_data`` in the mapping ``contents``, after checking every part (see
    :func:`bayesmlc.safe_io.checked_csr`), that its width fits in memory and that a file of
    ``width_bytes`` bytes can declare it (:func:`~bayesmlc.safe_io.check_file_width`; default: the
    size of ``contents`` when it is a :class:`~bayesmlc.safe_io.LazyNpz`); a
    :class:`DataFormatError` naming ``path`` when they do not form one."""
    fail = _fail(path)
    what = f"{prefix} matrix"
    for part in ("indices", "indptr", "shape"):
        if f"{prefix}_{part}" not in contents:
            raise fail(f"{what}: member {prefix}_{part} is missing")
    shape = np.asarray(contents[f"{prefix}_shape"])
    if shape.dtype.kind not in "iu" or shape.shape != (2,):
        raise fail(f"{what}: {prefix}_shape must be two integers, got {shape.dtype} of shape {shape.shape}")
    file_bytes = getattr(contents, "size", None) if width_bytes is None else width_bytes
    if file_bytes is None:
        check_width(int(shape[1]), "D" if prefix == "X" else "L", fail)
    else:
        check_file_width(int(shape[1]), "D" if prefix == "X" else "L", file_bytes, fail)
    data = contents[f"{prefix}_data"] if f"{prefix}_data" in contents else None
    return checked_csr(data, contents[f"{prefix}_indices"], contents[f"{prefix}_indptr"],
                       (int(shape[0]), int(shape[1])), fail, what=what, dtype=np.float32)


def check_dataset_npz(members, read, path) -> None:
    """Refuse an ``.npz`` that is not a bayesmlc dataset file this version can read: ``members`` are
    its member names, ``read(name)`` returns a member."""
    required = {"format_version", "meta", "X_data", "X_indices", "X_indptr", "X_shape", "Y_indices", "Y_indptr",
                "Y_shape"}
    missing = sorted(required - set(members))
    if missing:
        raise DataFormatError(f"not a bayesmlc dataset .npz: missing {missing}", path=path)
    version = np.asarray(read("format_version"))
    if version.dtype.kind not in "iu" or version.size != 1:
        raise DataFormatError(f"format_version must be one integer, got {version.dtype} of shape {version.shape}",
                              path=path)
    if int(version.ravel()[0]) > NPZ_FORMAT_VERSION:
        raise DataFormatError(f"written by a newer bayesmlc (dataset format {int(version.ravel()[0])}; this version "
                              f"reads up to {NPZ_FORMAT_VERSION})", path=path)


def _meta_record(value: np.ndarray, path) -> dict:
    if value.dtype.kind != "U" or value.ndim != 0:
        raise DataFormatError(f"the meta record must be one string, got {value.dtype} of shape {value.shape}", path=path)
    try:
        meta = json.loads(str(value))
    except (ValueError, RecursionError) as exc:
        raise DataFormatError(f"corrupt metadata record: {str(exc)[:200]}", path=path) from None
    if not isinstance(meta, dict) or not isinstance(meta.get("source", {}), dict):
        raise DataFormatError("corrupt metadata record: not a JSON object with a 'source' object", path=path)
    return meta


def _names(value: np.ndarray, size: int, what: str, path) -> list:
    if value.dtype.kind != "U" or value.ndim != 1 or value.size != size:
        raise DataFormatError(f"{what} must be {size} strings, got {value.dtype} of shape {value.shape}", path=path)
    return value.tolist()


def load_npz(path, width_bytes: int | None = None) -> Tuple[Dataset, dict]:
    """Read a dataset ``.npz`` written by :func:`save_npz`; returns ``(dataset, meta record)``.

    Only the members a dataset file has are read, each after its declared size has been bounded;
    every stored matrix is checked whole before use, its widths against what a file of
    ``width_bytes`` bytes may declare (default: this file's size; a cache or a converted file
    passes its source's), and X must be finite. Anything else is a :class:`DataFormatError` naming
    the file.
    """
    path = Path(path)
    with LazyNpz(path, _fail(path), kind="dataset .npz") as archive:
        check_dataset_npz(archive.files, archive.__getitem__, path)
        meta = _meta_record(archive["meta"], path)
        X = csr_from_members(archive, "X", path, width_bytes)
        Y = csr_from_members(archive, "Y", path, width_bytes)
        mask = csr_from_members(archive, "mask", path, width_bytes) if "mask_indices" in archive else None
        names = {}
        for key, size in (("feature_names", X.shape[1]), ("label_names", Y.shape[1])):
            names[key] = _names(archive[key], size, key, path) if key in archive else None
    if X.nnz and not np.all(np.isfinite(X.data)):
        raise DataFormatError("X holds NaN or infinite values (or values beyond the float32 range)", path=path)
    try:
        dataset = Dataset(X=X, Y=Y, label_mask=mask, source=dict(meta.get("source", {})), **names)
    except ValueError as exc:
        raise DataFormatError(f"inconsistent dataset file: {exc}", path=path) from None
    return dataset, meta


# ----------------------------------------------------------------------------------------------
# cache of parsed text files
# ----------------------------------------------------------------------------------------------
def _fallback_dir() -> Path:
    env = os.environ.get("BAYESMLC_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "bayesmlc"


def cache_files_for(source, cache) -> List[Path]:
    """Where the cache of ``source`` may live, in order of preference, for ``cache=True`` or ``cache=DIR``."""
    source = Path(source).resolve()
    keyed_name = f"{source.name}-{hashlib.sha1(str(source).encode()).hexdigest()[:12]}{_SUFFIX}"
    if cache is True:
        return [source.with_name(source.name + _SUFFIX), _fallback_dir() / keyed_name]
    return [Path(cache) / keyed_name]


def _stamp(paths: Sequence[Path]) -> List[list]:
    return [[str(Path(p).resolve()), os.stat(p).st_size, os.stat(p).st_mtime_ns] for p in paths]


def cached_read(source, dependencies: Sequence[Path], options: dict, parse: Callable[[], Dataset], cache
                ) -> Dataset:
    """``parse()`` with a cache: reuse the cache of ``source`` if its record still matches.

    ``dependencies`` are the files the parse reads (the source first, then companion name files);
    ``options`` are the reader options (JSON-serialisable) that change the result. With
    ``cache=True`` the cache goes next to the source, or to the fallback folder when that write fails.
    """
    candidates = cache_files_for(source, cache)
    stamp = _stamp(dependencies)
    options = json.loads(json.dumps(options, default=str))
    for target in candidates:
        if not target.exists():
            continue
        try:  # the widths were bounded by the source when it was parsed
            dataset, meta = load_npz(target, width_bytes=max(os.stat(target).st_size, stamp[0][1]))
        except DataFormatError as exc:
            read_warnings.warn(f"ignoring unreadable cache {target}: {exc}", stacklevel=3)
            continue
        record = meta.get("cache", {})
        if record.get("files") == stamp and record.get("options") == options:
            dataset.source = {**dataset.source, "cache": str(target), "from_cache": True}
            return dataset
    dataset = parse()
    failures = []
    for target in candidates:
        try:
            save_npz(dataset, target, record={"cache": {"files": stamp, "options": options}})
        except OSError as exc:
            failures.append(f"{target}: {exc}")
            continue
        dataset.source = {**dataset.source, "cache": str(target), "from_cache": False}
        return dataset
    read_warnings.warn("could not write the cache: " + "; ".join(failures), stacklevel=3)
    return dataset
