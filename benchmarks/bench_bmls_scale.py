"""BMLS on many labels beside omikuji Parabel, in one run: ranking, training and prediction seconds.

Usage (from the repository root)::

    python benchmarks/bench_bmls_scale.py SET [--validation] [--seed 0] [--no-omikuji] [--save]
            [--data-root ../shared/datasets] [--config NAME key=value ...]...

SET is a folder of ``--data-root`` (``delicious``, ``bibtex``, ...) or ``PRESET:SCALE`` for
``bayesmlc.data.synthetic.make_shape(PRESET, SCALE, random_state=0)`` split 80/20 by
``bayesmlc.data.synthetic.split`` (``eurlex-4k:0.25``, ``amazoncat-13k:0.1``). With ``--validation``
the models are trained on 80% of the training rows and scored on the other 20% (seeded by ``--seed``):
the split the defaults are chosen on; without it, trained on the training rows and scored on the test
rows (``--test-rows N``: a random N of the scored rows, for shapes whose dense (rows, labels) scores would
not fit in memory). Each ``--config NAME key=value ...`` is a BMLS fit with those settings over the defaults
(``--config default`` alone: the defaults, which is also what no ``--config`` runs). Every model runs
at its default thread count. Prints P@1, P@5, PSP@1, PSP@5 (%, propensities from the training labels,
A = 0.55, B = 1.5), the training and prediction wall seconds, BMLS's K, sweeps and kept draws, the
model file's size (``--save``: written to a temporary folder, then removed), the ratio of each
training time to omikuji's, and the load average before each fit.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bayesmlc.baselines import OmikujiParabel, missing_dependency
from bayesmlc.bmls import BMLS
from bayesmlc.data.io import read_dataset
from bayesmlc.data.synthetic import make_shape, split
from bayesmlc.metrics import precision_at_k, psprecision_at_k

DATA_ROOT = Path(os.environ.get("BAYESMLC_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "datasets"))


def load_set(name: str, data_root=DATA_ROOT):
    """(X_train, Y_train, X_test, Y_test) of a data set under ``data_root`` or a ``PRESET:SCALE`` shape."""
    if ":" in name:
        preset, scale = name.split(":")
        train, test = split(make_shape(preset, float(scale), random_state=0), test_fraction=0.2, random_state=0)
        return train.X, train.Y, test.X, test.Y
    train = read_dataset(Path(data_root) / name / "train.txt")
    test = read_dataset(Path(data_root) / name / "test.txt").with_features_width(train.n_features)
    return train.X, train.Y, test.X, test.Y


def validation_split(X, Y, seed: int):
    """(X, Y of 80% of the rows, X, Y of the other 20%), drawn by ``seed``."""
    order = np.random.default_rng(seed).permutation(X.shape[0])
    held, kept = np.sort(order[: X.shape[0] // 5]), np.sort(order[X.shape[0] // 5 :])
    return X[kept], Y[kept], X[held], Y[held]


def parse_value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"True": True, "False": False, "None": None}.get(text, text)


def parse_configs(argv: list[str]) -> dict:
    """``--config NAME k=v ...`` groups as {NAME: {k: v}}."""
    configs, current = {}, None
    for token in argv:
        if token == "--config":
            current = None
        elif current is None:
            current = configs.setdefault(token, {})
        else:
            key, _, value = token.partition("=")
            current[key] = parse_value(value)
    return configs or {"default": {}}


def file_megabytes(model) -> float:
    """Size of ``model.save`` in MB (a temporary folder, removed)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.npz"
        model.save(path)
        return path.stat().st_size / 2**20


def fit_and_score(name, model, X, Y, X_test, Y_test, save: bool) -> dict:
    load = os.getloadavg()[0]
    start = time.perf_counter()
    model.fit(X, Y)
    train_s = time.perf_counter() - start
    start = time.perf_counter()
    scores = model.decision_function(X_test)
    predict_s = time.perf_counter() - start
    row = {"name": name, "train_s": train_s, "predict_s": predict_s, "load": load,
           "p1": 100 * precision_at_k(Y_test, scores, 1), "p5": 100 * precision_at_k(Y_test, scores, 5),
           "psp1": 100 * psprecision_at_k(Y_test, scores, 1, Y_train=Y),
           "psp5": 100 * psprecision_at_k(Y_test, scores, 5, Y_train=Y), "detail": "", "mb": float("nan")}
    if isinstance(model, BMLS):
        row["detail"] = (f"K {model.n_topics_}, sweeps {model.n_sweeps_} (burn-in {model.n_burnin_}), "
                         f"draws {model.phi_samples_.shape[0]} ({model.predictor_})")
        if save:
            row["mb"] = file_megabytes(model)
    return row


def print_row(row: dict, reference_s: float) -> None:
    ratio = row["train_s"] / reference_s if reference_s else float("nan")
    print(f"| {row['name']} | {row['p1']:.2f} | {row['p5']:.2f} | {row['psp1']:.2f} | {row['psp5']:.2f} | "
          f"{row['train_s']:.1f} | {ratio:.2f} | {row['predict_s']:.1f} | {row['mb']:.1f} | {row['load']:.1f} | "
          f"{row['detail']} |", flush=True)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--config") if "--config" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("set")
    parser.add_argument("--validation", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-omikuji", action="store_true")
    parser.add_argument("--save", action="store_true", help="measure the BMLS model file's size")
    parser.add_argument("--data-root", default=str(DATA_ROOT))
    parser.add_argument("--test-rows", type=int, help="score a random subset of this many rows (seeded by --seed)")
    args = parser.parse_args(argv[:cut])
    configs = parse_configs(argv[cut:])
    X, Y, X_test, Y_test = load_set(args.set, args.data_root)
    if args.validation:
        X, Y, X_test, Y_test = validation_split(X, Y, args.seed)
    if args.test_rows is not None and args.test_rows < X_test.shape[0]:
        rows = np.sort(np.random.default_rng(args.seed).choice(X_test.shape[0], args.test_rows, replace=False))
        X_test, Y_test = X_test[rows], Y_test[rows]
    print(f"{args.set}: {X.shape[0]} training rows, {X_test.shape[0]} scored rows "
          f"({'validation' if args.validation else 'test'}), D = {X.shape[1]}, L = {Y.shape[1]}, nnz(Y) = {Y.nnz}")
    print("| model | P@1 | P@5 | PSP@1 | PSP@5 | train s | / omikuji | predict s | file MB | load | BMLS |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")
    reference_s = 0.0
    if not args.no_omikuji and missing_dependency("omikuji_parabel") is None:
        row = fit_and_score("omikuji Parabel", OmikujiParabel(), X, Y, X_test, Y_test, False)
        reference_s = row["train_s"]
        print_row(row, reference_s)
    for name, settings in configs.items():
        model = BMLS(random_state=args.seed, **settings)
        print_row(fit_and_score(f"BMLS {name}", model, X, Y, X_test, Y_test, args.save), reference_s)


if __name__ == "__main__":
    main()
