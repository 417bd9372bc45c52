"""Where a default MLGPF fit spends its time, by stage, at fixed thread counts.

Usage (from the repository root)::

    python benchmarks/bench_mlgpf_profile.py SET [--threads 1 2] [--data-root ../shared/datasets]
            [--set key=value ...]

SET as for ``bench_mlgpf_linear.py`` (a folder of the data root, or ``PRESET:SCALE`` for the
synthetic shapes, split 80/20). For each thread count the script runs ``MLGPF(n_threads=T,
random_state=0, **sets).fit`` on the training rows with a clock (wall and process CPU seconds)
around each stage: the set-up before the first step (feature weighting, subspace SVD, k-means,
support screening, ridge warm start), and inside each Adam step the feature rows, the negative
sample, the linear term's block, the GP marginals, the data term (of it, the linear term's
products), the backward pass (of it, the linear term's), the gradient check, the two Adam steps,
then what ``fit`` adds between steps (the running training P@1, the evidence updates). The clocks
wrap library functions from outside (nothing in the library changes), and nested stages are
printed indented under their parent: the parent's figure includes them. CPU / wall above 1 means
the stage ran on more than one core. The load average is printed before each fit.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mlgpf_linear import DATA_ROOT, load_set  # noqa: E402

import bayesmlc.gp.objective as objective  # noqa: E402
import bayesmlc.gp.training as training  # noqa: E402
from bayesmlc.gp import MLGPF  # noqa: E402
from bayesmlc.gp.linear_support import SupportBlock, SupportLinearTerm, _SupportTimes  # noqa: E402
from bayesmlc.gp.linear_term import PenalisedLinearWeights  # noqa: E402
from bayesmlc.gp.variational import SharedWhitened  # noqa: E402
from bayesmlc.parameters import parse_set_values  # noqa: E402

#: (printed name, depth, owner, attribute): the clocked functions, in the order printed
STAGES = [
    ("set-up: Trainer.initialise", 1, training.Trainer, "initialise"),
    ("epochs (Trainer._epoch)", 1, training.Trainer, "_epoch"),
    ("steps (Trainer.step)", 2, training.Trainer, "step"),
    ("feature rows", 3, training, "feature_batch"),
    ("negative sample", 3, training, "minibatch_targets"),
    ("linear block", 3, PenalisedLinearWeights, "block"),
    ("GP marginals", 3, objective, "latent_marginals"),
    ("data term (sampled negatives)", 3, objective, "data_term_shared"),
    ("data term (all labels)", 3, objective, "data_term_full"),
    ("linear forward (B x S)", 4, SupportBlock, "sampled_utilities"),
    ("linear forward (positives)", 4, SupportBlock, "positive_utilities"),
    ("KL", 3, SharedWhitened, "kl"),
    ("backward", 3, torch.autograd, "backward"),
    ("linear backward", 4, _SupportTimes, "backward"),
    ("linear prior gradient", 3, SupportLinearTerm, "prior_gradient"),
    ("finite check", 3, training, "all_finite"),
    ("GP Adam", 3, torch.optim.Adam, "step"),
    ("linear Adam", 3, SupportLinearTerm, "adam_step"),
    ("linear utilities (train P@1, evidence)", 2, SupportLinearTerm, "utilities"),
    ("evidence updates", 1, training.Trainer, "update_prior_variance"),
]


@contextmanager
def clocked(owner, attribute: str, totals: list):
    """Replace ``owner.attribute`` by a wrapper adding its wall and process CPU seconds to ``totals``
    (a [wall, cpu, calls] list), and put the original back on exit."""
    original = owner.__dict__[attribute] if isinstance(owner, type) else getattr(owner, attribute)
    function = original.__func__ if isinstance(original, staticmethod) else original

    def wrapper(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            totals[0] += time.perf_counter() - wall
            totals[1] += time.process_time() - cpu
            totals[2] += 1

    setattr(owner, attribute, staticmethod(wrapper) if isinstance(original, staticmethod) else wrapper)
    try:
        yield
    finally:
        setattr(owner, attribute, original)


def profile_fit(X, Y, threads: int, settings: dict) -> dict:
    """{stage name: [wall s, CPU s, calls]} of one clocked ``MLGPF(...).fit(X, Y)``."""
    totals = {name: [0.0, 0.0, 0] for name, *_ in STAGES}
    with ExitStack() as stack:
        for name, _, owner, attribute in STAGES:
            stack.enter_context(clocked(owner, attribute, totals[name]))
        wall, cpu = time.perf_counter(), time.process_time()
        MLGPF(n_threads=threads, random_state=0, **settings).fit(X, Y)
        totals["fit"] = [time.perf_counter() - wall, time.process_time() - cpu, 1]
    return totals


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("set")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--data-root", default=str(DATA_ROOT))
    parser.add_argument("--set", dest="sets", nargs="*", default=[])
    args = parser.parse_args(argv)
    settings = parse_set_values(args.sets, MLGPF().get_params())
    X, Y, _, _ = load_set(args.set, args.data_root)
    print(f"{args.set}: {X.shape[0]} training rows, D = {X.shape[1]}, L = {Y.shape[1]}; settings {settings or 'defaults'}")
    results = {}
    for threads in args.threads:
        print(f"{threads} thread(s): load average before {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
        results[threads] = profile_fit(X, Y, threads, settings)
    header = " | ".join(f"{t} thr wall s | CPU s" for t in args.threads)
    print(f"\n| stage | calls | {header} |\n|---|---|" + "---|---|" * len(args.threads))
    for name, depth, *_ in [("fit", 0)] + STAGES:
        figures = " | ".join(f"{results[t][name][0]:.2f} | {results[t][name][1]:.2f}" for t in args.threads)
        print(f"| {'. ' * depth}{name} | {results[args.threads[0]][name][2]} | {figures} |")


if __name__ == "__main__":
    main()
