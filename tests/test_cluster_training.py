"""``bayesmlc.cluster.fit_data_parallel``, the body every worker of a torchrun, Spark TorchDistributor or
Ray Train fit runs: in a process group the launcher set up or one it joins from torchrun's
environment variables, on 127.0.0.1 with gloo. One process equals the plain fit; two spawned ranks
whose one cannot read its shard both stop, each with its error (the launchers themselves, and two
fits in one torchrun launch: the slow tests in test_cluster_ray.py and test_cluster_spark.py)."""

from __future__ import annotations

import os
import socket
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bayesmlc.bnmc import BNMC
from bayesmlc.cluster import fit_data_parallel, ray_train_loop
from bayesmlc.data.io import write_dataset
from bayesmlc.data.synthetic import make_multilabel
from bayesmlc.exceptions import ValidationError
from bayesmlc.gp import MLGPF
from bayesmlc.linear import LogisticRegression

MLGPF_SETTINGS = dict(n_latent=3, n_inducing=8, subspace_rank=6, batch_size=40, epochs=2, dtype="float64",
                      learning_rate=0.05, lr_decay=0.0, random_state=3)
JOIN_TIMEOUT_S = 180.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def train_file(tmp_path):
    data = make_multilabel(121, 40, 10, features_per_row=8, labels_per_row=2, random_state=11)
    write_dataset(data, tmp_path / "train.npz")
    return data, tmp_path / "train.npz"


def _same_parameters(fitted, reference):
    for key, value in reference.parameters_.items():
        np.testing.assert_allclose(fitted.parameters_[key].numpy(), value.numpy(), rtol=1e-9, atol=1e-12, err_msg=key)


def test_in_a_process_group_the_launcher_set_up_it_equals_the_plain_fit(train_file):
    """Ray Train's case: the group is initialised before the worker's loop runs; it stays open."""
    data, path = train_file
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        fitted = ray_train_loop({"estimator": MLGPF(**MLGPF_SETTINGS), "train": str(path)})
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()
    assert fitted.device == "auto"  # trained on the worker's device, returned to score on any
    _same_parameters(fitted, MLGPF(device="cpu", **MLGPF_SETTINGS).fit(data.X, data.Y))


def test_from_torchruns_variables_it_joins_the_group_and_keeps_it_for_the_next_fit(train_file, monkeypatch):
    """torchrun's and Spark TorchDistributor's case: the worker creates the group, and a second fit in
    the process uses it again (the group is left at the process's exit)."""
    data, path = train_file
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    for name, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=str(_free_port())).items():
        monkeypatch.setenv(name, value)
    settings = dict(truncation=4, n_passes=2, batch_size=30, random_state=4, device="cpu", solver="cg",
                    calibration_folds=1)
    try:
        fitted_bnmc = fit_data_parallel(BNMC(**settings), path)
        assert dist.is_initialized()
        fitted_mlgpf = fit_data_parallel(MLGPF(**MLGPF_SETTINGS), path)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    expected = BNMC(**settings).fit(data.X, data.Y)
    np.testing.assert_allclose(fitted_bnmc.predict_proba(data.X), expected.predict_proba(data.X), rtol=1e-6, atol=1e-7)
    _same_parameters(fitted_mlgpf, MLGPF(device="cpu", **MLGPF_SETTINGS).fit(data.X, data.Y))


def test_it_refuses_a_model_without_a_data_parallel_fit_and_a_bad_config(train_file):
    _, path = train_file
    with pytest.raises(ValidationError, match="trains MLGPF, BNMC or BMLS.*not LogisticRegression"):
        fit_data_parallel(LogisticRegression(), path)
    with pytest.raises(ValidationError, match="must hold 'estimator' and 'train'.*got the keys \\['estimator'\\]"):
        ray_train_loop({"estimator": MLGPF()})


def _rank_with_a_missing_file(rank, world_size, port, folder):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    path = os.path.join(folder, "train.npz" if rank == 0 else "missing.npz")  # rank 1's host lacks the file
    started = time.monotonic()
    try:
        fit_data_parallel(MLGPF(device="cpu", **MLGPF_SETTINGS), path)
        outcome = "finished"
    except Exception as exc:  # noqa: BLE001 - the test reads what each rank stopped with
        outcome = f"{type(exc).__name__}: {exc}"
    with open(os.path.join(folder, f"rank{rank}.txt"), "w") as handle:
        handle.write(f"{time.monotonic() - started}\n{outcome}")


@pytest.mark.slow  # two spawned processes importing torch: about 15 s on the 2-core VM
def test_a_rank_that_cannot_read_its_shard_stops_the_others(train_file):
    _, path = train_file
    folder = str(path.parent)
    context = mp.start_processes(_rank_with_a_missing_file, args=(2, _free_port(), folder), nprocs=2, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the ranks did not stop within {JOIN_TIMEOUT_S} s")
    outcomes, seconds = {}, {}
    for rank in (0, 1):
        with open(os.path.join(folder, f"rank{rank}.txt")) as handle:
            elapsed, outcomes[rank] = handle.read().split("\n", 1)
        seconds[rank] = float(elapsed)
    assert outcomes[1].startswith("DataFormatError") and "no such file" in outcomes[1]
    assert outcomes[0].startswith("RankFailedError: data-parallel training stopped because rank 1 failed: "
                                  "DataFormatError"), outcomes[0]
    assert seconds[0] < 60  # stopped by the failure protocol, not by the process group's 600 s timeout
