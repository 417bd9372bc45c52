"""One real MLGPF epoch at a full extreme-classification shape: set-up and epoch timed apart.

Usage (from the repository root)::

    python benchmarks/bench_mlgpf_epoch.py [--shape amazoncat-13k:1.25] [--epochs 1] [--threads 2]
        [--device cpu|cuda|auto] [--cache-dir /tmp/bayesmlc-scale] [--set key=value ...]

The shape is ``make_shape(name, scale, random_state=0)`` split 80/20 and cached as ``.npz`` (the same
files as ``bench_mlgpf_scale.py``); ``amazoncat-13k:1.25`` gives the published 1,186,239 training rows.
The script fits the default ``MLGPF`` (or ``--set`` overrides) for ``--epochs`` epochs and prints one
table: reading the cached file, the set-up (feature weighting, subspace SVD, k-means, ridge warm start:
everything before the first step), each epoch's wall time and rows/s, the process's CPU seconds, the
peak resident memory and the load average before and after, because the machine may be shared.

``--device`` is where the model trains (``MLGPF(device=...)``; default the CPU). On a CUDA device the
clocks are read after ``torch.cuda.synchronize`` (``fit``'s own per-step clocks follow the running
training P@1, which copies each step's result to the host), and the table adds the peak GPU memory
allocated and reserved by PyTorch's allocator. The set-up's subspace iteration, k-means and the host
side of batching run on the CPU whatever the device, with ``--threads`` threads.

``--split`` runs the same set-up and epochs through the training loop's public pieces instead of
``fit`` (``FeaturePreprocessor``, ``Trainer.initialise``, ``Trainer.step`` over ``epoch_batches``),
with a clock around each stage of every step: kernels, factorisations, marginals, quadrature, kl,
backward, adam, and "batching" (row gather and negative sampling). It leaves out what ``fit`` adds per
epoch (history, the running training P@1, the learning-rate schedule), and the set-up is timed
directly rather than estimated. On a CUDA device the per-stage clocks are read without waiting for
the device (the step queues its kernels and waits where it reads a result back), so the stage split
is the host's and only the set-up and epoch totals, read after a synchronisation, are device times.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mlgpf import (  # noqa: E402
    STAGES, device_label, load_avg, parse_sets, peak_memory_rows, reset_peak_memory, setup, synchronize, timed_steps,
)
from bench_mlgpf_scale import cached_preset  # noqa: E402

import numpy as np  # noqa: E402

from bayesmlc.gp import MLGPF  # noqa: E402
from bayesmlc.gp.training import epoch_batches, resolve_batch_size  # noqa: E402
from bayesmlc.preprocessing import FeaturePreprocessor  # noqa: E402
from bayesmlc.utils import resolve_device  # noqa: E402


def split_epochs(model: MLGPF, X, Y, epochs: int, device="cpu"):
    """Set-up and ``epochs`` epochs of ``model``'s settings through ``Trainer.step`` on ``device``, with
    per-stage clocks (:func:`bench_mlgpf.setup`, :func:`bench_mlgpf.timed_steps`); returns (set-up s,
    of which ``Trainer.initialise`` s, [epoch s], {stage: s over all epochs})."""
    start = time.perf_counter()
    preprocessor = FeaturePreprocessor(standardize=model.standardize, idf=model.idf_weighting,
                                       normalize=model.normalize_features).fit(X)
    X = preprocessor.transform(X)
    rng = np.random.default_rng(model.random_state)
    trainer, rows, initialise_s = setup(model.get_params(), X, Y, rng, device)
    setup_s = time.perf_counter() - start
    timings: dict = {}
    epoch_s = []
    for _ in range(epochs):
        epoch_start = time.perf_counter()
        steps = timed_steps(trainer, rows, epoch_batches(X.shape[0], resolve_batch_size(model.batch_size, X.shape[0]), rng))
        synchronize(device)
        for stage, seconds in steps.items():
            timings[stage] = timings.get(stage, 0.0) + seconds
        epoch_s.append(time.perf_counter() - epoch_start)
    return setup_s, initialise_s, epoch_s, timings


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="amazoncat-13k:1.25", help="preset:scale (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=1, help="epochs to train (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    parser.add_argument("--cache-dir", default=os.environ.get("BAYESMLC_SCALE_CACHE", "/tmp/bayesmlc-scale"),
                        help="where the generated .npz files are kept (default: %(default)s)")
    parser.add_argument("--set", action="append", help="MLGPF parameter override key=value")
    parser.add_argument("--split", action="store_true", help="time each stage of every step (module docstring)")
    parser.add_argument("--device", default="cpu",
                        help="where the model trains: cpu, cuda, cuda:N or auto (default: %(default)s)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    name, scale = args.shape.split(":")
    print(f"MLGPF epoch benchmark, {args.shape}, threads={args.threads}, device {device_label(device)}, "
          f"torch {torch.__version__}, {load_avg()}", flush=True)
    train, _, data_s = cached_preset(name, float(scale), Path(args.cache_dir))
    n, d = train.X.shape
    print(f"{n} training rows, {d} features, {train.Y.shape[1]} labels, nnz(x) {train.X.nnz / n:.1f} per row "
          f"(read or made in {data_s:.1f} s)", flush=True)
    model = MLGPF(**{"random_state": 0, "n_threads": args.threads, "verbose": True, **parse_sets(args.set),
                     "epochs": args.epochs, "device": args.device})
    reset_peak_memory(device)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    if args.split:
        setup_s, initialise_s, epoch_s, timings = split_epochs(model, train.X, train.Y, args.epochs, device)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        total = sum(timings.values())
        print("\n| quantity | value |\n|---|---|")
        print(f"| set-up s (wall: preprocessing, SVD, k-means, Phi, ridge warm start) | {setup_s:.1f} |")
        print(f"| of which Trainer.initialise s (SVD, k-means, Phi, bias, ridge warm start, module) | {initialise_s:.1f} |")
        for i, seconds in enumerate(epoch_s, 1):
            print(f"| epoch {i} s (wall) | {seconds:.1f} ({n / seconds:.0f} rows/s, {seconds / 60:.2f} min) |")
        for stage in STAGES:
            print(f"| {stage} (all epochs) | {timings.get(stage, 0.0):.1f} s ({100 * timings.get(stage, 0.0) / total:.0f}%) |")
        print(f"| set-up + epochs (wall / CPU) | {wall:.1f} / {cpu:.1f} |")
        print(f"| peak RSS GB | {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2:.2f} |")
        for row in peak_memory_rows(device):
            print(row)
        print(f"| settings | variational={model.variational}, negative_samples={model.negative_samples}, "
              f"negative_sampling={model.negative_sampling}, batch {resolve_batch_size(model.batch_size, n)} |")
        if device.type == "cuda":
            print("(on CUDA the stage clocks are the host's: kernels run asynchronously; the set-up and epoch "
                  "totals are read after a synchronisation)")
        print(f"({load_avg()})")
        return
    model.fit(train.X, train.Y)
    synchronize(device)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    # history_ and step_history_ clocks start with fit's set-up, so the first step's end time is
    # set-up + one step; the second step's duration stands in for the first's.
    step_ends = list(model.step_history_["wall_time"])
    one_step = step_ends[1] - step_ends[0] if len(step_ends) > 1 else 0.0
    setup_s = max(step_ends[0] - one_step, 0.0)
    epoch_ends = list(model.history_["wall_time"])
    print("\n| quantity | value |\n|---|---|")
    print(f"| set-up s (before the first step, wall; estimated) | {setup_s:.1f} |")
    previous = setup_s
    for i, end in enumerate(epoch_ends, 1):
        print(f"| epoch {i} s (wall) | {end - previous:.1f} ({n / (end - previous):.0f} rows/s, "
              f"{(end - previous) / 60:.2f} min) |")
        previous = end
    print(f"| fit total s (wall / CPU) | {wall:.1f} / {cpu:.1f} |")
    print(f"| peak RSS GB | {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2:.2f} |")
    for row in peak_memory_rows(device):
        print(row)
    print(f"| settings | variational={model.variational}, negative_samples={model.negative_samples}, "
          f"batch {model.history_['batch_size'][-1]} |")
    print(f"({load_avg()})")


if __name__ == "__main__":
    sys.exit(main())
