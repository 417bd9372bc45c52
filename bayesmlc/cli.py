"""The ``bayesmlc`` command line: a thin layer over the library.

file -> Dataset -> estimator.fit -> scores and probabilities -> metrics -> report.

Exit codes: 0 success, 2 bad arguments or bad input (the message names the argument, file or line).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

from .exceptions import BayesMLCError, ValidationError

MODEL_FILE = "model.npz"
META_FILE = "meta.json"
METRICS_FILE = "metrics.json"
HISTORY_FILE = "history.json"
RELIABILITY_FILE = "reliability.json"

EXIT_OK = 0
EXIT_USAGE = 2

class CLIError(Exception):
    """A user error reported as ``bayesmlc: error: ...`` with exit code 2."""


# ---- small pieces ----------------------------------------------------------------------------
def parse_set_values(pairs, valid_keys) -> dict:
    """``["k=v", ...]`` to a dict; values are Python literals (int, float, bool, None, list) or strings."""
    params = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise CLIError(f"--set expects key=value, got {pair!r}")
        if key not in valid_keys:
            raise CLIError(f"--set {key}: unknown parameter; valid keys: {', '.join(sorted(valid_keys))}")
        lowered = raw.strip().lower()
        if lowered in ("true", "false"):
            value = lowered == "true"
        elif lowered in ("none", "null"):
            value = None
        else:
            try:
                value = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                value = raw
        params[key] = value
    return params


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MB (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _progress(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)


def dataset_name(path) -> str:
    """A dataset's name from its path: the folder of ``train.txt``/``test.txt``, else the file stem."""
    path = Path(path)
    if path.stem in ("train", "test") and path.parent.name:
        return path.parent.name
    return path.stem


def propensity_constants(name: str):
    """(A, B) of Jain et al.'s propensity model for a known dataset, else the defaults (0.55, 1.5)."""
    from .data.registry import get_info

    try:
        info = get_info(name)
    except ValidationError:  # not a registered dataset
        return 0.55, 1.5
    return float(info.propensity_a), float(info.propensity_b)


def build_model(name: str, settings, seed, device, quiet: bool):
    from .models import get_model_class

    cls = get_model_class(name)
    valid = cls().get_params(deep=False)
    params = parse_set_values(settings, valid.keys())
    if seed is not None and "random_state" in valid:
        params.setdefault("random_state", seed)
    if device is not None and "device" in valid:
        params.setdefault("device", device)
    if "verbose" in valid:
        params.setdefault("verbose", not quiet)
    return cls(**params)


def evaluate_model(model, test, inv_propensity) -> tuple[dict, float, dict]:
    """Metrics of ``model`` on the ``test`` dataset; returns (metrics, predict_seconds, reliability).

    Entries that ``test.label_mask`` marks unobserved are left out of the metrics that take a mask.
    A metric that is undefined on this data (an AUC with one class only) is ``None``.
    """
    from . import metrics

    start = time.perf_counter()
    scores = model.decision_function(test.X)
    proba = model.predict_proba(test.X)
    predicted = model.predict(test.X)
    seconds = time.perf_counter() - start
    values = metrics.evaluate(test.Y, scores=scores, proba=proba, Y_pred=predicted, inv_propensity=inv_propensity,
                              label_mask=test.label_mask)
    values = {k: (None if np.isnan(v) else float(v)) for k, v in values.items()}
    reliability = metrics.calibration_curves(test.Y, proba, label_mask=test.label_mask, scores=scores)
    return values, seconds, reliability


def format_metrics_table(values: dict) -> str:
    width = max((len(k) for k in values), default=0)
    return "\n".join(f"{key:<{width}}  {value:8.4f}" if value is not None else f"{key:<{width}}  undefined"
                     for key, value in values.items())


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def _write_json(path: Path, payload) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=_json_default))
    os.replace(tmp, path)


def _device_name(model) -> str:
    device = getattr(model, "device", None)
    if device is None:
        return "cpu"
    from .utils import resolve_device

    resolved = resolve_device(device)
    if resolved.type == "cuda":
        import torch

        return f"cuda ({torch.cuda.get_device_name(resolved)})"
    return str(resolved)


def _emit(args, record: dict, table: str) -> None:
    if args.json:
        if not args.quiet and table:
            print(table, file=sys.stderr)
        print(json.dumps(record, default=_json_default))
    else:
        print(table)


# ---- commands --------------------------------------------------------------------------------
def cmd_train(args) -> int:
    parallel = None
    if args.distributed:
        if args.model != "mlgpf":
            raise CLIError(f"--distributed: only --model mlgpf trains data-parallel, not {args.model}")
        from .distributed import DataParallel

        parallel = DataParallel.from_env()  # under torchrun: RANK, WORLD_SIZE, MASTER_ADDR, ...
    if args.resume and args.model != "mlgpf":
        raise CLIError(f"--resume: only --model mlgpf writes checkpoints, not {args.model}")
    try:
        return _train(args, parallel)
    finally:
        if parallel is not None:
            parallel.close()


def _train(args, parallel) -> int:
    from .data.io import infer_format, read_dataset, read_train_test
    from .exceptions import DataFormatError
    from .metrics import inverse_propensity, inverse_propensity_from_counts

    is_main = parallel is None or parallel.is_main
    quiet = args.quiet or not is_main
    sharded = parallel is not None and (args.format or infer_format(args.train)) in ("npz", "xc")
    if sharded:  # each rank reads only its rows; rank 0 alone reads the test file
        from .distributed import read_shard

        train = read_shard(args.train, parallel, format=args.format)
        test = read_dataset(args.test, format=args.format) if args.test and is_main else None
        if test is not None and (test.n_features, test.n_labels) != (train.n_features, train.n_labels):
            raise DataFormatError(f"train/test width mismatch: {args.train} has D={train.n_features}, "
                                  f"L={train.n_labels} but {args.test} has D={test.n_features}, L={test.n_labels}")
    elif args.test:
        train, test = read_train_test(args.train, args.test, format=args.format)
    else:
        train, test = read_dataset(args.train, format=args.format), None
    n_rows = train.source["shard"]["n_rows"] if sharded else train.n_samples
    device = args.device if args.device is not None or parallel is None else str(parallel.device)
    model = build_model(args.model, args.set, args.seed, device, quiet)
    if args.calibrate:
        from .calibration import CalibratedClassifier

        model = CalibratedClassifier(model, method=args.calibrate, random_state=args.seed)
    name = dataset_name(args.train)
    a, b = propensity_constants(name)
    _progress(f"training {args.model} on {name}: {n_rows} rows, {train.n_features} features, {train.n_labels} labels", quiet)
    fit_params = {}
    if parallel is not None:
        fit_params["parallel"] = parallel
    if args.resume:
        fit_params["resume"] = True
    start = time.perf_counter()
    model.fit(train.X, train.Y, label_mask=train.label_mask, **fit_params)
    train_seconds = time.perf_counter() - start
    # a shard sees only its rows: the propensities come from the label counts fit summed over ranks
    inv_prop = (inverse_propensity_from_counts(model.label_frequencies_, n_rows, A=a, B=b) if sharded
                else inverse_propensity(train.Y, A=a, B=b))
    if not is_main:  # rank 0 alone evaluates, writes and prints
        return EXIT_OK
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        model.save(out / MODEL_FILE)
        _write_json(out / HISTORY_FILE, getattr(model, "history_", {}))
        _write_json(out / META_FILE, {
            "model": args.model, "dataset": name, "train_path": str(args.train),
            "params": model.get_params(deep=False), "propensity": {"A": a, "B": b},
            "inv_propensity": inv_prop, "label_names": train.label_names, "feature_names": train.feature_names,
        })
    record = {"model": args.model, "dataset": name, "params": model.get_params(deep=False), "metrics": {},
              "train_seconds": train_seconds, "predict_seconds": None, "peak_rss_mb": None, "device": _device_name(model)}
    table = f"trained in {train_seconds:.2f} s"
    if test is not None:
        values, predict_seconds, reliability = evaluate_model(model, test, inv_prop)
        record["metrics"], record["predict_seconds"] = values, predict_seconds
        table = f"{args.model} on {name} (train {train_seconds:.2f} s, predict {predict_seconds:.2f} s)\n" + format_metrics_table(values)
        if out is not None:
            _write_json(out / METRICS_FILE, values)
            _write_json(out / RELIABILITY_FILE, reliability)
    record["peak_rss_mb"] = peak_rss_mb()
    _emit(args, record, table)
    return EXIT_OK


def _load_model_dir(model_dir):
    from .base import MultiLabelEstimator

    folder = Path(model_dir)
    if not (folder / MODEL_FILE).exists():
        raise CLIError(f"--model-dir {folder}: no {MODEL_FILE} there (train with --out {folder} first)")
    meta = json.loads((folder / META_FILE).read_text()) if (folder / META_FILE).exists() else {}
    return MultiLabelEstimator.load(folder / MODEL_FILE), meta


def cmd_evaluate(args) -> int:
    from .data.io import read_dataset

    model, meta = _load_model_dir(args.model_dir)
    test = read_dataset(args.test, format=args.format)
    if test.n_labels != model.n_labels_:
        raise CLIError(f"--test {args.test}: has {test.n_labels} labels, the model was trained with {model.n_labels_}")
    inv_prop = np.asarray(meta["inv_propensity"]) if "inv_propensity" in meta else None
    values, predict_seconds, _ = evaluate_model(model, test, inv_prop)
    record = {"model": meta.get("model", type(model).__name__), "dataset": dataset_name(args.test),
              "params": model.get_params(deep=False), "metrics": values, "train_seconds": None,
              "predict_seconds": predict_seconds, "peak_rss_mb": peak_rss_mb(), "device": _device_name(model)}
    _emit(args, record, format_metrics_table(values))
    return EXIT_OK


def cmd_predict(args) -> int:
    from .data.io import read_dataset

    model, meta = _load_model_dir(args.model_dir)
    data = read_dataset(args.input, format=args.format)
    indices, scores = model.predict_topk(data.X, args.top_k)
    names = meta.get("label_names") if args.names else None
    stream = open(args.output, "w") if args.output else sys.stdout
    try:
        for row_idx, row_scores in zip(indices, scores):
            labels = [names[i] if names else str(i) for i in row_idx]
            stream.write(" ".join(f"{label}:{score:.6g}" for label, score in zip(labels, row_scores)) + "\n")
    finally:
        if args.output:
            stream.close()
    return EXIT_OK


def cmd_info(args) -> int:
    from .data.io import read_dataset

    dataset = read_dataset(args.path, format=args.format)
    if args.json:
        print(json.dumps(dataset.stats()))
    else:
        print(dataset.summary())
    return EXIT_OK


def cmd_demo(args) -> int:
    from .data.synthetic import make_multilabel

    # binary bag-of-words features, so that every model (BMLS needs binary input) runs on it
    data = make_multilabel(args.n_samples, 1000, 40, feature_kind="binary", random_state=args.seed)
    n_test = args.n_samples // 4
    train, test = data.subset(np.arange(n_test, data.n_samples)), data.subset(np.arange(n_test))
    model = build_model(args.model, args.set or [], args.seed, args.device, args.quiet)
    from .metrics import inverse_propensity

    _progress(f"demo: {args.model} on synthetic data ({train.n_samples} train / {test.n_samples} test rows, "
              f"{data.n_features} features, {data.n_labels} labels)", args.quiet)
    start = time.perf_counter()
    model.fit(train.X, train.Y)
    train_seconds = time.perf_counter() - start
    values, predict_seconds, _ = evaluate_model(model, test, inverse_propensity(train.Y))
    record = {"model": args.model, "dataset": "synthetic-demo", "params": model.get_params(deep=False),
              "metrics": values, "train_seconds": train_seconds, "predict_seconds": predict_seconds,
              "peak_rss_mb": peak_rss_mb(), "device": _device_name(model)}
    table = (f"{args.model} on synthetic demo data (train {train_seconds:.2f} s, predict {predict_seconds:.2f} s)\n"
             + format_metrics_table(values))
    _emit(args, record, table)
    return EXIT_OK


def cmd_topics(args) -> int:
    from .bmls.topics import format_topics

    model, meta = _load_model_dir(args.model_dir)
    print(format_topics(model, args.n_top, meta.get("label_names"), meta.get("feature_names")))
    return EXIT_OK


def cmd_plot_history(args) -> int:
    from .gp.plotting import plot_history

    folder = Path(args.model_dir)
    history_path = folder / HISTORY_FILE
    if not history_path.exists():
        raise CLIError(f"--model-dir {folder}: no {HISTORY_FILE} there")
    output = Path(args.output) if args.output else folder / "history.png"
    plot_history(json.loads(history_path.read_text()), output)
    print(output)
    return EXIT_OK


def cmd_bench(args) -> int:
    from .bench.cli import run

    return run(args)


# ---- parser ----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .models import MODEL_CLASSES

    parser = argparse.ArgumentParser(prog="bayesmlc", description="Bayesian multi-label classification at scale")
    parser.add_argument("--version", action="version", version=f"bayesmlc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p, model=True):
        p.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
        p.add_argument("--quiet", action="store_true", help="no progress output on stderr")
        p.add_argument("--format", default=None, help="input format (default: from the file extension)")
        if model:
            p.add_argument("--set", action="append", metavar="KEY=VALUE", help="model parameter (repeatable)")
            p.add_argument("--seed", type=int, default=0, help="random_state of the model (default 0)")
            p.add_argument("--device", default=None, help="auto, cpu or cuda (default: the model's)")

    p = sub.add_parser("train", help="fit a model, optionally score a test file")
    p.add_argument("--model", required=True, choices=sorted(MODEL_CLASSES))
    p.add_argument("--train", required=True, help="training data file")
    p.add_argument("--test", help="test data file (metrics are printed)")
    p.add_argument("--out", help="folder for the model, history and metrics")
    p.add_argument("--distributed", action="store_true",
                   help="data-parallel training under torchrun (mlgpf; see docs/scaling.md)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the model's checkpoint (mlgpf: --set checkpoint_path=...)")
    p.add_argument("--calibrate", choices=("isotonic", "temperature", "platt"),
                   help="fit on 80%% of the training rows and recalibrate the probabilities on the other 20%% "
                        "(bayesmlc.calibration.CalibratedClassifier)")
    common(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", help="score a saved model on a test file")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--test", required=True)
    common(p, model=False)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("predict", help="top-k labels per row of a file")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--output", help="write here instead of stdout")
    p.add_argument("--names", action="store_true", help="print label names instead of indices")
    common(p, model=False)
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("info", help="statistics of a data file")
    p.add_argument("path")
    common(p, model=False)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("demo", help="train on built-in synthetic data and print a metrics table")
    p.add_argument("--model", default="mlgpf", choices=sorted(MODEL_CLASSES),
                   help="model to train (default mlgpf; logistic is the baseline)")
    p.add_argument("--n-samples", type=int, default=2000)
    common(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("topics", help="top labels and features per BMLS topic")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--n-top", type=int, default=5)
    p.set_defaults(func=cmd_topics)

    p = sub.add_parser("plot-history", help="plot a model's training history to PNG")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--output", help="PNG path (default DIR/history.png)")
    p.set_defaults(func=cmd_plot_history)

    try:
        from .bench.cli import add_arguments
    except ImportError:
        add_arguments = None
    if add_arguments is not None:
        p = sub.add_parser("bench", help="run a benchmark suite and write a report with plots")
        add_arguments(p)
        p.set_defaults(func=cmd_bench)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (CLIError, BayesMLCError, FileNotFoundError, IsADirectoryError) as exc:
        print(f"bayesmlc: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # the reader closed the pipe (``bayesmlc predict ... | head``): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
