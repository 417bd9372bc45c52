"""Throughput of data-parallel MLGPF training: rows per second for 1 and W processes.

    python benchmarks/bench_distributed.py --procs 1 2 --threads 1 [--device cpu|cuda] [--json out.json]

Every configuration trains the same model on the same synthetic data (written once to an ``.npz``
dataset file) with the same global batch size. "1" is a plain single-process fit (no process
group) of the whole file; W > 1 starts W processes on 127.0.0.1 (gloo on CPUs, nccl with --device
cuda, one GPU per process) with ``DataParallel``, each reading only its shard (``read_shard``).
Throughput is measured over the epochs after the first (initialisation, SVD and warm-up excluded):
rows / (wall time of the last epoch end - wall time of the first epoch end). The initialisation
time (fit start to the first step) and each process's peak resident memory are reported too.

The machine load (``uptime``) is printed beside the numbers: timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
import torch.multiprocessing as mp

COMM_REPEATS = 20


def _settings(args) -> dict:
    return dict(
        n_latent=args.latent, n_inducing=args.inducing, subspace_rank=args.rank, batch_size=args.batch_size,
        epochs=args.epochs, negative_samples=args.negative_samples, learning_rate=0.01, random_state=0,
        linear_term=False,  # one model for 1 and N processes ("auto" has the term in one process only)
    )


def _write_data(args, path: str) -> None:
    from bayesmlc.data.dataset import Dataset
    from bayesmlc.data.io import write_dataset
    from bayesmlc.data.synthetic import make_multilabel

    data = make_multilabel(args.n_samples, args.n_features, args.n_labels, random_state=0)
    write_dataset(Dataset(X=data.X, Y=data.Y), path)


def _throughput(model, n_rows: int) -> float:
    times = model.history_["wall_time"]
    return n_rows * (len(times) - 1) / (times[-1] - times[0])


def _measures(model, n_rows: int) -> dict:
    steps = model.step_history_["wall_time"]
    first_step = steps[1] - steps[0] if len(steps) > 1 else 0.0
    return {"rows_per_s": _throughput(model, n_rows), "objective": model.history_["objective"][-1],
            "init_s": steps[0] - first_step,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _single_worker(_, args, data_path, out):
    """A plain fit of the whole file, in a fresh process (so its peak memory is comparable)."""
    from bayesmlc.data.io import read_dataset
    from bayesmlc.gp import MLGPF

    torch.set_num_threads(args.threads)
    train = read_dataset(data_path)
    model = MLGPF(device=args.device, **_settings(args)).fit(train.X, train.Y)
    with open(out, "w") as handle:
        json.dump(_measures(model, train.n_samples), handle)


def _worker(rank, world_size, port, args, data_path, out):
    from bayesmlc.data.shard import read_shard
    from bayesmlc.distributed import DataParallel
    from bayesmlc.gp import MLGPF
    from bayesmlc.gp.initialisation import module_from_parameters

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(args.threads)
    parallel = DataParallel.from_env(backend="nccl" if args.device == "cuda" else "gloo")
    train = read_shard(data_path, parallel)  # this rank's rows only
    with warnings.catch_warnings():  # fit's check of empty label columns sees only this rank's rows
        warnings.filterwarnings("ignore", message=".*label column.*have no positive training example")
        model = MLGPF(device=parallel.device, **_settings(args)).fit(train.X, train.Y, parallel=parallel)
    measures = _measures(model, train.source["shard"]["n_rows"])
    peak_rss = parallel.reduce_sum(np.eye(world_size)[rank] * measures["peak_rss_mb"])  # every rank's
    # the cost of one step's collectives alone: failure/consistency check + flattened gradient all-reduce
    module = module_from_parameters(model, model.parameters_, parallel.device, torch.float32)
    params = [p for p in module.parameters() if p.requires_grad]
    for param in params:
        param.grad = torch.ones_like(param)
    started = time.perf_counter()
    for _ in range(COMM_REPEATS):
        parallel.reduce_gradients(params, torch.tensor(0.0))
    comm_ms = 1000 * (time.perf_counter() - started) / COMM_REPEATS
    if parallel.is_main:
        with open(out, "w") as handle:
            json.dump({**measures, "peak_rss_mb": peak_rss.tolist(), "comm_ms_per_step": comm_ms,
                       "gradient_floats": sum(p.numel() for p in params)}, handle)
    parallel.close()


def _run(args, world_size: int, data_path: str) -> dict:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "result.json")
        if world_size == 1:
            mp.start_processes(_single_worker, args=(args, data_path, out), nprocs=1, start_method="spawn")
        else:
            mp.start_processes(_worker, args=(world_size, port, args, data_path, out), nprocs=world_size,
                               start_method="spawn")
        with open(out) as handle:
            return json.load(handle)


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "uptime unavailable"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--n-samples", type=int, default=6000)
    parser.add_argument("--n-features", type=int, default=2000)
    parser.add_argument("--n-labels", type=int, default=1000)
    parser.add_argument("--latent", type=int, default=30)
    parser.add_argument("--inducing", type=int, default=100)
    parser.add_argument("--rank", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--negative-samples", type=int, default=None)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.device == "cuda" and max(args.procs) > torch.cuda.device_count():
        parser.error(f"--procs {max(args.procs)} needs that many GPUs; this machine has {torch.cuda.device_count()}")

    results = []
    folder = tempfile.TemporaryDirectory()
    data_path = os.path.join(folder.name, "train.npz")
    _write_data(args, data_path)
    for procs in args.procs:
        load_before = _uptime()
        started = time.perf_counter()
        result = _run(args, procs, data_path)
        result.update(procs=procs, threads_per_proc=args.threads, device=args.device, uptime_before=load_before,
                      uptime_after=_uptime(), wall_s=time.perf_counter() - started)
        results.append(result)
        comm = f", collectives {result['comm_ms_per_step']:.1f} ms/step" if "comm_ms_per_step" in result else ""
        rss = "/".join(f"{v:.0f}" for v in np.atleast_1d(result["peak_rss_mb"]))
        print(f"procs={procs} threads/proc={args.threads} device={args.device}: {result['rows_per_s']:.0f} rows/s, "
              f"init {result['init_s']:.2f} s, peak RSS {rss} MB per process (final objective "
              f"{result['objective']:.8g}{comm}); load: {load_before.split('load average:')[-1].strip()}", flush=True)
    folder.cleanup()
    base = results[0]["rows_per_s"]
    for result in results:
        result["speedup"] = result["rows_per_s"] / base
    record = {"problem": {k: v for k, v in vars(args).items() if k not in ("json", "procs")}, "results": results,
              "torch": torch.__version__, "cpu_count": os.cpu_count()}
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(record, handle, indent=2)
    print(json.dumps({r["procs"]: round(r["speedup"], 3) for r in results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
