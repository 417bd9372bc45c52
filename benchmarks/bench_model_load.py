"""Model-file load time: ``MultiLabelEstimator.load`` of fitted MLGPF and BNMC files, and the first
prediction after it.

Usage (from the repository root)::

    PYTHONPATH=. python benchmarks/bench_model_load.py --folder /tmp/loadbench fit   # fit and save (once)
    PYTHONPATH=. python benchmarks/bench_model_load.py --folder /tmp/loadbench time --repeats 5

``fit`` writes ``{model}-{preset}.npz`` for each model and synthetic preset shape
(``bayesmlc.data.synthetic.make_shape`` at ``--scale`` of its rows: the model's size follows the
preset's features and labels, not its rows) and keeps 1,000 rows of the same shape to predict.
``time`` loads each file ``--repeats`` times with the load-time check (``_check_loaded``: the field
checks and the prediction probe, :mod:`bayesmlc.fitted_state`) and as many times without it,
alternately (the file in the page cache), and reports the median load seconds (wall and process
CPU), the seconds of the first ``predict_proba`` of the 1,000 rows after the load (the probe moves
the first prediction's set-up into the load), their total, and the sum of the probabilities (the
check must not change a prediction), with the 1-minute load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

MODELS = {
    "mlgpf": lambda: __import__("bayesmlc.gp", fromlist=["MLGPF"]).MLGPF(epochs=1, random_state=0, device="cpu"),
    "bnmc": lambda: __import__("bayesmlc.bnmc", fromlist=["BNMC"]).BNMC(n_passes=1, random_state=0, device="cpu"),
}


def _fit(folder: Path, presets, scale: float) -> None:
    from bayesmlc.data.synthetic import SHAPES, make_shape

    folder.mkdir(parents=True, exist_ok=True)
    for preset in presets:
        data = make_shape(preset, scale=scale, random_state=0)
        test = make_shape(preset, scale=1000 / SHAPES[preset]["n_samples"], random_state=1)
        sp.save_npz(folder / f"test-{preset}.npz", sp.csr_matrix(test.X))
        for name, build in MODELS.items():
            start = time.perf_counter()
            model = build().fit(data.X, data.Y)
            model.save(folder / f"{name}-{preset}.npz")
            print(f"{name} {preset}: fitted on {data.X.shape} x {data.Y.shape[1]} labels in "
                  f"{time.perf_counter() - start:.1f} s", flush=True)


def _time(folder: Path, repeats: int) -> None:
    """Each file loaded ``repeats`` times with the load-time check (``_check_loaded``: field checks and
    the prediction probe) and as many times without it, alternately; medians."""
    from bayesmlc.base import MultiLabelEstimator

    check = MultiLabelEstimator._check_loaded
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'file':<26} {'MB':>6} {'check':>5} {'load s':>7} {'load CPU s':>10} {'first predict s':>15} "
          f"{'total s':>7}  sum of probabilities")
    try:
        for path in sorted(folder.glob("*-*.npz")):
            if path.name.startswith("test-"):
                continue
            X = sp.load_npz(folder / f"test-{path.stem.split('-', 1)[1]}.npz")
            MultiLabelEstimator.load(path)  # warm: imports, page cache
            runs = {False: [], True: []}
            for _ in range(repeats):
                for checked in (False, True):
                    MultiLabelEstimator._check_loaded = check if checked else (lambda self: None)
                    cpu, wall = time.process_time(), time.perf_counter()
                    model = MultiLabelEstimator.load(path)
                    load, load_cpu = time.perf_counter() - wall, time.process_time() - cpu
                    start = time.perf_counter()
                    proba = model.predict_proba(X)
                    first = time.perf_counter() - start
                    runs[checked].append((load, load_cpu, first, load + first, float(np.sum(proba, dtype=np.float64))))
            for checked in (False, True):
                median = [statistics.median(run[i] for run in runs[checked]) for i in range(4)]
                print(f"{path.name:<26} {path.stat().st_size / 2**20:>6.1f} {'on' if checked else 'off':>5} "
                      f"{median[0]:>7.3f} {median[1]:>10.3f} {median[2]:>15.3f} {median[3]:>7.3f}  "
                      f"{sorted({run[4] for run in runs[checked]})}")
    finally:
        MultiLabelEstimator._check_loaded = check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=Path("/tmp/bayesmlc-loadbench"))
    parser.add_argument("--presets", default="eurlex-4k,amazoncat-13k")
    parser.add_argument("--scale", type=float, default=None,
                        help="share of each preset's rows to fit on (default: 2,000 rows)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("command", choices=["fit", "time"])
    args = parser.parse_args()
    if args.command == "fit":
        from bayesmlc.data.synthetic import SHAPES

        for preset in args.presets.split(","):
            _fit(args.folder, [preset], args.scale or 2000 / SHAPES[preset]["n_samples"])
    else:
        _time(args.folder, args.repeats)


if __name__ == "__main__":
    main()
