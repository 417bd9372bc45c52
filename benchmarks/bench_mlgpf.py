"""MLGPF benchmarks: accuracy on Bibtex, seconds per epoch with a time split, AmazonCat-13K-shaped scale.

Usage (from the repository root; the ``bibtex_xc`` set, read from the data root the registry and the
benchmark harness read: ``$BAYESMLC_DATA``, see ``bayesmlc.datasets.data_home``; what the set is
and where to get it: ``bayesmlc.datasets.get_info("bibtex_xc")``)::

    python benchmarks/bench_mlgpf.py speed    [--threads 2] [--epochs 2] [--set variational=cholesky ...]
    python benchmarks/bench_mlgpf.py accuracy [--threads 2] [--config paper|default|best|code] [--epochs 100]
                                              [--eval-every 10] [--set key=value ...]
    python benchmarks/bench_mlgpf.py scale    [--threads 2] [--scale 0.02] [--steps 20] [--set ...]
    python benchmarks/bench_mlgpf.py pair     [--threads 1] [--seed 0]

Each prints a Markdown table (and the machine's load average) to paste into docs/benchmarks.md.

``speed`` and ``scale`` time the steps of :class:`bayesmlc.gp.Trainer` (set up by
:meth:`~bayesmlc.gp.training.Trainer.initialise`, stepped by :meth:`~bayesmlc.gp.training.Trainer.step`
with a clock around each stage) on unit-normalised rows without idf weighting or standardisation: a
step's cost depends on the rows' sparsity pattern, which those keep.
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

from bayesmlc.datasets import data_home
from bayesmlc.parameters import parse_set_values
from bayesmlc.data.io import read_dataset
from bayesmlc.gp import MLGPF, Trainer
from bayesmlc.gp.initialisation import resolved_structure
from bayesmlc.gp.likelihoods import BernoulliLogit
from bayesmlc.gp.objective import VariationalELBO
from bayesmlc.gp.training import TrainingRows, epoch_batches, resolve_batch_size
from bayesmlc.metrics import evaluate, inverse_propensity
from bayesmlc.presets import MLGPF_AUTHORS_CODE, MLGPF_BEST_SINGLE, MLGPF_PAIR, MLGPF_PAPER
from bayesmlc.preprocessing import normalize_rows
from bayesmlc.utils import resolve_device

DATA = data_home()

# The recipes measured here are bayesmlc.presets' (their comments say what each is): PAPER the subspace
# paper's settings, BEST the best single configuration, CODE the authors' code's settings, PAIR the two
# recipes whose AveragingEnsemble is MLGPF's best configuration (MLGPF.preset("best")).
PAPER, BEST, CODE, PAIR = MLGPF_PAPER, MLGPF_BEST_SINGLE, MLGPF_AUTHORS_CODE, MLGPF_PAIR
CONFIGS = {"paper": PAPER, "default": {}, "best": BEST, "code": CODE}


def load_avg() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def parse_sets(items) -> dict:
    """``--set key=value`` pairs, parsed and checked as ``bayesmlc train --set`` does."""
    return parse_set_values(items, MLGPF().get_params())


def bibtex():
    train = read_dataset(DATA / "bibtex_xc" / "train.txt")
    test = read_dataset(DATA / "bibtex_xc" / "test.txt")
    return train, test


STAGES = ["batching", "kernels", "factorisations", "marginals", "quadrature", "kl", "backward", "adam"]


def setup(params: dict, X, Y, rng, device="cpu"):
    """A :class:`~bayesmlc.gp.Trainer` of ``MLGPF(**params)``'s settings set up on the rows ``X``, ``Y`` as
    fit sets it up (subspace SVD, k-means, Phi, bias, ridge warm start, Adam) with the random stream
    ``rng``, its module on ``device`` ("cpu", "cuda", "auto" or a torch.device); returns (trainer,
    training rows, seconds)."""
    settings = MLGPF(**params).get_params()
    settings["kernel"], settings["n_latent"] = resolved_structure(settings, X, Y.shape[1])
    device = resolve_device(device)
    trainer = Trainer(settings, rng, device, getattr(torch, settings["dtype"]))
    t0 = time.perf_counter()
    projection = trainer.initialise(X, Y)
    synchronize(device)
    return trainer, TrainingRows(X, Y, None, projection), time.perf_counter() - t0


def synchronize(device) -> None:
    """Wait for the work queued on ``device`` (a CUDA device; nothing to wait for on the CPU), so that a
    clock read next counts it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device) -> None:
    """Start counting the peak of ``device``'s allocated memory anew (CUDA only)."""
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def device_label(device) -> str:
    """``device`` in words for a benchmark's header: "cpu", or the CUDA device's index, name and memory."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    properties = torch.cuda.get_device_properties(index)
    return f"cuda:{index} ({properties.name}, {properties.total_memory / 2**30:.1f} GiB)"


def peak_memory_rows(device) -> list[str]:
    """Table rows of ``device``'s peak allocated and reserved memory since the last
    :func:`reset_peak_memory` (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``); none on
    the CPU."""
    if torch.device(device).type != "cuda":
        return []
    return [f"| peak GPU memory allocated GB (torch.cuda.max_memory_allocated) | "
            f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f} |",
            f"| peak GPU memory reserved GB (torch.cuda.max_memory_reserved) | "
            f"{torch.cuda.max_memory_reserved(device) / 2**30:.2f} |"]


def timed_steps(trainer: Trainer, rows: TrainingRows, batches) -> dict:
    """Adam steps as in MLGPF.fit (:meth:`~bayesmlc.gp.training.Trainer.step`) on ``batches`` of
    ``rows``; returns seconds per stage (:data:`STAGES`)."""
    settings = trainer.settings
    elbo = VariationalELBO(BernoulliLogit(settings.quadrature_points), rows.context.n_total, settings.kl_weight)
    timings: dict = {}
    for batch_rows in batches:
        trainer.step(rows, batch_rows, elbo, timings)
    return timings


def batch_size(trainer: Trainer, n_rows: int) -> int:
    return resolve_batch_size(trainer.settings.batch_size, n_rows)


def split_row(timings: dict) -> str:
    return " | ".join(f"{timings.get(s, 0.0):.2f}" for s in STAGES)


def cmd_speed(args):
    train, _ = bibtex()
    params = dict(PAPER, **parse_sets(args.set))
    rng = np.random.default_rng(0)
    X = normalize_rows(train.X)
    trainer, rows, init_s = setup(params, X, train.Y, rng)
    print(f"\nMLGPF speed on bibtex_xc train ({train.X.shape[0]} rows), threads={torch.get_num_threads()}, {load_avg()}")
    print(f"settings: {params}")
    print(f"initialisation (SVD + k-means + factor and mean warm starts): {init_s:.1f} s")
    print("\n| epoch | s/epoch | CPU s/epoch (all threads) | " + " | ".join(STAGES) + " |")
    print("|---|---|---|" + "---|" * len(STAGES))
    for epoch in range(1, args.epochs + 1):
        start, cpu_start = time.perf_counter(), time.process_time()
        timings = timed_steps(trainer, rows, epoch_batches(X.shape[0], batch_size(trainer, X.shape[0]), rng))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        print(f"| {epoch} | {wall:.2f} | {cpu:.2f} | {split_row(timings)} |", flush=True)
    total = sum(timings.values())
    print("\nshare of the last epoch: " + ", ".join(f"{s} {100 * timings.get(s, 0.0) / total:.0f}%" for s in STAGES))
    print(f"(after the run: {load_avg()})")


def cmd_accuracy(args):
    train, test = bibtex()
    params = dict(CONFIGS[args.config], **parse_sets(args.set))
    params.setdefault("random_state", 0)
    params["epochs"] = args.epochs
    if MLGPF(**params).lr_decay > 0 and args.eval_every < args.epochs:
        # the decay schedule depends on the total epochs: a run cut into resumed pieces would decay in
        # every piece, so a decayed run is scored once, at its end
        print(f"lr_decay > 0: scoring only after all {args.epochs} epochs (--eval-every ignored)")
        args.eval_every = args.epochs
    weights = inverse_propensity(train.Y)
    path = Path(args.workdir) / f"bench-{os.getpid()}.ckpt.npz"
    print(f"\nMLGPF accuracy on bibtex_xc (train.txt -> test.txt), threads={torch.get_num_threads()}, {load_avg()}")
    print(f"settings: {params}")
    print("\n| epochs | train s (cumulative) | P@1 | P@3 | P@5 |")
    print("|---|---|---|---|---|")
    reached_62 = None
    model = None
    for stop in range(args.eval_every, args.epochs + 1, args.eval_every):
        model = MLGPF(**dict(params, epochs=stop, checkpoint_every=args.eval_every, checkpoint_path=str(path)))
        model.fit(train.X, train.Y, resume=stop > args.eval_every)
        seconds = model.history_["wall_time"][-1]
        ranks = evaluate(test.Y, scores=model.decision_function(test.X))
        print(f"| {stop} | {seconds:.0f} | {100 * ranks['P@1']:.2f} | {100 * ranks['P@3']:.2f} | {100 * ranks['P@5']:.2f} |",
              flush=True)
        if reached_62 is None and ranks["P@1"] >= 0.62:
            reached_62 = (stop, seconds)
    path.unlink(missing_ok=True)
    scores = model.decision_function(test.X)
    proba = model.predict_proba(test.X)
    full = evaluate(test.Y, scores=scores, proba=proba, inv_propensity=weights)
    print(f"\ntime to test P@1 >= 62: {'not reached' if reached_62 is None else f'{reached_62[1]:.0f} s ({reached_62[0]} epochs)'}")
    print_full_row(full)
    by_proba = evaluate(test.Y, scores=proba)
    print("\nranked by predict_proba (E[sigmoid(f)], uses the predictive variance) instead of E[f]: P@1/3/5 = "
          + " / ".join(f"{100 * by_proba[f'P@{k}']:.2f}" for k in (1, 3, 5)))


def pair_ensemble(random_state, overrides: dict):
    """The :data:`PAIR` ensemble (``MLGPF.preset("best")``); ``overrides`` apply to both members."""
    return MLGPF.preset("best", **overrides, random_state=random_state)


def cmd_pair(args):
    train, test = bibtex()
    ensemble = pair_ensemble(args.seed, parse_sets(args.set))
    print(f"\nMLGPF pair (AveragingEnsemble) on bibtex_xc (train.txt -> test.txt), threads={torch.get_num_threads()}, "
          f"random_state={args.seed}, {load_avg()}")
    for name, member in ensemble.estimators:
        print(f"{name}: {member.get_params()}")
    ensemble.fit(train.X, train.Y)
    print("\n| model | member seed | train s | P@1 | P@3 | P@5 |")
    print("|---|---|---|---|---|---|")
    for (name, member), seconds in zip(ensemble.named_estimators_.items(), ensemble.fit_seconds_):
        ranks = evaluate(test.Y, scores=member.predict_proba(test.X))
        print(f"| {name} | {member.random_state} | {seconds:.0f} | "
              + " | ".join(f"{100 * ranks[f'P@{k}']:.2f}" for k in (1, 3, 5)) + " |")
    scores, proba = ensemble.decision_function(test.X), ensemble.predict_proba(test.X)
    full = evaluate(test.Y, scores=scores, proba=proba, inv_propensity=inverse_propensity(train.Y))
    print(f"| average | | {ensemble.fit_seconds_.sum():.0f} | "
          + " | ".join(f"**{100 * full[f'P@{k}']:.2f}**" for k in (1, 3, 5)) + " |")
    print_full_row(full)
    print(f"(after the run: {load_avg()})")


def print_full_row(full: dict) -> None:
    """Every rank and calibration metric of ``evaluate`` as a one-row Markdown table."""
    keys = [k for k in full if k.split("@")[0] in ("P", "nDCG", "PSP", "PSnDCG")] + ["AUC_micro", "ECE"]
    print("\n| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    print("| " + " | ".join(f"{100 * full[k]:.2f}" if "AUC" not in k and k != "ECE" else f"{full[k]:.4f}" for k in keys) + " |")


def cmd_scale(args):
    from bayesmlc.data.synthetic import make_shape

    t = time.perf_counter()
    data = make_shape("amazoncat-13k", scale=args.scale, random_state=0)
    gen_s = time.perf_counter() - t
    params = dict(n_latent=30, n_inducing=500, kernel="linear", inducing="subspace", subspace_rank=args.rank,
                  batch_size=500, negative_samples=args.negative_samples, svd_max_rows=20000, random_state=0,
                  epochs=1)
    params.update(parse_sets(args.set))
    X = normalize_rows(data.X)
    rng = np.random.default_rng(0)
    trainer, rows, init_s = setup(params, X, data.Y, rng)
    batches = epoch_batches(X.shape[0], batch_size(trainer, X.shape[0]), rng)[: args.steps]
    t = time.perf_counter()
    timings = timed_steps(trainer, rows, batches)
    step_s = (time.perf_counter() - t) / len(batches)
    rows_done = sum(len(r) for r in batches)
    full_rows = 1_186_239
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print(f"\nMLGPF scale: synthetic amazoncat-13k preset, scale={args.scale} ({X.shape[0]} rows, {X.shape[1]} features, "
          f"{data.Y.shape[1]} labels), threads={torch.get_num_threads()}, {load_avg()}")
    print(f"settings: {params}; projections cached: {rows.projection is not None}")
    print("\n| data gen s | init s | s/step (B=500) | s per 1000 rows | projected s/epoch at 1.19M rows | peak RSS GB |")
    print("|---|---|---|---|---|---|")
    per_row = step_s * len(batches) / rows_done
    print(f"| {gen_s:.0f} | {init_s:.0f} | {step_s:.3f} | {1000 * per_row:.2f} | {full_rows * per_row:.0f} | {peak_gb:.1f} |")
    print(f"\nstage seconds over {len(batches)} steps: | " + " | ".join(STAGES) + " |")
    print(f"| {split_row(timings)} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("speed", "accuracy", "scale", "pair"):
        p = sub.add_parser(name)
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--set", action="append", help="MLGPF parameter override key=value")
    sub.choices["speed"].add_argument("--epochs", type=int, default=2)
    sub.choices["accuracy"].add_argument("--config", choices=sorted(CONFIGS), default="default")
    sub.choices["accuracy"].add_argument("--epochs", type=int, default=100)
    sub.choices["accuracy"].add_argument("--eval-every", type=int, default=10)
    sub.choices["accuracy"].add_argument("--workdir", default="/tmp")
    sub.choices["scale"].add_argument("--scale", type=float, default=0.02)
    sub.choices["scale"].add_argument("--steps", type=int, default=20)
    sub.choices["scale"].add_argument("--rank", type=int, default=500)
    sub.choices["scale"].add_argument("--negative-samples", type=int, default=100)
    sub.choices["pair"].add_argument("--seed", type=int, default=0, help="the ensemble's random_state")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    {"speed": cmd_speed, "accuracy": cmd_accuracy, "scale": cmd_scale, "pair": cmd_pair}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
