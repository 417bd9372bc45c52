"""MLGPF ablations by label-frequency band, chosen on a validation split of the training rows.

Usage (from the repository root)::

    python benchmarks/ablate_mlgpf_bands.py --train TRAIN.txt [--test TEST.txt --final]
        [--configs default P50 P200 ...] [--threads 1] [--out results.jsonl]

Without ``--final`` every configuration is fitted on 80% of the rows of ``--train`` (``split``,
seed 0) and scored on the other 20%, the validation rows: the choice of settings never sees the test
rows. With ``--final`` it is fitted on all of ``--train`` and scored on ``--test``. Each configuration
prints (and appends to ``--out``) one JSON line: its P@1, P@5, PSP@1, PSP@5 and R@5 (in %), each
metric's contributions of the ten label-frequency bands (:func:`bayesmlc.metrics.metrics_by_band`,
the bands of the rows it was fitted on), the training seconds and the load average.

A configuration is a set of :class:`bayesmlc.MLGPF` parameters (``CONFIGS``) and a count-feature
weighting applied to the rows before the model sees them (``"bm25"``: Okapi BM25 term weights,
Robertson and Zaragoza 2009, eq. 3.15 with k1 = 1.2, b = 0.75 and the model's own idf turned off;
``"log1p"``: log(1 + x) of every stored value). ``--set key=value`` overrides a parameter of every
configuration.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

#: name -> (MLGPF parameters, feature weighting)
CONFIGS = {
    "default": ({}, None),
    "P50": ({"n_latent": 50}, None),
    "P200": ({"n_latent": 200}, None),
    "P400": ({"n_latent": 400}, None),
    "R100": ({"subspace_rank": 100}, None),
    "R250": ({"subspace_rank": 250}, None),
    "R2000": ({"subspace_rank": 2000}, None),
    "R4000": ({"subspace_rank": 4000}, None),
    "neg200": ({"negative_samples": 200}, None),
    "neg500": ({"negative_samples": 500}, None),
    "neg1000": ({"negative_samples": 1000}, None),
    "neg2000": ({"negative_samples": 2000}, None),
    "negall": ({"negative_samples": None}, None),
    "idf-off": ({"idf_weighting": False}, None),
    "idf-on": ({"idf_weighting": True}, None),
    "bm25": ({"idf_weighting": False}, "bm25"),
    "log1p": ({}, "log1p"),
    "M400": ({"n_inducing": 400}, None),
    "linear+term": ({"kernel": "linear", "linear_term": True}, None),
    "se-no-term": ({"kernel": "se", "linear_term": False}, None),
    "se+term": ({"kernel": "se", "linear_term": True}, None),
}
BAND_METRICS = ("P@1", "P@5", "PSP@1", "PSP@5", "R@5")


def bm25_weights(X_fit: sp.csr_matrix, X: sp.csr_matrix, k1: float = 1.2, b: float = 0.75) -> sp.csr_matrix:
    """Okapi BM25 term weights of the rows of ``X``, with the document frequencies and mean row length
    of ``X_fit``: idf_j tf (k1 + 1) / (tf + k1 (1 - b + b len / mean len)), idf_j = ln(1 + (N - n_j + 0.5)
    / (n_j + 0.5)) (Robertson and Zaragoza 2009, eq. 3.15; the "+1" keeps every weight positive)."""
    X_fit = sp.csr_matrix(X_fit)
    n_rows = X_fit.shape[0]
    document_frequency = np.bincount(X_fit.indices, minlength=X_fit.shape[1])
    idf = np.log1p((n_rows - document_frequency + 0.5) / (document_frequency + 0.5))
    mean_length = np.asarray(X_fit.sum(axis=1)).mean()
    X = sp.csr_matrix(X, dtype=np.float64, copy=True)
    length = np.repeat(np.asarray(X.sum(axis=1)).ravel(), np.diff(X.indptr))
    tf = X.data
    X.data = idf[X.indices] * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / mean_length))
    return X


def weighted(kind, X_fit, X):
    if kind is None:
        return X
    if kind == "log1p":
        out = sp.csr_matrix(X, dtype=np.float64, copy=True)
        out.data = np.log1p(out.data)
        return out
    if kind == "bm25":
        return bm25_weights(X_fit, X)
    raise ValueError(f"unknown feature weighting {kind!r}")


def run_config(name, params, weighting, fit, evaluate, threads, seed):
    """Fit one configuration on ``fit`` and score ``evaluate``; the JSON record."""
    from bayesmlc import MLGPF
    from bayesmlc.metrics import inverse_propensity, metrics_by_band

    X_fit, X_eval = weighted(weighting, fit.X, fit.X), weighted(weighting, fit.X, evaluate.X)
    model = MLGPF(random_state=seed, n_threads=threads, **params)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    model.fit(X_fit, fit.Y)
    seconds = time.perf_counter() - start
    ranking = model.predict_topk(X_eval, 5)
    bands = metrics_by_band(evaluate.Y, ranking, fit.Y, ks=(1, 5), propensities=inverse_propensity(fit.Y))
    return {
        "config": name, "params": params, "weighting": weighting, "n_latent": model.n_latent_,
        "train_seconds": round(seconds, 1), "load_avg_1m": round(load, 2),
        "metrics": {m: round(100 * bands.overall(m), 2) for m in BAND_METRICS},
        "bands": {m: [round(100 * v, 3) for v in bands.values[m]] for m in BAND_METRICS},
        "band_labels": bands.bands.n_labels.tolist(), "band_max_count": bands.bands.max_count.tolist(),
        "positive_share": [round(100 * v, 2) for v in bands.positive_share],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", required=True)
    parser.add_argument("--test")
    parser.add_argument("--final", action="store_true", help="fit on all of --train, score --test")
    parser.add_argument("--configs", nargs="+", default=["default"], choices=sorted(CONFIGS))
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    from bayesmlc.data.io import conform_widths, read_dataset
    from bayesmlc.data.synthetic import split

    overrides = {key: ast.literal_eval(value) for key, value in (item.split("=", 1) for item in args.set)}
    data = read_dataset(args.train)
    if args.final:
        if not args.test:
            parser.error("--final needs --test")
        evaluate = conform_widths(read_dataset(args.test), data.n_features, data.n_labels, args.test,
                                  "the training file has")
        fit = data
    else:
        fit, evaluate = split(data, 0.2, random_state=0)
    for name in args.configs:
        params, weighting = CONFIGS[name]
        record = run_config(name, {**params, **overrides}, weighting, fit, evaluate, args.threads, args.seed)
        record.update(train=args.train, evaluated_on="test" if args.final else "validation (20% of train, seed 0)")
        line = json.dumps(record)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
