"""Data-parallel training (bayesmlc.distributed): 2 CPU processes on the gloo backend, 127.0.0.1.

The distributed runs are compared with single-process runs of the same global batch size, which
is what the scheme promises: each rank holds only its shard of the rows, the initialisation is
built from statistics summed over ranks, the per-rank bounds sum to the single-process bound, so
after the gradient all-reduce every rank takes the single-process step. A stand-in model (logistic
regression with a Gaussian prior) also checks the reduced gradient against its closed form.
The sharded reader and the reduce-based SVD / k-means are also checked in one process (shards
read one by one; "ranks" as threads that sum through a barrier).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.multiprocessing as mp

import bayesmlc.data.shard as shard_module
from bayesmlc.data.dataset import Dataset
from bayesmlc.data.io import read_dataset, write_dataset
from bayesmlc.data.synthetic import make_multilabel
from bayesmlc.data.shard import RowShard, read_shard, shard_bounds
from bayesmlc.distributed import DataParallel, ParallelContext, RankFailedError, SingleProcess
from bayesmlc.exceptions import DataFormatError, ValidationError
from bayesmlc.gp import MLGPF
from bayesmlc.gp.inducing import kmeans_centres, subspace_kmeans_centres, truncated_svd
from bayesmlc.linalg import top_singular_vectors

WORLD_SIZE = 2
JOIN_TIMEOUT_S = 240.0  # the whole spawned run; a hang fails the test instead of blocking the suite
GROUP_TIMEOUT_S = 120.0  # backstop inside the process group

# a tiny problem: 121 rows in batches of 40 -> 40, 40, 40, 1 (rank 1 gets no row of the last batch)
N_ROWS, N_FEATURES, N_LABELS = 121, 40, 10
MLGPF_SETTINGS = dict(
    n_latent=3, n_inducing=8, subspace_rank=6, batch_size=40, learning_rate=0.05, random_state=3, device="cpu",
    lr_decay=0.0,  # constant rates: a 2-epoch checkpoint is the first half of a 4-epoch run
    linear_term=False,  # "auto" keeps the per-label linear term to one process: one model on both sides
)
STANDIN_STEPS, STANDIN_BATCH = 6, 25
# initialisations compared with one process: the SVD on a row sample split across the ranks (and a
# validation split, evaluated after one epoch), k-means in input space, a subset of rows
INIT_VARIANTS = {
    "subsampled": dict(epochs=1, svd_max_rows=50, validation_fraction=0.2),
    "free": dict(epochs=0, inducing="free", standardize=True),  # column means and scales from sums over ranks
    "fixed": dict(epochs=0, inducing="fixed", idf_weighting=True),  # idf from document counts over ranks
}


# ---- pure pieces --------------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_shard_bounds_tile_every_batch_in_order(world_size):
    for n_rows in range(0, 23):
        bounds = [shard_bounds(n_rows, rank, world_size) for rank in range(world_size)]
        assert bounds[0][0] == 0 and bounds[-1][1] == n_rows
        assert all(bounds[r][1] == bounds[r + 1][0] for r in range(world_size - 1))
        sizes = [stop - start for start, stop in bounds]
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_single_process_strategy_changes_nothing():
    single = SingleProcess()
    X, Y = sp.csr_matrix(np.eye(7, 3)), sp.csr_matrix(np.eye(7, 2))
    local_X, local_Y, mask, shard = single.local_data(X, Y)
    assert local_X is X and local_Y is Y and mask is None and shard == RowShard(0, 7, 7)
    assert single.reduce_sum([1.5, 2.0]).tolist() == [1.5, 2.0]
    assert single.bound_weights(100, 0.5, 7, 7) == (100, 0.5)
    param = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    param.grad = torch.tensor([0.25, -1.0])
    assert single.reduce_gradients([param], torch.tensor(-3.5)) == -3.5
    assert param.grad.tolist() == [0.25, -1.0]
    assert single.sum_counts(3, 4.5) == (3, 4.5)


# ---- shards in one process ------------------------------------------------------------------------
class _Rank:
    def __init__(self, rank, world_size):
        self.rank, self.world_size = rank, world_size


@pytest.mark.parametrize("kind", ["npz", "compressed-npz", "txt"])
def test_read_shard_reads_each_ranks_rows_and_the_shards_tile_the_file(tmp_path, monkeypatch, kind):
    import zipfile

    monkeypatch.setattr(shard_module, "_SCAN_BYTES", 13)  # many chunk boundaries while looking for the lines
    X, Y = _data()
    Y = Y.tolil()
    Y[0, :] = 0  # a row without labels (an XC line that starts with a space)
    extension = "txt" if kind == "txt" else "npz"
    mask = None if kind == "txt" else _mask()  # XC text cannot store a mask
    path = tmp_path / f"train.{extension}"
    write_dataset(Dataset(X=X, Y=Y.tocsr(), label_mask=mask), path)
    whole = read_dataset(path)
    if kind == "compressed-npz":  # as numpy.savez_compressed writes: the members are deflated
        stored = tmp_path / "stored.npz"
        path.rename(stored)
        with zipfile.ZipFile(stored) as source, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as target:
            for member in source.infolist():
                target.writestr(member.filename, source.read(member.filename))
    for world_size in (1, 2, 3, 5):
        shards = [read_shard(path, _Rank(rank, world_size)) for rank in range(world_size)]
        for rank, shard in enumerate(shards):
            start, stop = shard_bounds(N_ROWS, rank, world_size)
            assert shard.source["shard"] == {**shard.source["shard"], "start": start, "stop": stop, "n_rows": N_ROWS}
            assert shard.n_samples == stop - start
        for name in ("X", "Y", "label_mask"):
            if getattr(whole, name) is None:
                assert all(getattr(shard, name) is None for shard in shards)
                continue
            stacked = sp.vstack([getattr(shard, name) for shard in shards]).tocsr()
            assert stacked.shape == getattr(whole, name).shape
            assert (stacked != getattr(whole, name)).nnz == 0, (name, world_size)


def test_read_shard_allocates_about_its_share_of_an_npz_file(tmp_path):
    import tracemalloc

    X = sp.random(16000, 400, density=0.1, random_state=0, format="csr", dtype=np.float32)  # 5 MB of X
    Y = sp.random(16000, 30, density=0.1, random_state=1, format="csr", dtype=np.float32)
    Y.data[:] = 1.0
    path = tmp_path / "big.npz"
    write_dataset(Dataset(X=X, Y=Y), path)
    whole_bytes = X.data.nbytes + X.indices.nbytes + Y.indices.nbytes
    tracemalloc.start()
    try:
        shard = read_shard(path, _Rank(3, 8))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert shard.n_samples == 2000
    # one eighth of the rows, read at their offsets: the allocations peak at about the shard's size
    # (0.145 x the whole file when written), not at the file's
    assert peak < 0.2 * whole_bytes, (peak, whole_bytes)


def test_read_shard_names_the_file_and_problem(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("5 3 2\n0 0:1\n1 2:0.5\n")
    with pytest.raises(DataFormatError, match="declares N=5 rows"):
        read_shard(short, _Rank(1, 2))
    X, Y = _data()
    svm = tmp_path / "train.svm"
    write_dataset(Dataset(X=X, Y=Y), svm)
    with pytest.raises(ValidationError, match="npz and xc formats, not 'svmlight'"):
        read_shard(svm, _Rank(0, 2))
    with pytest.raises(DataFormatError, match="no such file"):
        read_shard(tmp_path / "missing.npz", _Rank(0, 2))
    # a dataset file of a newer format is refused, as read_dataset refuses it
    npz = tmp_path / "train.npz"
    write_dataset(Dataset(X=X, Y=Y), npz)
    with np.load(npz) as archive:
        contents = dict(archive)
    contents["format_version"] = np.asarray(99)
    np.savez(tmp_path / "newer.npz", **contents)
    with pytest.raises(DataFormatError, match="newer bayesmlc"):
        read_shard(tmp_path / "newer.npz", _Rank(0, 2))


def _run_as_ranks(world_size, compute):
    """``compute(rank, reduce)`` on ``world_size`` threads whose ``reduce`` sums (in rank order) over
    the threads through a barrier: the collectives of ``world_size`` processes, in one process."""
    barrier, parts, results = threading.Barrier(world_size), [None] * world_size, [None] * world_size

    def reducer(rank):
        def reduce(array):
            parts[rank] = np.array(array, dtype=np.float64)
            barrier.wait()
            total = sum(parts[1:], parts[0].copy())
            barrier.wait()  # nobody overwrites its part before every thread has read them all
            return total
        return reduce

    def run(rank):
        results[rank] = compute(rank, reducer(rank))

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert all(result is not None for result in results), "a simulated rank failed"
    return results


class _Summing:
    """A strategy whose only collective is ``reduce_sum`` (the threads' barrier sum)."""

    def __init__(self, reduce):
        self.reduce_sum = reduce


def _context(shard, reduce) -> ParallelContext:
    return ParallelContext(shard, _Summing(reduce))


def _uneven_shards(n_rows):
    """Three shards of different sizes, one of them small."""
    cuts = [0, n_rows // 2, n_rows // 2 + 3, n_rows]
    return [RowShard(cuts[r], cuts[r + 1], n_rows) for r in range(3)]


def test_row_shard_gather_collects_rows_from_every_shard():
    rows = sp.random(40, 6, density=0.4, random_state=1, format="csr")
    shards = _uneven_shards(40)
    ids = np.array([39, 0, 21, 20, 22, 5])
    gathered = _run_as_ranks(3, lambda r, reduce: shards[r].gather(rows[shards[r].start : shards[r].stop], ids, reduce))
    for result in gathered:
        np.testing.assert_array_equal(result, rows[ids].toarray())


def test_top_singular_vectors_over_row_shards_equal_one_process_and_the_dense_svd():
    rng = np.random.default_rng(3)
    scales = np.array([9.0, 7.0, 5.0, 3.0, 2.0])
    low_rank = rng.standard_normal((90, 5)) * scales @ np.linalg.qr(rng.standard_normal((20, 5)))[0].T
    X = sp.csr_matrix(np.where(rng.random((90, 20)) < 0.6, low_rank + 0.01 * rng.standard_normal((90, 20)), 0.0))
    Vt, s = top_singular_vectors(X, 4, seed=0)
    _, s_dense, Vt_dense = np.linalg.svd(X.toarray(), full_matrices=False)
    # 4 iterations at a gap of s4 / s5 = 1.5, then Rayleigh-Ritz on Q^T X: s4 is 3.1e-7 low from this
    # seed's start (1.2e-7 from another); the first three to 2.3e-9
    np.testing.assert_allclose(s, s_dense[:4], rtol=1e-6)
    np.testing.assert_allclose(s[:3], s_dense[:3], rtol=1e-8)
    np.testing.assert_allclose(np.abs(Vt @ Vt_dense[:4].T), np.eye(4), atol=1e-6)  # same vectors up to sign
    shards = _uneven_shards(90)
    results = _run_as_ranks(
        3, lambda r, reduce: top_singular_vectors(X[shards[r].start : shards[r].stop], 4, 0, _context(shards[r], reduce))
    )
    for Vt_r, s_r in results:
        np.testing.assert_allclose(Vt_r, Vt, atol=1e-10)
        np.testing.assert_allclose(s_r, s, rtol=1e-10)


def test_truncated_svd_of_a_row_sample_over_shards_equals_one_process():
    X = sp.random(120, 15, density=0.3, random_state=4, format="csr", dtype=np.float32)
    basis = truncated_svd(X, 5, seed=2, max_rows=70)
    # the basis of the sampled rows: the same rows by the documented draw, then the iteration on them
    sample = np.sort(np.random.default_rng(2).choice(120, 70, replace=False))
    np.testing.assert_allclose(basis, top_singular_vectors(X[sample], 5, seed=2)[0], atol=1e-6)
    shards = _uneven_shards(120)
    results = _run_as_ranks(
        3, lambda r, reduce: truncated_svd(X[shards[r].start : shards[r].stop], 5, 2, 70, _context(shards[r], reduce))
    )
    for basis_r in results:
        np.testing.assert_allclose(basis_r, basis, atol=1e-6)


def test_subspace_kmeans_over_shards_equals_one_process_and_kmeans_of_the_sampled_projections():
    X = sp.random(150, 20, density=0.3, random_state=5, format="csr", dtype=np.float32)
    basis = truncated_svd(X, 6, seed=0)
    found = subspace_kmeans_centres(X, basis, 4, seed=3, max_rows=90)
    # independently: the 90 rows of the documented draw, projected densely, then kmeans_centres
    sample = np.sort(np.random.default_rng(3).choice(150, 90, replace=False))
    projected = X[sample].toarray() @ basis.T.astype(np.float64)
    np.testing.assert_allclose(found, kmeans_centres(projected, 4, seed=3, max_rows=90), atol=1e-5)
    shards = _uneven_shards(150)
    results = _run_as_ranks(
        3, lambda r, reduce: subspace_kmeans_centres(X[shards[r].start : shards[r].stop], basis, 4, 3, 90,
                                                     _context(shards[r], reduce))
    )
    for result in results:
        np.testing.assert_allclose(result, found, atol=1e-5)


def test_kmeans_over_shards_equals_one_process_and_lloyds_algorithm():
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(5)
    centres = rng.standard_normal((6, 4)) * 5
    points = centres[rng.integers(0, 6, 300)] + rng.standard_normal((300, 4))
    found = kmeans_centres(points, 6, seed=7, max_rows=200)
    # the same sample and initial rows, then 5 Lloyd iterations by scikit-learn
    draw = np.random.default_rng(7)
    sample = points[np.sort(draw.choice(300, 200, replace=False))]
    initial = sample[draw.choice(200, 6, replace=False)]
    lloyd = KMeans(6, init=initial, n_init=1, max_iter=5, tol=0.0, algorithm="lloyd").fit(sample)
    np.testing.assert_allclose(found, lloyd.cluster_centers_, rtol=1e-5, atol=1e-5)
    shards = _uneven_shards(300)
    results = _run_as_ranks(
        3, lambda r, reduce: kmeans_centres(points[shards[r].start : shards[r].stop], 6, 7, 200, _context(shards[r], reduce))
    )
    for result in results:
        np.testing.assert_allclose(result, found, atol=1e-5)
    # sparse points (free inducing inputs in input space)
    sparse_points = sp.random(80, 30, density=0.2, random_state=6, format="csr")
    found = kmeans_centres(sparse_points, 5, seed=1)
    shards = _uneven_shards(80)
    results = _run_as_ranks(
        3, lambda r, reduce: kmeans_centres(sparse_points[shards[r].start : shards[r].stop], 5, 1,
                                            context=_context(shards[r], reduce))
    )
    for result in results:
        np.testing.assert_allclose(result, found, atol=1e-6)


def test_data_parallel_needs_a_process_group_and_torchrun_environment(monkeypatch):
    assert not torch.distributed.is_initialized()
    with pytest.raises(ValidationError, match="initialised torch.distributed process group"):
        DataParallel()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValidationError, match="RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.*torchrun"):
        DataParallel.from_env(backend="gloo")


# ---- helpers run by every rank ------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _join_group(rank: int, world_size: int, port: int) -> DataParallel:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    return DataParallel.from_env(backend="gloo", timeout_s=GROUP_TIMEOUT_S)


def _spawn(worker, *args) -> None:
    """Run ``worker(rank, world_size, port, *args)`` on WORLD_SIZE spawned processes; fail on a hang."""
    context = mp.start_processes(
        worker, args=(WORLD_SIZE, _free_port(), *args), nprocs=WORLD_SIZE, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            pytest.fail(f"the {WORLD_SIZE} ranks did not finish within {JOIN_TIMEOUT_S} s")


def _data():
    data = make_multilabel(N_ROWS, N_FEATURES, N_LABELS, features_per_row=8, labels_per_row=2, random_state=11)
    return data.X, data.Y


def _mask():
    """About 70% of the label entries observed."""
    return sp.csr_matrix(np.random.default_rng(12).random((N_ROWS, N_LABELS)) < 0.7, dtype=np.float32)


def _standin_data():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((60, 4))
    y = (X @ np.array([1.0, -2.0, 0.5, 0.0]) + rng.standard_normal(60) > 0).astype(np.float64)
    return X, y


def _standin_fit(parallel):
    """Logistic regression, prior N(0, I), the same minibatch bound and loop structure as MLGPF:
    loss = -[(N / B) sum_{i in B} log p(y_i | x_i, w) - 0.5 |w|^2] / N, Adam.
    Returns (weights after STANDIN_STEPS steps, the reduced gradient of the first step)."""
    X, y = _standin_data()
    n = len(y)
    shard = RowShard(*shard_bounds(n, parallel.rank, parallel.world_size), n)
    X, y = X[shard.start : shard.stop], y[shard.start : shard.stop]  # this rank's rows only
    weights = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    optimizer = torch.optim.Adam([weights], lr=0.1)
    order = np.random.default_rng(0).permutation(n)
    first_gradient = None
    for step in range(STANDIN_STEPS):
        batch_rows = np.sort(order[(step * STANDIN_BATCH) % n :][:STANDIN_BATCH])  # global row ids
        rows = batch_rows[shard.positions_in(batch_rows)] - shard.start
        n_scale, prior_weight = parallel.bound_weights(n, 1.0, len(rows), len(batch_rows))
        logits = torch.as_tensor(X[rows]) @ weights
        log_lik = -torch.nn.functional.binary_cross_entropy_with_logits(
            logits, torch.as_tensor(y[rows]), reduction="sum"
        )
        bound = (n_scale / max(len(rows), 1)) * log_lik - prior_weight * 0.5 * weights.pow(2).sum()
        optimizer.zero_grad()
        (-bound / n).backward()
        parallel.reduce_gradients([weights], bound.detach())
        if first_gradient is None:
            first_gradient = weights.grad.detach().clone().numpy()
        optimizer.step()
    return weights.detach().numpy(), first_gradient


def _mlgpf_arrays(model) -> dict:
    arrays = {f"param/{k}": v.numpy() for k, v in model.parameters_.items()}
    arrays.update({f"history/{k}": np.asarray(v, dtype=np.float64) for k, v in model.history_.items()})
    return arrays


def _training_worker(rank, world_size, port, out):
    parallel = _join_group(rank, world_size, port)
    weights, first_gradient = _standin_fit(parallel)
    if parallel.is_main:
        np.savez(os.path.join(out, "standin.npz"), weights=weights, first_gradient=first_gradient)

    train = read_shard(os.path.join(out, "train.npz"), parallel)  # this rank's rows, nothing else
    X, Y = train.X, train.Y
    held = parallel.local_data(X, Y)[3]
    np.savez(os.path.join(out, f"shard-rank{rank}.npz"), X=X.toarray(), Y=Y.toarray(),
             read=[train.source["shard"][k] for k in ("start", "stop", "n_rows")],
             held=[held.start, held.stop, held.n_total])
    for name, settings in INIT_VARIANTS.items():
        model = MLGPF(dtype="float64", **{**MLGPF_SETTINGS, **settings}).fit(X, Y, parallel=parallel)
        if parallel.is_main:
            np.savez(os.path.join(out, f"init-{name}.npz"), **_mlgpf_arrays(model))

    checkpoint = os.path.join(out, "checkpoint.npz")
    full = MLGPF(epochs=2, dtype="float64", checkpoint_every=1, checkpoint_path=checkpoint, **MLGPF_SETTINGS)
    full.fit(X, Y, parallel=parallel)
    if parallel.is_main:
        np.savez(os.path.join(out, "full.npz"), **_mlgpf_arrays(full))
        shutil.copy(checkpoint, os.path.join(out, "checkpoint-epoch2.npz"))
    # every rank resumes from the checkpoint rank 0 wrote (fit returns only after all ranks finished)
    resumed = MLGPF(epochs=4, dtype="float64", checkpoint_every=1, checkpoint_path=checkpoint, **MLGPF_SETTINGS)
    resumed.fit(X, Y, parallel=parallel, resume=True)
    if parallel.is_main:
        np.savez(os.path.join(out, "resumed.npz"), **_mlgpf_arrays(resumed))

    # the whole data set on every rank (each rank keeps its shard), with a label mask
    X_all, Y_all = _data()
    sampled = MLGPF(epochs=2, negative_samples=3, dtype="float64", **MLGPF_SETTINGS)
    sampled.fit(X_all, Y_all, label_mask=_mask(), parallel=parallel)
    if parallel.is_main:
        np.savez(os.path.join(out, "sampled.npz"), **_mlgpf_arrays(sampled))
    _run_out_of_step(parallel, X, Y, out)
    # last, as it leaves rank 1's bound replaced: a failure on one rank must stop both
    _run_with_failure_on_rank_1(parallel, X, Y, out)
    parallel.close()


def _record_outcome(path, fit):
    started = time.monotonic()
    try:
        fit()
        outcome = "finished without error"
    except Exception as exc:  # recorded for the parent test to inspect
        outcome = f"{type(exc).__name__}: {exc}"
    with open(path, "w") as handle:
        handle.write(f"{time.monotonic() - started:.3f}\n{outcome}")


def _run_out_of_step(parallel, X, Y, out):
    """Rank 0 resumes from the checkpoint, rank 1 cannot see it (as on a host without the shared
    file system) and starts from scratch: both must stop with RanksOutOfStepError."""
    path = os.path.join(out, "checkpoint.npz" if parallel.is_main else "not-on-this-host.npz")
    model = MLGPF(epochs=5, dtype="float64", checkpoint_path=path, **MLGPF_SETTINGS)
    _record_outcome(os.path.join(out, f"out-of-step-rank{parallel.rank}.txt"),
                    lambda: model.fit(X, Y, parallel=parallel, resume=True))
    # both resume, from checkpoints of different epochs: the same collectives, different parameters
    path = os.path.join(out, "checkpoint-epoch2.npz" if parallel.is_main else "checkpoint.npz")
    model = MLGPF(epochs=5, dtype="float64", checkpoint_path=path, **MLGPF_SETTINGS)
    _record_outcome(os.path.join(out, f"different-checkpoints-rank{parallel.rank}.txt"),
                    lambda: model.fit(X, Y, parallel=parallel, resume=True))


def _run_with_failure_on_rank_1(parallel, X, Y, out):
    """Rank 1 raises in its third bound evaluation; every rank records the error it stopped with."""
    if parallel.rank == 1:
        import bayesmlc.gp.objective as objective

        original, calls = objective.minibatch_elbo, []

        def failing_elbo(*args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                raise ValueError("injected failure on rank 1")
            return original(*args, **kwargs)

        objective.minibatch_elbo = failing_elbo
    _record_outcome(os.path.join(out, f"failure-rank{parallel.rank}.txt"),
                    lambda: MLGPF(epochs=3, **MLGPF_SETTINGS).fit(X, Y, parallel=parallel))


def _load(path) -> dict:
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


def _assert_same_fit(distributed: dict, single, rtol, atol):
    reference = _mlgpf_arrays(single)
    assert sorted(distributed) == sorted(reference)
    for key in reference:
        if key.startswith("history/wall_time"):
            continue
        np.testing.assert_allclose(distributed[key], reference[key], rtol=rtol, atol=atol, err_msg=key)


# ---- the spawned runs ---------------------------------------------------------------------------
def _spawned_run(tmp_path_factory, name, worker) -> str:
    """A folder with the test data as ``train.npz`` and what ``worker`` wrote there on 2 spawned ranks."""
    out = str(tmp_path_factory.mktemp(name))
    X, Y = _data()
    write_dataset(Dataset(X=X, Y=Y), os.path.join(out, "train.npz"))
    _spawn(worker, out)
    return out


@pytest.fixture(scope="module")
def distributed_run(tmp_path_factory):
    return _spawned_run(tmp_path_factory, "distributed", _training_worker)


def test_each_rank_read_and_trained_on_its_shard_only(distributed_run):
    X, Y = _data()
    for rank in range(WORLD_SIZE):
        start, stop = shard_bounds(N_ROWS, rank, WORLD_SIZE)
        shard = _load(os.path.join(distributed_run, f"shard-rank{rank}.npz"))
        assert shard["read"].tolist() == [start, stop, N_ROWS]
        assert shard["X"].shape == (stop - start, N_FEATURES)  # the rank never held another row
        np.testing.assert_array_equal(shard["X"], X[start:stop].toarray())
        np.testing.assert_array_equal(shard["Y"], Y[start:stop].toarray())
        # the model placed the rank's rows at their global position
        assert shard["held"].tolist() == [start, stop, N_ROWS]


@pytest.mark.parametrize("name", sorted(INIT_VARIANTS))
def test_initialisation_from_shards_equals_single_process(distributed_run, name):
    X, Y = _data()
    single = MLGPF(dtype="float64", **{**MLGPF_SETTINGS, **INIT_VARIANTS[name]}).fit(X, Y)
    _assert_same_fit(_load(os.path.join(distributed_run, f"init-{name}.npz")), single, rtol=1e-7, atol=1e-9)


def test_standin_gradient_equals_closed_form_and_training_equals_single_process(distributed_run):
    result = _load(os.path.join(distributed_run, "standin.npz"))
    X, y = _standin_data()
    rows = np.random.default_rng(0).permutation(len(y))[:STANDIN_BATCH]
    # d/dw of -[(N/B) sum_B log p - |w|^2 / 2] / N at w = 0: -(1/B) X_B^T (y_B - 1/2)
    expected = -X[rows].T @ (y[rows] - 0.5) / STANDIN_BATCH
    np.testing.assert_allclose(result["first_gradient"], expected, rtol=1e-12, atol=1e-14)
    single_weights, _ = _standin_fit(SingleProcess())
    np.testing.assert_allclose(result["weights"], single_weights, rtol=1e-10, atol=1e-12)


def test_mlgpf_two_ranks_equal_one_process_with_the_same_global_batch(distributed_run):
    X, Y = _data()
    single = MLGPF(epochs=2, dtype="float64", **MLGPF_SETTINGS).fit(X, Y)
    distributed = _load(os.path.join(distributed_run, "full.npz"))
    _assert_same_fit(distributed, single, rtol=1e-7, atol=1e-9)
    # the run moved the parameters: the comparison is not between two copies of the initial values
    initial = MLGPF(epochs=0, dtype="float64", **MLGPF_SETTINGS).fit(X, Y)
    assert np.abs(distributed["param/Phi"] - initial.parameters_["Phi"].numpy()).max() > 1e-2


def test_mlgpf_sampled_negatives_with_a_mask_two_ranks_equal_one_process(distributed_run):
    X, Y = _data()
    single = MLGPF(epochs=2, negative_samples=3, dtype="float64", **MLGPF_SETTINGS).fit(X, Y, label_mask=_mask())
    _assert_same_fit(_load(os.path.join(distributed_run, "sampled.npz")), single, rtol=1e-7, atol=1e-9)


def test_distributed_checkpoint_resumes_in_one_process_and_on_every_rank(distributed_run, tmp_path):
    X, Y = _data()
    uninterrupted = MLGPF(epochs=4, dtype="float64", **MLGPF_SETTINGS).fit(X, Y)
    checkpoint = tmp_path / "checkpoint.npz"
    shutil.copy(os.path.join(distributed_run, "checkpoint-epoch2.npz"), checkpoint)
    resumed = MLGPF(epochs=4, dtype="float64", checkpoint_path=str(checkpoint), **MLGPF_SETTINGS)
    resumed.fit(X, Y, resume=True)
    _assert_same_fit(_mlgpf_arrays(resumed), uninterrupted, rtol=1e-6, atol=1e-7)
    _assert_same_fit(_load(os.path.join(distributed_run, "resumed.npz")), uninterrupted, rtol=1e-6, atol=1e-7)


def _outcomes(folder, name):
    seconds, outcomes = {}, {}
    for rank in range(WORLD_SIZE):
        with open(os.path.join(folder, f"{name}-rank{rank}.txt")) as handle:
            elapsed, outcome = handle.read().split("\n", 1)
        seconds[rank], outcomes[rank] = float(elapsed), outcome
    return seconds, outcomes


def test_ranks_that_start_from_different_parameters_stop_instead_of_diverging(distributed_run):
    seconds, outcomes = _outcomes(distributed_run, "out-of-step")
    for rank in range(WORLD_SIZE):
        # rank 1 initialises (collectives on the data) while rank 0 already trains
        assert outcomes[rank].startswith("RanksOutOfStepError: the ranks are out of step"), outcomes[rank]
        assert "same checkpoint file" in outcomes[rank]
    seconds, outcomes = _outcomes(distributed_run, "different-checkpoints")
    for rank in range(WORLD_SIZE):
        assert outcomes[rank].startswith("RanksOutOfStepError: the ranks hold different parameters"), outcomes[rank]
        assert seconds[rank] < GROUP_TIMEOUT_S / 2
        assert seconds[rank] < GROUP_TIMEOUT_S / 2


def test_a_failure_on_one_rank_stops_every_rank_with_its_error(distributed_run):
    seconds, outcomes = _outcomes(distributed_run, "failure")
    assert outcomes[1].startswith("ValueError: injected failure on rank 1")
    assert outcomes[0].startswith(RankFailedError.__name__)
    assert "rank 1 failed: ValueError: injected failure on rank 1" in outcomes[0]
    # stopped by the failure protocol, not by the process-group timeout backstop
    assert seconds[0] < GROUP_TIMEOUT_S / 2


TORCHRUN_SCRIPT = """
import sys
import numpy as np
from bayesmlc.data.synthetic import make_multilabel
from bayesmlc.distributed import DataParallel
from bayesmlc.gp import MLGPF

parallel = DataParallel.from_env(backend="gloo", timeout_s=120)
data = make_multilabel(121, 40, 10, features_per_row=8, labels_per_row=2, random_state=11)
model = MLGPF(epochs=2, dtype="float64", n_latent=3, n_inducing=8, subspace_rank=6, batch_size=40, lr_decay=0.0,
              learning_rate=0.05, random_state=3, device=parallel.device, linear_term=False)
model.fit(data.X, data.Y, parallel=parallel)
if parallel.is_main:
    np.save(sys.argv[1], model.parameters_["Phi"].numpy())
parallel.close()
"""


@pytest.mark.slow
def test_torchrun_launch_equals_one_process(tmp_path):
    """The real launcher: ``python -m torch.distributed.run --nproc-per-node 2`` on 127.0.0.1."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TORCHRUN_SCRIPT))
    out = tmp_path / "phi.npy"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(_free_port()), str(script), str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    launched = subprocess.run(command, timeout=JOIN_TIMEOUT_S, env=env, capture_output=True, text=True)
    assert launched.returncode == 0, f"torchrun exited {launched.returncode}:\n{launched.stderr[-4000:]}"
    X, Y = _data()
    single = MLGPF(epochs=2, dtype="float64", **MLGPF_SETTINGS).fit(X, Y)
    np.testing.assert_allclose(np.load(out), single.parameters_["Phi"].numpy(), rtol=1e-7, atol=1e-9)


#: ``--set`` values of the torchrun CLI test per model; BNMC calibrates on one split, as several
#: processes do (its "auto" cross-fits a one-process fit of this few rows)
CLI_SETTINGS = {
    "mlgpf": ["epochs=2", "dtype=float64", "n_latent=3", "n_inducing=8", "subspace_rank=6", "batch_size=40"],
    "bnmc": ["truncation=4", "n_passes=2", "batch_size=30", "solver=cg", "calibration_folds=1", "device=cpu"],
}


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(CLI_SETTINGS))
def test_torchrun_cli_reads_shards_and_equals_one_process(tmp_path, model):
    """``torchrun -m bayesmlc train --distributed`` on an XC file: each rank reads its rows, rank 0
    writes the model, and it scores the test file as the single-process CLI run does (BNMC: its
    classifiers' float32 sums over rows come in another order, so to rounding)."""
    from bayesmlc.base import MultiLabelEstimator

    data = make_multilabel(n_samples=160, n_features=30, n_labels=7, random_state=4)
    train_path, test_path = tmp_path / "train.txt", tmp_path / "test.txt"
    write_dataset(data.subset(np.arange(120)), train_path)
    write_dataset(data.subset(np.arange(120, 160)), test_path)
    settings = [part for value in CLI_SETTINGS[model] for part in ("--set", value)]
    common = ["train", "--model", model, "--train", str(train_path), "--test", str(test_path), "--quiet",
              "--seed", "3"] + settings
    env = dict(os.environ, OMP_NUM_THREADS="1")
    launched = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
         "--master-port", str(_free_port()), "-m", "bayesmlc"] + common + ["--distributed", "--out", str(tmp_path / "two")],
        timeout=JOIN_TIMEOUT_S, env=env, capture_output=True, text=True)
    assert launched.returncode == 0, f"torchrun exited {launched.returncode}:\n{launched.stderr[-4000:]}"
    single = subprocess.run([sys.executable, "-m", "bayesmlc"] + common + ["--out", str(tmp_path / "one")],
                            timeout=JOIN_TIMEOUT_S, env=env, capture_output=True, text=True)
    assert single.returncode == 0, single.stderr[-4000:]
    test = read_dataset(test_path)
    two = MultiLabelEstimator.load(tmp_path / "two" / "model.npz")
    one = MultiLabelEstimator.load(tmp_path / "one" / "model.npz")
    if model == "mlgpf":
        np.testing.assert_allclose(two.decision_function(test.X), one.decision_function(test.X), rtol=1e-6, atol=1e-8)
    else:
        np.testing.assert_allclose(two.predict_proba(test.X), one.predict_proba(test.X), rtol=2e-3, atol=2e-4)
    metrics_two = json.loads((tmp_path / "two" / "metrics.json").read_text())
    metrics_one = json.loads((tmp_path / "one" / "metrics.json").read_text())
    assert metrics_two.keys() == metrics_one.keys()
    assert metrics_two["P@1"] == pytest.approx(metrics_one["P@1"], abs=1 / 40 + 1e-9)  # at most one row apart


# ---- BNMC on two ranks --------------------------------------------------------------------------
# the mixture's SVI statistics, ELBO and merge profiles, the classifiers' products over rows and the
# calibration data are summed over ranks; every rank ends with the single-process model (float32
# classifier sums in another order: equal to rounding)
# calibration_folds=1: several processes calibrate on the single validation split, which "auto" keeps
# for them but would replace by cross-fitting in the one-process fit of these few rows
BNMC_RUNS = {
    "exact": (dict(truncation=4, n_passes=2, batch_size=30, random_state=4, device="cpu", solver="cg",
                   calibration_folds=1), False),
    # the support term is fitted in one process only (a data-parallel fit runs without it): compare the basis alone
    "lowrank": (dict(truncation=4, n_passes=2, batch_size=30, random_state=4, device="cpu", solver="lowrank",
                     low_rank=12, support_features=0, calibration_folds=1), True),
}


def _bnmc_worker(rank, world_size, port, out):
    from bayesmlc.bnmc import BNMC

    parallel = _join_group(rank, world_size, port)
    try:
        train = read_shard(os.path.join(out, "train.npz"), parallel)
        X_all, _ = _data()
        start, stop = shard_bounds(N_ROWS, rank, world_size)
        for name, (settings, masked) in BNMC_RUNS.items():
            mask = _mask()[start:stop] if masked else None
            model = BNMC(**settings).fit(train.X, train.Y, label_mask=mask, parallel=parallel)
            if parallel.is_main:
                np.savez(os.path.join(out, f"bnmc-{name}.npz"), **_bnmc_arrays(model, X_all))
    finally:
        parallel.close()


def _bnmc_arrays(model, X) -> dict:
    return {
        "proba": model.predict_proba(X), "samples": model.classifier_samples_, "variances": model.classifier_variances_,
        "label_conc": model._mixture.label_conc, "stick_a": model._mixture.stick_a, "elbo": np.asarray(model.history_["objective"]),
        "calibration": model.evidence_weights_, "threshold": np.array([model.threshold_]),
        "count_mean": np.array([model.label_count_mean_, model.label_count_std_]), "prior": model.label_prior_,
        "basis": np.zeros(0) if model.classifier_basis_ is None else model.classifier_basis_,
        "weight_precision": np.array([model.weight_precision_]),
    }


@pytest.fixture(scope="module")
def bnmc_distributed_run(tmp_path_factory):
    return _spawned_run(tmp_path_factory, "bnmc-distributed", _bnmc_worker)


@pytest.mark.parametrize("name", sorted(BNMC_RUNS))
def test_bnmc_two_ranks_equal_one_process(bnmc_distributed_run, name):
    from bayesmlc.bnmc import BNMC

    settings, masked = BNMC_RUNS[name]
    X, Y = _data()
    single = BNMC(**settings).fit(X, Y, label_mask=_mask() if masked else None)
    reference = _bnmc_arrays(single, X)
    distributed = dict(np.load(os.path.join(bnmc_distributed_run, f"bnmc-{name}.npz")))
    # the mixture and the label statistics: float64 sums (the low-rank prior's: of projections on the float32 basis)
    for key in ("label_conc", "stick_a", "elbo", "count_mean", "prior", "weight_precision"):
        tolerance = 1e-6 if key == "weight_precision" and settings["solver"] == "lowrank" else 1e-9
        np.testing.assert_allclose(distributed[key], reference[key], rtol=tolerance, atol=1e-9, err_msg=key)
    # the classifiers: float32 sums over rows in another order
    for key in ("basis", "samples", "variances", "calibration", "proba"):
        np.testing.assert_allclose(distributed[key], reference[key], rtol=2e-3, atol=2e-4, err_msg=key)
    assert distributed["threshold"][0] == reference["threshold"][0]
    # the fit learned something: the probabilities are not the prior's
    assert np.abs(reference["proba"] - single.label_prior_[None, :]).max() > 0.1
