"""BNMC benchmark: the paper's F1 / exact-match tables, time on Bibtex, online mode, missing labels.

Usage (from the repository root; datasets from ../shared/datasets)::

    python benchmarks/bench_bnmc.py accuracy --datasets scene,emotions,bibtex --seeds 10
    python benchmarks/bench_bnmc.py accuracy --datasets bibtex --seeds 10 --online
    python benchmarks/bench_bnmc.py speed --repeats 3            # bibtex: batch vs online, fit+predict
    python benchmarks/bench_bnmc.py missing --fractions 0.7,0.8,0.9 --seeds 5   # paper figure 6 protocol
    python benchmarks/bench_bnmc.py scale --sets eurlex-4k,amazoncat-13k-0.01,hmc_cellcycle_go,goemotions
    python benchmarks/bench_bnmc.py distributed --dataset bibtex --procs 2   # 2 gloo ranks vs one process
    ... --set key=value ...                                      # any BNMC parameter
    ... --device cuda                                            # BNMC(device=...); default cpu

Each run: fit on the train split with ``random_state=seed``, predict the test split with the model's
own count rule (eqs. 8-9), and report example-based F1 and exact match (the paper's Tables 2-3),
micro-F1 (what the authors' code reports as F1), P@1/3/5 and micro-AUC, all from
``bayesmlc.metrics.evaluate``; mean and standard deviation over seeds. Times are wall-clock seconds of
fit + predict (and the process CPU seconds, all threads), printed with the 1-minute load average (the
machine may be shared).

``scale``: the default BNMC fit beside omikuji Parabel (``bayesmlc.baselines.OmikujiParabel``,
one thread) on the extreme-classification shapes of ``bayesmlc.data.synthetic.make_shape``
(``eurlex-4k`` = the full EURLex-4K shape, ``amazoncat-13k-0.01`` = AmazonCat-13K at 1 %: 4/3 of the
preset's rows are generated and a random quarter held out, so the model trains on the preset's row
count, 15,539 and 11,862) and on real sets (their train/test files). Each fit runs in its own
forked process, which reports its fit wall and CPU seconds and its peak resident memory (data
included); the table gives BNMC's time as a multiple of Parabel's from the same run.

``--device`` is where BNMC's classifier linear algebra runs (``BNMC(device=...)``: cpu, cuda, cuda:N
or auto; default the CPU, as before; ``--set device=...`` overrides it); Parabel stays on the CPU. With
a CUDA device the ``scale`` child reads its clocks after ``torch.cuda.synchronize`` and reports the
peak GPU memory allocated and reserved by PyTorch's allocator (an extra table column); the parent
process never touches CUDA, so the forked child can initialise it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mlgpf import synchronize  # noqa: E402

from bayesmlc.bnmc import BNMC  # noqa: E402
from bayesmlc.parameters import parse_set_values  # noqa: E402
from bayesmlc.data.io import read_dataset  # noqa: E402
from bayesmlc.metrics import evaluate  # noqa: E402

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
PAPER = {  # best BNMC row of the paper (Tables 2-3), fractions
    "scene": {"F1_example": 0.715, "exact_match": 0.662},
    "emotions": {"F1_example": 0.360, "exact_match": 0.102},
    "bibtex": {"F1_example": 0.410, "exact_match": 0.176},
}
COLUMNS = ["F1_example", "exact_match", "F1_micro", "P@1", "P@3", "P@5", "AUC_micro", "seconds", "cpu_seconds"]


def load(name: str):
    train = read_dataset(DATA / name / "train.txt")
    test = read_dataset(DATA / name / "test.txt").with_features_width(train.n_features)
    return train, test


def run_once(train_X, train_Y, test, params: dict, label_mask=None) -> dict:
    start, cpu_start = time.perf_counter(), time.process_time()
    model = BNMC(**params).fit(train_X, train_Y, label_mask=label_mask)
    proba = model.predict_proba(test.X)
    pred = model.predict(test.X)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    metrics = evaluate(test.Y, proba=proba, Y_pred=pred, ks=(1, 3, 5))
    out = {key: metrics[key] for key in COLUMNS if key in metrics}
    out.update(seconds=seconds, cpu_seconds=cpu_seconds, n_patterns=model.n_patterns_, rule=model.count_rule_)
    return out


def summarise(rows: list[dict]) -> dict:
    return {key: (float(np.mean([r[key] for r in rows])), float(np.std([r[key] for r in rows]))) for key in COLUMNS}


def print_table(title: str, summary: dict[str, dict], extra: dict[str, str] | None = None) -> None:
    print(f"\n{title} (load average {os.getloadavg()[0]:.1f})")
    header = "| run | " + " | ".join(COLUMNS) + " |" + (" note |" if extra else "")
    print(header)
    print("|" + "---|" * (len(COLUMNS) + 1 + bool(extra)))
    for name, stats in summary.items():
        cells = [f"{m:.1f} ± {s:.1f}" if key.endswith("seconds") else f"{m:.4f} ± {s:.4f}" for key, (m, s) in stats.items()]
        note = f" {extra.get(name, '')} |" if extra else ""
        print(f"| {name} | " + " | ".join(cells) + " |" + note)


def cmd_accuracy(args, params):
    summary, notes = {}, {}
    for name in args.datasets.split(","):
        train, test = load(name)
        rows = []
        for seed in range(args.seeds):
            row = run_once(train.X, train.Y, test, {**params, "random_state": seed, "online": args.online})
            rows.append(row)
            _log(args, {"command": "accuracy", "dataset": name, "seed": seed, "online": args.online, **row})
            print(f"  {name} seed {seed}: F1 {row['F1_example']:.4f} exact {row['exact_match']:.4f} "
                  f"{row['seconds']:.1f}s rule {row['rule']} patterns {row['n_patterns']}", flush=True)
        key = f"{name}{' online' if args.online else ''}"
        summary[key] = summarise(rows)
        target = PAPER.get(name)
        if target:
            ok = summary[key]["F1_example"][0] >= target["F1_example"] and summary[key]["exact_match"][0] >= target["exact_match"]
            notes[key] = f"paper F1 {target['F1_example']:.3f} / exact {target['exact_match']:.3f}: {'met' if ok else 'NOT met'}"
    print_table(f"BNMC accuracy, {args.seeds} seeds", summary, notes)


def cmd_speed(args, params):
    train, test = load("bibtex")
    summary = {}
    for online in (False, True):
        rows = [run_once(train.X, train.Y, test, {**params, "random_state": seed, "online": online})
                for seed in range(args.repeats)]
        for row in rows:
            _log(args, {"command": "speed", "online": online, **row})
        summary["bibtex " + ("online" if online else "batch")] = summarise(rows)
    print_table(f"BNMC time on bibtex, fit + predict, {args.repeats} repeats", summary)
    ratio = summary["bibtex batch"]["seconds"][0] / summary["bibtex online"]["seconds"][0]
    print(f"batch / online time ratio: {ratio:.1f}")


def cmd_missing(args, params):
    train, test = load(args.dataset)
    n, L = train.Y.shape
    summary = {}
    for fraction in [float(f) for f in args.fractions.split(",")]:
        both, labelled_only = [], []
        for seed in range(args.seeds):
            rng = np.random.default_rng(1000 + seed)
            hidden = rng.permutation(n)[: int(round(fraction * n))]
            observed = np.ones(n, dtype=bool)
            observed[hidden] = False
            mask = sp.csr_matrix(np.repeat(observed[:, None], L, axis=1).astype(np.float32))
            run_params = {**params, "random_state": seed}
            both.append(run_once(train.X, train.Y, test, run_params, label_mask=mask))
            keep = np.flatnonzero(observed)
            labelled_only.append(run_once(train.X[keep], train.Y[keep], test, run_params))
            _log(args, {"command": "missing", "fraction": fraction, "seed": seed, "with_unlabelled": both[-1],
                        "labelled_only": labelled_only[-1]})
        summary[f"{int(fraction * 100)}% missing, BNMC with unlabelled rows"] = summarise(both)
        summary[f"{int(fraction * 100)}% missing, BNMC on labelled rows only"] = summarise(labelled_only)
    print_table(f"BNMC with missing label vectors on {args.dataset}, {args.seeds} seeds", summary)


def _scale_data(name: str):
    """(train, test) for a preset shape ``eurlex-4k`` / ``amazoncat-13k-0.01`` or a real set."""
    from bayesmlc.data.synthetic import make_shape, split

    if (DATA / name).is_dir():
        return load(name)
    preset, _, fraction = name.partition("-0.")
    scale = float("0." + fraction) if fraction else 1.0
    return split(make_shape(preset, scale=scale * 4.0 / 3.0, random_state=0), 0.25, random_state=0)


def _model_device(model) -> torch.device:
    """The torch device a model computes on (its ``device`` parameter resolved; the CPU if it has none)."""
    from bayesmlc.utils import resolve_device

    device = getattr(model, "device", None)
    return torch.device("cpu") if device is None else resolve_device(device)


def _timed_fit(queue, make_model, train, test) -> None:
    """In a forked process: fit, predict, score; put the numbers on ``queue`` (and on a CUDA device the
    device's name and the peak GPU memory of the fit and prediction)."""
    torch.set_num_threads(1)
    model = make_model()
    device = _model_device(model)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    model.fit(train.X, train.Y)
    synchronize(device)
    fit_s, fit_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    start = time.perf_counter()
    proba = model.predict_proba(test.X)
    pred = model.predict(test.X)
    synchronize(device)
    predict_s = time.perf_counter() - start
    metrics = evaluate(test.Y, proba=proba, Y_pred=pred, ks=(1, 5))
    result = {"fit_s": fit_s, "fit_cpu_s": fit_cpu, "predict_s": predict_s,
              "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, "device": str(device),
              "solver": getattr(model, "solver_", ""), **{k: metrics[k] for k in ("P@1", "P@5", "F1_example")}}
    if device.type == "cuda":
        result.update(device=f"{device} ({torch.cuda.get_device_name(device)})",
                      peak_gpu_allocated_gb=torch.cuda.max_memory_allocated(device) / 2**30,
                      peak_gpu_reserved_gb=torch.cuda.max_memory_reserved(device) / 2**30)
    queue.put(result)


def _in_child(make_model, train, test) -> dict:
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=_timed_fit, args=(queue, make_model, train, test))
    process.start()
    result = queue.get()
    process.join()
    return result


def _bnmc_default(params):
    return lambda: BNMC(**{"random_state": 0, **params})


def _parabel():
    from bayesmlc.baselines import OmikujiParabel

    return OmikujiParabel(n_threads=1, predict_top_k=100, random_state=0)


def cmd_scale(args, params):
    rows = []
    for name in args.sets.split(","):
        train, test = _scale_data(name)
        shape = f"{train.X.shape[0]} x {train.X.shape[1]}, L={train.Y.shape[1]}"
        print(f"{name}: train {shape}, nnz(X) {train.X.nnz}", flush=True)
        results = {}
        for model_name, make_model in (("parabel", _parabel), ("bnmc", _bnmc_default(params))):
            if model_name == "parabel" and args.no_parabel:
                continue
            results[model_name] = _in_child(make_model, train, test)
            _log(args, {"command": "scale", "dataset": name, "model": model_name, **results[model_name]})
            print(f"  {model_name}: {results[model_name]}", flush=True)
        for model_name, result in results.items():
            ratio = result["fit_s"] / results["parabel"]["fit_s"] if "parabel" in results else float("nan")
            cpu_ratio = result["fit_cpu_s"] / results["parabel"]["fit_cpu_s"] if "parabel" in results else float("nan")
            rows.append((name, shape, model_name, result, ratio, cpu_ratio))
    gpu = any("peak_gpu_allocated_gb" in row[3] for row in rows)  # the GPU column only where one was used
    print(f"\nBNMC at scale, BNMC device {params['device']} (load average "
          f"{', '.join(f'{v:.1f}' for v in os.getloadavg())})")
    print("| set | train shape | model | solver | fit s | fit CPU s | fit / Parabel (wall, CPU) | predict s | peak GB "
          + ("| peak GPU GB (allocated, reserved) " if gpu else "") + "| P@1 | P@5 | F1 example |")
    print("|---|---|---|---|---|---|---|---|---|" + ("---|" if gpu else "") + "---|---|---|")
    for name, shape, model_name, r, ratio, cpu_ratio in rows:
        gpu_cell = ""
        if gpu:
            gpu_cell = (f"{r['peak_gpu_allocated_gb']:.2f}, {r['peak_gpu_reserved_gb']:.2f} | "
                        if "peak_gpu_allocated_gb" in r else "- | ")
        print(f"| {name} | {shape} | {model_name} | {r['solver'] or '-'} | {r['fit_s']:.1f} | {r['fit_cpu_s']:.1f} | "
              f"{ratio:.2f}, {cpu_ratio:.2f} | {r['predict_s']:.1f} | {r['peak_gb']:.2f} | {gpu_cell}{r['P@1']:.4f} | "
              f"{r['P@5']:.4f} | {r['F1_example']:.4f} |")


def _distributed_worker(rank, world_size, port, path, params, out):
    from bayesmlc.data.shard import read_shard
    from bayesmlc.distributed import DataParallel

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    parallel = DataParallel.from_env(backend="gloo")
    try:
        shard = read_shard(path, parallel)  # this rank's rows only
        start, cpu_start = time.perf_counter(), time.process_time()
        model = BNMC(**params).fit(shard.X, shard.Y, parallel=parallel)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        if parallel.is_main:
            model.save(out)
            with open(out + ".json", "w") as handle:
                json.dump({"fit_s": seconds, "fit_cpu_s": cpu_seconds}, handle)
    finally:
        parallel.close()


def cmd_distributed(args, params):
    """One process against ``--procs`` gloo ranks on 127.0.0.1, each reading only its rows of the
    training file; the same seed and settings; F1 / P@1 of both on the test split."""
    import socket
    import tempfile

    import torch.multiprocessing as mp

    train, test = load(args.dataset)
    params = {"random_state": 0, **params}
    start = time.perf_counter()
    single = BNMC(**params).fit(train.X, train.Y)
    single_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as folder:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        out = os.path.join(folder, "model.npz")
        mp.start_processes(_distributed_worker, args=(args.procs, port, str(DATA / args.dataset / "train.txt"), params,
                                                      out), nprocs=args.procs, start_method="spawn")
        multi = BNMC.load(out)
        with open(out + ".json") as handle:
            multi_times = json.load(handle)
    rows = {}
    for name, model in (("1 process", single), (f"{args.procs} processes", multi)):
        metrics = evaluate(test.Y, proba=model.predict_proba(test.X), Y_pred=model.predict(test.X), ks=(1, 5))
        rows[name] = metrics
    gap = abs(rows["1 process"]["F1_example"] - rows[f"{args.procs} processes"]["F1_example"])
    print(f"\nBNMC on {args.dataset}: one process vs {args.procs} gloo ranks (load average {os.getloadavg()[0]:.1f})")
    print("| run | fit wall s | F1_example | exact_match | P@1 | P@5 |")
    print("|---|---|---|---|---|---|")
    for name, metrics in rows.items():
        seconds = single_s if name == "1 process" else multi_times["fit_s"]
        print(f"| {name} | {seconds:.1f} | {metrics['F1_example']:.4f} | {metrics['exact_match']:.4f} | "
              f"{metrics['P@1']:.4f} | {metrics['P@5']:.4f} |")
    print(f"F1 difference: {gap:.4f} (target <= 0.002)")


def _log(args, record: dict) -> None:
    if args.out:
        with open(args.out, "a") as handle:
            handle.write(json.dumps(record) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["accuracy", "speed", "missing", "scale", "distributed"])
    parser.add_argument("--procs", type=int, default=2, help="distributed: number of gloo ranks")
    parser.add_argument("--sets", default="eurlex-4k,amazoncat-13k-0.01,hmc_cellcycle_go,goemotions")
    parser.add_argument("--no-parabel", action="store_true", help="scale: BNMC only")
    parser.add_argument("--datasets", default="scene,emotions,bibtex")
    parser.add_argument("--dataset", default="scene")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--online", action="store_true")
    parser.add_argument("--fractions", default="0.7,0.8,0.9")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="a BNMC parameter")
    parser.add_argument("--out", help="append one JSON line per run to this file")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu",
                        help="where BNMC's classifier linear algebra runs: cpu, cuda, cuda:N or auto "
                             "(default: %(default)s)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    # the device is resolved in the forked child of ``scale`` (CUDA must not be initialised before a fork)
    params = {"device": args.device, **parse_set_values(args.set, BNMC().get_params())}
    commands = {"accuracy": cmd_accuracy, "speed": cmd_speed, "missing": cmd_missing, "scale": cmd_scale,
                "distributed": cmd_distributed}
    commands[args.command](args, params)


if __name__ == "__main__":
    main()
