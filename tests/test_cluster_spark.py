"""Spark (issue 39): ``TorchDistributor(local_mode=True, num_processes=2)`` runs
:func:`bayesmlc.cluster.fit_data_parallel` under ``torch.distributed.run`` and returns the one-process
model, and ``predict_batch_udf`` with :class:`bayesmlc.cluster.SparseRowScorer` scores rows given as
two list columns as the model does in process.

Needs pyspark (>= 3.4) and Java; skips without either. The local Spark session binds its driver to
127.0.0.1 and has no UI. Slow: starting the JVM and the Python workers takes tens of seconds.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import bayesmlc
from bayesmlc.cluster import SparseRowScorer, fit_data_parallel
from bayesmlc.data.io import write_dataset
from bayesmlc.data.synthetic import make_multilabel
from bayesmlc.gp import MLGPF

if importlib.util.find_spec("pyspark") is None:
    pytest.skip("pyspark is not installed: pip install 'pyspark>=3.4'", allow_module_level=True)
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs Java: neither java on PATH nor JAVA_HOME", allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")]

#: the driver on the loopback address; its Python workers and torchrun's processes import this
#: bayesmlc, compute on one thread and run gloo on the loopback interface
SPARK_ENVIRONMENT = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
                     "PYSPARK_DRIVER_PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
                     "PYTHONPATH": str(Path(bayesmlc.__file__).resolve().parents[1])}
#: linear_term=False: "auto" turns the per-label linear term on in one process only (L > P), so the
#: one-process comparison would be between different models
MLGPF_SETTINGS = dict(n_latent=3, n_inducing=8, subspace_rank=6, batch_size=40, epochs=2, dtype="float64",
                      learning_rate=0.05, lr_decay=0.0, random_state=3, linear_term=False)


@pytest.fixture(scope="module")
def spark():
    with pytest.MonkeyPatch.context() as patch:
        for name, value in SPARK_ENVIRONMENT.items():
            patch.setenv(name, value)
        from pyspark.sql import SparkSession

        session = (SparkSession.builder.master("local[2]").appName("bayesmlc-cluster-test")
                   .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.ui.enabled", "false").getOrCreate())
        try:
            yield session
        finally:
            session.stop()


def test_torch_distributor_two_processes_give_the_one_process_model(spark, tmp_path):
    from pyspark.ml.torch.distributor import TorchDistributor

    data = make_multilabel(121, 40, 10, features_per_row=8, labels_per_row=2, random_state=11)
    write_dataset(data, tmp_path / "train.npz")
    distributor = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False)
    model = distributor.run(fit_data_parallel, MLGPF(**MLGPF_SETTINGS), str(tmp_path / "train.npz"))
    single = MLGPF(device="cpu", **MLGPF_SETTINGS).fit(data.X, data.Y)
    for key, value in single.parameters_.items():  # as tests/test_distributed.py finds for torchrun
        np.testing.assert_allclose(model.parameters_[key].numpy(), value.numpy(), rtol=1e-7, atol=1e-9, err_msg=key)
    initial = MLGPF(device="cpu", **{**MLGPF_SETTINGS, "epochs": 0}).fit(data.X, data.Y)
    assert np.abs(model.parameters_["Phi"].numpy() - initial.parameters_["Phi"].numpy()).max() > 1e-2


def test_predict_batch_udf_scores_as_the_model_does(spark, tmp_path):
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType, LongType, StructField, StructType

    data = make_multilabel(400, 40, 9, features_per_row=8, labels_per_row=2, random_state=17)
    model = MLGPF(n_latent=3, n_inducing=8, subspace_rank=6, epochs=2, random_state=0, device="cpu")
    model.fit(data.X[:250], data.Y[:250])
    path = str(tmp_path / "model.npz")
    model.save(path)
    X = data.X[250:]
    frame = spark.createDataFrame([(i, X[i].indices.tolist(), X[i].data.tolist()) for i in range(X.shape[0])],
                                  ["id", "indices", "values"])
    top = StructType([StructField("labels", ArrayType(LongType())), StructField("scores", ArrayType(FloatType()))])
    # list columns of varying length: no fixed tensor shape (None for each input)
    score = predict_batch_udf(lambda: SparseRowScorer(path, k=3).predict, return_type=top, batch_size=32,
                              input_tensor_shapes=[None, None])
    rows = frame.withColumn("top", score("indices", "values")).select("id", "top.labels", "top.scores").collect()
    rows = sorted(rows, key=lambda row: row["id"])
    assert [row["id"] for row in rows] == list(range(X.shape[0]))
    labels, scores = model.predict_topk(X, 3)
    np.testing.assert_array_equal(np.array([row["labels"] for row in rows]), labels)
    # float32 products over batches of 32 rows round differently from those over the whole matrix
    np.testing.assert_allclose(np.array([row["scores"] for row in rows]), scores, rtol=1e-5, atol=1e-5)
