"""``bayesmlc bench``: run a suite, then write ``results.jsonl``, ``report.md`` and ``plots/*.png``.

Exit status: 0 when every run finished or was skipped (an optional package not installed, a model
not landed), 1 when some run failed or timed out (the report lists them), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import math
import shlex
import shutil
import sys
import time
from pathlib import Path

from ..cli.threads import max_threads, too_many_threads
from ..exceptions import BayesMLCError
from .report import splice_into_document
from .runner import RESULTS_FILE, read_results, run_suite
from .suites import SUITES, get_suite
from .user_data import add_user_datasets

__all__ = ["add_arguments", "run", "main"]


#: seeds are handed to NumPy and scikit-learn, whose ``random_state`` takes 0 to 2**32 - 1
MAX_SEED = 2**32 - 1


def _integer(text: str, low: int, high: int | None = None, why: str = "") -> int:
    """``text`` as an integer in [``low``, ``high``]; an argparse error (one line, exit 2) otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low or (high is not None and value > high):
        raise argparse.ArgumentTypeError(why or f"{value} is outside [{low}, {high if high is not None else 'inf'}]")
    return value


def _seed(text: str) -> int:
    return _integer(text, 0, MAX_SEED, f"{text} is not a seed (an integer in [0, {MAX_SEED}])")


def _repeats(text: str) -> int:
    return _integer(text, 1, why=f"{text}: at least 1 run per configuration")


def _threads(text: str) -> int:
    value = _integer(text, 1, why=f"{text}: at least 1 thread")
    if value > max_threads():
        raise argparse.ArgumentTypeError(f"{value}: {too_many_threads()}")
    return value


def _seconds(text: str) -> float:
    """A positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text}: a timeout must be a positive, finite number of seconds")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench`` options, added to ``parser``."""
    parser.add_argument("--suite", required=True, choices=sorted(SUITES), help="which suite to run")
    parser.add_argument("--datasets", nargs="+", metavar="NAME", help="only these datasets of the suite")
    parser.add_argument("--models", nargs="+", metavar="NAME", help="only these models of the suite; "
                        "NAME:CONFIG for one configuration of a model (mlgpf:default)")
    parser.add_argument("--dataset", action="append", metavar="NAME=TRAIN[,TEST]", default=[],
                        help="also run on your own files (repeatable; without TEST, 20%% of TRAIN's rows are held "
                             "out by --seed); add --datasets NAME to run on yours alone")
    parser.add_argument("--repeats", type=_repeats, default=1, help="runs per configuration, seeds seed..seed+n-1 (default 1)")
    parser.add_argument("--out", help="output folder (default: bench-SUITE)")
    parser.add_argument("--data-root", help="folder of the real datasets, one folder per set (default: the data root, "
                        "$BAYESMLC_DATA, else ~/.cache/bayesmlc)")
    parser.add_argument("--seed", type=_seed, default=0, help="seed of the first repeat (default 0)")
    parser.add_argument("--threads", type=_threads, help="threads per run, via OMP_NUM_THREADS and friends (default: each run "
                        "takes one per idle core when it starts, fewer when other processes keep the cores busy)")
    parser.add_argument("--device", help="--device passed to every run (default: each model's own)")
    parser.add_argument("--timeout", type=_seconds, help="seconds per run (default: the suite's and configuration's)")
    parser.add_argument("--calibrate", nargs="+", metavar="METHOD", default=(),
                        help="also run every configuration recalibrated (isotonic, temperature, platt), side by side")
    parser.add_argument("--calibration-folds", type=int, metavar="K",
                        help="with --calibrate: fit the maps on K-fold held-out predictions (every training row held "
                             "out once) and train the model on all rows, K + 1 fits (default: one 80/20 split)")
    parser.add_argument("--bands", action="store_true",
                        help="also split P@k, PSP@k and recall@k of every finished run into label-frequency bands "
                             "(deciles of training frequency, head to tail; reloads each saved model to rank the test rows)")
    parser.add_argument("--risk-control", action="store_true",
                        help="also measure every finished run's label sets at recall 0.9, precision 0.9 and selective "
                             "top-1 accuracy 0.9 (conformal risk control, Learn then Test) on random halves of the test "
                             "rows, and ECE@k's noise floor (reloads each saved model; docs/risk-control.md)")
    parser.add_argument("--resume", action="store_true", help="keep finished runs of OUT/results.jsonl, rerun the rest")
    parser.add_argument("--report-only", action="store_true", help="rebuild report and plots from OUT/results.jsonl")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--doc", metavar="MARKDOWN",
                        help="also write the report into this markdown file, between the suite's markers "
                             "(e.g. docs/benchmarks-quick.md), with the plots copied to benchmarks-SUITE/ beside it")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _command_line(args) -> str:
    parts = ["bayesmlc", "bench", "--suite", args.suite]
    for option in ("datasets", "models"):
        if getattr(args, option):
            parts += [f"--{option}"] + list(getattr(args, option))
    for argument in getattr(args, "dataset", None) or ():
        parts += ["--dataset", argument]
    if args.repeats != 1:
        parts += ["--repeats", str(args.repeats)]
    if getattr(args, "calibrate", None):
        parts += ["--calibrate"] + list(args.calibrate)
    if getattr(args, "calibration_folds", None) is not None:
        parts += ["--calibration-folds", str(args.calibration_folds)]
    if getattr(args, "bands", False):
        parts.append("--bands")
    if getattr(args, "risk_control", False):
        parts.append("--risk-control")
    for option, flag in (("seed", "--seed"), ("threads", "--threads"), ("device", "--device"), ("timeout", "--timeout")):
        value = getattr(args, option)
        if value is not None and not (option == "seed" and value == 0):
            parts += [flag, str(value)]
    parts += ["--out", str(args.out)]
    return shlex.join(parts)


def run(args) -> int:
    """Run ``bayesmlc bench`` with parsed ``args``; returns the exit status."""
    from ..calibration import check_calibration_folds
    from .plots import PLOTS_DIR, make_plots
    from .report import write_report

    suite = get_suite(args.suite)
    args.out = args.out or f"bench-{suite.name}"
    out = Path(args.out)
    log = (lambda message: None) if args.quiet else (lambda message: print(message, file=sys.stderr, flush=True))
    start = time.perf_counter()
    try:
        check_calibration_folds(getattr(args, "calibrate", ()), getattr(args, "calibration_folds", None))
        if args.report_only:
            if not (out / RESULTS_FILE).exists():
                print(f"bayesmlc bench: error: --report-only: no {out / RESULTS_FILE}", file=sys.stderr)
                return 2
            records = read_results(out / RESULTS_FILE)
        else:
            suite = add_user_datasets(suite, getattr(args, "dataset", None), out, args.seed)
            records = run_suite(
                suite, out, datasets=args.datasets, models=args.models, repeats=args.repeats, seed=args.seed,
                data_root=args.data_root, threads=args.threads, device=args.device, timeout_s=args.timeout,
                resume=args.resume, log=log, calibrate=getattr(args, "calibrate", ()),
                calibration_folds=getattr(args, "calibration_folds", None), bands=getattr(args, "bands", False),
                risk_control=getattr(args, "risk_control", False),
            )
    except BayesMLCError as exc:
        print(f"bayesmlc bench: error: {exc}", file=sys.stderr)
        return 2
    plots = {} if args.no_plots else make_plots(records, out, quality=suite.quality)
    report = write_report(records, out, suite=suite.name, quality=suite.quality, plots=plots,
                          command=_command_line(args))
    if args.doc:
        _write_into_document(Path(args.doc), suite.name, report, None if args.no_plots else out / PLOTS_DIR)
    counts = {}
    for record in records:
        counts[record.get("status")] = counts.get(record.get("status"), 0) + 1
    log(f"{len(records)} runs ({', '.join(f'{n} {status}' for status, n in sorted(counts.items()))}) "
        f"in {time.perf_counter() - start:.0f} s; report: {report}")
    return 1 if counts.get("failed") or counts.get("timeout") else 0


def _write_into_document(document: Path, suite: str, report: Path, plots: Path | None) -> None:
    """Splice ``report`` into ``document`` and replace ``benchmarks-SUITE/`` beside it with ``plots``
    (``None``, as with ``--no-plots``: the folder is left as it is, since the report links no plots)."""
    folder_name = f"benchmarks-{suite}"
    folder = document.parent / folder_name
    if plots is not None:
        if folder.exists():
            shutil.rmtree(folder)
        if plots.is_dir():
            shutil.copytree(plots, folder)
    text = document.read_text(encoding="utf-8") if document.exists() else "# Benchmarks\n"
    text = splice_into_document(text, suite, report.read_text(encoding="utf-8"), plots_folder=folder_name)
    document.write_text(text, encoding="utf-8")


def main(argv=None) -> int:
    """``python -m bayesmlc.bench ...``."""
    parser = argparse.ArgumentParser(prog="bayesmlc bench", description="run a benchmark suite")
    add_arguments(parser)
    return run(parser.parse_args(argv))
