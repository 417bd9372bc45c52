"""Training and scoring on the clusters users run (docs/scaling.md, "Launchers and scorers, measured"):
wall times with 1 and with 2 workers of one thread each.

    python benchmarks/bench_cluster.py [--workers 1 2] [--launchers torchrun ray spark]
                                       [--scorers dask ray spark] [--json out.json]

Training: MLGPF on a synthetic set written once to an ``.npz`` file; every worker runs
:func:`bayesmlc.cluster.fit_data_parallel` (reads its shard, fits under ``DataParallel``). Reported:
``launch_s``, the wall time of the launch (worker start-up, imports, reading, fitting; Ray's and
Spark's own start is done once, before) and ``fit_s``, the fit inside the workers (the model's
``history_["wall_time"][-1]``: fit start to the last epoch's end, initialisation included).

Scoring: each test row's top 5 labels (``predict_topk``), the test rows being the training rows
repeated; ``score_s`` is the wall time of the job on a started cluster: Dask ``map_blocks`` over CSR
blocks (workers warmed by a first job), Ray Data ``map_batches`` with ``SparseRowScorer`` (its
actors start inside the job), Spark ``predict_batch_udf`` into the ``noop`` sink (Python workers
warmed by a first job). ``in_process_s`` is ``predict_topk`` in this process on one thread.

Every cluster binds to 127.0.0.1 only, without dashboards or UI. The machine load (``uptime``) is
printed beside the numbers: on a shared 2-core machine the timings are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

REPO = Path(__file__).resolve().parents[1]
LOOPBACK_ENVIRONMENT = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
                        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
                        "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
#: linear_term=False: "auto" would turn the per-label linear term on with one worker only (L > P)
SETTINGS = dict(n_latent=30, n_inducing=100, subspace_rank=200, batch_size=500, epochs=3, random_state=0,
                n_threads=1, device="cpu", linear_term=False)
TORCHRUN_SCRIPT = """
import os, pickle, sys
from bayesmlc.cluster import fit_data_parallel
from bayesmlc.gp import MLGPF
model = fit_data_parallel(MLGPF(**{settings}), sys.argv[1])
if os.environ["RANK"] == "0":
    with open(sys.argv[2], "wb") as handle:
        pickle.dump(model.history_["wall_time"][-1], handle)
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train_torchrun(path: str, workers: int, folder: str) -> dict:
    script, out = os.path.join(folder, "train.py"), os.path.join(folder, "fit.pkl")
    Path(script).write_text(textwrap.dedent(TORCHRUN_SCRIPT.format(settings=SETTINGS)))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(workers), "--master-addr",
                    "127.0.0.1", "--master-port", str(_free_port()), script, path, out], check=True,
                   env={**os.environ, **LOOPBACK_ENVIRONMENT}, capture_output=True)
    launch = time.perf_counter() - start
    with open(out, "rb") as handle:
        return {"launch_s": launch, "fit_s": pickle.load(handle)}


def train_ray(path: str, workers: int, folder: str) -> dict:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from bayesmlc.cluster import ray_train_loop
    from bayesmlc.gp import MLGPF

    trainer = TorchTrainer(ray_train_loop, train_loop_config={"estimator": MLGPF(**SETTINGS), "train": path},
                           scaling_config=ScalingConfig(num_workers=workers, use_gpu=False),
                           run_config=RunConfig(storage_path=os.path.join(folder, "ray"), name=f"w{workers}"))
    start = time.perf_counter()
    model = trainer.fit().return_value
    return {"launch_s": time.perf_counter() - start, "fit_s": model.history_["wall_time"][-1]}


def train_spark(path: str, workers: int, folder: str) -> dict:
    from pyspark.ml.torch.distributor import TorchDistributor

    from bayesmlc.cluster import fit_data_parallel
    from bayesmlc.gp import MLGPF

    start = time.perf_counter()
    model = TorchDistributor(num_processes=workers, local_mode=True, use_gpu=False).run(
        fit_data_parallel, MLGPF(**SETTINGS), path)
    return {"launch_s": time.perf_counter() - start, "fit_s": model.history_["wall_time"][-1]}


def score_dask(model, X, workers: int) -> float:
    import dask.array as da
    from distributed import Client, LocalCluster

    with LocalCluster(host="127.0.0.1", dashboard_address=None, n_workers=workers, threads_per_worker=1) as cluster, \
            Client(cluster):
        blocks = da.from_array(X, chunks=(2048, X.shape[1]), asarray=False)

        def top(block):
            return model.predict_topk(block, 5)[0]

        labels = blocks.map_blocks(top, dtype=np.int64, chunks=(blocks.chunks[0], (5,)),
                                   meta=np.empty((0, 5), dtype=np.int64))
        labels[:4096].compute()  # warm-up: the workers import torch and unpickle the model
        start = time.perf_counter()
        labels.compute()
        return time.perf_counter() - start


def score_ray(path: str, rows: list, workers: int) -> float:
    import ray

    from bayesmlc.cluster import SparseRowScorer

    dataset = ray.data.from_items(rows).materialize()
    start = time.perf_counter()
    dataset.map_batches(SparseRowScorer, fn_constructor_kwargs={"model": path, "k": 5}, batch_size=2048,
                        concurrency=workers, num_cpus=1, batch_format="numpy").materialize()
    return time.perf_counter() - start


def score_spark(spark, path: str, rows: list, workers: int) -> float:
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType, LongType, StructField, StructType

    from bayesmlc.cluster import SparseRowScorer

    top = StructType([StructField("labels", ArrayType(LongType())), StructField("scores", ArrayType(FloatType()))])
    score = predict_batch_udf(lambda: SparseRowScorer(path, k=5).predict, return_type=top, batch_size=2048,
                              input_tensor_shapes=[None, None])
    frame = spark.createDataFrame(rows, ["indices", "values"]).repartition(workers).cache()
    frame.count()
    job = frame.select(score("indices", "values").alias("top"))
    job.limit(10).write.format("noop").mode("overwrite").save()  # warm-up: the Python workers import bayesmlc
    start = time.perf_counter()
    job.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def _start(launchers, scorers):
    """Ray and Spark started once (on 127.0.0.1), when a launcher or scorer needs them."""
    os.environ.update(LOOPBACK_ENVIRONMENT)
    spark = None
    if "ray" in launchers or "ray" in scorers:
        import ray

        ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                 object_store_memory=512 * 2**20, log_to_driver=False,
                 runtime_env={"env_vars": {k: LOOPBACK_ENVIRONMENT[k] for k in ("GLOO_SOCKET_IFNAME", "PYTHONPATH")}})
    if "spark" in launchers or "spark" in scorers:
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[2]").config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1").config("spark.ui.enabled", "false").getOrCreate())
    return spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--launchers", nargs="*", default=["torchrun", "ray", "spark"], choices=["torchrun", "ray", "spark"])
    parser.add_argument("--scorers", nargs="*", default=["dask", "ray", "spark"], choices=["dask", "ray", "spark"])
    parser.add_argument("--n-samples", type=int, default=30000)
    parser.add_argument("--score-repeats", type=int, default=4, help="test rows: the training rows this many times")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as folder:
        results = _run(args, folder)
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def _run(args, folder: str) -> dict:
    """The training launches and the scoring jobs, with the data and models written under ``folder``."""
    from bayesmlc.data.io import write_dataset
    from bayesmlc.data.synthetic import make_multilabel
    from bayesmlc.gp import MLGPF

    data = make_multilabel(args.n_samples, 2000, 400, random_state=0)
    train_path = os.path.join(folder, "train.npz")
    write_dataset(data, train_path)
    spark = _start(args.launchers, args.scorers)
    results = {"load": os.getloadavg(), "train": {}, "score": {}}
    trainers = {"torchrun": train_torchrun, "ray": train_ray, "spark": train_spark}
    for launcher in args.launchers:
        for workers in args.workers:
            results["train"][f"{launcher}/{workers}"] = trainers[launcher](train_path, workers, folder)
            print(launcher, workers, results["train"][f"{launcher}/{workers}"], flush=True)
    if args.scorers:
        model = MLGPF(**SETTINGS).fit(data.X, data.Y)
        model_path = os.path.join(folder, "model.npz")
        model.save(model_path)
        X = sp.vstack([data.X] * args.score_repeats, format="csr")
        start = time.perf_counter()
        model.predict_topk(X, 5)
        results["score"]["in_process/1"] = time.perf_counter() - start
        rows = [(X[i].indices.tolist(), X[i].data.tolist()) for i in range(X.shape[0])] if set(args.scorers) - {"dask"} \
            else []
        for scorer in args.scorers:
            for workers in args.workers:
                if scorer == "dask":
                    seconds = score_dask(model, X, workers)
                elif scorer == "ray":
                    seconds = score_ray(model_path, [{"indices": i, "values": v} for i, v in rows], workers)
                else:
                    seconds = score_spark(spark, model_path, rows, workers)
                results["score"][f"{scorer}/{workers}"] = seconds
                print(scorer, workers, round(seconds, 2), flush=True)
    results["rows"] = {"train": args.n_samples, "score": args.n_samples * args.score_repeats}
    results["load_after"] = os.getloadavg()
    if spark is not None:
        spark.stop()
    if "ray" in sys.modules:
        sys.modules["ray"].shutdown()
    return results


if __name__ == "__main__":
    main()
