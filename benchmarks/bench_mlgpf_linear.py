"""MLGPF with and without the per-label linear term (``linear_term``), beside omikuji Parabel, in one run.

Usage (from the repository root)::

    python benchmarks/bench_mlgpf_linear.py SET [--validation] [--seed 0] [--no-omikuji]
            [--data-root ../shared/datasets] [--config NAME key=value ...]...

SET is a folder of ``../shared/datasets`` (``delicious``, ``bibtex_xc``, ...) or ``PRESET:SCALE`` for
``bayesmlc.data.synthetic.make_shape(PRESET, SCALE, random_state=0)`` split 80/20 by
``bayesmlc.data.synthetic.split``. With ``--validation`` the models are trained on 80% of the
training rows and scored on the other 20% (seeded by ``--seed``): the split the defaults are chosen
on; without it, trained on the training rows and scored on the test rows. Each ``--config NAME
key=value ...`` is an MLGPF fit with those settings over the defaults (``--config default`` alone:
the defaults); with no ``--config``: the defaults and ``linear_term=True``. Every model runs at its
default thread count. Prints P@1, P@5, PSP@1, PSP@5 (%, propensities from the training labels,
A = 0.55, B = 1.5), ECE@1 and AURC of the raw probabilities (top-1 label by the scores), the training
wall and process CPU seconds (omikuji's Rust threads count in the CPU seconds), and the load average
before each fit. ``--bands`` adds each model's test metrics by decile of the labels' training frequency,
head first, as ``bayesmlc bench --bands`` reports them (:func:`bayesmlc.metrics.metrics_by_band`: the
bands add up to the whole).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from bayesmlc.baselines import OmikujiParabel, missing_dependency
from bayesmlc.bench import report
from bayesmlc.bench.bands import BAND_KS
from bayesmlc.data.io import read_dataset
from bayesmlc.data.synthetic import make_shape, split
from bayesmlc.gp import MLGPF
from bayesmlc.metrics import aurc, ece_at_k, inverse_propensity, metrics_by_band, precision_at_k, psprecision_at_k

DATA_ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def load_set(name: str, data_root=DATA_ROOT):
    """(X_train, Y_train, X_test, Y_test) of a data set under ``data_root`` or a ``PRESET:SCALE``
    synthetic shape."""
    if ":" in name:
        preset, scale = name.split(":")
        train, test = split(make_shape(preset, float(scale), random_state=0), test_fraction=0.2, random_state=0)
        return train.X, train.Y, test.X, test.Y
    train, test = (read_dataset(Path(data_root) / name / f"{part}.txt") for part in ("train", "test"))
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
    return configs or {"default": {}, "linear": {"linear_term": True}}


def scores_line(name, seconds, Y_true, scores, proba, Y_train, load: float) -> str:
    """A table row of a fitted model's test ``scores`` and ``proba``: P@1, P@5, PSP@1, PSP@5 (%),
    ECE@1 and AURC of its raw probabilities (top-1 label by its scores), then ``seconds`` (wall, CPU)
    and ``load`` (the load average before the fit)."""
    figures = [100 * precision_at_k(Y_true, scores, k) for k in (1, 5)]
    figures += [100 * psprecision_at_k(Y_true, scores, k, Y_train=Y_train) for k in (1, 5)]
    calibration = [ece_at_k(Y_true, proba, 1, scores=scores), aurc(Y_true, proba, scores=scores)]
    return (f"| {name} | " + " | ".join(f"{v:.2f}" for v in figures) + " | "
            + " | ".join(f"{v:.4f}" for v in calibration) + f" | {seconds[0]:.1f} | {seconds[1]:.1f} | {load:.1f} |")


def band_table(rankings: dict, Y_true, Y_train) -> str:
    """The harness's label-frequency band table (:func:`bayesmlc.bench.report.band_table`) of each
    model's test ``rankings`` (name: scores), with propensities from ``Y_train``."""
    propensities = inverse_propensity(Y_train)
    records = []
    for name, scores in rankings.items():
        model, config = name.split(" ", 1)  # "MLGPF default" is labelled "MLGPF (default)"
        bands = metrics_by_band(Y_true, scores, Y_train, ks=BAND_KS, propensities=propensities)
        records.append({"dataset": "test", "model": model, "config": config, "status": "ok", "bands": bands.to_json()})
    return report.band_table(report.summarise(records))


def timed_fit(model, X, Y):
    """(the fitted ``model``, (wall s, process CPU s) of its fit, the load average before it)."""
    load, wall, cpu = os.getloadavg()[0], time.perf_counter(), time.process_time()
    model.fit(X, Y)
    return model, (time.perf_counter() - wall, time.process_time() - cpu), load


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--config") if "--config" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("set")
    parser.add_argument("--validation", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-omikuji", action="store_true")
    parser.add_argument("--data-root", default=str(DATA_ROOT))
    parser.add_argument("--bands", action="store_true")
    args = parser.parse_args(argv[:cut])
    configs = parse_configs(argv[cut:])
    X, Y, X_test, Y_test = load_set(args.set, args.data_root)
    if args.validation:
        X, Y, X_test, Y_test = validation_split(X, Y, args.seed)
    print(f"{args.set}: {X.shape[0]} training rows, {X_test.shape[0]} scored rows ({'validation' if args.validation else 'test'}), "
          f"D = {X.shape[1]}, L = {Y.shape[1]}")
    print("| model | P@1 | P@5 | PSP@1 | PSP@5 | ECE@1 | AURC | train s | train CPU s | load |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
    models = {f"MLGPF {name}": (lambda s=s: MLGPF(random_state=args.seed, **s)) for name, s in configs.items()}
    if not args.no_omikuji and missing_dependency("omikuji_parabel") is None:
        models = {"omikuji Parabel": OmikujiParabel, **models}
    rankings = {}
    for name, make in models.items():
        model, seconds, load = timed_fit(make(), X, Y)
        scores, proba = model.score_and_proba(X_test)  # one pass of the model for both
        print(scores_line(name, seconds, Y_test, scores, proba, Y, load), flush=True)
        if args.bands:
            rankings[name] = scores
    if rankings:
        print(band_table(rankings, Y_test, Y))


if __name__ == "__main__":
    main()
