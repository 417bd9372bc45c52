"""BMLS on Bibtex (the BMLS split) in one process and in two data-parallel processes (gloo, 127.0.0.1).

    BAYESMLC_DATA=/path/to/datasets python benchmarks/bench_bmls_distributed.py OUT_DIR [SEED]

Both fits use the defaults with ``random_state=SEED`` (0 when not given) and one thread per process;
the two processes each read their shard of ``bibtex/train.txt`` (``read_shard``) and fit with
``parallel=`` (docs/scaling.md, "BMLS on several processes"). Prints each fit's test micro-AUC (all
(instance, label) pairs), its seconds, sweeps and step seconds, and for two processes the share of
the h step's block proposals accepted; the two-process "launch" includes spawning and importing.
"""

import json
import os
import sys
import time
import warnings

import numpy as np
import torch
import torch.multiprocessing as mp

FOLDER = os.path.join(os.environ.get("BAYESMLC_DATA", "../shared/datasets"), "bibtex")
PORT = 29541


def _rank(rank, out, seed):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(PORT), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from bayesmlc.bmls import BMLS
    from bayesmlc.data.shard import read_shard
    from bayesmlc.distributed import DataParallel

    parallel = DataParallel.from_env(backend="gloo", timeout_s=600)
    train = read_shard(os.path.join(FOLDER, "train.txt"), parallel)
    started = time.perf_counter()
    model = BMLS(random_state=seed, n_threads=1).fit(train.X, train.Y, parallel=parallel)
    if parallel.is_main:
        model.save(os.path.join(out, "two.npz"))
        with open(os.path.join(out, "two.json"), "w") as handle:
            json.dump({"fit_s": time.perf_counter() - started, "sweeps": int(model.n_sweeps_),
                       "burnin": int(model.n_burnin_), "steps": model.sweep_step_seconds_,
                       "h_acceptance": float(np.nanmean(model.history_["h_acceptance"]))}, handle)
    parallel.close()


def main(out, seed):
    from sklearn.metrics import roc_auc_score

    from bayesmlc.base import MultiLabelEstimator
    from bayesmlc.bmls import BMLS
    from bayesmlc.data.io import read_dataset

    os.makedirs(out, exist_ok=True)
    train = read_dataset(os.path.join(FOLDER, "train.txt"))
    test = read_dataset(os.path.join(FOLDER, "test.txt")).with_features_width(train.n_features)
    truth = test.Y.toarray().ravel()
    started = time.perf_counter()
    mp.start_processes(_rank, args=(out, seed), nprocs=2, start_method="spawn")
    launch = time.perf_counter() - started
    two = MultiLabelEstimator.load(os.path.join(out, "two.npz"))
    with open(os.path.join(out, "two.json")) as handle:
        info = json.load(handle)
    print(f"two processes: AUC {roc_auc_score(truth, two.predict_proba(test.X).ravel()):.4f}, launch {launch:.1f} s, "
          f"{info}", flush=True)
    torch.set_num_threads(1)
    started = time.perf_counter()
    one = BMLS(random_state=seed, n_threads=1).fit(train.X, train.Y)
    print(f"one process: AUC {roc_auc_score(truth, one.predict_proba(test.X).ravel()):.4f}, fit "
          f"{time.perf_counter() - started:.1f} s, {one.n_sweeps_} sweeps ({one.n_burnin_} burn-in), "
          f"{one.sweep_step_seconds_}", flush=True)
    np.save(os.path.join(out, "history-two.npy"), np.asarray(two.history_["objective"]))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bmls-distributed-out", int(sys.argv[2]) if len(sys.argv) > 2 else 0)
