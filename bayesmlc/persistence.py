"""Versioned, pickle-free storage of fitted estimators.

A model file is a NumPy ``.npz`` archive. Entry ``__meta__`` holds a JSON document::

    {"format": "bayesmlc-model", "format_version": 1, "class": "bayesmlc.linear:LogisticRegression",
     "library_version": "...", "params": {...}, "state": {...}}

Arrays (NumPy, torch, scipy.sparse) anywhere inside ``params`` or ``state`` are stored as separate
entries and replaced in the JSON by ``{"__array__": key}`` (or ``__sparse__`` / ``__tensor__``), so
loading never unpickles anything (``allow_pickle=False``). Files are written atomically.

A bayesmlc estimator inside ``params`` or ``state`` (the members of an ensemble) is stored as
``{"__estimator__": "module:Class", "params": {...}, "state": {...} or null}`` with its arrays beside
the others; such files are format version 2, every other file stays version 1, so an older bayesmlc
still reads what it can and refuses the rest with a clear message.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import tempfile
import zipfile

import numpy as np
import scipy.sparse as sp
import torch

from .exceptions import ModelFormatError

FORMAT_NAME = "bayesmlc-model"
FORMAT_VERSION = 2  # version 2 added nested estimators; files without them are still written as 1

__all__ = ["FORMAT_VERSION", "save_model", "load_model", "encode", "decode", "estimator_class", "write_npz_atomically",
           "read_npz"]


def encode(value, arrays: dict, prefix: str):
    """Replace arrays inside ``value`` by references; arrays are collected into ``arrays``.

    A fitted or unfitted bayesmlc estimator becomes ``{"__estimator__": ..., "params": ..., "state": ...}``.
    """
    from .base import MultiLabelEstimator  # base imports this module

    if isinstance(value, MultiLabelEstimator):
        cls = type(value)
        fitted = hasattr(value, "n_labels_")
        return {
            "__estimator__": f"{cls.__module__}:{cls.__name__}",
            "params": encode(value.get_params(deep=False), arrays, f"{prefix}.params"),
            "state": encode(value._get_state(), arrays, f"{prefix}.state") if fitted else None,
        }
    if isinstance(value, torch.Tensor):
        key = f"{prefix}#{len(arrays)}"
        arrays[key] = value.detach().cpu().numpy()
        return {"__tensor__": key}
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError(f"cannot store object array at {prefix}")
        key = f"{prefix}#{len(arrays)}"
        arrays[key] = value
        return {"__array__": key}
    if sp.issparse(value):
        csr = sp.csr_matrix(value)
        key = f"{prefix}#{len(arrays)}"
        arrays[key + ".data"] = csr.data
        arrays[key + ".indices"] = csr.indices
        arrays[key + ".indptr"] = csr.indptr
        return {"__sparse__": key, "shape": list(csr.shape)}
    if isinstance(value, dict):
        return {str(k): encode(v, arrays, f"{prefix}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v, arrays, f"{prefix}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot store a value of type {type(value).__name__} at {prefix}")


def decode(value, arrays):
    """Inverse of :func:`encode`."""
    if isinstance(value, dict):
        if "__estimator__" in value:
            return _build(value["__estimator__"], value["params"], value["state"], arrays)
        if "__array__" in value:
            return arrays[value["__array__"]]
        if "__tensor__" in value:
            return torch.from_numpy(np.array(arrays[value["__tensor__"]]))
        if "__sparse__" in value:
            key = value["__sparse__"]
            return sp.csr_matrix(
                (arrays[key + ".data"], arrays[key + ".indices"], arrays[key + ".indptr"]), shape=tuple(value["shape"])
            )
        return {k: decode(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v, arrays) for v in value]
    return value


def estimator_class(class_path: str):
    """The bayesmlc estimator class named ``"module:Class"``; ``ModelFormatError`` for anything else.

    Only the names in :data:`bayesmlc.models.LOADABLE_CLASSES` are accepted, and the check comes before
    any import: a model file can never make Python import a module that is not one of bayesmlc's own
    estimator modules.
    """
    from .base import MultiLabelEstimator
    from .models import LOADABLE_CLASSES

    if not isinstance(class_path, str) or class_path not in LOADABLE_CLASSES:
        shown = class_path if isinstance(class_path, str) else type(class_path).__name__
        raise ModelFormatError(f"{shown[:200]!s} is not a bayesmlc estimator class that model files may name")
    module_name, _, class_name = class_path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ModelFormatError(f"model class {class_path} is not available ({exc})") from None
    if not (isinstance(cls, type) and issubclass(cls, MultiLabelEstimator)):  # pragma: no cover - allow-list
        raise ModelFormatError(f"{class_path} is not a bayesmlc estimator class")
    return cls


def _build(class_path: str, params, state, arrays):
    """An estimator from its encoded parameters and fitted state (``None``: left unfitted)."""
    model = estimator_class(class_path)(**decode(params, arrays))
    if state is not None:
        model._set_state(decode(state, arrays))
    return model


def _has_estimator(encoded) -> bool:
    if isinstance(encoded, dict):
        return "__estimator__" in encoded or any(_has_estimator(v) for v in encoded.values())
    if isinstance(encoded, list):
        return any(_has_estimator(v) for v in encoded)
    return False


def save_model(path, model, library_version: str) -> None:
    """Write a fitted model to a file atomically (a temporary file in the same folder, then a rename),
    with the lowest format version that can hold it."""
    arrays: dict = {}
    encoded = encode(model, arrays, "model")
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION if _has_estimator([encoded["params"], encoded["state"]]) else 1,
        "class": encoded["__estimator__"],
        "library_version": library_version,
        "params": encoded["params"],
        "state": encoded["state"],
    }
    write_npz_atomically(path, meta, arrays)


def write_npz_atomically(path, meta: dict, arrays: dict) -> None:
    """Write ``arrays`` plus ``meta`` (JSON, as entry ``__meta__``) to ``path``: a temporary file in
    the same folder, then a rename, so a reader never sees a half-written file."""
    arrays = dict(arrays, __meta__=np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8))
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_npz(path) -> tuple[dict, dict]:
    """Read a file written by :func:`write_npz_atomically`: ``(meta, arrays)``, never unpickling.

    Raises ``OSError``, ``ValueError``, ``KeyError``, ``UnicodeDecodeError`` or ``zipfile.BadZipFile``
    for a file that is not such an archive; callers turn them into their own message.
    """
    with open(path, "rb") as handle:
        data = np.load(io.BytesIO(handle.read()), allow_pickle=False)
        arrays = {key: data[key] for key in data.files}
    meta = json.loads(arrays.pop("__meta__").tobytes().decode("utf-8"))
    return meta, arrays


def load_model(path):
    """Read a model file; returns the fitted model. Refuses newer format versions."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ModelFormatError(f"{path}: no such model file")
    try:
        meta, arrays = read_npz(path)
    except KeyError:
        raise ModelFormatError(f"{path}: not a bayesmlc model file (no __meta__ entry)") from None
    except (OSError, ValueError, UnicodeDecodeError, zipfile.BadZipFile) as exc:
        raise ModelFormatError(f"{path}: not a bayesmlc model file ({exc})") from None
    if meta.get("format") != FORMAT_NAME:
        raise ModelFormatError(f"{path}: not a bayesmlc model file (format {meta.get('format')!r})")
    version = meta.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ModelFormatError(
            f"{path}: written with model format version {version} by bayesmlc {meta.get('library_version')}; "
            f"this bayesmlc reads versions up to {FORMAT_VERSION}. Upgrade bayesmlc to load it."
        )
    try:
        return _build(meta["class"], meta["params"], meta["state"], arrays)
    except ModelFormatError as exc:
        raise ModelFormatError(f"{path}: {exc}") from None
