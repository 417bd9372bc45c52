"""Benchmark harness: suites of (dataset, model, configuration) runs, each in its own process through
``bayesmlc train --json``, collected into ``results.jsonl``, a markdown report and PNG plots.

Run it as ``bayesmlc bench --suite quick --out DIR`` (or ``python -m bayesmlc.bench``); see
``docs/bench.md``.
"""

from .runner import CLIRunner, RunFailure, RunSpec, plan_runs, run_suite
from .suites import SUITES, get_suite

__all__ = ["CLIRunner", "RunFailure", "RunSpec", "plan_runs", "run_suite", "SUITES", "get_suite"]
