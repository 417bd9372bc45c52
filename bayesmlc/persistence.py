"""Versioned, pickle-free storage of fitted estimators.

A model file is a NumPy ``.npz`` archive. Entry ``__meta__`` holds a JSON document::

    {"format": "bayesmlc-model", "format_version": 1, "class": "bayesmlc.linear:LogisticRegression",
     "library_version": "...", "params": {...}, "state": {...}}

Arrays (NumPy, torch, scipy.sparse) anywhere inside ``params`` or ``state`` are stored as separate
entries and replaced in the JSON by ``{"__array__": key}`` (or ``__sparse__`` / ``__tensor__``), so
loading never unpickles anything (``allow_pickle=False``). Files are written atomically.

A bayesmlc estimator inside ``params`` or ``state`` (the members of an ensemble, a model's
:class:`~bayesmlc.preprocessing.FeaturePreprocessor`) is stored as
``{"__estimator__": "module:Class", "params": {...}, "state": {...} or null}`` with its arrays beside
the others. A file gets the lowest format version that holds it: 1 without nested estimators, 2 with
them, 3 with a nested ``FeaturePreprocessor`` (models keep their feature scaling in one since
version 3; files of versions 1 and 2 hold the older ``feature_mean_`` / ``feature_scale_`` form, which
the models convert when loading). An older bayesmlc reads what it can and refuses the rest with a
clear message.

An estimator is anything scikit-learn-like with ``_get_state`` and ``_set_state``
(:func:`is_storable_estimator`): this module does not import the estimator classes (the base class
imports it), and loading builds only the classes in :data:`bayesmlc.models.LOADABLE_CLASSES`.
"""

from __future__ import annotations

import importlib
import json
import os

import numpy as np
import scipy.sparse as sp
import torch
from sklearn.base import BaseEstimator

from .exceptions import ModelFormatError
from .models import LOADABLE_CLASSES, NATIVE_CLASSES
from .safe_io import LazyNpz, checked_csr, error_factory, make_temporary_file, remove_stale_temporaries

FORMAT_NAME = "bayesmlc-model"
FORMAT_VERSION = 3  # 2 added nested estimators, 3 a nested FeaturePreprocessor; a file gets the lowest that holds it

__all__ = ["FORMAT_VERSION", "NATIVE_OPT_IN", "save_model", "load_model", "native_classes_named", "encode", "decode", "estimator_class", "write_npz_atomically",
           "read_npz"]


def is_storable_estimator(value) -> bool:
    """Whether ``value`` is stored as a nested estimator: a scikit-learn estimator (or class) with
    ``_get_state`` and ``_set_state``."""
    cls = value if isinstance(value, type) else type(value)
    return issubclass(cls, BaseEstimator) and hasattr(cls, "_get_state") and hasattr(cls, "_set_state")


def _is_fitted(estimator) -> bool:
    """scikit-learn's rule: fitted once it has a public attribute ending in ``_``."""
    return any(name.endswith("_") and not name.startswith("_") for name in vars(estimator))


def encode(value, arrays: dict, prefix: str):
    """Replace arrays inside ``value`` by references; arrays are collected into ``arrays``.

    A fitted or unfitted bayesmlc estimator becomes ``{"__estimator__": ..., "params": ..., "state": ...}``.
    """
    if is_storable_estimator(value):
        cls = type(value)
        fitted = _is_fitted(value)
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


def _member(arrays, key, kind: str):
    if not isinstance(key, str) or key not in arrays:
        raise ModelFormatError(f"the file refers to a missing {kind} entry {str(key)[:100]!r}")
    return arrays[key]


def decode(value, arrays):
    """Inverse of :func:`encode`. A reference to an entry that is not there, or a sparse matrix whose
    parts do not form one (indices out of range, ``indptr`` not monotone, wrong lengths), is a
    :class:`ModelFormatError`: every part is checked before scipy sees it."""
    if isinstance(value, dict):
        if "__estimator__" in value:
            if not isinstance(value.get("params"), dict) or "state" not in value:
                raise ModelFormatError("a nested estimator entry lacks its params or state")
            return _build(value["__estimator__"], value["params"], value["state"], arrays)
        if "__array__" in value:
            return _member(arrays, value["__array__"], "array")
        if "__tensor__" in value:
            array = _member(arrays, value["__tensor__"], "tensor")
            native = array.dtype.newbyteorder("=")  # torch reads only the machine's byte order
            if array.dtype.kind not in "biufc" or native.itemsize > (16 if native.kind == "c" else 8):
                raise ModelFormatError(f"tensor entry {value['__tensor__']!r} has dtype {array.dtype}")
            return torch.from_numpy(np.array(array, dtype=native))
        if "__sparse__" in value:
            key = value["__sparse__"]
            if not isinstance(key, str):
                raise ModelFormatError("a sparse entry's key is not a string")
            parts = [_member(arrays, key + suffix, "sparse") for suffix in (".data", ".indices", ".indptr")]
            return checked_csr(*parts, value.get("shape"), ModelFormatError, what=f"sparse entry {key!r}")
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
    if not isinstance(class_path, str) or class_path not in LOADABLE_CLASSES:
        shown = class_path if isinstance(class_path, str) else type(class_path).__name__
        raise ModelFormatError(f"{shown[:200]!s} is not a bayesmlc estimator class that model files may name")
    module_name, _, class_name = LOADABLE_CLASSES[class_path].partition(":")  # a moved class: its new home
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ModelFormatError(f"model class {class_path} is not available ({exc})") from None
    if not (isinstance(cls, type) and is_storable_estimator(cls)):  # pragma: no cover - allow-list
        raise ModelFormatError(f"{class_path} is not a bayesmlc estimator class")
    return cls


def current_names(values: dict, renamed: dict) -> dict:
    """``values`` (a model file's parameters or fitted state, by name) with each earlier name that
    ``renamed`` maps (old -> current) replaced by the current one, unless ``values`` also holds the
    current one (then both stay: a deprecated parameter that is still accepted keeps its value)."""
    return {(key if renamed.get(key, key) in values else renamed[key]): value for key, value in values.items()}


def _build(class_path: str, params, state, arrays):
    """An estimator from its encoded parameters and fitted state (``None``: left unfitted); parameters
    a file names by an earlier name (the class's ``_renamed_parameters``) are passed by the current one."""
    cls = estimator_class(class_path)
    model = cls(**current_names(decode(params, arrays), getattr(cls, "_renamed_parameters", {})))
    if state is not None:
        model._set_state(decode(state, arrays))
    return model


#: The first format version that may nest each class (other nested estimators: version 2). Models
#: keep their feature scaling in a nested FeaturePreprocessor since version 3, so an older reader
#: refuses such a file with "upgrade bayesmlc" rather than misreading it.
_NESTED_FROM_VERSION = {"bayesmlc.preprocessing:FeaturePreprocessor": 3}


def _needed_version(encoded) -> int:
    """The lowest format version that can hold an encoded params or state tree."""
    if isinstance(encoded, dict):
        own = _NESTED_FROM_VERSION.get(encoded["__estimator__"], 2) if "__estimator__" in encoded else 1
        return max([own] + [_needed_version(v) for v in encoded.values()])
    if isinstance(encoded, list):
        return max([1] + [_needed_version(v) for v in encoded])
    return 1


def save_model(path, model, library_version: str) -> None:
    """Write a fitted model to a file atomically (a temporary file in the same folder, then a rename),
    with the lowest format version that can hold it."""
    arrays: dict = {}
    encoded = encode(model, arrays, "model")
    meta = {
        "format": FORMAT_NAME,
        "format_version": _needed_version([encoded["params"], encoded["state"]]),
        "class": encoded["__estimator__"],
        "library_version": library_version,
        "params": encoded["params"],
        "state": encoded["state"],
    }
    write_npz_atomically(path, meta, arrays)


def write_npz_atomically(path, meta: dict, arrays: dict) -> None:
    """Write ``arrays`` plus ``meta`` (JSON, as entry ``__meta__``) to ``path``: a temporary file in
    the same folder, then a rename, so a reader never sees a half-written file. The file gets the
    umask's permissions; temporaries a killed writer left in the folder are removed first."""
    arrays = dict(arrays, __meta__=np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8))
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    remove_stale_temporaries(folder)
    fd, tmp = make_temporary_file(folder, os.path.basename(path), suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


#: the JSON document of a model file is parsed whole; beyond this size it is refused unread
MAX_META_BYTES = 256 * 2**20
#: bayesmlc writes model files and checkpoints uncompressed; compressed members of one (a file
#: zipped again by hand) may add at most this many bytes, or the file's own size if that is more,
#: when inflated: a 1 MB file cannot make a reader allocate a gigabyte before its fields are checked
MODEL_INFLATION_FLOOR = 64 * 2**20


def read_npz(path) -> tuple[dict, LazyNpz]:
    """Read a file written by :func:`write_npz_atomically`: ``(meta, arrays)``, never unpickling.

    ``arrays`` is a :class:`~bayesmlc.safe_io.LazyNpz`: an entry is decompressed only when looked up,
    after its declared size has been bounded (by the bytes the file stores for it, and all
    compressed entries together by :data:`MODEL_INFLATION_FLOOR` or the file's size). Raises
    :class:`ModelFormatError` (naming the file) for anything that is not such an archive, a FIFO or
    device included.
    """
    path = os.fspath(path)
    failed = error_factory(ModelFormatError, lambda message: f"{path}: not a bayesmlc model file ({message})")
    try:
        size = os.stat(path).st_size
    except OSError:
        size = 0  # the open below names what is wrong
    arrays = LazyNpz(path, failed, inflation_budget=max(MODEL_INFLATION_FLOOR, size))
    if "__meta__" not in arrays:
        arrays.close()
        raise ModelFormatError(f"{path}: not a bayesmlc model file (no __meta__ entry)")
    try:
        if arrays.declared_size("__meta__") > MAX_META_BYTES:
            raise failed(f"its __meta__ entry declares more than {MAX_META_BYTES} bytes")
        raw = arrays["__meta__"]
        if raw.dtype != np.uint8 or raw.ndim != 1:
            raise failed(f"__meta__ is {raw.dtype} of shape {raw.shape}, not bytes")
        try:
            meta = json.loads(raw.tobytes().decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise failed(f"__meta__ is not JSON: {str(exc)[:200]}") from None
        if not isinstance(meta, dict):
            raise failed("__meta__ is not a JSON object")
    except BaseException:
        arrays.close()
        raise
    return meta, arrays


#: deeper than any record bayesmlc writes (an ensemble of calibrated models is about 10 levels)
_MAX_RECORD_DEPTH = 200
#: what a refusal of a native baseline names: the two ways to opt in
NATIVE_OPT_IN = "load_model(path, allow_native=True), or --allow-native-baselines on the command line"


def native_classes_named(encoded) -> list:
    """The classes of :data:`bayesmlc.models.NATIVE_CLASSES` that a model file's JSON record names,
    at its top (``"class"``) or nested (``"__estimator__"``), in the order met; nothing is imported."""
    found = []

    def walk(node, depth):
        if depth > _MAX_RECORD_DEPTH:
            raise ModelFormatError("corrupt model file (nested too deeply)")
        if isinstance(node, dict):
            for key in ("class", "__estimator__"):
                name = LOADABLE_CLASSES.get(node.get(key)) if isinstance(node.get(key), str) else None
                if name in NATIVE_CLASSES and name not in found:
                    found.append(name)
            for value in node.values():
                walk(value, depth + 1)
        elif isinstance(node, list):
            for value in node:
                walk(value, depth + 1)

    walk(encoded, 0)
    return found


def refuse_native_classes(path, meta: dict) -> None:
    """``ModelFormatError`` (one line, naming the opt-in) when the record ``meta`` of model file
    ``path`` names a class whose state a native library reads (:func:`native_classes_named`)."""
    try:
        named = native_classes_named(meta)
    except ModelFormatError as exc:
        raise ModelFormatError(f"{path}: {exc}") from None
    if named:
        shown = named[0].rpartition(":")[2]
        raise ModelFormatError(
            f"{path}: holds a {shown}, whose model files a native library (napkinXC or omikuji) reads trusting "
            f"their contents; load it only from a file you trust, with {NATIVE_OPT_IN}")


def load_model(path, allow_native: bool = False):
    """Read a model file; returns the fitted model. Refuses newer format versions.

    A file that holds a napkinXC or omikuji baseline (:data:`bayesmlc.models.NATIVE_CLASSES`, at any
    depth: an ensemble member too) embeds that library's own model files, which its C++ or Rust reader
    trusts: such a file loads only with ``allow_native=True`` (the CLI's ``--allow-native-baselines``),
    and is otherwise refused, before anything is decoded or any native code runs, with a
    :class:`ModelFormatError` that names the option. Pass it only for files you trust as you would a
    program: bayesmlc bounds what it can in those files before the library sees them (declared sizes
    against the bytes present, the tree's structure), not everything the library reads.

    Anything wrong with the file (not an archive, damaged members, a missing or malformed entry, a
    class that is not on the allow-list, parameters the class does not take, a state the class
    cannot use) is a :class:`ModelFormatError` naming the file.

    A fitted model is checked before it is returned, so that a crafted field fails here and never at
    prediction: its ``_check_loaded()`` (:meth:`bayesmlc.base.MultiLabelEstimator._check_loaded`)
    checks its parameters and the type and shape of its fitted fields, nested estimators included
    (the message names the field: ``coef_ must be a float array of shape (5, 3), got ...``), then
    predicts two synthetic rows of its width (all zeros; ones in every column, at most
    :data:`bayesmlc.fitted_state.PROBE_FEATURES` of them) and requires scores and probabilities of
    shape (2, ``n_labels_``), finite for the zero row, the probabilities in [0, 1] ("fitted state
    does not predict (TypeError: ...)" otherwise). The probe changes no prediction; it does the first
    prediction's set-up (an MLGPF builds its module, a napkinXC or omikuji wrapper loads its
    library's model) at load.
    A model whose ``device`` this machine does not have loads (its fields checked; it predicts after
    ``set_params(device=...)``).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ModelFormatError(f"{path}: no such model file")
    meta, arrays = read_npz(path)
    with arrays:
        if meta.get("format") != FORMAT_NAME:
            raise ModelFormatError(f"{path}: not a bayesmlc model file (format {str(meta.get('format'))[:80]!r})")
        version = meta.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ModelFormatError(
                f"{path}: written with model format version {str(version)[:40]} by bayesmlc "
                f"{str(meta.get('library_version'))[:40]}; this bayesmlc reads versions up to {FORMAT_VERSION}. "
                "Upgrade bayesmlc to load it."
            )
        if not isinstance(meta.get("params"), dict) or "state" not in meta:
            raise ModelFormatError(f"{path}: not a bayesmlc model file (no params or state)")
        if not allow_native:
            refuse_native_classes(path, meta)
        try:
            model = _build(meta.get("class"), meta["params"], meta["state"], arrays)
            check = getattr(model, "_check_loaded", None) if meta["state"] is not None else None
            if check is not None:  # the fields, then a prediction of two synthetic rows
                check()
            return model
        except ModelFormatError as exc:
            raise ModelFormatError(f"{path}: {exc}") from None
        except RecursionError:
            raise ModelFormatError(f"{path}: corrupt model file (nested too deeply)") from None
        except MemoryError:
            raise ModelFormatError(f"{path}: corrupt model file (its state does not fit in memory)") from None
        except Exception as exc:  # the class refused the parameters or state the file holds
            raise ModelFormatError(f"{path}: corrupt model file ({type(exc).__name__}: {str(exc)[:300]})") from None
