"""Reading a run folder written by ``train --out``: the model and ``meta.json``."""

from __future__ import annotations

from pathlib import Path

from ..errors import CLIError
from ..output import printable, read_json
from ..run_directory import META_FILE, MODEL_FILE


def load_model_dir(model_dir, allow_native: bool = False):
    """``(model, meta)`` of a ``--model-dir``; meta is ``{}`` when there is no ``meta.json``.
    ``allow_native``: ``--allow-native-baselines`` (a napkinXC or omikuji model loads only with it)."""
    from ...base import MultiLabelEstimator

    folder = Path(model_dir)
    if not (folder / MODEL_FILE).exists():
        raise CLIError(f"--model-dir {folder}: no {MODEL_FILE} there (train with --out {folder} first)")
    model = MultiLabelEstimator.load(folder / MODEL_FILE, allow_native=allow_native)
    meta = read_json(folder / META_FILE, META_FILE) if (folder / META_FILE).exists() else {}
    if not isinstance(meta, dict):
        raise CLIError(f"{folder / META_FILE}: corrupt {META_FILE} (not a JSON object)")
    return model, meta


def names_from_meta(meta: dict, key: str, size: int, folder) -> list | None:
    """The ``label_names``/``feature_names`` of ``meta.json``, escaped for the terminal; ``None`` when
    absent; a CLIError when they are not ``size`` strings."""
    names = meta.get(key)
    if names is None:
        return None
    if not isinstance(names, list) or len(names) != size or not all(isinstance(n, str) for n in names):
        shown = f"{len(names)} entries" if isinstance(names, list) else type(names).__name__
        raise CLIError(f"{Path(folder) / META_FILE}: {key} has {shown}, the model has {size}")
    return [printable(n) for n in names]
