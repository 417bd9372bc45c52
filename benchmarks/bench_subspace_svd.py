"""The subspace basis of MLGPF's set-up alone, split by stage, with the held-out energy it keeps.

Usage (from the repository root)::

    python benchmarks/bench_subspace_svd.py [--shape amazoncat-13k:1.25] [--rows 100000] [--held-out 20000]
        [--rank 1000] [--threads 2] [--repeats 2] [--cache-dir /tmp/bayesmlc-scale]

The shape's training rows (``bench_mlgpf_scale.cached_preset``: ``make_shape(name, scale,
random_state=0)`` split 80/20, cached as ``.npz``) are prepared as the default MLGPF prepares them
(idf weighting, unit rows). ``--rows`` of them, drawn with seed 0, go to
:func:`bayesmlc.linalg.top_singular_vectors` (float32 work arrays, as MLGPF's default ``dtype``);
``--held-out`` other rows measure what the basis keeps of new rows, ||X_held X~^T||_F^2 /
||X_held||_F^2 (the linear kernel without ARD sees only the span). The table gives, per repeat, the
basis's wall seconds and those of its stages (the X W and X^T Y products, the LU renormalisations,
the float64 Gram matrices; the rest is the random start, the eigendecompositions and the final
rotation), the held-out energy and max |X~ X~^T - I|, and the load average.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mlgpf import load_avg  # noqa: E402
from bench_mlgpf_scale import cached_preset  # noqa: E402

from bayesmlc import linalg  # noqa: E402
from bayesmlc.preprocessing import FeaturePreprocessor  # noqa: E402

STAGES = ("X W", "X^T Y", "LU", "Gram")


def clocked(clock: dict, stage: str, fn):
    """``fn`` with its wall seconds added to ``clock[stage]`` on every call."""

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            clock[stage] = clock.get(stage, 0.0) + time.perf_counter() - start

    return wrapper


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="amazoncat-13k:1.25", help="preset:scale (default: %(default)s)")
    parser.add_argument("--rows", type=int, default=100_000, help="rows the basis sees (default: %(default)s)")
    parser.add_argument("--held-out", type=int, default=20_000, help="rows measuring the energy kept")
    parser.add_argument("--rank", type=int, default=1000, help="R (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cache-dir", default=os.environ.get("BAYESMLC_SCALE_CACHE", "/tmp/bayesmlc-scale"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    name, scale = args.shape.split(":")
    train, _, _ = cached_preset(name, float(scale), Path(args.cache_dir))
    X = FeaturePreprocessor(standardize="auto", idf=True, normalize=True).fit(train.X).transform(train.X)
    order = np.random.default_rng(0).permutation(X.shape[0])
    rows = X[np.sort(order[: args.rows])]
    held = X[np.sort(order[args.rows : args.rows + args.held_out])]
    held_energy = float(held.multiply(held).sum())
    clock: dict = {}
    products = linalg._ThreadedProducts
    originals = (products.times, products.transpose_times, linalg._lu_basis, linalg._gram)
    products.times = clocked(clock, "X W", products.times)
    products.transpose_times = clocked(clock, "X^T Y", products.transpose_times)
    linalg._lu_basis = clocked(clock, "LU", linalg._lu_basis)
    linalg._gram = clocked(clock, "Gram", linalg._gram)
    print(f"subspace basis, {args.shape}: {rows.shape[0]} rows x {rows.shape[1]} features, R={args.rank}, "
          f"threads={args.threads}, {load_avg()}", flush=True)
    print("\n| repeat | basis s | " + " | ".join(f"{stage} s" for stage in STAGES)
          + " | other s | held-out energy kept | max abs(X~ X~^T - I) |")
    print("|---" * (len(STAGES) + 5) + "|")
    try:
        for repeat in range(1, args.repeats + 1):
            clock.clear()
            start = time.perf_counter()
            Vt, _ = linalg.top_singular_vectors(rows, args.rank, seed=12345, dtype=np.float32)
            total = time.perf_counter() - start
            kept = linalg.sparse_dense_product(held, np.ascontiguousarray(Vt.T)).astype(np.float64)
            energy = float((kept**2).sum()) / held_energy
            orthonormality = float(np.abs(Vt @ Vt.T - np.eye(Vt.shape[0])).max())
            stages = [clock.get(stage, 0.0) for stage in STAGES]
            print(f"| {repeat} | {total:.1f} | " + " | ".join(f"{s:.1f}" for s in stages)
                  + f" | {total - sum(stages):.1f} | {energy:.5f} | {orthonormality:.1e} |", flush=True)
    finally:
        products.times, products.transpose_times, linalg._lu_basis, linalg._gram = originals
    print(f"({load_avg()})")


if __name__ == "__main__":
    sys.exit(main())
