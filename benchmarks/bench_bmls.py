"""BMLS benchmark: seconds per Gibbs sweep, and the AUC table of the BMLS paper on Bibtex.

Usage (from the repository root; ../shared/datasets/bibtex is the BMLS split)::

    python benchmarks/bench_bmls.py speed                      # s/sweep vs N (20..100%) and vs K
    python benchmarks/bench_bmls.py auc --settings full        # the headline run
    python benchmarks/bench_bmls.py auc --settings full,labels20,labels20-co,inst20,inst20-co
    python benchmarks/bench_bmls.py all --out bmls-results.jsonl
    python benchmarks/bench_bmls.py scale                      # "BMLS at scale": default fit vs omikuji
    python benchmarks/bench_bmls.py scale --datasets amazoncat-13k-0.01,eurlex-4k-1.0
    python benchmarks/bench_bmls.py hstep --baseline 5e11c96   # s/sweep of this tree vs a git commit

Part ``scale`` (docs/benchmarks.md, "BMLS at scale"): on each data set the BMLS default
(``schedule="auto"``), omikuji Parabel (``bayesmlc.baselines.OmikujiParabel``, 3 trees) and, where
cheap, one-vs-rest logistic regression are trained in the same process with one thread; the table gives
wall and CPU seconds of ``fit``, BMLS's ratio to omikuji, global AUC (where every label is scored), P@1
and P@5 on the test rows, and BMLS's seconds per sweep split by step (topics, labels, features,
co-occurrence, likelihood). Synthetic shapes: ``make_shape(name, scale * 1.25)`` split 80/20 with seed
0, so the training part has the preset's row count (AmazonCat-13K at 1%: 11,862 rows; EURLex-4K: 15,539).

Part ``hstep`` (docs/benchmarks.md, "Seconds per sweep against an earlier commit"): the sampler of
this working tree against the one of ``--baseline`` (a git commit, unpacked with ``git archive`` into a
temporary folder), each in its own child process with one thread (``NUMBA_NUM_THREADS``,
``OMP_NUM_THREADS`` and torch set to 1), on the same training matrices (written once by this process),
``schedule="fixed"`` for ``--sweeps`` sweeps at the defaults (K = 100, mu0 = nu0 = 10), seed 0. The two
trees alternate for ``--rounds`` rounds after one untimed warm-up fit each (numba compilation). Each
sweep is timed in wall and CPU seconds (``time.process_time()``) by wrapping ``gibbs_sweep``; the
table gives medians over the sweeps after the first two, the feature-weight (h) step's CPU seconds per
sweep (mean), the new/old ratios, the mean training log-likelihood of the second half of the chain (the two
chains use different random streams, so they agree only in distribution) and the 1-minute load average.

Settings (paper Sec. 6.1-6.2, Tables 2-4; test set always the full test split):

* ``full``: all training labels.
* ``labels20`` / ``labels20-co``: 80% of the training label entries hidden at random (a mask, the
  entries are integrated out); ``-co`` adds the co-occurrence counts of the *complete* training labels,
  as the paper's code does.
* ``labels20pos`` / ``labels20pos-co``: the authors' released variant: 80% of the *positives* turned
  into zeros, no mask.
* ``inst20`` / ``inst20-co``: a random 20% of the training rows; ``-co`` with C from all training rows.

BMLS-co form (``--co-form``, ``-co`` settings only; ``--set`` overrides it):

* ``paper`` (default): the paper's specification, C = Y^T Y *with its diagonal* (c_ii = rows carrying
  label i; ``cooccurrence_diagonal=True``) and beta0 = 0.01 fixed.
* ``code``: the authors' code, strict upper triangle of Y^T Y and beta0 sampled (the BMLS defaults).

Every row reports the global AUC over all (instance, label) test pairs (scikit-learn ``roc_auc_score``
on the flattened matrices, as the paper computes it), macro-AUC over labels, P@1/3/5, training time,
median seconds per sweep and the 1-minute load average (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from bayesmlc.bmls import BMLS, cooccurrence_matrix, remove_labels, subsample_instances
from bayesmlc.data.io import read_dataset
from bayesmlc.metrics import auc_macro, precision_at_k

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "bibtex"
SETTINGS = ["full", "labels20", "labels20-co", "inst20", "inst20-co", "labels20pos", "labels20pos-co"]
PAPER_AUC = {"full": 0.9379, "labels20": 0.8598, "labels20-co": 0.8764, "inst20": 0.8651, "inst20-co": 0.8723,
             "labels20pos": 0.8598, "labels20pos-co": 0.8764}


# BMLS-co configurations of the -co settings: the paper's C = Y^T Y (with the diagonal) and beta0 = 0.01,
# or the authors' code (the BMLS defaults)
CO_FORMS = {"paper": {"cooccurrence_diagonal": True, "beta0": 0.01, "sample_beta0": False}, "code": {}}


def load(folder: Path):
    train = read_dataset(folder / "train.txt")
    test = read_dataset(folder / "test.txt").with_features_width(train.n_features)
    return train, test


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def speed(train, n_sweeps: int, seed: int):
    """Seconds per sweep, mean and median over ``n_sweeps`` sweeps after 3 (compilation, the chain's
    transient). The mean includes the theta recomputation done every 10th sweep; the median does not."""
    rows_all = np.random.default_rng(seed).permutation(train.n_samples)
    results = []

    def measure(rows, n_topics):
        model = BMLS(n_topics=n_topics, mu0=10, nu0=10, schedule="fixed", n_burnin=n_sweeps + 3, n_draws=1, thin=1,
                     random_state=seed)
        model.fit(train.X[rows], train.Y[rows])
        times = np.asarray(model.history_["sweep_time"][3:])
        return float(times.mean()), float(np.median(times))

    print(f"{'setting':<24}{'N':>7}{'K':>6}{'mean s/sweep':>14}{'median':>9}{'load':>7}")
    for fraction in (0.2, 0.4, 0.6, 0.8, 1.0):
        rows = np.sort(rows_all[: int(round(fraction * train.n_samples))])
        mean, median = measure(rows, 100)
        row = {"part": "speed", "vary": "N", "fraction": fraction, "n": int(rows.size), "K": 100,
               "s_per_sweep": mean, "median_s_per_sweep": median, "load": load_average()}
        results.append(row)
        print(f"{'N = ' + format(fraction, '.0%'):<24}{rows.size:>7}{100:>6}{mean:>14.4f}{median:>9.4f}{row['load']:>7}")
    rows = np.arange(train.n_samples)
    for n_topics in (25, 50, 100, 200):
        mean, median = measure(rows, n_topics)
        row = {"part": "speed", "vary": "K", "fraction": 1.0, "n": int(rows.size), "K": n_topics,
               "s_per_sweep": mean, "median_s_per_sweep": median, "load": load_average()}
        results.append(row)
        print(f"{'K = ' + str(n_topics):<24}{rows.size:>7}{n_topics:>6}{mean:>14.4f}{median:>9.4f}{row['load']:>7}")
    return results


def auc_run(setting: str, train, test, seed: int, params: dict, save_dir: Path | None, co_params: dict | None = None):
    X, Y, mask = train.X, train.Y, None
    co = setting.endswith("-co")
    base = setting[:-3] if co else setting
    if co and co_params:
        params = {**co_params, **params}
    if base == "labels20":
        Y, mask = remove_labels(train.Y, 0.8, mode="entries", random_state=seed)
    elif base == "labels20pos":
        Y, mask = remove_labels(train.Y, 0.8, mode="positives", random_state=seed)
    elif base == "inst20":
        rows = subsample_instances(train.n_samples, 0.2, random_state=seed)
        X, Y = train.X[rows], train.Y[rows]
    elif base != "full":
        raise SystemExit(f"unknown setting {setting!r}; choose from {', '.join(SETTINGS)}")
    # the paper builds C from the complete training labels, even in the reduced-data runs
    diagonal = bool(params.get("cooccurrence_diagonal", BMLS().cooccurrence_diagonal))
    cooccurrence = cooccurrence_matrix(train.Y, diagonal=diagonal) if co else False
    model = BMLS(cooccurrence=cooccurrence, random_state=seed, **params)
    start = time.perf_counter()
    model.fit(X, Y, label_mask=mask)
    fit_seconds = time.perf_counter() - start
    start = time.perf_counter()
    proba = model.predict_proba(test.X)
    predict_seconds = time.perf_counter() - start
    Y_test = test.Y.toarray()
    row = {
        "part": "auc",
        "setting": setting,
        "auc": float(roc_auc_score(Y_test.ravel(), proba.ravel())),
        "paper_auc": PAPER_AUC[setting],
        "macro_auc": float(auc_macro(test.Y, proba)),
        "p@1": float(precision_at_k(test.Y, proba, 1)),
        "p@3": float(precision_at_k(test.Y, proba, 3)),
        "p@5": float(precision_at_k(test.Y, proba, 5)),
        "fit_s": round(fit_seconds, 1),
        "predict_s": round(predict_seconds, 1),
        "s_per_sweep": float(np.mean(model.history_["sweep_time"])),
        "n_sweeps": int(model.n_sweeps_),
        "beta0": model.beta0_,
        "n_burnin": int(model.n_burnin_),
        "phi_acceptance": float(np.mean(model.history_["phi_acceptance"][int(model.n_burnin_):] or [1.0])),
        "load": load_average(),
        "params": {**model.get_params(), "cooccurrence": bool(co)},
    }
    if save_dir is not None:
        save_dir.mkdir(parents=True, exist_ok=True)
        model.save(save_dir / f"bmls-{setting}.npz")
    return row


SCALE_SETS = ["bibtex", "amazoncat-13k-0.01", "eurlex-4k-1.0", "hmc_cellcycle_go", "goemotions"]
LOGISTIC_SETS = {"bibtex", "hmc_cellcycle_go", "goemotions"}  # sets where one-vs-rest logistic is cheap
STEPS = ("topics", "labels", "features", "cooccurrence", "likelihood")


def scale_data(name: str, shared: Path):
    """(train X, train Y, test X, test Y, all_labels_scored) of a real set or a synthetic shape ``preset-scale``."""
    if (shared / name / "train.txt").exists():
        train, test = load(shared / name)
        return train.X, train.Y, test.X, test.Y
    from bayesmlc.data.synthetic import make_shape, split

    preset, _, scale = name.rpartition("-")
    train, test = split(make_shape(preset, scale=float(scale) * 1.25, random_state=0), 0.2, random_state=0)
    return train.X, train.Y, test.X, test.Y


def timed_fit(model, X, Y):
    wall, cpu = time.perf_counter(), time.process_time()
    model.fit(X, Y)
    return time.perf_counter() - wall, time.process_time() - cpu


def scale_run(name: str, shared: Path, seed: int, bmls_params: dict, model_names=None):
    """Rows of the ``scale`` table for one data set (see the module docstring)."""
    import torch

    from bayesmlc.baselines import OmikujiParabel
    from bayesmlc.linear import LogisticRegression
    from bayesmlc.metrics import auc_micro

    torch.set_num_threads(1)
    X, Y, X_test, Y_test = scale_data(name, shared)
    many_labels = Y.shape[1] > 1000
    models = {
        "omikuji_parabel": OmikujiParabel(n_threads=1, predict_top_k=100 if many_labels else None, random_state=seed),
        "bmls": BMLS(random_state=seed, **bmls_params),
    }
    if name in LOGISTIC_SETS:
        models["logistic"] = LogisticRegression(standardize=name == "hmc_cellcycle_go", random_state=seed)
    if model_names is not None:  # omikuji always: it is the reference of the ratios
        models = {key: model for key, model in models.items() if key in model_names or key == "omikuji_parabel"}
    rows = []
    for model_name, model in models.items():
        fit_wall, fit_cpu = timed_fit(model, X, Y)
        scores = model.decision_function(X_test)
        row = {"part": "scale", "dataset": name, "model": model_name, "n_train": int(X.shape[0]),
               "n_labels": int(Y.shape[1]), "fit_wall_s": round(fit_wall, 1), "fit_cpu_s": round(fit_cpu, 1),
               "p@1": float(precision_at_k(Y_test, scores, 1)), "p@5": float(precision_at_k(Y_test, scores, 5)),
               "auc": None if model_name == "omikuji_parabel" and many_labels else float(auc_micro(Y_test, scores)),
               "load": load_average()}
        if model_name == "bmls":
            row.update(n_sweeps=int(model.n_sweeps_), n_burnin=int(model.n_burnin_),
                       kept_draws=int(model.phi_samples_.shape[0]),
                       step_s_per_sweep={step: model.sweep_step_seconds_.get(step, 0.0) / model.n_sweeps_ for step in STEPS})
        rows.append(row)
    base = next(row for row in rows if row["model"] == "omikuji_parabel")
    for row in rows:
        row["wall_vs_omikuji"] = round(row["fit_wall_s"] / max(base["fit_wall_s"], 1e-9), 2)
        row["cpu_vs_omikuji"] = round(row["fit_cpu_s"] / max(base["fit_cpu_s"], 1e-9), 2)
    return rows


def print_scale_rows(rows):
    for row in rows:
        auc = "-" if row["auc"] is None else f"{row['auc']:.4f}"
        extra = ""
        if row["model"] == "bmls":
            steps = " ".join(f"{step} {value:.4f}" for step, value in row["step_s_per_sweep"].items())
            extra = f"  sweeps {row['n_sweeps']} (burn-in {row['n_burnin']}), s/sweep: {steps}"
        print(f"{row['dataset']:<20}{row['model']:<17}{row['fit_wall_s']:>9.1f}{row['fit_cpu_s']:>9.1f}"
              f"{row['wall_vs_omikuji']:>7.2f}{row['cpu_vs_omikuji']:>7.2f}{auc:>8}{row['p@1'] * 100:>7.2f}"
              f"{row['p@5'] * 100:>7.2f}{row['load']:>6}{extra}", flush=True)


HSTEP_SETS = ["bibtex", "eurlex-4k-1.0", "amazoncat-13k-0.01"]


def hstep_child(data_file: Path, n_sweeps: int, seed: int) -> dict:
    """One timed fit in this process (whatever ``bayesmlc`` is on the path): per-sweep wall and CPU s."""
    import scipy.sparse as sp
    import torch

    import types

    from bayesmlc.bmls import gibbs as bmls_gibbs
    from bayesmlc.bmls import model as bmls_model

    torch.set_num_threads(1)
    arrays = np.load(data_file)
    X = sp.csr_matrix((arrays["x_data"], arrays["x_indices"], arrays["x_indptr"]), shape=tuple(arrays["x_shape"]))
    Y = sp.csr_matrix((arrays["y_data"], arrays["y_indices"], arrays["y_indptr"]), shape=tuple(arrays["y_shape"]))
    wall, cpu = [], []
    sweep = bmls_model.gibbs_sweep

    def timed_sweep(*args, **kwargs):
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        result = sweep(*args, **kwargs)
        wall.append(time.perf_counter() - start_wall)
        cpu.append(time.process_time() - start_cpu)
        return result

    bmls_model.gibbs_sweep = timed_sweep
    # the per-step timings of gibbs_sweep read time.perf_counter: make them CPU seconds
    bmls_gibbs.time = types.SimpleNamespace(perf_counter=time.process_time)
    model = BMLS(n_topics=100, schedule="fixed", n_burnin=n_sweeps - 1, n_draws=1, thin=1, random_state=seed).fit(X, Y)
    objective = np.asarray(model.history_["objective"])
    return {"s_per_sweep": float(np.median(wall[2:])), "cpu_s_per_sweep": float(np.median(cpu[2:])),
            "features_cpu_s_per_sweep": model.sweep_step_seconds_["features"] / model.n_sweeps_,
            "log_lik": float(objective[len(objective) // 2:].mean()), "n_sweeps": int(model.n_sweeps_),
            "load": load_average()}


def hstep_run(names: list[str], shared: Path, baseline: str, n_sweeps: int, n_rounds: int, seed: int):
    """Rows of the ``hstep`` table (see the module docstring): old and new tree per data set."""
    import subprocess
    import tempfile

    import scipy.sparse as sp

    repo = Path(__file__).resolve().parents[1]
    script = Path(__file__).resolve()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    print(f"{'dataset':<20}{'tree':<10}{'s/sweep':>9}{'CPU s':>9}{'h CPU s':>10}{'log-lik':>14}{'load':>6}")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        old_tree = scratch / "baseline"
        old_tree.mkdir()
        archive = subprocess.run(["git", "-C", str(repo), "archive", baseline, "bayesmlc"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive, check=True)
        trees = {"baseline": old_tree, "new": repo}

        def child(tree: Path, data_file: Path, sweeps: int) -> dict:
            out = subprocess.run([sys.executable, str(script), "hstep-child", "--data-file", str(data_file),
                                  "--sweeps", str(sweeps), "--seed", str(seed)], check=True, capture_output=True,
                                 text=True, env={**env, "PYTHONPATH": str(tree)}, cwd=scratch).stdout
            return json.loads(out.strip().splitlines()[-1])

        for name in names:
            X, Y, _, _ = scale_data(name, shared)
            X, Y = sp.csr_matrix(X), sp.csr_matrix(Y)
            data_file = scratch / f"{name}.npz"
            np.savez(data_file, x_data=X.data, x_indices=X.indices, x_indptr=X.indptr, x_shape=X.shape,
                     y_data=Y.data, y_indices=Y.indices, y_indptr=Y.indptr, y_shape=Y.shape)
            for tree in trees.values():  # warm-up: numba compiles into each tree's cache
                child(tree, data_file, 3)
            measured = {label: [] for label in trees}
            for _ in range(n_rounds):
                for label, tree in trees.items():
                    measured[label].append(child(tree, data_file, n_sweeps))
            for label, results in measured.items():
                row = {"part": "hstep", "dataset": name, "tree": label,
                       "commit": baseline if label == "baseline" else "working tree",
                       "n_train": int(X.shape[0]), "n_features": int(X.shape[1]), "n_labels": int(Y.shape[1]),
                       "nnz_x": int(X.nnz), "rounds": results}
                for key in ("s_per_sweep", "cpu_s_per_sweep", "features_cpu_s_per_sweep", "log_lik"):
                    row[key] = float(np.median([result[key] for result in results]))
                row["load"] = max(result["load"] for result in results)
                rows.append(row)
                print(f"{name:<20}{label:<10}{row['s_per_sweep']:>9.4f}{row['cpu_s_per_sweep']:>9.4f}"
                      f"{row['features_cpu_s_per_sweep']:>10.4f}{row['log_lik']:>14.1f}{row['load']:>6}", flush=True)
            old, new = rows[-2], rows[-1]
            print(f"{name:<20}{'new/old':<10}{new['s_per_sweep'] / old['s_per_sweep']:>9.2f}"
                  f"{new['cpu_s_per_sweep'] / old['cpu_s_per_sweep']:>9.2f}"
                  f"{new['features_cpu_s_per_sweep'] / old['features_cpu_s_per_sweep']:>10.2f}", flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["speed", "auc", "all", "scale", "hstep", "hstep-child"])
    parser.add_argument("--datasets", default=",".join(SCALE_SETS), help="data sets of the scale part")
    parser.add_argument("--models", help="scale: models to train beside omikuji (default: bmls and, where "
                        "cheap, logistic), e.g. --models bmls")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with train.txt / test.txt")
    parser.add_argument("--settings", default="full,labels20,labels20-co,inst20,inst20-co")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speed-sweeps", type=int, default=40)
    parser.add_argument("--baseline", default="HEAD", help="hstep: git commit whose sampler is the baseline")
    parser.add_argument("--sweeps", type=int, default=20, help="hstep: sweeps per timed fit")
    parser.add_argument("--rounds", type=int, default=2, help="hstep: timed fits per tree and data set")
    parser.add_argument("--data-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a BMLS parameter for the AUC runs (JSON value), e.g. --set n_draws=100")
    parser.add_argument("--co-form", choices=sorted(CO_FORMS), default="paper",
                        help="BMLS-co configuration of the -co settings (see above)")
    parser.add_argument("--out", type=Path, help="append result rows as JSON lines")
    parser.add_argument("--save-dir", type=Path, help="save each AUC run's model here")
    args = parser.parse_args(argv)

    params = {"n_topics": 100, "mu0": 10.0, "nu0": 10.0}
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = json.loads(value)
    params.update(overrides)
    if args.part == "hstep-child":
        print(json.dumps(hstep_child(args.data_file, args.sweeps, args.seed)))
        return 0
    if args.part == "hstep":
        names = HSTEP_SETS if args.datasets == ",".join(SCALE_SETS) else args.datasets.split(",")
        rows = hstep_run([name.strip() for name in names], args.data.parent, args.baseline, args.sweeps, args.rounds,
                         args.seed)
        if args.out:
            with open(args.out, "a") as handle:
                handle.writelines(json.dumps(row) + "\n" for row in rows)
        return 0
    if args.part == "scale":
        print(f"{'dataset':<20}{'model':<17}{'fit s':>9}{'CPU s':>9}{'wall x':>7}{'CPU x':>7}{'AUC':>8}{'P@1':>7}{'P@5':>7}{'load':>6}")
        for name in args.datasets.split(","):
            rows = scale_run(name.strip(), args.data.parent, args.seed, overrides,
                             args.models.split(",") if args.models else None)
            print_scale_rows(rows)
            if args.out:
                with open(args.out, "a") as handle:
                    handle.writelines(json.dumps(row) + "\n" for row in rows)
        return 0
    train, test = load(args.data)
    if args.part in ("speed", "all"):
        speed_rows = speed(train, args.speed_sweeps, args.seed)
        if args.out:
            with open(args.out, "a") as handle:
                handle.writelines(json.dumps(row) + "\n" for row in speed_rows)
    if args.part in ("auc", "all"):
        header = f"{'setting':<16}{'AUC':>8}{'paper':>8}{'macroAUC':>10}{'P@1':>7}{'P@3':>7}{'P@5':>7}{'fit s':>8}{'s/sweep':>9}{'load':>6}"
        print(header)
        for setting in args.settings.split(","):
            row = auc_run(setting.strip(), train, test, args.seed, params, args.save_dir, CO_FORMS[args.co_form])
            print(
                f"{row['setting']:<16}{row['auc']:>8.4f}{row['paper_auc']:>8.4f}{row['macro_auc']:>10.4f}"
                f"{row['p@1'] * 100:>7.2f}{row['p@3'] * 100:>7.2f}{row['p@5'] * 100:>7.2f}{row['fit_s']:>8.1f}"
                f"{row['s_per_sweep']:>9.4f}{row['load']:>6}",
                flush=True,
            )
            if args.out:
                with open(args.out, "a") as handle:
                    handle.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
