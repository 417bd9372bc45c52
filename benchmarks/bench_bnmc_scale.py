"""BNMC on thousands of labels beside omikuji Parabel in one run: fit time by stage, peak memory, and
P@k / PSP@k by label-frequency band.

Usage (from the repository root)::

    python benchmarks/bench_bnmc_scale.py SET [--validation] [--seed 0] [--no-omikuji] [--top 0]
            [--data-root ../shared/datasets] [--config NAME key=value ...]...

SET is a folder of ``--data-root`` (``delicious``, ``bibtex``, ...), ``PRESET:SCALE`` for
``bayesmlc.data.synthetic.make_shape(PRESET, SCALE, random_state=0)`` split 80/20, or
``multilabel:N:D:L[:FEATURES_PER_ROW[:LABELS_PER_ROW]]`` for ``make_multilabel(N, D, L,
feature_kind="count", random_state=0)`` split 80/20 (count features, as word-count text sets). With
``--validation`` the models are trained on 80% of the training rows and scored on the other 20%
(seeded by ``--seed``), the split defaults are chosen on. Each ``--config NAME key=value ...`` is a
BNMC fit with those settings over the defaults (none given: the defaults alone); ``weighting=KIND``
weights BNMC's features first (:data:`WEIGHTINGS`; omikuji keeps the raw ones).

Every model is fitted in its own forked process at its default thread count, which reports its fit
wall and CPU seconds and its peak resident memory (data included). BNMC's fit is split into stages by
timing the methods that make it up, each stage's own time (a stage called inside another is not
counted twice): preprocessing, the mixture's SVI (``MixtureFitter.fit``), the low-rank basis
(``ClassifierFitter._set_basis``), the classifier fits (each call of the fit function: the first fit,
the cross-fitting folds, the refit), the held-out evidence (``calibrate``, ``_fold_evidence``), and the
calibration maps (``fit_calibration_maps``); "other" is the rest. ``--top N`` prints the N functions of
largest cumulative time in BNMC's fit (cProfile). Bands: deciles of the labels by training frequency
(``bayesmlc.metrics.metrics_by_band``), summed to head (bands 1-3), middle (4-7) and tail (8-10).
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import multiprocessing
import os
import pstats
import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mlgpf_linear import DATA_ROOT, load_set, parse_configs, validation_split  # noqa: E402

from bayesmlc.baselines import OmikujiParabel, missing_dependency  # noqa: E402
from bayesmlc.bnmc import BNMC  # noqa: E402
from bayesmlc.bnmc.classifier_fitting import ClassifierFitter  # noqa: E402
from bayesmlc.bnmc.svi import MixtureFitter  # noqa: E402
from bayesmlc.data.synthetic import make_multilabel, split  # noqa: E402
from bayesmlc.metrics import metrics_by_band, precision_at_k, psprecision_at_k  # noqa: E402

#: (stage, class, method): the methods whose own time makes up each stage of BNMC's fit.
STAGE_METHODS = (
    ("preprocessing", BNMC, "_setup_preprocessing"),
    ("mixture SVI", MixtureFitter, "fit"),
    ("low-rank basis", ClassifierFitter, "_set_basis"),
    ("held-out evidence", ClassifierFitter, "calibrate"),
    ("held-out evidence", ClassifierFitter, "_fold_evidence"),
    ("calibration maps", ClassifierFitter, "fit_calibration_maps"),
)
CLASSIFIER_STAGE = "classifier fits"
BAND_GROUPS = {"head": slice(0, 3), "mid": slice(3, 7), "tail": slice(7, None)}


class StageClock:
    """Own (exclusive) wall seconds per stage: a timed call's time less that of the timed calls inside it."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[float] = []  # time of the timed calls inside each open call

    def wrap(self, stage: str, function):
        def timed(*args, **kwargs):
            self._stack.append(0.0)
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                inner = self._stack.pop()
                self.seconds[stage] = self.seconds.get(stage, 0.0) + elapsed - inner
                self.calls[stage] = self.calls.get(stage, 0) + 1
                if self._stack:
                    self._stack[-1] += elapsed
        return timed

    @contextmanager
    def installed(self):
        """The stage methods of :data:`STAGE_METHODS` and the classifier fit function timed while open."""
        saved = [(owner, name, getattr(owner, name)) for _, owner, name in STAGE_METHODS]
        saved.append((ClassifierFitter, "_fit_function", ClassifierFitter._fit_function))
        for stage, owner, name in STAGE_METHODS:
            setattr(owner, name, self.wrap(stage, getattr(owner, name)))
        make_fit = ClassifierFitter._fit_function
        clock = self

        def fit_function(fitter, rows):
            return clock.wrap(CLASSIFIER_STAGE, make_fit(fitter, rows))
        ClassifierFitter._fit_function = fit_function
        try:
            yield self
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)


def load_data(name: str, data_root):
    """(X, Y, X_test, Y_test): ``multilabel:N:D:L[:F[:K]]`` or what :func:`load_set` reads."""
    if name.startswith("multilabel:"):
        parts = name.split(":")[1:]
        n, d, labels = (int(v) for v in parts[:3])
        extra = dict(zip(("features_per_row", "labels_per_row"), (float(v) for v in parts[3:])))
        data = make_multilabel(n, d, labels, feature_kind="count", random_state=0, **extra)
        train, test = split(data, test_fraction=0.2, random_state=0)
        return train.X, train.Y, test.X, test.Y
    return load_set(name, data_root)


#: ``weighting=`` of a ``--config``: how BNMC's count features are weighted before its fit (measured here;
#: each then scaled to unit L2 rows): "l2" the raw counts, "log" 1 + log(count), "idf" count x idf,
#: "logidf" (1 + log count) x idf (Salton and Buckley 1988, as the XC repository's tf-idf files), "bm25"
#: tf (k1 + 1) / (tf + k1 (1 - b + b len / mean len)) x idf with k1 = 1.2, b = 0.75 (Robertson and
#: Zaragoza 2009); idf = log((1 + N) / (1 + df)) + 1 over the training rows.
WEIGHTINGS = ("l2", "log", "idf", "logidf", "bm25")


def weight_counts(kind: str, X_train, X_other):
    """(X_train, X_other) weighted by ``kind`` of :data:`WEIGHTINGS` (statistics of ``X_train``), rows at
    unit L2 norm."""
    import scipy.sparse as sp
    from sklearn.preprocessing import normalize

    if kind not in WEIGHTINGS:
        raise SystemExit(f"weighting must be one of {WEIGHTINGS}, got {kind!r}")
    df = np.bincount(X_train.indices, minlength=X_train.shape[1])
    idf = np.log((1.0 + X_train.shape[0]) / (1.0 + df)) + 1.0
    mean_length = X_train.sum() / X_train.shape[0]

    def weighted(X):
        X = sp.csr_matrix(X, dtype=np.float64, copy=True)
        if kind in ("log", "logidf"):
            X.data = 1.0 + np.log(np.maximum(X.data, 1e-12))
        if kind == "bm25":
            length = np.repeat(np.asarray(X.sum(axis=1)).ravel(), np.diff(X.indptr))
            X.data = X.data * 2.2 / (X.data + 1.2 * (0.25 + 0.75 * length / mean_length))
        if kind in ("idf", "logidf", "bm25"):
            X = X @ sp.diags(idf)
        return sp.csr_matrix(normalize(X), dtype=np.float32)

    return weighted(X_train), weighted(X_other)


def _fit_in_child(queue, make_model, X, Y, X_test, top: int) -> None:
    """Fit, score ``X_test`` (decision_function) and put times, peak memory, stages and scores on ``queue``
    (the native baselines' progress bars on stderr are sent to /dev/null)."""
    model = make_model()
    for name, value in getattr(model, "module_settings", {}).items():  # "classifier_fitting.NAME=value" of a --config
        setattr(importlib.import_module(f"bayesmlc.bnmc.{name.split('.')[0]}"), name.split(".")[1], value)
    if not isinstance(model, BNMC):
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    clock = StageClock()
    profile = cProfile.Profile() if top else None
    with clock.installed():
        start, cpu_start = time.perf_counter(), time.process_time()
        if profile:
            profile.enable()
        model.fit(X, Y)
        if profile:
            profile.disable()
        fit_s, fit_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    scores = model.decision_function(X_test)
    text = ""
    if profile:
        stream = io.StringIO()
        pstats.Stats(profile, stream=stream).sort_stats("cumulative").print_stats(top)
        text = stream.getvalue()
    queue.put({"fit_s": fit_s, "fit_cpu_s": fit_cpu, "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
               "stages": clock.seconds, "calls": clock.calls, "scores": np.asarray(scores, dtype=np.float32),
               "profile": text, "solver": getattr(model, "solver_", "-"),
               "basis": None if getattr(model, "classifier_basis_", None) is None else model.classifier_basis_.shape[1]})


def fit_in_child(make_model, X, Y, X_test, top: int = 0) -> dict:
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=_fit_in_child, args=(queue, make_model, X, Y, X_test, top))
    process.start()
    result = queue.get()
    process.join()
    return result


def band_cells(Y_test, scores, Y_train) -> str:
    """P@5 and PSP@5 (%) summed over the head / mid / tail bands."""
    bands = metrics_by_band(Y_test, scores, Y_train, ks=(5,))
    cells = []
    for metric in ("P@5", "PSP@5"):
        values = bands.values[metric]
        cells.append(" / ".join(f"{100 * values[part].sum():.1f}" for part in BAND_GROUPS.values()))
    return " | ".join(cells)


def _bnmc(seed: int, settings: dict) -> BNMC:
    """BNMC with ``settings``; a key ``MODULE.NAME`` (a module of ``bayesmlc.bnmc``) is set on that module
    in the forked child instead (a constant under test)."""
    model = BNMC(random_state=seed, **{k: v for k, v in settings.items() if "." not in k})
    model.module_settings = {k: v for k, v in settings.items() if "." in k}
    return model


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--config") if "--config" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("set")
    parser.add_argument("--validation", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-omikuji", action="store_true")
    parser.add_argument("--top", type=int, default=0, help="print this many cProfile lines of BNMC's fit")
    parser.add_argument("--data-root", default=str(DATA_ROOT))
    args = parser.parse_args(argv[:cut])
    configs = parse_configs(argv[cut:]) if cut < len(argv) else {"default": {}}
    X, Y, X_test, Y_test = load_data(args.set, args.data_root)
    if args.validation:
        X, Y, X_test, Y_test = validation_split(X, Y, args.seed)
    print(f"{args.set}: {X.shape[0]} training rows, {X_test.shape[0]} scored rows "
          f"({'validation' if args.validation else 'test'}), D = {X.shape[1]}, L = {Y.shape[1]}, nnz(X) = {X.nnz}, "
          f"labels that occur = {np.unique(Y.indices).size}", flush=True)
    runs = []
    if not args.no_omikuji and missing_dependency("omikuji_parabel") is None:
        runs.append(("omikuji Parabel", lambda: OmikujiParabel(predict_top_k=100)))
    weightings = {}
    for name, settings in configs.items():
        weightings[f"BNMC {name}"] = settings.pop("weighting", None)
        runs.append((f"BNMC {name}", lambda settings=settings: _bnmc(args.seed, settings)))
    results = {}
    print("| model | P@1 | P@5 | PSP@1 | PSP@5 | P@5 head / mid / tail | PSP@5 head / mid / tail | fit s (CPU s) "
          "| / omikuji | peak GB | load |\n|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for name, make_model in runs:
        load = os.getloadavg()[0]
        X_fit, X_scored = X, X_test
        if weightings.get(name):
            X_fit, X_scored = weight_counts(weightings[name], X, X_test)
        result = results[name] = fit_in_child(make_model, X_fit, Y, X_scored, args.top if name.startswith("BNMC") else 0)
        scores = result["scores"]
        figures = [100 * precision_at_k(Y_test, scores, k) for k in (1, 5)]
        figures += [100 * psprecision_at_k(Y_test, scores, k, Y_train=Y) for k in (1, 5)]
        base = results.get("omikuji Parabel")
        ratio = f"{result['fit_s'] / base['fit_s']:.2f}" if base else "-"
        print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in figures) + f" | {band_cells(Y_test, scores, Y)} | "
              f"{result['fit_s']:.1f} ({result['fit_cpu_s']:.1f}) | {ratio} | {result['peak_gb']:.2f} | {load:.1f} |",
              flush=True)
    for name, result in results.items():
        if not result["stages"]:
            continue
        stages = dict(result["stages"])
        stages["other"] = result["fit_s"] - sum(stages.values())
        print(f"\n{name} (solver {result['solver']}, basis rank {result['basis']}): fit {result['fit_s']:.1f} s by stage")
        print("| stage | s | share | calls |\n|---|---|---|---|")
        for stage, seconds in stages.items():
            print(f"| {stage} | {seconds:.1f} | {seconds / result['fit_s']:.0%} | {result['calls'].get(stage, '-')} |")
        if result["profile"]:
            print(result["profile"])


if __name__ == "__main__":
    main()
