"""``bayesmlc info``, ``topics`` and ``plot-history``: what a data file, a BMLS model or a training
history holds; and ``bench``, which hands over to the benchmark harness."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import EXIT_OK, CLIError
from ..output import printable, read_json
from ..run_directory import HISTORY_FILE, META_FILE
from .saved_run import load_model_dir, names_from_meta


def cmd_info(args) -> int:
    from ...data.io import read_dataset

    if args.presets:
        from ...presets import format_presets, presets_as_dicts

        print(json.dumps(presets_as_dicts()) if args.json else format_presets())
        return EXIT_OK
    if getattr(args, "models", False):
        return _print_models(args.json)
    if args.path is None:
        raise CLIError("info: give a data file, or --presets, or --models")
    dataset = read_dataset(args.path, format=args.format)
    if args.json:
        print(json.dumps(dataset.stats()))
    else:
        print(dataset.summary())
    return EXIT_OK


def _print_models(as_json: bool) -> int:
    """``info --models``: each registered model, whether it needs the ``[compare]`` extra and why it
    cannot run here (``null``/nothing when it can)."""
    from ...models import COMPARE_MODELS, MODEL_CLASSES, missing_optional_package, model_label

    entries = [{"model": name, "class": MODEL_CLASSES[name], "extra": "compare" if name in COMPARE_MODELS else None,
                "unavailable": missing_optional_package(name)} for name in MODEL_CLASSES]
    if as_json:
        print(json.dumps(entries))
        return EXIT_OK
    width = max(len(model_label(entry["model"])) for entry in entries)
    for entry in entries:
        state = "not installed: " + entry["unavailable"] if entry["unavailable"] else "available"
        print(f"{model_label(entry['model']):<{width}}  {entry['class']:<38}  {state}")
    return EXIT_OK


def cmd_topics(args) -> int:
    from ...bmls.topics import format_topics

    model, meta = load_model_dir(args.model_dir, getattr(args, "allow_native_baselines", False))
    if not hasattr(model, "topics"):
        raise CLIError(f"--model-dir {args.model_dir}: holds a {type(model).__name__}; topics exist only for bmls")
    label_names = names_from_meta(meta, "label_names", model.n_labels_, args.model_dir)
    feature_names = names_from_meta(meta, "feature_names", model.n_features_in_, args.model_dir)
    print(format_topics(model, args.n_top, label_names, feature_names))
    return EXIT_OK


def cmd_plot_history(args) -> int:
    from ...gp.plotting import plot_history

    folder = Path(args.model_dir)
    history_path = folder / HISTORY_FILE
    if not history_path.exists():
        raise CLIError(f"--model-dir {folder}: no {HISTORY_FILE} there")
    output = Path(args.output) if args.output else folder / "history.png"
    history = read_json(history_path, HISTORY_FILE)
    if not isinstance(history, dict):
        raise CLIError(f"{history_path}: corrupt {HISTORY_FILE} (not a JSON object)")
    meta = read_json(folder / META_FILE, META_FILE) if (folder / META_FILE).exists() else {}
    title = (f"{printable(meta['model'])} on {printable(meta['dataset'])}"
             if isinstance(meta, dict) and isinstance(meta.get("model"), str) and isinstance(meta.get("dataset"), str)
             else None)
    try:
        plot_history(history, output, title=title)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "matplotlib":
            raise
        raise CLIError("plot-history needs matplotlib, a dependency of bayesmlc missing from this environment: "
                       "python -m pip install matplotlib") from None
    except (KeyError, TypeError, IndexError) as exc:
        raise CLIError(f"{history_path}: corrupt {HISTORY_FILE} ({type(exc).__name__}: {exc})") from None
    print(output)
    return EXIT_OK


def cmd_bench(args) -> int:
    from ...bench.cli import run

    return run(args)
