"""Ray (issue 39; the ``[ray]`` extra): MLGPF's and BNMC's data-parallel fits inside a Ray Train
``TorchTrainer`` of two CPU workers give the model of the ``torchrun --nproc-per-node 2`` launch on
the same file, and a Ray Data ``map_batches`` callable class scores as the model does in process.

The local Ray cluster binds to 127.0.0.1 only (``_node_ip_address``, and Ray's loopback mode), has
no dashboard and sends no usage statistics. Slow: starting Ray and its worker processes takes
most of a minute on the 2-core VM.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import bayesmlc
from bayesmlc.bnmc import BNMC
from bayesmlc.cluster import SparseRowScorer, ray_train_loop
from bayesmlc.data.io import write_dataset
from bayesmlc.data.synthetic import make_multilabel
from bayesmlc.gp import MLGPF

if importlib.util.find_spec("ray") is None:
    pytest.skip("the [ray] extra is not installed: pip install 'bayesmlc[ray]'", allow_module_level=True)

pytestmark = pytest.mark.slow

#: Ray's processes: the loopback address as the node's address (Ray otherwise resolves 127.0.0.1 to the
#: machine's routable address), no usage statistics sent
RAY_ENVIRONMENT = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
#: the workers': bayesmlc importable, one thread each, gloo on the loopback interface
WORKER_ENVIRONMENT = {"PYTHONPATH": str(Path(bayesmlc.__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1",
                      "GLOO_SOCKET_IFNAME": "lo"}
#: linear_term=False: "auto" turns the per-label linear term on in one process only (L > P), so the
#: one-process comparison would be between different models
MLGPF_SETTINGS = dict(n_latent=3, n_inducing=8, subspace_rank=6, batch_size=40, epochs=2, dtype="float64",
                      learning_rate=0.05, lr_decay=0.0, random_state=3, linear_term=False)
BNMC_SETTINGS = dict(truncation=4, n_passes=2, batch_size=30, random_state=4, solver="cg", calibration_folds=1)


@pytest.fixture(scope="module")
def ray_session():
    with pytest.MonkeyPatch.context() as patch:
        for name, value in RAY_ENVIRONMENT.items():  # read when ray is imported
            patch.setenv(name, value)
        import ray

        ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                 object_store_memory=256 * 2**20, runtime_env={"env_vars": WORKER_ENVIRONMENT}, log_to_driver=False)
        try:
            assert ray.util.get_node_ip_address() == "127.0.0.1"
            yield ray
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    data = make_multilabel(121, 40, 10, features_per_row=8, labels_per_row=2, random_state=11)
    path = tmp_path_factory.mktemp("ray-data") / "train.npz"
    write_dataset(data, path)
    return data, path


TORCHRUN_SCRIPT = """
import os, pickle, sys
from bayesmlc.bnmc import BNMC
from bayesmlc.cluster import fit_data_parallel
from bayesmlc.gp import MLGPF

models = [fit_data_parallel(MLGPF(**{mlgpf}), sys.argv[1]), fit_data_parallel(BNMC(**{bnmc}), sys.argv[1])]
if os.environ["RANK"] == "0":
    with open(sys.argv[2], "wb") as handle:
        pickle.dump(models, handle)
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _torchrun_models(path, folder):
    """MLGPF and BNMC fitted by ``torchrun --nproc-per-node 2`` on 127.0.0.1 with the same helper."""
    script = folder / "train.py"
    script.write_text(textwrap.dedent(TORCHRUN_SCRIPT.format(mlgpf=MLGPF_SETTINGS, bnmc=BNMC_SETTINGS)))
    out = folder / "torchrun-models.pkl"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(_free_port()), str(script), str(path), str(out)]
    launched = subprocess.run(command, timeout=300, env={**os.environ, **WORKER_ENVIRONMENT}, capture_output=True,
                              text=True)
    assert launched.returncode == 0, f"torchrun exited {launched.returncode}:\n{launched.stderr[-4000:]}"
    with open(out, "rb") as handle:
        return pickle.load(handle)


def test_ray_train_two_workers_give_the_torchrun_model(ray_session, train_file, tmp_path):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    data, path = train_file

    def both_fits(config):  # one Ray Train run fits both models, each through ray_train_loop
        return [ray_train_loop(run) for run in config["runs"]]

    runs = [{"estimator": MLGPF(**MLGPF_SETTINGS), "train": str(path)},
            {"estimator": BNMC(**BNMC_SETTINGS), "train": str(path)}]
    trainer = TorchTrainer(both_fits, train_loop_config={"runs": runs},
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                           run_config=RunConfig(storage_path=str(tmp_path / "ray-results"), name="cluster-test"))
    result = trainer.fit()
    assert result.error is None, result.error
    ray_mlgpf, ray_bnmc = result.return_value  # rank 0's models, pickled back to this process
    torchrun_mlgpf, torchrun_bnmc = _torchrun_models(path, tmp_path)

    # the same two-process computation under either launcher: equal to float rounding
    for key, value in torchrun_mlgpf.parameters_.items():
        np.testing.assert_allclose(ray_mlgpf.parameters_[key].numpy(), value.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=key)
    np.testing.assert_allclose(ray_bnmc.predict_proba(data.X), torchrun_bnmc.predict_proba(data.X), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(ray_bnmc.classifier_samples_, torchrun_bnmc.classifier_samples_, rtol=1e-5, atol=1e-6)
    # and both the one-process model, as tests/test_distributed.py finds for torchrun (BNMC: float32
    # classifier sums over rows in another order)
    single = MLGPF(device="cpu", **MLGPF_SETTINGS).fit(data.X, data.Y)
    for key, value in single.parameters_.items():
        np.testing.assert_allclose(ray_mlgpf.parameters_[key].numpy(), value.numpy(), rtol=1e-7, atol=1e-9,
                                   err_msg=key)
    single_bnmc = BNMC(device="cpu", **BNMC_SETTINGS).fit(data.X, data.Y)
    np.testing.assert_allclose(ray_bnmc.predict_proba(data.X), single_bnmc.predict_proba(data.X), rtol=2e-3,
                               atol=2e-4)
    initial = MLGPF(device="cpu", **{**MLGPF_SETTINGS, "epochs": 0}).fit(data.X, data.Y)
    assert np.abs(ray_mlgpf.parameters_["Phi"].numpy() - initial.parameters_["Phi"].numpy()).max() > 1e-2


def test_ray_data_map_batches_scores_as_the_model_does(ray_session, tmp_path):
    data = make_multilabel(500, 40, 9, features_per_row=8, labels_per_row=2, random_state=17)
    model = MLGPF(n_latent=3, n_inducing=8, subspace_rank=6, epochs=2, random_state=0, device="cpu")
    model.fit(data.X[:300], data.Y[:300])
    model.save(tmp_path / "model.npz")
    X = data.X[300:]
    rows = [{"id": i, "indices": X[i].indices.tolist(), "values": X[i].data.tolist()} for i in range(X.shape[0])]
    dataset = ray_session.data.from_items(rows).map_batches(
        SparseRowScorer, fn_constructor_kwargs={"model": str(tmp_path / "model.npz"), "k": 3}, batch_size=32,
        concurrency=2, batch_format="numpy")
    scored = sorted(dataset.take_all(), key=lambda row: row["id"])
    assert [row["id"] for row in scored] == list(range(X.shape[0]))
    labels, scores = model.predict_topk(X, 3)
    np.testing.assert_array_equal(np.stack([row["labels"] for row in scored]), labels)
    # float32 products over blocks of 32 rows round differently from those over the whole matrix
    np.testing.assert_allclose(np.stack([row["scores"] for row in scored]), scores, rtol=1e-5, atol=1e-5)
