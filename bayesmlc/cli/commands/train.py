"""``bayesmlc train``: fit a model on a data file, optionally score a test file, optionally write the
run folder (``--out``, :class:`~bayesmlc.cli.run_directory.RunDirectory`: whole or not at all)."""

from __future__ import annotations

import time

from ...evaluation import evaluate_model, format_metrics_table, propensity_constants
from ...exceptions import ValidationError
from ...parameters import parse_set_values
from ..errors import EXIT_OK, CLIError
from ..output import device_name, emit, peak_rss_mb, progress, write_json
from ..run_directory import HISTORY_FILE, META_FILE, METRICS_FILE, MODEL_FILE, RELIABILITY_FILE, RunDirectory
from ..threads import max_threads, thread_note, too_many_threads
from .data_files import announce_auc_rows, dataset_name
from .risk import format_risk, risk_record, wrap_for_risk

#: rows the CLI needs to train: the inverse propensities of the metrics need ln N > 1
MIN_TRAIN_ROWS = 3
#: The models whose ``fit`` takes ``parallel=`` (``--distributed``): MLGPF, and BNMC's batch
#: variational fit (``online=False``, ``inference="variational"``; docs/scaling.md).
DISTRIBUTED_MODELS = ("mlgpf", "bnmc")


def check_model_installed(name: str) -> None:
    """Refuse ``--model name`` when it needs an optional package (the ``[compare]`` extra) that this
    installation lacks: a CLIError before any data is read."""
    from ...models import missing_optional_package

    reason = missing_optional_package(name)
    if reason is not None:
        raise CLIError(f"--model {name}: {reason}")


def build_model(name: str, settings, seed, device, quiet: bool, preset: str | None = None):
    """The estimator ``--model name`` with ``--set`` values (over the named ``--preset``'s, if any)."""
    from ...models import get_model_class

    check_model_installed(name)
    cls = get_model_class(name)
    valid = cls().get_params(deep=False)
    try:
        params = parse_set_values(settings, valid.keys())
    except ValidationError as exc:
        raise CLIError(f"--set {exc}") from None
    if seed is not None and "random_state" in valid:
        params.setdefault("random_state", seed)
    if device is not None and "device" in valid:
        params.setdefault("device", device)
    if "verbose" in valid:
        params.setdefault("verbose", not quiet)
    threads = params.get("n_threads")
    if isinstance(threads, int) and not isinstance(threads, bool) and threads > max_threads():
        raise CLIError(f"--set n_threads={threads}: {too_many_threads()}")
    if preset is not None:
        from ...presets import build_preset

        return build_preset(name, preset, params)
    return cls(**params)


def check_training_data(train, n_rows: int, path) -> None:
    """Refuse, before any fitting, training data the CLI cannot use: fewer than
    :data:`MIN_TRAIN_ROWS` rows, or no positive label at all."""
    if n_rows < MIN_TRAIN_ROWS:
        raise CLIError(f"--train {path}: {n_rows} row(s); training needs at least {MIN_TRAIN_ROWS} "
                       "(the propensity-scored metrics need ln N > 1)")
    if train.Y.nnz == 0 and "shard" not in train.source:
        raise CLIError(f"--train {path}: no row has a positive label, so there is nothing to learn")


def cmd_train(args) -> int:
    check_model_installed(args.model)
    parallel = None
    if args.distributed:
        if args.model not in DISTRIBUTED_MODELS:
            raise CLIError(f"--distributed: only --model {' or '.join(DISTRIBUTED_MODELS)} trains data-parallel, "
                           f"not {args.model}")
        from ...distributed import DataParallel

        parallel = DataParallel.from_env()  # under torchrun: RANK, WORLD_SIZE, MASTER_ADDR, ...
    if args.risk is not None and args.distributed:
        raise CLIError("--risk: not with --distributed (the threshold is calibrated in one process)")
    if args.resume and args.model != "mlgpf":
        raise CLIError(f"--resume: only --model mlgpf writes checkpoints, not {args.model}")
    if args.calibration_folds is not None:
        from ...calibration import check_calibration_folds

        check_calibration_folds(args.calibrate, args.calibration_folds)
    if args.preset is not None:  # before any work: an unknown name, or an ensemble where one model is needed
        from ...presets import check_cli_preset

        check_cli_preset(args.model, args.preset, resume=args.resume, distributed=args.distributed)
    try:
        return _train(args, parallel)
    finally:
        if parallel is not None:
            parallel.close()


def _read_training_data(args, parallel, is_main):
    """``(train, test or None, sharded)`` as ``train`` reads them (each rank its shard under
    ``--distributed`` for npz/xc files)."""
    from ...data.io import conform_widths, infer_format, read_dataset, read_train_test

    sharded = parallel is not None and (args.format or infer_format(args.train)) in ("npz", "xc")
    if sharded:  # each rank reads only its rows; rank 0 alone reads the test file
        from ...data.shard import read_shard

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
    is_main = parallel is None or parallel.is_main
    quiet = args.quiet or not is_main
    # the output folder first: an unwritable or occupied --out fails before any work is done
    run_dir = RunDirectory(args.out, args.overwrite) if args.out and is_main else None
    try:
        train, test, sharded = _read_training_data(args, parallel, is_main)
        n_rows = train.source["shard"]["n_rows"] if sharded else train.n_samples
        check_training_data(train, n_rows, args.train)
        model = _training_model(args, parallel, quiet)
        name = dataset_name(args.train)
        progress(f"training {args.model} on {name}: {n_rows} rows, {train.n_features} features, "
                 f"{train.n_labels} labels{thread_note(args)}", quiet)
        fit_params = {"parallel": parallel} if parallel is not None else {}
        if args.resume:
            fit_params["resume"] = True
        start = time.perf_counter()
        model.fit(train.X, train.Y, label_mask=train.label_mask, **fit_params)
        train_seconds = time.perf_counter() - start
        constants = args.propensity or propensity_constants(train)
        inv_prop = _inverse_propensity(model, train, n_rows, sharded, constants)
        if not is_main:  # rank 0 alone evaluates, writes and prints
            return EXIT_OK
        record = {"model": args.model, "dataset": name, "params": model.get_params(deep=False), "metrics": {},
                  "train_seconds": train_seconds, "predict_seconds": None, "peak_rss_mb": None,
                  "device": device_name(model), "threads": _threads_used(args, model)}
        if args.risk is not None:
            record["risk_control"] = risk_record(model, test)
        if run_dir is not None:
            _write_model(run_dir, args, model, train, name, constants, inv_prop)
        else:
            progress("the model is not kept: give --out DIR to save it", quiet)
        table = f"trained in {train_seconds:.2f} s"
        if test is not None:
            table = _score_test_set(args, model, test, inv_prop, record, run_dir)
        if record.get("risk_control"):
            table += "\n" + format_risk(record["risk_control"])
        if run_dir is not None:
            run_dir.commit()
            run_dir = None
    finally:
        if run_dir is not None:
            run_dir.discard()
    record["peak_rss_mb"] = peak_rss_mb()
    emit(args, record, table)
    return EXIT_OK


def _threads_used(args, model) -> int | None:
    """The CPU threads the fit ran with: the model's own ``n_threads`` when set, else the command's
    (``--threads``, or one per idle core)."""
    own = model.get_params(deep=False).get("n_threads")
    choice = getattr(args, "thread_choice", None)
    return own if isinstance(own, int) else (choice.threads if choice is not None else None)


def _training_model(args, parallel, quiet: bool):
    """The estimator to fit: ``--model`` with its settings, wrapped for ``--calibrate``."""
    device = args.device if args.device is not None or parallel is None else str(parallel.device)
    model = build_model(args.model, args.set, args.seed, device, quiet, preset=args.preset)
    if args.calibrate:
        from ...calibration import CalibratedClassifier

        model = CalibratedClassifier(model, method=args.calibrate, cv=args.calibration_folds, random_state=args.seed)
    return wrap_for_risk(args, model)


def _inverse_propensity(model, train, n_rows: int, sharded: bool, constants):
    """Jain et al.'s inverse propensities of the training labels with constants (A, B); a shard sees
    only its rows, so then from the label counts the fit summed over the ranks."""
    from ...metrics import inverse_propensity, inverse_propensity_from_counts

    a, b = constants
    if sharded:
        return inverse_propensity_from_counts(model.label_frequencies_, n_rows, A=a, B=b)
    return inverse_propensity(train.Y, A=a, B=b)


def _write_model(run_dir, args, model, train, name: str, constants, inv_prop) -> None:
    """The model file, its training history and ``meta.json`` into the run folder."""
    model.save(run_dir.path(MODEL_FILE))
    write_json(run_dir.path(HISTORY_FILE), getattr(model, "history_", {}))
    write_json(run_dir.path(META_FILE), {
        "model": args.model, "dataset": name, "train_path": str(args.train),
        "params": model.get_params(deep=False), "propensity": {"A": constants[0], "B": constants[1]},
        "inv_propensity": inv_prop, "label_names": train.label_names, "feature_names": train.feature_names,
    })


def _score_test_set(args, model, test, inv_prop, record: dict, run_dir) -> str:
    """Score ``--test`` into ``record`` (and the run folder's metrics and reliability files);
    returns the table to print."""
    result = evaluate_model(model, test, inv_prop, announce_auc_rows(test, args.test))
    record.update(metrics=result.metrics, predict_seconds=result.predict_seconds, evaluated_rows=test.n_samples,
                  auc_rows=result.auc_rows)
    if run_dir is not None:
        write_json(run_dir.path(METRICS_FILE), result.metrics)
        write_json(run_dir.path(RELIABILITY_FILE), result.reliability)
    return (f"{args.model} on {record['dataset']} (train {record['train_seconds']:.2f} s, predict "
            f"{result.predict_seconds:.2f} s)\n" + format_metrics_table(result.metrics))
