"""MLGPF at extreme-classification shapes: rows/s and the split of an epoch's time per variational family,
beside omikuji Parabel's training time in the same run.

Usage (from the repository root)::

    python benchmarks/bench_mlgpf_scale.py [--shapes eurlex-4k:1.0 amazoncat-13k:0.01]
        [--families shared whitened cholesky preconditioned] [--steps 8] [--threads 1]
        [--cache-dir /tmp/bayesmlc-scale] [--full-fit [--device cpu|cuda|auto]] [--set key=value ...]

For each shape (``make_shape(name, scale, random_state=0)``, written once to an ``.npz`` under
``--cache-dir`` and read back from there on later runs) it

* trains omikuji Parabel (``n_threads=--threads``) on the training rows (80% of the rows; the other 20%
  are the test rows of ``--full-fit``), timed in wall and CPU seconds (left out, with a line that says
  so, where omikuji is not installed);
* for every family builds the default ``MLGPF``'s module (``variational=family``, everything else at
  its default, or ``--set``) from one set-up shared by the families (SVD, k-means, Phi:
  :func:`bayesmlc.gp.initialisation.initial_arrays`, as ``fit`` does, timed once) and its own ridge warm
  start, and times ``--steps`` steps of :class:`bayesmlc.gp.Trainer` on the default batch with a clock
  around each stage (kernels, factorisations, marginals, quadrature, kl, backward, adam): rows/s, CPU s
  per 1,000 rows, and the epoch of this shape and of the full AmazonCat-13K shape (1,186,239 rows) that
  rate projects. The steps see unit-normalised rows without idf weighting (a step's cost depends on
  the sparsity pattern, which idf keeps);
* with ``--full-fit``, a complete default ``MLGPF`` fit on ``--device`` (``MLGPF(device=...)``; default
  the CPU) and its test P@1 beside omikuji's. On a CUDA device the fit's clock is read after
  ``torch.cuda.synchronize``, and the peak GPU memory allocated and reserved by PyTorch's allocator
  is printed. The per-family steps above always run on the CPU.

Every figure is measured with ``torch.set_num_threads(--threads)`` and printed with the load average,
because the machine may be shared: compare ratios taken in the same run.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mlgpf import (  # noqa: E402
    STAGES, batch_size, device_label, load_avg, parse_sets, peak_memory_rows, reset_peak_memory, synchronize, timed_steps,
)

from bayesmlc.baselines import OmikujiParabel, missing_dependency  # noqa: E402
from bayesmlc.data.io import read_dataset, write_dataset  # noqa: E402
from bayesmlc.data.synthetic import make_shape, split  # noqa: E402
from bayesmlc.gp import MLGPF, Trainer  # noqa: E402
from bayesmlc.gp.initialisation import (  # noqa: E402
    build_module, initial_arrays, resolved_structure, training_projection, warm_start_mean,
)
from bayesmlc.gp.training import TrainingRows, epoch_batches  # noqa: E402
from bayesmlc.metrics import precision_at_k  # noqa: E402
from bayesmlc.preprocessing import normalize_rows  # noqa: E402
from bayesmlc.utils import resolve_device  # noqa: E402

FULL_AMAZONCAT_ROWS = 1_186_239
FAMILIES = ("shared", "whitened", "cholesky", "preconditioned")


def cached_preset(name: str, scale: float, cache_dir: Path):
    """(train, test, seconds to make or read): the preset at ``scale`` split 80/20, cached as .npz."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    paths = [cache_dir / f"{name}-{scale:g}-seed0-{part}.npz" for part in ("train", "test")]
    start = time.perf_counter()
    if not all(p.exists() for p in paths):
        train, test = split(make_shape(name, scale=scale, random_state=0), test_fraction=0.2, random_state=0)
        for dataset, path in zip((train, test), paths):
            write_dataset(dataset, path)
    train, test = (read_dataset(p) for p in paths)
    return train, test, time.perf_counter() - start


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def shared_setup(model: MLGPF, train):
    """The prepared training rows and the data-driven initial arrays (subspace SVD, k-means on U S, bias,
    Phi from the SVD of Y): computed once per shape and shared by the families (they do not depend on it)."""
    X = normalize_rows(train.X)
    return X, initial_arrays(model, X, train.Y, np.random.default_rng(0))


def resolved(model: MLGPF, train) -> MLGPF:
    """``model`` with its "auto" kernel and number of latent GPs set to what ``fit`` resolves them to on
    ``train`` (:func:`~bayesmlc.gp.initialisation.resolved_structure`): the set-up and the family
    modules below read the settings as given."""
    kernel, n_latent = resolved_structure(model.get_params(), train.X, train.Y.shape[1])
    return model.set_params(kernel=kernel, n_latent=n_latent)


def family_rows(model: MLGPF, X, Y, arrays: dict, steps: int) -> dict:
    """The family's module from ``arrays`` with the ridge warm start, then ``steps`` timed optimiser steps
    of ``model``'s default batch."""
    rng = np.random.default_rng(1)

    def build():
        module = build_module(model, arrays)
        projection = training_projection(module, X)
        if model.init_mean == "ridge":
            warm_start_mean(model, module, X, Y, rng)
        return Trainer(model.get_params(), rng, module=module), TrainingRows(X, Y, None, projection)

    (trainer, rows), warm_s, _ = timed(build)
    batch = batch_size(trainer, X.shape[0])
    batches = epoch_batches(X.shape[0], batch, rng)[: steps + 1]
    timed_steps(trainer, rows, batches[:1])  # warm-up step, not counted
    timings, wall, cpu = timed(lambda: timed_steps(trainer, rows, batches[1:]))
    n_rows = sum(len(b) for b in batches[1:])
    return dict(warm_s=warm_s, rows=n_rows, wall=wall, cpu=cpu, timings=timings, batch=batch)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["eurlex-4k:1.0", "amazoncat-13k:0.01"])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--steps", type=int, default=8, help="timed optimiser steps per family")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache-dir", default=os.environ.get("BAYESMLC_SCALE_CACHE", "/tmp/bayesmlc-scale"))
    parser.add_argument("--full-fit", action="store_true", help="also a complete default fit and test P@1")
    parser.add_argument("--device", default="cpu",
                        help="where the --full-fit model trains: cpu, cuda, cuda:N or auto (default: %(default)s)")
    parser.add_argument("--set", action="append", help="MLGPF parameter override key=value (every family)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = parse_sets(args.set)
    device = resolve_device(args.device)
    parabel_missing = missing_dependency("omikuji_parabel")
    print(f"MLGPF scale benchmark, threads={args.threads}, full fit on {device_label(device)}, "
          f"torch {torch.__version__}, {load_avg()}, overrides {overrides or 'none'}")
    for shape in args.shapes:
        name, scale = shape.split(":")
        train, test, data_s = cached_preset(name, float(scale), Path(args.cache_dir))
        n, d = train.X.shape
        print(f"\n### {name} at scale {scale}: {n} training rows, {d} features, {train.Y.shape[1]} labels, "
              f"nnz(x) {train.X.nnz / n:.1f} per row, {train.Y.nnz / n:.2f} labels per row (data {data_s:.1f} s)")
        parabel = None
        if parabel_missing is None:
            parabel = OmikujiParabel(n_threads=args.threads, predict_top_k=5, random_state=0)
            _, parabel_s, parabel_cpu = timed(lambda: parabel.fit(train.X, train.Y))
            print(f"omikuji Parabel fit: {parabel_s:.1f} s wall, {parabel_cpu:.1f} s CPU ({load_avg()})")
        else:
            print(f"no Parabel baseline: {parabel_missing}")
        base = dict(random_state=0, n_threads=args.threads, **overrides)
        (X, arrays), init_s, init_cpu = timed(lambda: shared_setup(resolved(MLGPF(**base), train), train))
        print(f"set-up shared by the families (row normalisation, subspace SVD, k-means, bias, Phi): "
              f"{init_s:.1f} s wall, {init_cpu:.1f} s CPU")
        print("\n| family | warm start s | rows/s | CPU s / 1000 rows | epoch s, this shape | epoch min, 1.19M rows | "
              + " | ".join(STAGES) + " |")
        print("|---|---|---|---|---|---|" + "---|" * len(STAGES))
        for family in args.families:
            model = resolved(MLGPF(**dict(base, variational=family)), train)
            r = family_rows(model, X, train.Y, arrays, args.steps)
            rate = r["rows"] / r["wall"]
            split_s = " | ".join(f"{100 * r['timings'].get(s, 0.0) / r['wall']:.0f}%" for s in STAGES)
            print(f"| {family} | {r['warm_s']:.1f} | {rate:.0f} | {1000 * r['cpu'] / r['rows']:.2f} | "
                  f"{n / rate:.1f} | {FULL_AMAZONCAT_ROWS / rate / 60:.1f} | {split_s} |", flush=True)
        print(f"(stage shares of the timed steps' wall time; batch {r['batch']}, {args.steps} steps per family after "
              f"one untimed; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2:.2f} GB; {load_avg()})")
        if args.full_fit:
            model = MLGPF(**dict(base, device=args.device))
            reset_peak_memory(device)

            def fit():
                model.fit(train.X, train.Y)
                synchronize(device)

            _, fit_s, fit_cpu = timed(fit)
            mlgpf_p1 = precision_at_k(test.Y, model.decision_function(test.X), 1)
            print(f"\n| model | fit s | fit CPU s | fit s / Parabel's | test P@1 |\n|---|---|---|---|---|")
            if parabel is not None:
                parabel_p1 = precision_at_k(test.Y, parabel.decision_function(test.X), 1)
                print(f"| omikuji Parabel | {parabel_s:.1f} | {parabel_cpu:.1f} | 1.00 | {100 * parabel_p1:.2f} |")
            ratio = f"{fit_s / parabel_s:.2f}" if parabel is not None else "-"
            print(f"| MLGPF default ({model.variational}, {model.epochs} epochs, {device.type}) | {fit_s:.1f} | "
                  f"{fit_cpu:.1f} | {ratio} | {100 * mlgpf_p1:.2f} |")
            memory = peak_memory_rows(device)
            if memory:
                print("\n| quantity (the full fit and its test predictions) | value |\n|---|---|\n" + "\n".join(memory))
            print(f"({load_avg()})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
