"""Time of ``bayesmlc demo`` with and without a competing CPU load, with the thread back-off and
with every core forced.

    python benchmarks/bench_demo.py                      # 0 and cpu_count busy processes, mlgpf
    python benchmarks/bench_demo.py --busy 0 2 4 --model bnmc --repeats 2

Each run is a fresh ``python -m bayesmlc demo --json --quiet`` process. The competing load is
``--busy`` processes that spin on the CPU (started before the runs of that row, stopped after them).
Three thread settings per load: ``auto`` (the CLI's default: fewer threads when other processes keep
the cores busy, bayesmlc.threads), ``--threads 1``, and ``--threads N`` with N the usable cores
(torch's own default, one thread per core, whatever the load). The table gives the wall and CPU seconds of the whole process
(imports included; CPU from ``getrusage`` of the children), the training seconds and test P@1 the
demo reports, and the load (busy cores) the back-off saw before each run. On a machine that other
work already loads, the ``--busy 0`` row is not an idle figure: the load column says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def spin_processes(count: int) -> list:
    """``count`` processes that keep one core each busy until killed."""
    # each spins until its parent (this script) is gone, so none outlives a killed benchmark
    spin = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(count)]


def stop(processes: list) -> None:
    for process in processes:
        process.kill()
    for process in processes:
        process.wait()


def run_demo(model: str, threads: int | None, n_samples: int) -> dict:
    """One demo process: wall and CPU seconds, and the demo's own figures."""
    from bayesmlc.threads import current_load

    command = [sys.executable, "-m", "bayesmlc", "demo", "--model", model, "--n-samples", str(n_samples), "--json",
               "--quiet"]
    if threads is not None:
        command += ["--threads", str(threads)]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # an explicit count disables the back-off
        env.pop(name, None)
    load = current_load()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    record = json.loads(completed.stdout.strip().splitlines()[-1])
    return {"wall": wall, "cpu": (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime),
            "train": record["train_seconds"], "p1": record["metrics"]["P@1"],
            "baseline_p1": record["baseline_metrics"]["P@1"], "load": load}


def main(argv=None) -> int:
    from bayesmlc.threads import usable_cores

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # stop the spinners on a kill

    cores = usable_cores()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, nargs="+", default=[0, cores],
                        help=f"competing busy processes per row (default: 0 and {cores}, the usable cores)")
    parser.add_argument("--model", default="mlgpf", help="demo model (default mlgpf)")
    parser.add_argument("--n-samples", type=int, default=2000, help="demo rows (default 2000, the demo's default)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per cell (default 1)")
    args = parser.parse_args(argv)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    import torch

    print(f"# bayesmlc demo --model {args.model} --n-samples {args.n_samples}: commit {commit or '?'}, "
          f"{platform.processor() or platform.machine()}, {cores} usable cores, torch {torch.__version__}, "
          f"load average before {os.getloadavg()[0]:.2f}")
    print()
    print("| busy processes | threads | wall s | CPU s | train s | P@1 | baseline P@1 | load seen |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for busy in args.busy:
        spinners = spin_processes(busy)
        try:
            time.sleep(1.0 if busy else 0.0)  # let them reach the run queue
            for threads in (None, 1, cores) if cores > 1 else (None, 1):
                for _ in range(args.repeats):
                    r = run_demo(args.model, threads, args.n_samples)
                    label = "auto" if threads is None else f"--threads {threads}"
                    print(f"| {busy} | {label} | {r['wall']:.1f} | {r['cpu']:.1f} | {r['train']:.1f} | {r['p1']:.3f} | "
                          f"{r['baseline_p1']:.3f} | {r['load']:.1f} |", flush=True)
        finally:
            stop(spinners)
    print()
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
