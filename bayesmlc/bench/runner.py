"""Run a suite: every (dataset, model configuration, repeat) in its own process, one JSON line each.

A run is ``python -m bayesmlc train --model M --train .. --test .. --set k=v .. --out RUN_DIR --json
--quiet --seed S`` (:class:`CLIRunner`); the last line of its stdout is the CLI's JSON record. The
harness adds what is needed to reproduce and compare it (machine, library versions, git commit, seed,
threads, device, load average, and the run's wall and CPU seconds, its child processes included, so
that a reader can tell a slow run from a run on a busy machine) and appends it to ``OUT/results.jsonl`` as soon as it finishes, so an
interrupted suite keeps what it measured. A run that fails or times out is recorded with its status
and the tail of its stderr; it never stops the suite. A model that is not installed (not importable,
or its optional package missing) is recorded as ``skipped``.

Tests, and callers with their own way to run a model, pass ``run_one(spec, run_dir) -> dict``
instead of :class:`CLIRunner`; it returns the CLI's JSON record or raises :class:`RunFailure`.

With ``calibrate=("isotonic", ...)`` every configuration also runs wrapped in
:class:`bayesmlc.calibration.CalibratedClassifier` (``bayesmlc train --calibrate METHOD``), as configuration
``CONFIG+METHOD``; its record carries ``calibrate``, ``calibration_seconds`` (predicting the held-out rows
and fitting the maps) and ``calibrated_fit_seconds`` (the wrapped estimator's fit on the other rows), read
from the saved model file. With ``calibration_folds=K`` as well (``bayesmlc train --calibration-folds K``)
the maps are cross-fitted, ``CalibratedClassifier(cv=K)``: the configuration is ``CONFIG+METHOD-cvK``
(another run, never taken for a 20%-split one by ``resume``), the record carries ``calibration_folds``,
and ``calibrated_fit_seconds`` counts all K + 1 fits.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..data.registry import data_home
from ..exceptions import ValidationError
from ..safe_io import physical_memory_bytes
from .suites import DatasetSpec, Suite

__all__ = [
    "RunSpec",
    "RunFailure",
    "CLIRunner",
    "plan_runs",
    "run_suite",
    "model_unavailable_reason",
    "environment_info",
    "read_results",
    "epoch_timing",
    "timing_unit",
    "RESULTS_FILE",
    "calibration_suffix",
]

RESULTS_FILE = "results.jsonl"
STDERR_TAIL_CHARS = 4000
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS",
                     "VECLIB_MAXIMUM_THREADS")
_VERSION_PACKAGES = ("bayesmlc", "numpy", "scipy", "scikit-learn", "torch", "numba", "matplotlib", "napkinxc",
                     "omikuji")


class RunFailure(Exception):
    """A run that did not produce a record: ``message`` says why, ``stderr_tail`` shows the end of stderr."""

    def __init__(self, message: str, *, stderr_tail: str = "", returncode: int | None = None, timed_out: bool = False):
        super().__init__(message)
        self.stderr_tail = stderr_tail
        self.returncode = returncode
        self.timed_out = timed_out


@dataclass
class RunSpec:
    """One run: a model configuration on a dataset, with a seed."""

    suite: str
    dataset: str
    model: str
    config: str
    params: dict
    seed: int
    repeat: int
    baseline: bool
    timeout_s: float
    train_path: Path
    test_path: Path
    dataset_spec: DatasetSpec = field(default=None, repr=False)
    excluded: str | None = None  # the suite's reason not to run this configuration on this dataset
    calibrate: str | None = None  # run wrapped in CalibratedClassifier with this method
    calibration_folds: int | None = None  # with calibrate: CalibratedClassifier(cv=K), None: the 20% split

    @property
    def run_id(self) -> str:
        return f"{self.dataset}/{self.model}-{self.config}/r{self.repeat}"


RunOne = Callable[[RunSpec, Path], dict]


def calibration_suffix(method: str | None, folds: int | None = None) -> str:
    """What a calibrated configuration adds to its configuration's name: ``+METHOD`` (the 20% split),
    ``+METHOD-cvK`` (cross-fitted on K folds); ``""`` for a raw one."""
    if method is None:
        return ""
    return f"+{method}" + (f"-cv{folds}" if folds is not None else "")


# ---- environment ------------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> float | None:
    physical = physical_memory_bytes()
    return None if physical is None else round(physical / 2**30, 1)


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for package in _VERSION_PACKAGES:
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = None
    return out


def _git_info() -> dict | None:
    repo = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(status.strip())}


def _gpu_name() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def environment_info(threads: int | None, device: str | None) -> dict:
    """Machine, library versions, threads and requested device, for every record (the git commit is
    taken per run, see :func:`run_suite`). ``threads_requested`` is ``--threads`` (``None``: each run
    chooses one thread per idle core when it starts); ``threads`` is replaced by the count a run
    reports it used."""
    return {
        "machine": {
            "platform": platform.platform(),
            "cpu": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "memory_gb": _memory_gb(),
            "gpu": _gpu_name(),
        },
        "versions": _versions(),
        "threads": threads,
        "threads_requested": threads,
        "device_requested": device,
    }


# ---- availability -----------------------------------------------------------------------------
def model_unavailable_reason(model: str) -> str | None:
    """Why ``model`` cannot run in this installation, or ``None`` when it can."""
    from ..models import MODEL_CLASSES, get_model_class
    from ..baselines import missing_dependency

    if model not in MODEL_CLASSES:
        return f"model {model!r} is not registered in bayesmlc.models.MODEL_CLASSES"
    try:
        get_model_class(model)
    except (ValidationError, AttributeError) as exc:
        return f"not available in this installation: {exc}"
    return missing_dependency(model)


# ---- the default way to run one configuration ------------------------------------------------
def _format_value(value) -> str:
    """A ``--set`` value the CLI parses back to ``value`` (it reads Python literals)."""
    return repr(value)


def _tail(text: str) -> str:
    return text[-STDERR_TAIL_CHARS:]


def _is_registered(spec: RunSpec) -> bool:
    """Whether ``spec``'s dataset is a real set of the data registry, read from the data root by its
    registry name (not a synthetic set, nor a user's files)."""
    from ..data.registry import REGISTRY

    dataset_spec = spec.dataset_spec
    real = dataset_spec is None or (dataset_spec.synthetic is None and dataset_spec.files is None)
    return real and spec.dataset in REGISTRY


class CLIRunner:
    """Run a configuration as ``python -m bayesmlc train ... --json`` in a fresh process.

    Parameters
    ----------
    threads : int or None
        Exported as ``OMP_NUM_THREADS`` and friends in the child's environment; ``None``: not set, so
        the child chooses one thread per idle core when it starts (:mod:`bayesmlc.threads`).
    device : str or None
        Passed as ``--device`` when given.
    python : str
        The interpreter (default: the one running the harness).
    """

    def __init__(self, threads: int | None = None, device: str | None = None, python: str = sys.executable):
        self.threads = threads
        self.device = device
        self.python = python

    def command(self, spec: RunSpec, run_dir: Path) -> list[str]:
        command = [self.python, "-m", "bayesmlc", "train", "--model", spec.model, "--train", str(spec.train_path),
                   "--test", str(spec.test_path), "--out", str(run_dir), "--overwrite", "--json", "--quiet", "--seed", str(spec.seed)]
        for key, value in spec.params.items():
            command += ["--set", f"{key}={_format_value(value)}"]
        if _is_registered(spec):  # the set's own propensity constants (the CLI never reads them from a path)
            command += ["--propensity", spec.dataset]
        if self.device is not None:
            command += ["--device", self.device]
        if spec.calibrate is not None:
            command += ["--calibrate", spec.calibrate]
            if spec.calibration_folds is not None:
                command += ["--calibration-folds", str(spec.calibration_folds)]
        return command

    def environment(self) -> dict:
        env = dict(os.environ)
        if self.threads is not None:
            for variable in _THREAD_VARIABLES:
                env[variable] = str(self.threads)
        return env

    def __call__(self, spec: RunSpec, run_dir: Path) -> dict:
        run_dir.mkdir(parents=True, exist_ok=True)
        command = self.command(spec, run_dir)
        (run_dir / "command.txt").write_text(" ".join(command) + "\n")
        stdout_path, stderr_path = run_dir / "stdout.txt", run_dir / "stderr.txt"
        with open(stdout_path, "w") as stdout, open(stderr_path, "w") as stderr:
            try:
                completed = subprocess.run(command, stdout=stdout, stderr=stderr, env=self.environment(),
                                           timeout=spec.timeout_s)
            except subprocess.TimeoutExpired:
                completed = None
        stderr_text = stderr_path.read_text(errors="replace")
        if completed is None:
            raise RunFailure(f"timed out after {spec.timeout_s:g} s", stderr_tail=_tail(stderr_text), timed_out=True)
        if completed.returncode != 0:
            raise RunFailure(f"exit code {completed.returncode}", stderr_tail=_tail(stderr_text),
                             returncode=completed.returncode)
        lines = [line for line in stdout_path.read_text(errors="replace").splitlines() if line.strip()]
        try:
            record = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError) as exc:
            raise RunFailure(f"the last stdout line is not the CLI's JSON record ({exc})",
                             stderr_tail=_tail(stderr_text), returncode=0) from None
        if not isinstance(record, dict):
            raise RunFailure("the last stdout line is JSON but not an object", stderr_tail=_tail(stderr_text))
        return record


# ---- planning -----------------------------------------------------------------------------------
def _select(requested, available: list[str], what: str, suite: str) -> list[str]:
    if not requested:
        return available
    unknown = [name for name in requested if name not in available]
    if unknown:
        raise ValidationError(
            f"--{what} {', '.join(unknown)}: not in suite {suite!r}; it has {', '.join(available)}"
        )
    return [name for name in available if name in requested]


def _select_configs(requested, suite: Suite) -> set[tuple[str, str]]:
    """The (model, configuration) pairs of ``suite`` that ``--models`` names: ``MODEL`` takes every
    configuration of the model, ``MODEL:CONFIG`` one of them (``mlgpf:default``)."""
    pairs = [(config.model, config.config) for config in suite.configs]
    if not requested:
        return set(pairs)
    _select([name.split(":", 1)[0] for name in requested], suite.model_names, "models", suite.name)  # unknown models
    wanted = set()
    for name in requested:
        model, _, config = name.partition(":")
        chosen = {pair for pair in pairs if pair[0] == model and (not config or pair[1] == config)}
        if not chosen:
            configs = ", ".join(sorted({c for m, c in pairs if m == model}))
            raise ValidationError(f"--models {name}: suite {suite.name!r} has no configuration {config!r} of "
                                  f"{model}; it has {configs}")
        wanted |= chosen
    return wanted


def plan_runs(suite: Suite, out_dir: Path, *, datasets=None, models=None, repeats: int = 1, seed: int = 0,
              data_root: Path | None = None, timeout_s: float | None = None, calibrate=(),
              calibration_folds: int | None = None) -> list[RunSpec]:
    """Every run of ``suite`` (restricted to ``datasets`` and ``models`` when given), repeat by repeat.

    Repeat r uses seed ``seed + r``. Each method in ``calibrate`` adds, after a configuration's raw
    runs, the same runs wrapped in ``CalibratedClassifier(method=...)`` as configuration ``CONFIG+METHOD``;
    with ``calibration_folds=K`` (needs ``calibrate``, K >= 2) in ``CalibratedClassifier(method=..., cv=K)``
    as ``CONFIG+METHOD-cvK``. Real sets are read from ``data_root`` (None: the data root,
    :func:`bayesmlc.data.registry.data_home`); synthetic ones are written to ``out_dir/data/<name>/``
    by :func:`run_suite`.
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise ValidationError(f"--repeats must be a positive integer, got {repeats!r}")
    from ..calibration import CALIBRATION_METHODS, check_calibration_folds

    calibrate = tuple(dict.fromkeys(calibrate or ()))
    unknown = [method for method in calibrate if method not in CALIBRATION_METHODS]
    if unknown:
        raise ValidationError(f"--calibrate {', '.join(unknown)}: choose from {', '.join(CALIBRATION_METHODS)}")
    check_calibration_folds(calibrate, calibration_folds)
    data_root = data_home(data_root)
    dataset_names = _select(datasets, suite.dataset_names, "datasets", suite.name)
    wanted_configs = _select_configs(models, suite)
    runs = []
    for name in dataset_names:
        spec = suite.dataset(name)
        folder = (Path(out_dir) / "data" / name) if spec.synthetic is not None else data_root / name
        train_path, test_path = (map(Path, spec.files) if spec.files is not None
                                 else (folder / "train.txt", folder / "test.txt"))
        for config in suite.configs:
            if (config.model, config.config) not in wanted_configs:
                continue
            for method in (None,) + calibrate:
                for repeat in range(repeats):
                    runs.append(RunSpec(
                        suite=suite.name, dataset=name, model=config.model,
                        config=config.config + calibration_suffix(method, calibration_folds),
                        params=config.params_for(name), seed=seed + repeat, repeat=repeat, baseline=config.baseline,
                        timeout_s=float(timeout_s or config.timeout_s or suite.timeout_s),
                        train_path=train_path, test_path=test_path, dataset_spec=spec,
                        excluded=config.exclude.get(name), calibrate=method,
                        calibration_folds=None if method is None else calibration_folds,
                    ))
    return runs


# ---- synthetic data ------------------------------------------------------------------------------
def write_synthetic(spec: DatasetSpec, folder: Path) -> None:
    """Generate ``spec``'s synthetic set and write ``train.txt``/``test.txt`` (XC format) to ``folder``."""
    from ..data import synthetic
    from ..data.io import write_dataset

    settings = dict(spec.synthetic)
    test_fraction = float(settings.pop("test_fraction", 0.2))
    random_state = settings.pop("random_state", 0)
    if "preset" in settings:
        data = synthetic.make_shape(settings.pop("preset"), scale=settings.pop("scale", 1.0),
                                     random_state=random_state, **settings)
    else:
        data = synthetic.make_multilabel(random_state=random_state, **settings)
    train, test = synthetic.split(data, test_fraction, random_state=random_state)
    folder.mkdir(parents=True, exist_ok=True)
    write_dataset(train, folder / "train.txt")
    write_dataset(test, folder / "test.txt")


def _read_header(path: Path) -> tuple[int, int, int] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            fields = handle.readline().split()
        return tuple(int(value) for value in fields[:3]) if len(fields) >= 3 else None
    except (OSError, ValueError):
        return None


def _dataset_shape(spec: RunSpec) -> dict | None:
    train, test = _read_header(spec.train_path), _read_header(spec.test_path)
    if train is None:
        return None
    return {"n_train": train[0], "n_test": test[0] if test else None, "n_features": train[1], "n_labels": train[2]}


# ---- timing from a model's history --------------------------------------------------------------
#: History keys that count training units, in order of preference: optimiser epochs, Gibbs sweeps,
#: passes over the data (BNMC's SVI).
EPOCH_KEYS = ("epoch", "sweep", "pass")


def timing_unit(history: dict) -> str:
    """The unit :func:`epoch_timing` counts in: the first of :data:`EPOCH_KEYS` the history has,
    else ``"iteration"`` (one logged entry)."""
    return next((key for key in EPOCH_KEYS if history.get(key)), "iteration")


def epoch_timing(history: dict) -> tuple[int | None, float | None]:
    """``(n_epochs, seconds_per_epoch)`` from a ``history_`` dict.

    The unit is the first of :data:`EPOCH_KEYS` the history has (epoch, Gibbs sweep, pass), else one
    logged entry (an optimiser iteration). Seconds per unit is measured between the first and the
    last logged entries, so set-up before the first entry (k-means, SVD, ...) is left out; with a
    single unit it is the last entry's time.
    """
    times = list(history.get("wall_time") or [])
    if not times:
        return None, None
    key = timing_unit(history)
    units = list(history[key]) if key in EPOCH_KEYS else list(range(len(times)))
    n_units = len(set(units))
    if len(times) >= 2 and units[-1] > units[0]:
        return n_units, float(times[-1] - times[0]) / float(units[-1] - units[0])
    return n_units, float(times[-1]) / n_units


def _history_fields(run_dir: Path) -> dict:
    path = run_dir / "history.json"
    if not path.exists():
        return {}
    try:
        history = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    n_epochs, per_epoch = epoch_timing(history)
    return {"n_epochs": n_epochs, "seconds_per_epoch": per_epoch,
            "epoch_unit": timing_unit(history) if per_epoch is not None else None}


def _calibration_fields(run_dir: Path) -> dict:
    """``calibration_seconds`` and ``calibrated_fit_seconds`` of a calibrated run, from the fitted state
    in its ``model.npz`` (only the JSON entry is read; ``{}`` when there is no such file)."""
    import numpy as np

    try:
        with np.load(run_dir / "model.npz", allow_pickle=False) as archive:
            meta = json.loads(archive["__meta__"].tobytes().decode("utf-8"))
    except (OSError, KeyError, ValueError):
        return {}
    state = meta.get("state") or {}
    return {"calibration_seconds": state.get("calibration_seconds_"), "calibrated_fit_seconds": state.get("fit_seconds_")}


# ---- the suite -----------------------------------------------------------------------------------
def read_results(path: Path) -> list[dict]:
    """The records of a ``results.jsonl`` file."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValidationError(f"{path}, line {number}: not a JSON record ({exc})") from None
    return records


def _stderr_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _summary(record: dict) -> str:
    if record["status"] != "ok":
        return f"{record['status']}: {record.get('reason', '')}"
    p1 = (record.get("metrics") or {}).get("P@1")
    shown = f", P@1 {100 * p1:.2f}" if isinstance(p1, (int, float)) else ""
    return f"ok, train {record.get('train_seconds') or 0:.2f} s{shown}"


def run_suite(suite: Suite, out_dir, *, datasets=None, models=None, repeats: int = 1, seed: int = 0,
              data_root=None, run_one: RunOne | None = None, availability: Callable[[str], str | None] | None = None,
              threads: int | None = None, device: str | None = None, timeout_s: float | None = None,
              resume: bool = False, log: Callable[[str], None] = _stderr_log, calibrate=(),
              calibration_folds: int | None = None, bands: bool = False, risk_control: bool = False) -> list[dict]:
    """Run ``suite`` and return its records (also appended, one JSON line each, to ``OUT/results.jsonl``).

    Parameters
    ----------
    run_one : callable ``(RunSpec, run_dir) -> dict``, default :class:`CLIRunner`
    availability : callable ``model -> reason or None``, default :func:`model_unavailable_reason`
    threads : threads per run (default: each run chooses one per idle core when it starts)
    resume : keep the records already in ``results.jsonl`` and rerun only what is not ``ok`` there
    calibrate : calibration methods; each adds calibrated runs of every configuration (:func:`plan_runs`)
    calibration_folds : K: the calibrated runs cross-fit their maps, ``CalibratedClassifier(cv=K)``
    bands : also score each finished raw run by label-frequency band (:func:`.bands.band_fields`)
    risk_control : also measure each finished run's label sets at the same guarantees (:func:`.risk.risk_control_fields`)
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    threads = None if threads is None else int(threads)
    run_one = run_one or CLIRunner(threads=threads, device=device)
    availability = availability or model_unavailable_reason
    runs = plan_runs(suite, out_dir, datasets=datasets, models=models, repeats=repeats, seed=seed,
                     data_root=data_root, timeout_s=timeout_s, calibrate=calibrate,
                     calibration_folds=calibration_folds)
    results_path = out_dir / RESULTS_FILE
    kept = []
    if resume and results_path.exists():
        kept = [r for r in read_results(results_path) if r.get("status") == "ok" and r.get("suite") == suite.name]
    done = {r["run_id"] for r in kept}
    with open(results_path, "w", encoding="utf-8") as handle:
        for record in kept:
            handle.write(json.dumps(record) + "\n")
    environment = environment_info(threads, device)
    unavailable: dict[str, str | None] = {}
    data_problems: dict[str, str | None] = {}
    records = list(kept)
    for index, spec in enumerate(runs, 1):
        if spec.run_id in done:
            continue
        if spec.model not in unavailable:
            unavailable[spec.model] = availability(spec.model)
        if spec.dataset not in data_problems and not spec.excluded:
            data_problems[spec.dataset] = _prepare_dataset(spec)
        record = {
            "suite": suite.name, "run_id": spec.run_id, "dataset": spec.dataset, "model": spec.model,
            "config": spec.config, "baseline": spec.baseline, "repeat": spec.repeat, "seed": spec.seed,
            "settings": spec.params, "calibrate": spec.calibrate, "calibration_folds": spec.calibration_folds,
            **environment,
            # per run, not per suite: a tree edited while a long suite runs must show up in its records
            "git": _git_info(),
            "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        reason = spec.excluded or unavailable[spec.model] or data_problems.get(spec.dataset)
        if reason:
            record.update(status="skipped", reason=reason)
        else:
            record.update(_run(spec, out_dir, run_one, bands, risk_control))
        records.append(record)
        with open(results_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
        log(f"[{index}/{len(runs)}] {spec.run_id}: {_summary(record)}")
    # in plan order (a resumed suite appended its reruns after the kept records)
    order = {spec.run_id: index for index, spec in enumerate(runs)}
    records.sort(key=lambda record: order.get(record["run_id"], len(order)))
    temporary = results_path.with_suffix(".jsonl.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, default=str) + "\n")
    os.replace(temporary, results_path)
    return records


def _prepare_dataset(spec: RunSpec) -> str | None:
    """Make sure the dataset's files exist; returns a reason to skip its runs, or ``None``."""
    if spec.dataset_spec is not None and spec.dataset_spec.synthetic is not None and not spec.train_path.exists():
        try:
            write_synthetic(spec.dataset_spec, spec.train_path.parent)
        except Exception as exc:  # recorded as the reason every run on this dataset is skipped
            return f"could not generate synthetic dataset {spec.dataset!r}: {type(exc).__name__}: {exc}"
    missing = [str(path) for path in (spec.train_path, spec.test_path) if not path.exists()]
    if missing:
        return f"dataset files not found: {', '.join(missing)} (set --data-root)"
    return None


def _run(spec: RunSpec, out_dir: Path, run_one: RunOne, bands: bool = False, risk_control: bool = False) -> dict:
    run_dir = out_dir / "runs" / spec.dataset / f"{spec.model}-{spec.config}" / f"r{spec.repeat}"
    run_dir.mkdir(parents=True, exist_ok=True)
    fields = {"run_dir": str(run_dir.relative_to(out_dir)), "dataset_shape": _dataset_shape(spec)}
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    result = None
    try:
        result = run_one(spec, run_dir)
    except RunFailure as failure:
        fields.update(status="timeout" if failure.timed_out else "failed", reason=str(failure),
                      returncode=failure.returncode, stderr_tail=failure.stderr_tail)
    # the run alone (a --bands scoring below is the harness's work): a CPU / wall ratio well below the
    # threads a run used says that other processes took the cores
    fields["wall_seconds"] = time.perf_counter() - start
    fields["cpu_seconds"] = _cpu_seconds() - cpu_start
    if result is not None:
        fields.update({key: value for key, value in result.items() if key not in ("dataset", "model")})
        fields["cli_dataset"] = result.get("dataset")
        fields["status"] = "ok"
        fields.update(_history_fields(run_dir))
        if spec.calibrate is not None:
            fields.update(_calibration_fields(run_dir))
        elif bands:
            from .bands import band_fields

            fields.update(band_fields(spec.test_path, spec.train_path, run_dir))
        if risk_control:
            from .risk import risk_control_fields

            fields.update(risk_control_fields(spec.test_path, run_dir))
    return fields


def _cpu_seconds() -> float:
    """CPU seconds (user and system) of this process and of its finished child processes so far: the
    difference over a run is the run's CPU time, in the harness or in the child it waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
