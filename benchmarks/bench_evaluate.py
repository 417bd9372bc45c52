"""``bayesmlc evaluate`` against one ``predict_proba`` call on the same test rows.

Usage (from the repository root)::

    PYTHONPATH=. python benchmarks/bench_evaluate.py --folder /tmp/bench-evaluate --scale 0.25
    PYTHONPATH=. python benchmarks/bench_evaluate.py --folder /tmp/bench-evaluate --models bnmc --repeats 5

The data is the bench harness's synthetic EURLex-4K shape (``bayesmlc.bench.runner.write_synthetic``:
``make_shape("eurlex-4k", scale)``, 20 % of the rows held out, seed 0), written to ``--folder``
once. Each model is trained once through ``bayesmlc train --out`` with short settings (MLGPF 2
epochs, BNMC 1 pass: what is timed is prediction, which does not depend on how long the model
trained) and kept in ``--folder``. Then, ``--repeats`` times and alternately: the whole ``bayesmlc
evaluate --model-dir ... --test ...`` command, run in this process (reading the test file, loading
the model, scoring, every metric), and one ``predict_proba`` of the test rows on the loaded model,
all with ``--threads`` threads; also ``score_and_proba(X, return_labels=True)`` (the scoring alone),
:func:`bayesmlc.evaluation.evaluate_model` on the loaded model (the command without reading the file
and loading the model: the scoring and every metric), and the three
calls ``decision_function``, ``predict_proba`` and ``predict`` that scored a block before
``score_and_proba`` (two or three passes of the model). The table gives the medians of wall-clock and
of process CPU seconds (all threads: less disturbed than the wall clock when other processes share the
cores), each also as a multiple of ``predict_proba``'s; the 1-minute load average is printed with it.
The command's fixed costs are timed on their own too: ``read`` (parsing the test file) and ``load``
(``MultiLabelEstimator.load`` of the model file with its checks; MLGPF's predict two rows and so build
the module that prediction then reuses); they do not grow with the model's work per row.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import time
from pathlib import Path

#: what each model is trained with: prediction costs the same after a short fit
TRAIN_SETTINGS = {"mlgpf": ["epochs=2"], "bnmc": ["n_passes=1"]}


def prepare(folder: Path, scale: float, models, threads: int) -> Path:
    """The test file of the EURLex-4K shape at ``scale`` and a run folder per model in ``folder``
    (made once, reused when present)."""
    from bayesmlc.bench.runner import write_synthetic
    from bayesmlc.bench.suites import DatasetSpec
    from bayesmlc.cli import main

    data = folder / f"eurlex-4k-{scale:g}"
    if not (data / "test.txt").exists():
        write_synthetic(DatasetSpec(data.name, {"preset": "eurlex-4k", "scale": scale}), data)
    for name in models:
        run = data / name
        if not (run / "model.npz").exists():
            settings = [token for value in TRAIN_SETTINGS[name] for token in ("--set", value)]
            code = main(["train", "--model", name, "--train", str(data / "train.txt"), "--out", str(run), "--quiet",
                         "--threads", str(threads), "--overwrite", *settings])
            if code != 0:
                raise SystemExit(f"training {name} failed (exit code {code})")
    return data


def _seconds(function) -> tuple[float, float]:
    """Wall-clock and process CPU seconds (all threads) of ``function()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    function()
    return time.perf_counter() - wall, time.process_time() - cpu


def time_model(data: Path, name: str, repeats: int, threads: int) -> dict:
    """Median seconds of the ``evaluate`` command, ``evaluate_model``, the three separate calls and
    one ``predict_proba`` call, taken in turn ``repeats`` times."""
    from bayesmlc.base import MultiLabelEstimator
    from bayesmlc.cli import main
    from bayesmlc.data.io import read_dataset
    from bayesmlc.evaluation import evaluate_model
    from bayesmlc.threads import use_threads

    test = read_dataset(data / "test.txt")
    model = MultiLabelEstimator.load(data / name / "model.npz")
    inv_propensity = json.loads((data / name / "meta.json").read_text())["inv_propensity"]
    command = ["evaluate", "--model-dir", str(data / name), "--test", str(data / "test.txt"), "--json", "--quiet",
               "--threads", str(threads)]

    def run_command():
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(command) == 0

    def three_calls():
        model.decision_function(test.X), model.predict_proba(test.X), model.predict(test.X)

    timed = {"command": run_command, "evaluate_model": lambda: evaluate_model(model, test, inv_propensity),
             "score_and_proba": lambda: model.score_and_proba(test.X, return_labels=True),
             "three calls": three_calls, "predict_proba": lambda: model.predict_proba(test.X),
             "read": lambda: read_dataset(data / "test.txt"),
             "load": lambda: MultiLabelEstimator.load(data / name / "model.npz")}
    seconds = {key: [] for key in timed}
    with use_threads(threads):
        model.predict_proba(test.X[:10])  # the first call sets up what later ones reuse
        for _ in range(repeats):
            for key, function in timed.items():
                seconds[key].append(_seconds(function))
    return {"model": name, "rows": test.n_samples, "labels": test.n_labels,
            "wall": {key: statistics.median(wall for wall, _ in values) for key, values in seconds.items()},
            "cpu": {key: statistics.median(cpu for _, cpu in values) for key, values in seconds.items()}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True, help="where the data and the trained models are kept")
    parser.add_argument("--scale", type=float, default=0.25, help="rows of the EURLex-4K shape, as a fraction (default 0.25)")
    parser.add_argument("--models", nargs="+", default=["mlgpf", "bnmc"], choices=sorted(TRAIN_SETTINGS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    data = prepare(args.folder, args.scale, args.models, args.threads)
    rows = [time_model(data, name, args.repeats, args.threads) for name in args.models]
    print(f"EURLex-4K shape at scale {args.scale:g}, {args.threads} threads, median of {args.repeats}, "
          f"load average {os.getloadavg()[0]:.2f}")
    print("seconds (x predict_proba's): wall-clock, then process CPU (all threads)")
    columns = ("score_and_proba", "evaluate_model", "command", "three calls", "read", "load")
    print(f"{'model':<7} {'clock':<5} {'rows':>6} {'labels':>6} {'predict_proba':>13} "
          + " ".join(f"{key:>16}" for key in columns))
    for row in rows:
        for clock in ("wall", "cpu"):
            times = row[clock]
            cells = [f"{times[key]:.2f} ({times[key] / times['predict_proba']:.2f})" for key in columns]
            print(f"{row['model']:<7} {clock:<5} {row['rows']:>6} {row['labels']:>6} {times['predict_proba']:>13.2f} "
                  + " ".join(f"{cell:>16}" for cell in cells))


if __name__ == "__main__":
    main()
