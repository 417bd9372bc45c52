"""MATLAB ``.mat`` files (version 4 to 7.2, through :func:`scipy.io.loadmat`).

The caller names the variables: ``variables={"X": "X_tr", "Y": "Y_tr"}`` (optionally
``"label_mask"``). Matrices may be dense or sparse, ``Y`` (and the mask) must hold 0/1 and have as
many rows as ``X``.

scipy's MATLAB reader trusts the sizes and offsets inside the file: a damaged or crafted file can
crash the process (a segmentation fault in its compiled code) or make it allocate what the file
declares. Where ``fork`` exists the file is therefore read in a child process whose address space
is capped at what the file can expand to more than the parent's (never above the hard limit the
process has, nor :func:`bayesmlc.safe_io.memory_limit_bytes`); the child hands
the checked result back as a dataset ``.npz`` (read with every check of
:func:`~bayesmlc.data.formats.cache.load_npz`), and a crash or an exhausted limit becomes a
:class:`DataFormatError`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

import numpy as np
import scipy.io
import scipy.sparse as sp

from ...exceptions import DataFormatError
from ...safe_io import DEFLATE_MAX_RATIO, format_bytes, memory_limit_bytes
from ..dataset import Dataset

__all__ = ["read_mat", "write_mat", "DEFAULT_VARIABLES"]

DEFAULT_VARIABLES = {"X": "X", "Y": "Y"}
_ROLES = ("X", "Y", "label_mask")


def _load(path: Path) -> dict:
    try:
        return scipy.io.loadmat(path)
    except NotImplementedError as exc:  # MATLAB v7.3 files are HDF5
        raise DataFormatError(f"cannot read this .mat file ({exc}); save it with -v7 or read it with h5py",
                              path=path) from None
    except OSError as exc:
        raise DataFormatError(f"cannot read the file: {exc.strerror or exc}", path=path) from None
    except Exception as exc:  # scipy raises ValueError, TypeError, MatReadError... for corrupt files
        raise DataFormatError(f"not a readable MATLAB .mat file: {exc}", path=path) from None


def _matrix(contents: dict, name: str, role: str, path: Path) -> sp.csr_matrix:
    value = contents[name]
    if sp.issparse(value):
        matrix = sp.csr_matrix(value)
    else:
        array = np.asarray(value)
        if array.ndim != 2 or array.dtype.kind not in "biuf":
            raise DataFormatError(
                f"variable {name!r} ({role}) must be a 2-D numeric matrix, got {array.dtype} of shape {array.shape}",
                path=path,
            )
        matrix = sp.csr_matrix(array)
    if matrix.dtype.kind not in "biuf":
        raise DataFormatError(f"variable {name!r} ({role}) must be numeric, got {matrix.dtype}", path=path)
    if matrix.nnz and not np.all(np.isfinite(matrix.data)):
        raise DataFormatError(f"variable {name!r} ({role}) holds NaN or infinite values", path=path)
    if matrix.nnz and np.abs(matrix.data).max() > np.finfo(np.float32).max:
        raise DataFormatError(f"variable {name!r} ({role}) holds values beyond the float32 range", path=path)
    if role != "X":
        bad = matrix.data[(matrix.data != 0) & (matrix.data != 1)]
        if bad.size:
            raise DataFormatError(
                f"variable {name!r} ({role}) must hold 0/1, found values {np.unique(bad)[:5].tolist()}"
                + (" (a -1/+1 coding? map -1 to 0 first)" if np.all(np.isin(bad, (-1,))) else ""),
                path=path,
            )
        matrix.eliminate_zeros()
    return matrix


def _address_space_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


#: the child reading a ``.mat`` file may always map this much beyond what it inherits
MIN_READ_BYTES = 256 * 2**20


def _child_address_limit(path: Path) -> tuple:
    """``(soft, hard)`` address-space limits for the child reading ``path``: what it inherits plus
    what the file can expand to (deflate's :data:`~bayesmlc.safe_io.DEFLATE_MAX_RATIO` times its
    size, twice over for scipy's copies; at least :data:`MIN_READ_BYTES`), at most
    :func:`~bayesmlc.safe_io.memory_limit_bytes`, and never above the hard limit the process
    already has (a process cannot raise it: under ``ulimit -v`` the child keeps that limit)."""
    import resource

    expansion = max(MIN_READ_BYTES, 2 * DEFLATE_MAX_RATIO * path.stat().st_size)
    cap = _address_space_bytes() + min(memory_limit_bytes(), expansion)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    return cap, hard


def _read_in_child(path: Path, variables: dict, result: Path, error: Path) -> None:  # pragma: no cover - child
    import faulthandler
    import resource

    from .cache import save_npz

    faulthandler.disable()  # a crash is expected on damaged files: the parent reports it in one line
    code = 0
    try:
        if _address_space_bytes():
            resource.setrlimit(resource.RLIMIT_AS, _child_address_limit(path))
        save_npz(_read_mat_in_process(path, variables), result)
    except DataFormatError as exc:
        error.write_text(exc.reason, encoding="utf-8")
        code = 3
    except MemoryError:
        error.write_text(f"reading it needs more memory than a file of {format_bytes(path.stat().st_size)} can "
                         f"expand to, or than the {format_bytes(memory_limit_bytes())} available", encoding="utf-8")
        code = 3
    except BaseException as exc:
        error.write_text(f"not a readable MATLAB .mat file: {type(exc).__name__}: {exc}", encoding="utf-8")
        code = 3
    os._exit(code)


def _read_mat_isolated(path: Path, variables: dict) -> Dataset:
    import multiprocessing
    import shutil
    import tempfile

    from .cache import load_npz

    folder = Path(tempfile.mkdtemp(prefix="bayesmlc-mat-"))
    try:
        result, error = folder / "result.npz", folder / "error.txt"
        child = multiprocessing.get_context("fork").Process(target=_read_in_child, args=(path, variables, result, error))
        child.start()
        child.join()
        if error.exists():
            raise DataFormatError(error.read_text(encoding="utf-8", errors="replace"), path=path)
        if child.exitcode != 0 or not result.exists():
            how = f"signal {-child.exitcode}" if child.exitcode and child.exitcode < 0 else f"exit {child.exitcode}"
            raise DataFormatError(f"not a readable MATLAB .mat file: scipy's reader crashed on it ({how}); the file is "
                                  "damaged", path=path)
        dataset, _ = load_npz(result, width_bytes=path.stat().st_size)  # widths the .mat file can back
        dataset.source = {}
        return dataset
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def read_mat(path, variables: Optional[Mapping[str, str]] = None) -> Dataset:
    """Read a :class:`Dataset` from a ``.mat`` file.

    Parameters
    ----------
    variables:
        Maps the roles ``"X"``, ``"Y"`` and optionally ``"label_mask"`` to variable names in the
        file; default ``{"X": "X", "Y": "Y"}``.
    """
    path = Path(path)
    variables = dict(DEFAULT_VARIABLES if variables is None else variables)
    unknown = set(variables) - set(_ROLES)
    if unknown or not {"X", "Y"} <= set(variables):
        raise DataFormatError(f"variables must map 'X', 'Y' (and optionally 'label_mask') to variable names, got "
                              f"{variables}", path=path)
    if "fork" in __import__("multiprocessing").get_all_start_methods():
        return _read_mat_isolated(path, variables)
    return _read_mat_in_process(path, variables)


def _read_mat_in_process(path: Path, variables: dict) -> Dataset:
    contents = _load(path)
    present = sorted(k for k in contents if not k.startswith("__"))
    for role, name in variables.items():
        if name not in contents:
            raise DataFormatError(f"no variable {name!r} (for {role}) in the file; it holds {present}", path=path)
    X = _matrix(contents, variables["X"], "X", path)
    Y = _matrix(contents, variables["Y"], "Y", path)
    mask = _matrix(contents, variables["label_mask"], "label_mask", path) if "label_mask" in variables else None
    for role, matrix in (("Y", Y), ("label_mask", mask)):
        if matrix is not None and matrix.shape[0] != X.shape[0]:
            hint = " (stored transposed? it has as many columns as X has rows)" if matrix.shape[1] == X.shape[0] else ""
            raise DataFormatError(
                f"variable {variables[role]!r} ({role}) has shape {matrix.shape} but {variables['X']!r} (X) has "
                f"{X.shape[0]} rows{hint}", path=path,
            )
    if mask is not None and mask.shape != Y.shape:
        raise DataFormatError(f"label_mask {variables['label_mask']!r} has shape {mask.shape}, Y has {Y.shape}", path=path)
    return Dataset(X=X.astype(np.float32), Y=Y.astype(np.float32), label_mask=mask)


def write_mat(path, dataset: Dataset, variables: Optional[Mapping[str, str]] = None) -> None:
    """Write ``dataset`` to a ``.mat`` file as sparse matrices (names as in :func:`read_mat`)."""
    variables = dict(DEFAULT_VARIABLES if variables is None else variables)
    contents = {variables["X"]: dataset.X.astype(np.float64), variables["Y"]: dataset.Y.astype(np.float64)}
    if dataset.label_mask is not None:
        contents[variables.get("label_mask", "label_mask")] = dataset.label_mask.astype(np.float64)
    scipy.io.savemat(path, contents, do_compression=True)
