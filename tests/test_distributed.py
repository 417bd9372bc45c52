"""Data-parallel training (bayesmlc.distributed): 2 CPU processes on the gloo backend, 127.0.0.1.

The distributed runs are compared with single-process runs of the same global batch size, which
is what the scheme promises: the per-rank bounds sum to the single-process bound, so after the
gradient all-reduce every rank takes the single-process step. A stand-in model (logistic
regression with a Gaussian prior) also checks the reduced gradient against its closed form.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from bayesmlc.data.synthetic import make_multilabel
from bayesmlc.distributed import DataParallel, RankFailedError, SingleProcess, shard_bounds
from bayesmlc.exceptions import ValidationError
from bayesmlc.gp import MLGPF

WORLD_SIZE = 2
JOIN_TIMEOUT_S = 240.0  # the whole spawned run; a hang fails the test instead of blocking the suite
GROUP_TIMEOUT_S = 120.0  # backstop inside the process group

# a tiny problem: 121 rows in batches of 40 -> 40, 40, 40, 1 (rank 1 gets no row of the last batch)
N_ROWS, N_FEATURES, N_LABELS = 121, 40, 10
MLGPF_SETTINGS = dict(
    n_latent=3, n_inducing=8, subspace_rank=6, batch_size=40, learning_rate=0.05, random_state=3, device="cpu",
)
STANDIN_STEPS, STANDIN_BATCH = 6, 25


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
    assert single.local_rows(7) == slice(0, 7)
    assert single.bound_weights(100, 0.5, 7, 7) == (100, 0.5)
    param = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    param.grad = torch.tensor([0.25, -1.0])
    assert single.reduce_gradients([param], torch.tensor(-3.5)) == -3.5
    assert param.grad.tolist() == [0.25, -1.0]
    assert single.sum_counts(3, 4.5) == (3, 4.5)


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
    weights = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    optimizer = torch.optim.Adam([weights], lr=0.1)
    order = np.random.default_rng(0).permutation(n)
    first_gradient = None
    for step in range(STANDIN_STEPS):
        batch_rows = order[(step * STANDIN_BATCH) % n :][:STANDIN_BATCH]
        rows = batch_rows[parallel.local_rows(len(batch_rows))]
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
    X, Y = _data()
    weights, first_gradient = _standin_fit(parallel)
    if parallel.is_main:
        np.savez(os.path.join(out, "standin.npz"), weights=weights, first_gradient=first_gradient)

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

    sampled = MLGPF(epochs=2, negative_samples=3, dtype="float64", **MLGPF_SETTINGS)
    sampled.fit(X, Y, parallel=parallel)
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


def _run_with_failure_on_rank_1(parallel, X, Y, out):
    """Rank 1 raises in its third bound evaluation; every rank records the error it stopped with."""
    if parallel.rank == 1:
        import bayesmlc.gp.model as gp_model

        original, calls = gp_model.minibatch_elbo, []

        def failing_elbo(*args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                raise ValueError("injected failure on rank 1")
            return original(*args, **kwargs)

        gp_model.minibatch_elbo = failing_elbo
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
@pytest.fixture(scope="module")
def distributed_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("distributed"))
    _spawn(_training_worker, out)
    return out


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


def test_mlgpf_sampled_negatives_two_ranks_equal_one_process(distributed_run):
    X, Y = _data()
    single = MLGPF(epochs=2, negative_samples=3, dtype="float64", **MLGPF_SETTINGS).fit(X, Y)
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
        assert outcomes[rank].startswith("RanksOutOfStepError: the ranks hold different parameters"), outcomes[rank]
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
model = MLGPF(epochs=2, dtype="float64", n_latent=3, n_inducing=8, subspace_rank=6, batch_size=40,
              learning_rate=0.05, random_state=3, device=parallel.device)
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
