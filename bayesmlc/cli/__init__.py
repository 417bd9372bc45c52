"""The ``bayesmlc`` command line: a thin layer over the library.

file -> Dataset -> estimator.fit -> scores and probabilities -> metrics -> report.

Exit codes: 0 success; 2 bad arguments, bad input or a failed run (one line ``bayesmlc: error: ...``
naming the argument, file or line; no traceback); 130 interrupted (Ctrl-C); 1 an unexpected internal
error (one line; ``BAYESMLC_TRACEBACK=1`` shows the traceback).

``train --out DIR`` writes the run into a temporary sibling folder and renames it to ``DIR`` when
everything is written, so ``DIR`` holds one whole run or nothing; an existing run is replaced only
with ``--overwrite``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import resource
import sys
import time
import unicodedata
import warnings
from pathlib import Path

import numpy as np

from ..exceptions import BayesMLCError, ValidationError
from ..safe_io import make_temporary_file
from .errors import CLIError
from .run_directory import HISTORY_FILE, META_FILE, METRICS_FILE, MODEL_FILE, RELIABILITY_FILE, RunDirectory

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
#: rows the CLI needs to train: the inverse propensities of the metrics need ln N > 1
MIN_TRAIN_ROWS = 3
#: upper bound on ``--set n_threads=...`` and ``--threads`` as a multiple of the cores (an absurd count
#: aborts OpenMP)
MAX_THREADS_PER_CORE = 8
#: the demo's data: binary bag-of-words features, so that every model (BMLS included) runs on it
DEMO_FEATURES = 500
DEMO_LABELS = 40
#: fewest rows ``demo --n-samples`` takes: a quarter is the test set
DEMO_MIN_SAMPLES = 100
#: settings the demo gives a model unless ``--set`` says otherwise: MLGPF at 30 epochs needs half the
#: CPU of its default 100, for a test P@1 within 1.5 standard errors of it and far above the
#: baseline's (docs/experiments.md, "The demo")
DEMO_SETTINGS = {"mlgpf": {"epochs": 30}}


def printable(text) -> str:
    """``text`` with control and other non-printing characters escaped (``\\x1b``), so that names
    read from files cannot move the cursor or recolour the terminal."""
    text = str(text)
    if text.isprintable():
        return text
    out = []
    for char in text:
        category = unicodedata.category(char)
        if category[0] not in "CZ" or category == "Zs":  # letters, marks, numbers, punctuation, symbols, spaces
            out.append(char)
        else:
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


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
    from ..data.registry import get_info

    try:
        info = get_info(name)
    except ValidationError:  # not a registered dataset
        return 0.55, 1.5
    return float(info.propensity_a), float(info.propensity_b)


def build_model(name: str, settings, seed, device, quiet: bool, preset: str | None = None):
    """The estimator ``--model name`` with ``--set`` values (over the named ``--preset``'s, if any)."""
    from ..models import get_model_class

    cls = get_model_class(name)
    valid = cls().get_params(deep=False)
    params = parse_set_values(settings, valid.keys())
    if seed is not None and "random_state" in valid:
        params.setdefault("random_state", seed)
    if device is not None and "device" in valid:
        params.setdefault("device", device)
    if "verbose" in valid:
        params.setdefault("verbose", not quiet)
    threads = params.get("n_threads")
    if isinstance(threads, int) and not isinstance(threads, bool) and threads > max_threads():
        raise CLIError(f"--set n_threads={threads}: {_too_many_threads()}")
    if preset is not None:
        from ..presets import build_preset

        return build_preset(name, preset, params)
    return cls(**params)


def max_threads() -> int:
    """The most threads ``--threads`` or ``--set n_threads`` may ask for."""
    return MAX_THREADS_PER_CORE * (os.cpu_count() or 1)


def _too_many_threads() -> str:
    return f"more than {max_threads()} threads ({MAX_THREADS_PER_CORE} per core) is refused"


def format_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as the CLI prints it: one line, ``bayesmlc: warning: MESSAGE`` (Python's default
    adds the file, the line number and the source line that raised it)."""
    return f"bayesmlc: warning: {printable(' '.join(str(message).split()))}\n"


@contextlib.contextmanager
def one_line_warnings():
    """A context in which warnings print as :func:`format_warning` does; the previous formatter comes
    back afterwards (``main`` may be called from Python)."""
    previous = warnings.formatwarning
    warnings.formatwarning = format_warning
    try:
        yield
    finally:
        warnings.formatwarning = previous


def command_threads(args):
    """A context in which a command computes with ``--threads`` threads, or with fewer than one per
    core when other processes keep the cores busy (:func:`bayesmlc.threads.choose_threads`, kept in
    ``args.thread_choice`` for :func:`thread_note`); commands without ``--threads`` get a context that
    changes nothing."""
    if not getattr(args, "choose_threads", False):
        return contextlib.nullcontext()
    from ..threads import choose_threads, use_threads

    args.thread_choice = choose_threads(args.threads)
    return use_threads(args.thread_choice.threads)


def thread_note(args) -> str:
    """``"; 1 thread: ..."`` for a progress line when the command backed off under load, else ``""``."""
    choice = getattr(args, "thread_choice", None)
    if choice is None or choice.reason != "busy":
        return ""
    return (f"; {choice.threads} thread{'s' if choice.threads > 1 else ''}: other processes keep {choice.load:.1f} "
            f"of {choice.cores} cores busy (--threads N to choose)")


def check_training_data(train, n_rows: int, path) -> None:
    """Refuse, before any fitting, training data the CLI cannot use: fewer than
    :data:`MIN_TRAIN_ROWS` rows, or no positive label at all."""
    if n_rows < MIN_TRAIN_ROWS:
        raise CLIError(f"--train {path}: {n_rows} row(s); training needs at least {MIN_TRAIN_ROWS} "
                       "(the propensity-scored metrics need ln N > 1)")
    if train.Y.nnz == 0 and "shard" not in train.source:
        raise CLIError(f"--train {path}: no row has a positive label, so there is nothing to learn")


#: Test sets are scored in blocks of rows of at most this many (rows x labels) entries, so the dense
#: scores, probabilities and predictions of a block stay bounded (about 5,000 rows at the AmazonCat-13K
#: width); every metric but the AUCs is exact over all rows (:class:`bayesmlc.metrics.StreamingEvaluation`).
#: The AUCs need every score of the rows they rank, so above this many entries they are taken on a
#: seeded random subset of MAX_EVALUATION_ENTRIES // labels rows, announced on stderr and recorded as
#: ``auc_rows``.
MAX_EVALUATION_ENTRIES = 1 << 26


def auc_rows(test, source, seed: int = 0):
    """The rows of ``test`` whose scores enter the AUCs: None (every row) up to
    :data:`MAX_EVALUATION_ENTRIES` entries, else a seeded random subset of rows (sorted indices), with
    a notice on stderr naming ``source``."""
    n_rows, n_labels = test.Y.shape
    if n_rows * n_labels <= MAX_EVALUATION_ENTRIES:
        return None
    kept = max(1, MAX_EVALUATION_ENTRIES // n_labels)
    rows = np.sort(np.random.default_rng(seed).choice(n_rows, kept, replace=False))
    print(f"{source}: {n_rows:,} rows x {n_labels:,} labels is more than {MAX_EVALUATION_ENTRIES:,} scores to hold; "
          f"every metric is taken over all rows, the AUCs over {kept:,} rows drawn at random (seed {seed})",
          file=sys.stderr)
    return rows


def evaluate_model(model, test, inv_propensity, auc_subset=None) -> tuple[dict, float, dict]:
    """Metrics of ``model`` on the ``test`` dataset; returns (metrics, predict_seconds, reliability).

    The rows are scored in blocks of at most :data:`MAX_EVALUATION_ENTRIES` entries and the metrics
    pooled over every row (:class:`~bayesmlc.metrics.StreamingEvaluation`); ``auc_subset`` (sorted row
    indices, from :func:`auc_rows`) limits the rows of the AUCs. Entries that ``test.label_mask`` marks
    unobserved are left out of the metrics that take a mask. A metric that is undefined on this data
    (an AUC with one class only) is ``None``. ``predict_seconds`` adds up the blocks' prediction times.
    """
    from ..metrics import StreamingEvaluation

    n_rows, n_labels = test.Y.shape
    stream = StreamingEvaluation(n_labels, inv_propensity=inv_propensity)
    block = max(1, MAX_EVALUATION_ENTRIES // n_labels)
    seconds = 0.0
    for begin in range(0, n_rows, block):
        rows = np.arange(begin, min(begin + block, n_rows))
        X_rows = test.X[rows]
        start = time.perf_counter()
        scores = model.decision_function(X_rows)
        proba = model.predict_proba(X_rows)
        predicted = model.predict(X_rows)
        seconds += time.perf_counter() - start
        in_auc = None if auc_subset is None else np.isin(rows, auc_subset)
        stream.add(test.Y[rows], scores=scores, proba=proba, Y_pred=predicted,
                   label_mask=None if test.label_mask is None else test.label_mask[rows], auc_rows=in_auc)
    return _undefined_as_none(stream.result()), seconds, stream.curves()


def format_metrics_table(values: dict, baseline: dict | None = None, names=("", "")) -> str:
    """One metric per line; with ``baseline``, a second column of its values and a header line
    naming the two columns ``names``."""
    width = max((len(k) for k in values), default=0)
    if baseline is None:
        return "\n".join(f"{key:<{width}}  {value:8.4f}" if value is not None else f"{key:<{width}}  undefined"
                         for key, value in values.items())

    def cell(value):
        return f"{value:9.4f}" if value is not None else f"{'undefined':>9}"

    header = f"{'':<{width}}  {names[0]:>9}  {names[1]:>9}"
    return "\n".join([header] + [f"{key:<{width}}  {cell(value)}  {cell(baseline.get(key))}"
                                  for key, value in values.items()])


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def _write_json(path: Path, payload) -> None:
    """Write ``payload`` as JSON (a temporary file, then a rename)."""
    fd, tmp = make_temporary_file(path.parent, path.name, suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(payload, indent=1, default=_json_default))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise CLIError(f"{path}: corrupt {what} ({str(exc)[:200]})") from None


def _device_name(model) -> str:
    device = getattr(model, "device", None)
    if device is None:
        return "cpu"
    from ..utils import resolve_device

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
#: The models whose ``fit`` takes ``parallel=`` (``--distributed``): MLGPF, and BNMC's batch
#: variational fit (``online=False``, ``inference="variational"``; docs/scaling.md).
DISTRIBUTED_MODELS = ("mlgpf", "bnmc")


def cmd_train(args) -> int:
    parallel = None
    if args.distributed:
        if args.model not in DISTRIBUTED_MODELS:
            raise CLIError(f"--distributed: only --model {' or '.join(DISTRIBUTED_MODELS)} trains data-parallel, "
                           f"not {args.model}")
        from ..distributed import DataParallel

        parallel = DataParallel.from_env()  # under torchrun: RANK, WORLD_SIZE, MASTER_ADDR, ...
    if args.resume and args.model != "mlgpf":
        raise CLIError(f"--resume: only --model mlgpf writes checkpoints, not {args.model}")
    if args.calibration_folds is not None:
        from ..calibration import check_calibration_folds

        check_calibration_folds(args.calibrate, args.calibration_folds)
    if args.preset is not None:  # before any work: an unknown name, or an ensemble where one model is needed
        from ..presets import check_cli_preset

        check_cli_preset(args.model, args.preset, resume=args.resume, distributed=args.distributed)
    try:
        return _train(args, parallel)
    finally:
        if parallel is not None:
            parallel.close()


def _read_training_data(args, parallel, is_main):
    """``(train, test or None, sharded)`` as ``train`` reads them (each rank its shard under
    ``--distributed`` for npz/xc files)."""
    from ..data.io import conform_widths, infer_format, read_dataset, read_train_test

    sharded = parallel is not None and (args.format or infer_format(args.train)) in ("npz", "xc")
    if sharded:  # each rank reads only its rows; rank 0 alone reads the test file
        from ..data.shard import read_shard

        train = read_shard(args.train, parallel, format=args.format)
        test = read_dataset(args.test, format=args.format) if args.test and is_main else None
        if test is not None:
            test = conform_widths(test, train.n_features, train.n_labels, args.test, f"{args.train} has")
    elif args.test:
        train, test = read_train_test(args.train, args.test, format=args.format)
    else:
        train, test = read_dataset(args.train, format=args.format), None
    return train, test, sharded


def _train(args, parallel) -> int:
    from ..metrics import inverse_propensity, inverse_propensity_from_counts

    is_main = parallel is None or parallel.is_main
    quiet = args.quiet or not is_main
    # the output folder first: an unwritable or occupied --out fails before any work is done
    run_dir = RunDirectory(args.out, args.overwrite) if args.out and is_main else None
    try:
        train, test, sharded = _read_training_data(args, parallel, is_main)
        n_rows = train.source["shard"]["n_rows"] if sharded else train.n_samples
        check_training_data(train, n_rows, args.train)
        device = args.device if args.device is not None or parallel is None else str(parallel.device)
        model = build_model(args.model, args.set, args.seed, device, quiet, preset=args.preset)
        if args.calibrate:
            from ..calibration import CalibratedClassifier

            model = CalibratedClassifier(model, method=args.calibrate, cv=args.calibration_folds, random_state=args.seed)
        name = dataset_name(args.train)
        a, b = propensity_constants(name)
        _progress(f"training {args.model} on {name}: {n_rows} rows, {train.n_features} features, "
                  f"{train.n_labels} labels{thread_note(args)}", quiet)
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
        if run_dir is not None:
            model.save(run_dir.path(MODEL_FILE))
            _write_json(run_dir.path(HISTORY_FILE), getattr(model, "history_", {}))
            _write_json(run_dir.path(META_FILE), {
                "model": args.model, "dataset": name, "train_path": str(args.train),
                "params": model.get_params(deep=False), "propensity": {"A": a, "B": b},
                "inv_propensity": inv_prop, "label_names": train.label_names, "feature_names": train.feature_names,
            })
        record = {"model": args.model, "dataset": name, "params": model.get_params(deep=False), "metrics": {},
                  "train_seconds": train_seconds, "predict_seconds": None, "peak_rss_mb": None,
                  "device": _device_name(model)}
        table = f"trained in {train_seconds:.2f} s"
        if test is not None:
            subset = auc_rows(test, args.test)
            record["evaluated_rows"] = test.n_samples
            record["auc_rows"] = test.n_samples if subset is None else int(subset.size)
            values, predict_seconds, reliability = evaluate_model(model, test, inv_prop, subset)
            record["metrics"], record["predict_seconds"] = values, predict_seconds
            table = (f"{args.model} on {name} (train {train_seconds:.2f} s, predict {predict_seconds:.2f} s)\n"
                     + format_metrics_table(values))
            if run_dir is not None:
                _write_json(run_dir.path(METRICS_FILE), values)
                _write_json(run_dir.path(RELIABILITY_FILE), reliability)
        if run_dir is not None:
            run_dir.commit()
            run_dir = None
    finally:
        if run_dir is not None:
            run_dir.discard()
    record["peak_rss_mb"] = peak_rss_mb()
    _emit(args, record, table)
    return EXIT_OK


def _load_model_dir(model_dir):
    """``(model, meta)`` of a ``--model-dir``; meta is ``{}`` when there is no ``meta.json``."""
    from ..base import MultiLabelEstimator

    folder = Path(model_dir)
    if not (folder / MODEL_FILE).exists():
        raise CLIError(f"--model-dir {folder}: no {MODEL_FILE} there (train with --out {folder} first)")
    model = MultiLabelEstimator.load(folder / MODEL_FILE)
    meta = _read_json(folder / META_FILE, META_FILE) if (folder / META_FILE).exists() else {}
    if not isinstance(meta, dict):
        raise CLIError(f"{folder / META_FILE}: corrupt {META_FILE} (not a JSON object)")
    return model, meta


def _names_from_meta(meta: dict, key: str, size: int, folder) -> list | None:
    """The ``label_names``/``feature_names`` of ``meta.json``, escaped for the terminal; ``None`` when
    absent; a CLIError when they are not ``size`` strings."""
    names = meta.get(key)
    if names is None:
        return None
    if not isinstance(names, list) or len(names) != size or not all(isinstance(n, str) for n in names):
        shown = f"{len(names)} entries" if isinstance(names, list) else type(names).__name__
        raise CLIError(f"{Path(folder) / META_FILE}: {key} has {shown}, the model has {size}")
    return [printable(n) for n in names]


def _conform_to_model(data, model, path, labels: bool):
    """``data`` with the model's widths (see :func:`bayesmlc.data.io.conform_widths`): a narrower
    width the reader inferred is padded, a declared one that differs is refused."""
    from ..data.io import conform_widths

    return conform_widths(data, model.n_features_in_, model.n_labels_ if labels else None, path,
                          "the model was trained with")


def cmd_evaluate(args) -> int:
    from ..data.io import read_dataset

    model, meta = _load_model_dir(args.model_dir)
    test = _conform_to_model(read_dataset(args.test, format=args.format), model, args.test, labels=True)
    inv_prop = None
    if "inv_propensity" in meta:
        inv_prop = np.asarray(meta["inv_propensity"])
        if inv_prop.dtype.kind not in "iuf" or inv_prop.shape != (model.n_labels_,):
            raise CLIError(f"{Path(args.model_dir) / META_FILE}: inv_propensity is not {model.n_labels_} numbers")
    subset = auc_rows(test, args.test)
    values, predict_seconds, _ = evaluate_model(model, test, inv_prop, subset)
    record = {"model": meta.get("model", type(model).__name__), "dataset": dataset_name(args.test),
              "params": model.get_params(deep=False), "metrics": values, "train_seconds": None,
              "predict_seconds": predict_seconds, "peak_rss_mb": peak_rss_mb(), "device": _device_name(model),
              "evaluated_rows": test.n_samples, "auc_rows": test.n_samples if subset is None else int(subset.size)}
    _emit(args, record, format_metrics_table(values))
    return EXIT_OK


def cmd_predict(args) -> int:
    from ..data.io import read_dataset

    model, meta = _load_model_dir(args.model_dir)
    names = _names_from_meta(meta, "label_names", model.n_labels_, args.model_dir) if args.names else None
    if args.names and names is None:
        raise CLIError(f"--names: {Path(args.model_dir) / META_FILE} holds no label names")
    data = _conform_to_model(read_dataset(args.input, format=args.format), model, args.input, labels=False)
    stream = _open_output(args.output, "--output") if args.output else sys.stdout  # before the work
    try:
        indices, values = _top_labels(model, data.X, args.top_k, raw_scores=args.scores)
        kind = "score" if args.scores else "probability"
        if not args.json and not args.quiet:
            stream.write(f"# top {indices.shape[1]} labels per row, best first, as label:{kind}"
                         f"{' (raw decision_function scores)' if args.scores else ''}\n")
        for row_idx, row_values in zip(indices, values):
            labels = [names[i] if names else int(i) for i in row_idx]
            if args.json:
                record = {"labels": labels, ("scores" if args.scores else "probabilities"): row_values.tolist()}
                stream.write(json.dumps(record) + "\n")
            else:
                stream.write(" ".join(f"{label}:{value:.6g}" for label, value in zip(labels, row_values)) + "\n")
        if args.output:
            stream.close()
    except OSError as exc:
        if not args.output or isinstance(exc, BrokenPipeError):
            raise
        raise CLIError(f"--output {args.output}: cannot write: {exc.strerror or exc}") from None
    finally:
        if args.output:
            try:
                stream.close()
            except OSError:
                pass
    return EXIT_OK


def _top_labels(model, X, k: int, raw_scores: bool):
    """``(indices, values)``: each row's ``k`` best labels by the model's ranking, with their
    probabilities (``predict_proba``), or with the raw ``decision_function`` scores when
    ``raw_scores``; one batch of rows x L at a time."""
    from ..base import PREDICT_BATCH_ROWS
    from ..utils import iter_batches

    indices, scores = model.predict_topk(X, k)
    if raw_scores:
        return indices, scores
    probabilities = np.empty_like(scores)
    for rows in iter_batches(X.shape[0], PREDICT_BATCH_ROWS):
        proba = np.asarray(model.predict_proba(X[rows]))
        probabilities[rows] = np.take_along_axis(proba, indices[rows], axis=1)
    return indices, probabilities


def _open_output(path, option: str):
    try:
        return open(path, "w")
    except OSError as exc:
        raise CLIError(f"{option} {path}: cannot write: {exc.strerror or exc}") from None


def cmd_info(args) -> int:
    from ..data.io import read_dataset

    if args.presets:
        from ..presets import format_presets, presets_as_dicts

        print(json.dumps(presets_as_dicts()) if args.json else format_presets())
        return EXIT_OK
    if args.path is None:
        raise CLIError("info: give a data file, or --presets")
    dataset = read_dataset(args.path, format=args.format)
    if args.json:
        print(json.dumps(dataset.stats()))
    else:
        print(dataset.summary())
    return EXIT_OK


def cmd_demo(args) -> int:
    from ..data.synthetic import make_multilabel
    from ..metrics import inverse_propensity

    if args.n_samples < DEMO_MIN_SAMPLES:
        raise CLIError(f"--n-samples {args.n_samples}: the demo needs at least {DEMO_MIN_SAMPLES} rows")
    data = make_multilabel(args.n_samples, DEMO_FEATURES, DEMO_LABELS, feature_kind="binary", random_state=args.seed)
    n_test = args.n_samples // 4
    train, test = data.subset(np.arange(n_test, data.n_samples)), data.subset(np.arange(n_test))
    settings = [f"{key}={value!r}" for key, value in DEMO_SETTINGS.get(args.model, {}).items()] + (args.set or [])
    model = build_model(args.model, settings, args.seed, args.device, args.quiet)
    shape = (f"{train.n_samples} train / {test.n_samples} test rows, {data.n_features} features, "
             f"{data.n_labels} labels")
    _progress(f"demo: {args.model} on synthetic data ({shape}){thread_note(args)}", args.quiet)
    start = time.perf_counter()
    model.fit(train.X, train.Y)
    train_seconds = time.perf_counter() - start
    inv_prop = inverse_propensity(train.Y)
    values, predict_seconds, _ = evaluate_model(model, test, inv_prop)
    baseline = label_frequency_baseline(train.Y, test, inv_prop)
    record = {"model": args.model, "dataset": "synthetic-demo", "params": model.get_params(deep=False),
              "metrics": values, "baseline_metrics": baseline, "train_seconds": train_seconds,
              "predict_seconds": predict_seconds, "peak_rss_mb": peak_rss_mb(), "device": _device_name(model)}
    table = (f"{args.model} on synthetic demo data: {shape} (train {train_seconds:.2f} s, predict "
             f"{predict_seconds:.2f} s)\nbaseline: every row gets the labels ranked by their training frequency, "
             "with that frequency as the probability\n"
             + format_metrics_table(values, baseline, (args.model, "baseline")))
    _emit(args, record, table)
    return EXIT_OK


def label_frequency_baseline(train_Y, test, inv_propensity) -> dict:
    """Metrics of the trivial predictor that ranks every row's labels by their frequency in
    ``train_Y`` and gives that frequency as each label's probability; ``None`` where undefined."""
    from .. import metrics

    frequency = np.asarray(train_Y.mean(axis=0), dtype=np.float64).ravel()
    proba = np.broadcast_to(frequency, (test.n_samples, frequency.size))
    return _undefined_as_none(metrics.evaluate(test.Y, scores=proba, proba=proba, Y_pred=proba > 0.5,
                                               inv_propensity=inv_propensity, label_mask=test.label_mask))


def _undefined_as_none(values: dict) -> dict:
    """Metric values as floats, with ``None`` for an undefined (NaN) one, as the JSON record has them."""
    return {key: (None if np.isnan(value) else float(value)) for key, value in values.items()}


def cmd_topics(args) -> int:
    from ..bmls.topics import format_topics

    model, meta = _load_model_dir(args.model_dir)
    if not hasattr(model, "topics"):
        raise CLIError(f"--model-dir {args.model_dir}: holds a {type(model).__name__}; topics exist only for bmls")
    label_names = _names_from_meta(meta, "label_names", model.n_labels_, args.model_dir)
    feature_names = _names_from_meta(meta, "feature_names", model.n_features_in_, args.model_dir)
    print(format_topics(model, args.n_top, label_names, feature_names))
    return EXIT_OK


def cmd_plot_history(args) -> int:
    from ..gp.plotting import plot_history

    folder = Path(args.model_dir)
    history_path = folder / HISTORY_FILE
    if not history_path.exists():
        raise CLIError(f"--model-dir {folder}: no {HISTORY_FILE} there")
    output = Path(args.output) if args.output else folder / "history.png"
    history = _read_json(history_path, HISTORY_FILE)
    if not isinstance(history, dict):
        raise CLIError(f"{history_path}: corrupt {HISTORY_FILE} (not a JSON object)")
    meta = _read_json(folder / META_FILE, META_FILE) if (folder / META_FILE).exists() else {}
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
    from ..bench.cli import run

    return run(args)


# ---- parser ----------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``bayesmlc train: error: ...``), exit code 2."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {printable(' '.join(message.split()))} "
                              f"(see {self.prog} --help)\n")


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps descriptions to the terminal but keeps an epilog of examples line by line, so that an
    example command stays on one line and can be copied."""

    def _fill_text(self, text, width, indent):
        if text.startswith("example"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from ..models import MODEL_CLASSES

    parser = _Parser(prog="bayesmlc", description="Bayesian multi-label classification at scale",
                     epilog="start with 'bayesmlc demo'; 'bayesmlc COMMAND --help' lists a command's options "
                            "and gives an example")
    parser.add_argument("--version", action="version", version=f"bayesmlc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, help, example, description=None):
        return sub.add_parser(name, help=help, description=description or help[0].upper() + help[1:] + ".",
                              epilog="example:\n  " + example, formatter_class=_HelpFormatter)

    def common(p, model=True, data=True):
        p.add_argument("--json", action="store_true",
                       help="print one JSON object as the last line of stdout (default: a table)")
        p.add_argument("--quiet", action="store_true", help="no progress output on stderr (default: progress shown)")
        if data:
            p.add_argument("--format", default=None,
                           help="input format: xc, arff, svmlight, mat or npz (default: from the file extension)")
        if model:
            p.add_argument("--set", action="append", metavar="KEY=VALUE",
                           help="a model parameter, repeatable (default: the model's own)")
            p.add_argument("--seed", type=_non_negative_int, default=0, help="random_state of the model (default 0)")
            p.add_argument("--device", default=None, help="auto, cpu or cuda (default: the model's)")
        p.add_argument("--threads", type=_thread_count, default=None, metavar="N",
                       help="CPU threads (default: one per idle core, fewer when other processes keep the cores busy)")
        p.set_defaults(choose_threads=True)

    p = command("train", "fit a model, optionally score a test file",
                "bayesmlc train --model logistic --train train.txt --test test.txt --set C=4 --out runs/lr")
    p.add_argument("--model", required=True, choices=sorted(MODEL_CLASSES), help="model to fit (required)")
    p.add_argument("--train", required=True, metavar="FILE", help="training data file (required)")
    p.add_argument("--test", metavar="FILE", help="test data file; its metrics are printed (default: none)")
    p.add_argument("--out", metavar="DIR",
                   help="folder for the model, history and metrics, written whole or not at all (default: not saved)")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in --out (default: refuse)")
    p.add_argument("--distributed", action="store_true",
                   help="data-parallel training under torchrun (mlgpf, bnmc; see docs/scaling.md; default: one process)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the model's checkpoint (mlgpf: --set checkpoint_path=...; default: start afresh)")
    p.add_argument("--preset", metavar="NAME",
                   help="a named configuration of the model: fast, paper or best (default: none, the model's "
                        "defaults); --set overrides its values; 'bayesmlc info --presets' lists them with "
                        "their measured figures")
    p.add_argument("--calibrate", choices=("isotonic", "temperature", "platt"),
                   help="fit on 80%% of the training rows and recalibrate the probabilities on the other 20%% "
                        "(bayesmlc.calibration.CalibratedClassifier; default: not recalibrated)")
    p.add_argument("--calibration-folds", type=int, metavar="K",
                   help="with --calibrate: fit the maps on K-fold held-out predictions (every row held out once) "
                        "and train the model on all rows, K + 1 fits (default: one 80/20 split)")
    common(p)
    p.set_defaults(func=cmd_train)

    p = command("evaluate", "score a saved model on a test file",
                "bayesmlc evaluate --model-dir runs/lr --test test.txt --json")
    p.add_argument("--model-dir", required=True, metavar="DIR", help="folder written by 'train --out' (required)")
    p.add_argument("--test", required=True, metavar="FILE", help="test data file (required)")
    common(p, model=False)
    p.set_defaults(func=cmd_evaluate)

    p = command("predict", "top-k labels per row of a file",
                "bayesmlc predict --model-dir runs/lr --input test.txt --top-k 5 --names",
                description="Print each row's top-k labels with their probabilities (predict_proba): a '#' "
                            "header line, then 'label:probability ...' per row, best first. --scores prints "
                            "the raw decision_function scores instead; --json prints one JSON object per row "
                            "({\"labels\": [...], \"probabilities\": [...]}) and no header; --quiet drops "
                            "the header.")
    p.add_argument("--model-dir", required=True, metavar="DIR", help="folder written by 'train --out' (required)")
    p.add_argument("--input", required=True, metavar="FILE", help="data file to predict, any supported format (required)")
    p.add_argument("--top-k", type=_positive_int, default=5, metavar="K", help="labels printed per row (default 5)")
    p.add_argument("--output", metavar="FILE", help="write here (default: stdout)")
    p.add_argument("--names", action="store_true", help="print label names (default: label indices)")
    p.add_argument("--scores", action="store_true",
                   help="print raw decision_function scores (default: probabilities from predict_proba)")
    common(p, model=False)
    p.set_defaults(func=cmd_predict)

    p = command("info", "statistics of a data file, or the model presets", "bayesmlc info train.txt --json")
    p.add_argument("path", nargs="?", metavar="FILE",
                   help="data file, any supported format (required unless --presets)")
    p.add_argument("--presets", action="store_true",
                   help="list the presets of every model with their measured figures (default: off)")
    common(p, model=False)
    p.set_defaults(func=cmd_info)

    settings = "; ".join(f"{name}: {', '.join(f'{k}={v}' for k, v in values.items())}"
                         for name, values in DEMO_SETTINGS.items())
    p = command("demo", "train on built-in synthetic data and print its metrics beside a trivial baseline's",
                "bayesmlc demo --model bmls --n-samples 4000",
                description=f"Train a model on synthetic data ({DEMO_FEATURES} binary features, {DEMO_LABELS} labels, "
                            "a quarter of the rows held out) and print its test metrics beside those of "
                            "ranking every row's labels by their training frequency. The demo's "
                            f"settings, which --set overrides: {settings}.")
    p.add_argument("--model", default="mlgpf", choices=sorted(MODEL_CLASSES),
                   help="model to train (default mlgpf; logistic is the baseline)")
    p.add_argument("--n-samples", type=_positive_int, default=2000, metavar="N",
                   help=f"rows of synthetic data, a quarter of them for testing (default 2000, at least {DEMO_MIN_SAMPLES})")
    common(p, data=False)
    p.set_defaults(func=cmd_demo)

    p = command("topics", "top labels and features per BMLS topic", "bayesmlc topics --model-dir runs/bmls --n-top 10")
    p.add_argument("--model-dir", required=True, metavar="DIR",
                   help="folder written by 'train --model bmls --out' (required)")
    p.add_argument("--n-top", type=_positive_int, default=5, metavar="N", help="labels and features per topic (default 5)")
    p.set_defaults(func=cmd_topics)

    p = command("plot-history", "plot a model's training history to PNG",
                "bayesmlc plot-history --model-dir runs/mlgpf --output mlgpf-history.png")
    p.add_argument("--model-dir", required=True, metavar="DIR", help="folder written by 'train --out' (required)")
    p.add_argument("--output", metavar="PNG", help="PNG path (default DIR/history.png)")
    p.set_defaults(func=cmd_plot_history)

    try:
        from ..bench.cli import add_arguments
    except ImportError:
        add_arguments = None
    if add_arguments is not None:
        p = command("bench", "run a benchmark suite and write a report with plots",
                    "bayesmlc bench --suite quick --out runs/bench-quick")
        add_arguments(p)
        p.set_defaults(func=cmd_bench)
    return parser


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0 is not positive")
    return value


def _thread_count(text: str) -> int:
    value = _positive_int(text)
    if value > max_threads():
        raise argparse.ArgumentTypeError(f"{value}: {_too_many_threads()}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def describe_error(exc: BaseException) -> tuple[int, str]:
    """``(exit code, one-line message)`` for an exception that ends a command."""
    if isinstance(exc, (CLIError, BayesMLCError)):
        message = str(exc)
    elif isinstance(exc, OSError) and exc.strerror:
        names = [n for n in (exc.filename, exc.filename2) if n is not None]
        message = exc.strerror + (": " + " -> ".join(str(n) for n in names) if names else "")
    elif isinstance(exc, MemoryError):
        message = f"out of memory{': ' + str(exc) if str(exc) else ''}"
    elif isinstance(exc, RecursionError):
        message = f"input nested too deeply ({exc})"
    elif isinstance(exc, (OSError, ValueError, ArithmeticError)) or _is_linalg_error(exc):
        # ValueError: bad values in arguments or data; ArithmeticError: training diverged (MLGPF's
        # TrainingDivergedError); a linear-algebra error: a kernel matrix lost positive definiteness
        message = f"{type(exc).__name__}: {exc}" if type(exc).__name__ not in ("ValueError", "OSError") else str(exc)
    else:
        return EXIT_INTERNAL, (f"unexpected {type(exc).__name__}: {exc} (a bug in bayesmlc; "
                               "set BAYESMLC_TRACEBACK=1 to see where)")
    return EXIT_USAGE, message


def _is_linalg_error(exc: BaseException) -> bool:
    if type(exc).__name__ in ("CholeskyError", "LinAlgError", "_LinAlgError"):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(exc, torch.linalg.LinAlgError)


def _exit_interrupted() -> None:
    """End the process with exit code 130 after its exit handlers have run.

    Returning 130 through interpreter shutdown is not enough: a second Ctrl-C while Python finalises
    (or a KeyboardInterrupt that the interpreter has already recorded as unhandled) makes CPython kill
    itself with SIGINT instead, so a script sees -2 rather than the documented 130. Later interrupts
    are ignored; the exit handlers (temporary folders, progress bars) still run."""
    import atexit
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    finally:
        os._exit(EXIT_INTERRUPTED)


def main(argv=None) -> int:
    """Run one command; returns the exit code (see the module docstring). Every failure is one line
    on stderr."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with one_line_warnings(), command_threads(args):
            code = args.func(args)
        sys.stdout.flush()  # a full disk or a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:
        # the reader closed the pipe (``bayesmlc predict ... | head``): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        print("bayesmlc: interrupted", file=sys.stderr)
        if argv is None:  # the process's own command line: end it here, with the documented code
            _exit_interrupted()
        return EXIT_INTERRUPTED
    except Exception as exc:
        if os.environ.get("BAYESMLC_TRACEBACK"):
            raise
        code, message = describe_error(exc)
        print(f"bayesmlc: error: {printable(' '.join(message.split()))}", file=sys.stderr)
        return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
