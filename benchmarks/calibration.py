"""Calibration at the top: raw and isotonic-recalibrated ECE@1, ECE@5 and AURC of bayesmlc's models and
the baselines, on the five small real sets and bibtex_xc, through the bench harness.

Every configuration runs twice in its own process (``bayesmlc train ... --json``): raw on the whole
training file, and wrapped in ``CalibratedClassifier(method="isotonic")`` (fitted on 80% of the training
rows, calibrated on the other 20%). The bayesmlc models use the quick suite's settings. Each record gets
the child process's CPU seconds (``cpu_seconds``, from ``getrusage(RUSAGE_CHILDREN)``) beside the wall
seconds the CLI reports. Writes OUT/results.jsonl, OUT/report.md and OUT/plots/, and prints a table.

    PYTHONPATH=$PWD python benchmarks/calibration.py --out /tmp/calibration-bench [--datasets ...] [--models ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import sys
from pathlib import Path

from bayesmlc.bench.plots import make_plots
from bayesmlc.bench.report import summarise, write_report
from bayesmlc.bench.runner import CLIRunner, run_suite
from bayesmlc.bench.suites import _BASELINES, QUICK_SETTINGS, SMALL_SET_NAMES, DatasetSpec, Suite

BASELINES = ("logistic", "knn", "napkinxc_plt", "omikuji_parabel")
SUITE = Suite(
    "calibration",
    "the five small real sets and bibtex_xc; the quick suite's settings; the baselines",
    tuple(DatasetSpec(name) for name in SMALL_SET_NAMES + ("bibtex_xc",)),
    tuple(config for config in _BASELINES if config.model in BASELINES) + QUICK_SETTINGS,
    timeout_s=1200.0,
)


class TimedCLIRunner(CLIRunner):
    """:class:`CLIRunner` that adds the child's CPU seconds (user + system) to its record."""

    def __call__(self, spec, run_dir):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        record = super().__call__(spec, run_dir)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        record["cpu_seconds"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="calibration-bench")
    parser.add_argument("--datasets", nargs="+")
    parser.add_argument("--models", nargs="+")
    parser.add_argument("--methods", nargs="+", default=["isotonic"])
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    out = Path(args.out)
    records = run_suite(SUITE, out, datasets=args.datasets, models=args.models, threads=1, resume=args.resume,
                        run_one=TimedCLIRunner(threads=1), calibrate=tuple(args.methods))
    plots = make_plots(records, out)
    command = "PYTHONPATH=$PWD python benchmarks/calibration.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    report = write_report(records, out, suite=SUITE.name, plots=plots, command=command)
    print(f"report: {report}")
    header = f"{'dataset':<10} {'model':<28} {'P@1':>6} {'ECE@1':>7} {'ECE@5':>7} {'AURC':>7} {'train s':>8} {'cpu s':>7}"
    print(header)
    for summary in summarise(records):
        if not summary.records:
            continue
        values = [summary.median(key) for key in ("P@1", "ECE@1", "ECE@5", "AURC", "train_seconds", "cpu_seconds")]
        cells = [f"{v:.4f}" if v is not None else "-" for v in values[:4]] + [
            f"{v:.1f}" if v is not None else "-" for v in values[4:]]
        print(f"{summary.dataset:<10} {summary.label:<28} " + " ".join(f"{c:>7}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
