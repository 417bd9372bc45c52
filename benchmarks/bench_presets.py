"""A model's ``fast`` preset against its defaults: training wall and CPU seconds, and test P@1.

Usage (from the repository root)::

    PYTHONPATH=. python benchmarks/bench_presets.py --model mlgpf --dataset bibtex_xc
    PYTHONPATH=. python benchmarks/bench_presets.py --model mlgpf --dataset medical --threads 2

Each configuration (the model's defaults, then ``Model.preset("fast")``) is fitted once with
``random_state=0`` on ``DATASET/train.txt`` of the shared data sets, inside ``use_threads(--threads)``
(default 1, so that a busy machine changes the wall time but hardly the CPU time), and scored on
``test.txt``: P@1 of ``predict_proba`` and of ``decision_function`` (they differ for MLGPF's
default ``rank_by="mean"``). The table gives the wall and CPU seconds of ``fit`` (``time.process_time``:
this process, all its threads) and the preset's CPU time as a share of the defaults'; the promise of
``fast`` (docs/presets.md) is at most a third.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed_fit(model, train, test, threads: int) -> dict:
    """Fit ``model`` and score it: wall and CPU seconds of the fit, P@1 by probability and by score."""
    from bayesmlc.metrics import precision_at_k
    from bayesmlc.threads import use_threads

    with use_threads(threads), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wall, cpu = time.perf_counter(), time.process_time()
        model.fit(train.X, train.Y, label_mask=train.label_mask)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        proba, scores = model.predict_proba(test.X), model.decision_function(test.X)
    return {"wall": wall, "cpu": cpu, "p1_proba": 100 * precision_at_k(test.Y, proba, k=1),
            "p1_scores": 100 * precision_at_k(test.Y, scores, k=1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mlgpf", help="a model with presets (default mlgpf)")
    parser.add_argument("--dataset", default="bibtex_xc", help="a folder of the shared data sets (default bibtex_xc)")
    parser.add_argument("--data-root", default=str(REPO.parent / "shared" / "datasets"))
    parser.add_argument("--threads", type=int, default=1, help="threads of every fit (default 1)")
    args = parser.parse_args(argv)

    from bayesmlc.data.io import read_train_test
    from bayesmlc.models import get_model_class

    folder = Path(args.data_root) / args.dataset
    train, test = read_train_test(folder / "train.txt", folder / "test.txt")
    cls = get_model_class(args.model)
    results = {name: timed_fit(model, train, test, args.threads)
               for name, model in (("defaults", cls(random_state=0)), ("fast", cls.preset("fast", random_state=0)))}
    print(f"{args.model} on {args.dataset} ({train.n_samples} training rows), {args.threads} thread(s)")
    print("| configuration | fit wall s | fit CPU s | CPU share of the defaults | P@1 (predict_proba) | "
          "P@1 (decision_function) |")
    print("|---|---|---|---|---|---|")
    for name, result in results.items():
        share = result["cpu"] / results["defaults"]["cpu"]
        print(f"| {name} | {result['wall']:.1f} | {result['cpu']:.1f} | {share:.2f} | {result['p1_proba']:.2f} | "
              f"{result['p1_scores']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
