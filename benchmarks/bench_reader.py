"""Speed and memory of the XC text reader and of the .npz cache, on a synthetic file shaped like
AmazonCat-13K / RCV1 at scale.

    python benchmarks/bench_reader.py --quick            # 100k rows (~150 MB file)
    python benchmarks/bench_reader.py --sklearn          # 100k rows, then 1M rows x ~100 non-zeros (~1.4 GB file)

The file is written to a temporary folder (``--workdir``, default /tmp/bayesmlc-bench-reader) and
deleted afterwards unless ``--keep``. Each measurement runs in a fresh Python process so that its
peak resident memory is its own; the table reports the wall and CPU time (on a loaded machine the
CPU time is the better guide to an idle one), rows/s, non-zeros/s
and the peak resident memory of the read (VmHWM, reset after the imports), next to the RSS the process
had before the read (the baseline: Python, NumPy, SciPy, numba and the compiled scanner).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp


def generate(path: Path, n_rows: int, n_features: int, n_labels: int, nnz_per_row: int, labels_per_row: float,
             seed: int = 0, rows_per_chunk: int = 50_000) -> dict:
    """Write a synthetic XC file chunk by chunk; returns its statistics.

    Feature columns are uniform over ``n_features`` (repeats within a row removed, so rows hold about
    ``nnz_per_row``), values are tf-idf-like numbers with 4 decimals in (0, 1], label counts are
    Poisson(``labels_per_row``) and labels follow a Zipf-like power law over ``n_labels``.
    """
    from bayesmlc.data.formats.xc import write_sparse_rows

    rng = np.random.default_rng(seed)
    label_weights = 1.0 / np.arange(1, n_labels + 1) ** 0.8
    label_weights /= label_weights.sum()
    total_nnz = total_labels = 0
    with open(path, "wb") as stream:
        stream.write(f"{n_rows} {n_features} {n_labels}\n".encode())
        for first in range(0, n_rows, rows_per_chunk):
            rows = min(rows_per_chunk, n_rows - first)
            columns = np.sort(rng.integers(0, n_features, size=(rows, nnz_per_row)), axis=1)
            keep = np.ones(columns.shape, dtype=bool)
            keep[:, 1:] = columns[:, 1:] != columns[:, :-1]
            counts = keep.sum(axis=1)
            indptr = np.concatenate([[0], np.cumsum(counts)])
            values = np.maximum(np.round(rng.gamma(2.0, 0.08, size=int(indptr[-1])), 4), 1e-4).clip(max=1.0)
            X = sp.csr_matrix((values.astype(np.float32), columns[keep], indptr), shape=(rows, n_features))
            n_row_labels = np.minimum(rng.poisson(labels_per_row, size=rows), 50)
            drawn = rng.choice(n_labels, size=int(n_row_labels.sum()), p=label_weights)
            Y = sp.csr_matrix((np.ones(drawn.size, dtype=np.float32), drawn,
                               np.concatenate([[0], np.cumsum(n_row_labels)])), shape=(rows, n_labels))
            Y.sum_duplicates()
            Y.data[:] = 1
            Y.sort_indices()
            write_sparse_rows(stream, X, Y)
            total_nnz += X.nnz
            total_labels += Y.nnz
    return {"rows": n_rows, "features": n_features, "labels": n_labels, "nnz": total_nnz,
            "label_nnz": total_labels, "bytes": path.stat().st_size}


def _status_mb(key: str) -> float:
    """A memory figure of this process from /proc/self/status (VmRSS: now, VmHWM: peak), in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS counter (VmHWM), so the peak measured is that of the read alone."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:  # not Linux, or not permitted: the peak then includes the imports
        pass


def _peak_rss_mb() -> float:
    return _status_mb("VmHWM")


def measure(mode: str, path: str, cache_dir: str) -> dict:
    """Run inside the child process: one read, timed; returns seconds and peak RSS."""
    from bayesmlc.data.io import read_dataset

    warm = Path(cache_dir).parent / "warm-up.txt"  # load the compiled code (numba cache) before timing
    warm.write_text("1 2 1\n0 1:0.5\n")
    read_dataset(warm)
    baseline = _status_mb("VmRSS")
    _reset_peak_rss()
    start, cpu_start = time.perf_counter(), time.process_time()
    if mode == "xc":
        data = read_dataset(path, sha256=False)
    elif mode == "make-cache":
        data = read_dataset(path, sha256=False, cache=cache_dir)
    elif mode == "cache":
        data = read_dataset(path, sha256=False, cache=cache_dir)
        assert data.source["from_cache"], "the cache was not used"
    elif mode == "sklearn":
        from sklearn.datasets import load_svmlight_file

        with open(path, "rb") as stream:
            n, d, _ = (int(v) for v in stream.readline().split())
            X, _ = load_svmlight_file(stream, n_features=d, multilabel=True, zero_based=True, dtype=np.float32)
        data = None
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        return {"seconds": seconds, "cpu_seconds": cpu, "peak_rss_mb": _peak_rss_mb(), "baseline_rss_mb": baseline,
                "nnz": int(X.nnz), "rows": int(X.shape[0])}
    else:
        raise ValueError(mode)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_rss_mb": _peak_rss_mb(), "baseline_rss_mb": baseline,
            "nnz": int(data.X.nnz), "rows": int(data.n_samples)}


def _child(mode: str, path: Path, cache_dir: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(path), str(cache_dir)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(n_rows: int, args) -> list:
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"synthetic-{n_rows}.txt"
    cache_dir = workdir / "cache"
    start = time.perf_counter()
    stats = generate(path, n_rows, args.features, args.labels, args.nnz_per_row, args.labels_per_row)
    print(f"generated {path} in {time.perf_counter() - start:.1f} s: {json.dumps(stats)}", file=sys.stderr)
    results = []
    modes = ["xc", "make-cache", "cache"] + (["sklearn"] if args.sklearn and n_rows <= 200_000 else [])
    for mode in modes:
        result = _child(mode, path, cache_dir)
        result.update(mode=mode, file_mb=stats["bytes"] / 1e6)
        results.append(result)
        print(json.dumps(result), file=sys.stderr)
    if not args.keep:
        path.unlink()
        shutil.rmtree(cache_dir, ignore_errors=True)
        (workdir / "warm-up.txt").unlink(missing_ok=True)
    return results


LABELS = {"xc": "read_dataset (XC text)", "make-cache": "read_dataset(cache=dir), first (parse + write .npz)",
          "cache": "read_dataset(cache=dir), reload from .npz", "sklearn": "sklearn load_svmlight_file (reference)"}


def table(results: list) -> str:
    lines = ["| rows | nnz | file MB | reader | wall s | CPU s | rows/s (wall) | nnz/s (wall) | peak RSS MB "
             "| baseline RSS MB | peak - baseline MB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['rows']:,} | {r['nnz']:,} | {r['file_mb']:.0f} | {LABELS[r['mode']]} | {r['seconds']:.2f} | "
                     f"{r['cpu_seconds']:.2f} | "
                     f"{r['rows'] / r['seconds']:,.0f} | {r['nnz'] / r['seconds'] / 1e6:.1f} M | {r['peak_rss_mb']:.0f} | "
                     f"{r['baseline_rss_mb']:.0f} | {r['peak_rss_mb'] - r['baseline_rss_mb']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100k rows only")
    parser.add_argument("--rows", type=int, nargs="*", default=None, help="row counts (default 100000 1000000)")
    parser.add_argument("--features", type=int, default=200_000)
    parser.add_argument("--labels", type=int, default=13_000)
    parser.add_argument("--nnz-per-row", type=int, default=100)
    parser.add_argument("--labels-per-row", type=float, default=5.0)
    parser.add_argument("--workdir", default="/tmp/bayesmlc-bench-reader")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--sklearn", action="store_true",
                        help="also time scikit-learn's svmlight parser (files of at most 200k rows)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(*args.child)))
        return 0
    sizes = args.rows or ([100_000] if args.quick else [100_000, 1_000_000])
    results = []
    for n_rows in sizes:
        results += run(n_rows, args)
    print(f"load average: {os.getloadavg()}, cpus: {os.cpu_count()}")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
