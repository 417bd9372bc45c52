"""Shared fixtures. Real datasets are read from the data root ``$BAYESMLC_DATA`` when it is set, else
from ``../shared/datasets`` beside the repository; tests that need them skip with a clear reason when
they are not there."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATASETS = Path(os.environ.get("BAYESMLC_DATA") or REPO_ROOT.parent / "shared" / "datasets")


def shared_dataset_dir(name: str) -> Path:
    """Folder of a real dataset in the data root (:data:`SHARED_DATASETS`), or skip the test with the reason."""
    folder = SHARED_DATASETS / name
    if not (folder / "train.txt").exists():
        pytest.skip(f"real dataset {name!r} not found at {folder} (set BAYESMLC_DATA)")
    return folder


@pytest.fixture
def shared_datasets() -> Path:
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"shared datasets folder not found at {SHARED_DATASETS}")
    return SHARED_DATASETS


def batch_standard_error(x, batches: int = 40):
    """The batch-means standard error of the mean of a Markov chain's draws ``x`` (first axis: the
    draws; any trailing axes are kept): the draws cut into ``batches`` consecutive batches (a remainder
    dropped), the standard deviation of the batch means over sqrt(batches)."""
    x = np.asarray(x, dtype=float)
    means = x[: len(x) // batches * batches].reshape(batches, -1, *x.shape[1:]).mean(axis=1)
    return means.std(axis=0, ddof=1) / np.sqrt(batches)


def linear_multilabel_problem(n=240, d=30, n_labels=6, seed=0, density=0.25):
    """Sparse float32 CSR features (n, d) and 0/1 labels (n, n_labels) from a noisy linear rule."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=density, random_state=seed, format="csr", dtype=np.float32)
    W = rng.normal(size=(d, n_labels)) * 2
    Y = (np.asarray(X @ W) + rng.normal(size=(n, n_labels)) > 0.5).astype(np.float32)
    return X, Y


@pytest.fixture(autouse=True, scope="session")
def fixed_thread_count():
    """Every test computes with the thread count set above (torch's and the BLAS pools'), inside one
    ``use_threads`` block, instead of the count the estimators choose from the machine's load: a
    figure a test compares against must not change with what else runs. Tests of the adaptive
    choice run outside it, in a fresh ``contextvars.Context()``."""
    from bayesmlc.threads import use_threads

    with use_threads(torch.get_num_threads()):
        yield


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """Every test ends with torch's thread count as it began: the benchmark scripts under test set it for
    the process, and the CLI's busy-machine message compares against the count a command starts with."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def write_small_xc(path, n=40, d=12, n_labels=4, seed=0, features_per_row=4):
    """A small XC-format file at ``path`` (n rows, d binary features, n_labels labels; each row up to
    two labels and ``features_per_row`` features drawn with ``seed``); returns ``path``."""
    rng = np.random.default_rng(seed)
    lines = [f"{n} {d} {n_labels}"]
    for _ in range(n):
        labels = sorted(set(rng.integers(0, n_labels, 2).tolist()))
        features = sorted(set(rng.integers(0, d, features_per_row).tolist()))
        lines.append(",".join(map(str, labels)) + " " + " ".join(f"{j}:1" for j in features))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_dense_xc(path, X, Y):
    """The dense arrays ``X`` (features) and ``Y`` (0/1 labels) as an XC-format file at ``path``."""
    lines = [f"{X.shape[0]} {X.shape[1]} {Y.shape[1]}"]
    for x, y in zip(X, Y):
        lines.append(",".join(str(j) for j in np.flatnonzero(y)) + " " +
                     " ".join(f"{j}:{x[j]:g}" for j in np.flatnonzero(x)))
    path.write_text("\n".join(lines) + "\n")


def shared_negative_targets(Y_rows, sampled):
    """MLGPF minibatch targets ("shared", SharedNegatives) for the rows ``Y_rows``: their positives one by
    one and the B x S block of the labels ``sampled`` as negatives, weighted L / S (0 on positives)."""
    from bayesmlc.gp.objective import LabelEntries, SharedNegatives

    Y_rows = sp.csr_matrix(Y_rows)
    counts = np.diff(Y_rows.indptr)
    positives = LabelEntries(np.repeat(np.arange(Y_rows.shape[0]), counts), Y_rows.indices.astype(np.int64),
                             np.ones(Y_rows.nnz), np.ones(Y_rows.nnz))
    weights = Y_rows.shape[1] / len(sampled) * (1.0 - Y_rows[:, sampled].toarray())
    return ("shared", SharedNegatives(positives, np.asarray(sampled, dtype=np.int64), weights))


def planted_linear_problem(seed=0, n=400, D=30, L=12):
    """Each of L labels fires on its own feature (the first L of D): a signal a rank-2 MLGPF factor
    model cannot carry and a per-label linear term can. (X float32 CSR, Y CSR)."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, D, density=0.15, random_state=np.random.RandomState(seed), format="csr", dtype=np.float64)
    X.data = np.abs(rng.standard_normal(X.nnz)) + 0.5
    Y = sp.csr_matrix((X[:, :L].toarray() > 0).astype(np.float64))
    return sp.csr_matrix(X, dtype=np.float32), Y
