"""Named configurations of the library's models: ``fast``, ``paper`` and ``best``, as data.

Each :class:`Preset` holds the parameters of one configuration and the figures measured with it
(dataset, command, machine, commit, as docs/benchmarks.md and docs/experiments.md record them), or
``None`` where no measurement exists. ``bayesmlc train --preset NAME`` and ``Model.preset(NAME)``
build an unfitted estimator from it; ``bayesmlc info --presets`` prints the table.

``fast``
    The quickest configuration with a measured quality.
``paper``
    The model's paper's settings.
``best``
    The best configuration found. For MLGPF it is an :class:`~bayesmlc.ensemble.AveragingEnsemble`
    of two MLGPF recipes (``members``), their predictive probabilities averaged.

Parameters given with a preset (``--set k=v``, ``Model.preset(name, k=v)``) override the preset's.
For an ensemble preset, ``random_state`` and ``verbose`` go to the ensemble (``random_state`` seeds
every member through it) and every other parameter to each member.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ensemble import AveragingEnsemble
from .exceptions import ValidationError
from .models import MODEL_CLASSES, get_model_class

__all__ = ["Measurement", "Preset", "PRESETS", "PRESET_NAMES", "get_preset", "build_preset", "model_key",
           "format_presets", "presets_as_dicts", "check_cli_preset", "HasPresets"]

PRESET_NAMES = ("fast", "paper", "best")

# ---- MLGPF recipes (benchmarks/bench_mlgpf.py measures them under these names) -----------------------
#: The subspace paper's Bibtex settings (Table 3): linear kernel, subspace inducing inputs, P=30, M=500,
#: batch 500, R=1000, on the raw (row-normalised) features, with the full KL (the bound of the paper).
#: Learning rate and optimiser are not stated there. No per-label linear term (the papers have none).
MLGPF_PAPER = dict(n_latent=30, n_inducing=500, kernel="linear", inducing="subspace", subspace_rank=1000,
                   batch_size=500, variational="whitened", idf_weighting=False, kl_weight=1.0, linear_term=False)
#: The best single configuration measured (docs/experiments.md, "MLGPF on Bibtex"): the defaults
#: (idf-weighted features, a cosine decay of the learning rates over the second half of training) with
#: half the KL weight (the authors' code's 0.5), ranking by the predictive probability. Measured with
#: the whitened family, the default then; named so that the recipe stays the one measured.
MLGPF_BEST_SINGLE = dict(lr_decay=0.5, rank_by="proba", kl_weight=0.5, variational="whitened", epochs=50,
                         linear_term=False)
#: The fast preset: the defaults (the shared variational family, the cheapest per epoch) cut to 20
#: epochs (theirs: 40 where L > P or from 10,000 rows, 100 otherwise), ranked by the predictive probability. The cosine decay of the learning rates spans
#: the 20 epochs. The best single recipe for 10 epochs, the preset before, took as long as the defaults:
#: its whitened family costs about ten times as much per epoch (docs/presets.md).
MLGPF_FAST = dict(epochs=20, rank_by="proba")
#: The authors' code's settings (../shared/reference/reference-implementations.md 1.5-1.8): linear+SE
#: with per-feature weights, free inducing inputs (M=400), P=30, the non-whitened Cholesky family, Adam
#: at 0.005 without decay, batches of 100 rows growing by 20 every 10 epochs, half the KL, Phi drawn
#: N(0, 1/P), q(u) started at the prior mean, unit rows of the raw features, ranked by the mean
#: utilities; run it for 100 epochs (its default). Not reproduced: q_mu started at 0.5, Z renormalised
#: on every use, the SE and linear weights tied to sum to one.
MLGPF_AUTHORS_CODE = dict(
    kernel="linear+se", ard=True, inducing="free", n_inducing=400, n_latent=30, variational="cholesky",
    batch_size=100, batch_size_growth=20, batch_size_every=10, learning_rate=0.005, lr_decay=0.0,
    kl_weight=0.5, init_factors="random", init_mean="zero", idf_weighting=False, standardize=False,
    linear_term=False,
)
#: The best configuration found (docs/mlgpf.md, "The best configuration"): an AveragingEnsemble of the
#: two recipes that err most differently, the best single configuration at M=400 for 15 epochs (100
#: latent GPs on subspace inducing inputs) and the authors' recipe with this project's idf weighting,
#: SVD/ridge start and cosine decay (30 latent GPs on free inducing inputs with per-feature weights).
MLGPF_PAIR = {
    "subspace": dict(MLGPF_BEST_SINGLE, n_inducing=400, epochs=15),
    "free": dict(MLGPF_AUTHORS_CODE, idf_weighting=True, init_factors="svd", init_mean="ridge", lr_decay=0.5,
                 epochs=100),
}

#: The BMLS authors' demo (K=100, 200 burn-in sweeps, 250 samples thinned by 10).
BMLS_PAPER = dict(n_topics=100, schedule="fixed", n_burnin=200, n_draws=250, thin=10)
#: The quick suite's BMLS (bayesmlc.bench.suites.QUICK_SETTINGS).
BMLS_QUICK = dict(n_topics=50, schedule="fixed", n_burnin=100, n_draws=20, thin=5)
#: The BNMC authors' code, BNMC-L: truncation 15, two passes, Polya-Gamma logistic classifiers.
BNMC_PAPER_L = dict(truncation=15, n_passes=2, classifier="logistic")


@dataclass(frozen=True)
class Measurement:
    """Figures measured with a preset: on which data, what came out, how to reproduce it."""

    dataset: str
    figures: str
    command: str
    machine: str
    commit: str

    def line(self) -> str:
        return f"{self.dataset}: {self.figures} ({self.machine}; `{self.command}`; commit {self.commit})"


@dataclass(frozen=True)
class Preset:
    """A named configuration of ``model``: ``params`` for one estimator, or ``members`` (name,
    params) pairs for an AveragingEnsemble of several; ``measured`` is ``None`` where nothing was
    measured."""

    model: str
    name: str
    summary: str
    params: dict = field(default_factory=dict)
    members: tuple = ()
    measured: Measurement | None = None

    @property
    def is_ensemble(self) -> bool:
        return bool(self.members)

    def measured_line(self) -> str:
        return self.measured.line() if self.measured is not None else "not measured"


_ONE_THREAD = "2-core AMD EPYC VM, one torch thread"

PRESETS = {
    "mlgpf": {
        "fast": Preset(
            "mlgpf", "fast", "the defaults for 20 epochs (theirs: 40 where L > P or from 10,000 rows, else 100), ranked by predict_proba",
            params=dict(MLGPF_FAST),
            measured=Measurement(
                "bibtex_xc", "P@1 63.70 (ranked by predict_proba; the defaults: 63.70, 62.86 by their mean "
                             "ranking), fit 11.6 s CPU against 48.2 s for the defaults (0.24)",
                "python benchmarks/bench_presets.py --model mlgpf --dataset bibtex_xc",
                f"{_ONE_THREAD}, load 6-8", "026e9b4 (recorded at)"),
        ),
        "paper": Preset(
            "mlgpf", "paper", "the subspace paper's Bibtex settings (P=30, M=500, R=1000, batch 500, "
                              "constant rates, 400 epochs)",
            params=dict(MLGPF_PAPER, lr_decay=0.0, epochs=400),
            measured=Measurement(
                "bibtex_xc", "at 100 of the 400 epochs: P@1/3/5 60.44 / 37.23 / 27.64, micro-AUC 0.9455, "
                             "train 2590 s (400 epochs: not measured)",
                "bayesmlc bench --suite standard --threads 1", f"{_ONE_THREAD}, load 4-7", "b390a7d"),
        ),
        "best": Preset(
            "mlgpf", "best", "AveragingEnsemble of two recipes: the best single one at M=400 for 15 epochs "
                             "('subspace') and the authors' recipe with idf, SVD/ridge start and decay ('free')",
            members=tuple(MLGPF_PAIR.items()),
            measured=Measurement(
                "bibtex_xc", "P@1/3/5 64.20 / 40.29 / 29.87 (mean of seeds 0-3; 64.17-64.25), "
                             "micro-AUC 0.9529 (seed 0), train 1472 s (mean)",
                "python benchmarks/bench_mlgpf.py pair --threads 1 --seed S",
                f"{_ONE_THREAD}, two runs at a time, load about 2", "6395a60"),
        ),
    },
    "bmls": {
        "fast": Preset(
            "bmls", "fast", "the quick suite's settings: K=50, 100 burn-in sweeps, 20 samples thinned by 5",
            params=dict(BMLS_QUICK),
            measured=Measurement(
                "medical", "P@1 54.42, micro-AUC 0.9331, train 0.57 s",
                "bayesmlc bench --suite quick --out bench-quick", "2-core AMD EPYC VM, 2 threads, load 1.2-1.6",
                "d16d227"),
        ),
        "paper": Preset(
            "bmls", "paper", "the authors' demo: K=100, 200 burn-in sweeps, 250 samples thinned by 10 "
                             "(2,700 sweeps)",
            params=dict(BMLS_PAPER),
            measured=Measurement(
                "bibtex", "micro-AUC 0.9380 (published 0.9379), P@1 61.47, P@5 27.13, fit 190.8 s",
                "python benchmarks/bench_bmls.py auc --settings full --set 'schedule=\"fixed\"'",
                f"{_ONE_THREAD}, load 6.5", "4de11a4 (recorded at)"),
        ),
        "best": Preset(
            "bmls", "best", "the defaults (schedule='auto'): the paper's AUC in 1,120 sweeps instead of 2,700",
            params={},
            measured=Measurement(
                "bibtex", "micro-AUC 0.9378, P@1 60.87, P@5 27.27, 1,120 sweeps, 28.9 s wall (28.6 s CPU)",
                "python benchmarks/bench_bmls.py scale --datasets bibtex --models bmls", f"{_ONE_THREAD}, load 1.6",
                "52dc12f"),
        ),
    },
    "bnmc": {
        "fast": Preset(
            "bnmc", "fast", "online mode (SGD classifiers)",
            params=dict(online=True),
            measured=Measurement(
                "bibtex", "example F1 0.4275, P@1 0.6119, micro-AUC 0.9138, fit + predict 0.8 s "
                          "(batch mode: 6.4 s)",
                "python benchmarks/bench_bnmc.py speed", "2-core AMD EPYC VM, load 2.6", "8d8b085 (recorded at)"),
        ),
        "paper": Preset(
            "bnmc", "paper", "the authors' code, BNMC-L: truncation 15, 2 passes, Polya-Gamma logistic classifiers",
            params=dict(BNMC_PAPER_L),
            measured=Measurement(
                "bibtex", "micro-AUC 0.9440, example F1 46.11 (published 40.3); bibtex_xc P@1 62.66",
                "bayesmlc bench --suite standard --threads 1", f"{_ONE_THREAD}, load 4-7",
                "one of 473d434, 4de11a4, a6524c6, ee4d4d2, b390a7d (docs/benchmarks-standard.md)"),
        ),
        "best": Preset(
            "bnmc", "best", "the defaults: variational Polya-Gamma classifiers, SVI mixture, truncation 20",
            params={},
            measured=Measurement(
                "bibtex", "example F1 0.4609 +- 0.0022, P@1 0.6304, micro-AUC 0.9454 (10 seeds)",
                "python benchmarks/bench_bnmc.py accuracy --datasets bibtex --seeds 10",
                "2-core AMD EPYC VM, load 10-12", "a495226 (recorded at)"),
        ),
    },
}


def get_preset(model: str, name: str, option: str = "preset") -> Preset:
    """The preset ``name`` of ``model`` (a ``bayesmlc.models`` name); otherwise a one-line
    ValidationError that starts with ``option`` and names the valid presets."""
    if model not in PRESETS:
        raise ValidationError(f"{option} {name}: model {model!r} has no presets; presets exist for "
                              f"{', '.join(sorted(PRESETS))}")
    if name not in PRESETS[model]:
        raise ValidationError(f"{option} {name}: unknown preset for {model}; valid presets: "
                              f"{', '.join(PRESETS[model])}")
    return PRESETS[model][name]


def model_key(cls) -> str:
    """The ``bayesmlc.models`` name of the estimator class ``cls`` (``MLGPF`` -> ``"mlgpf"``)."""
    for key, path in MODEL_CLASSES.items():
        module, _, class_name = path.partition(":")
        if class_name == cls.__name__ and (cls.__module__ == module or cls.__module__.startswith(module + ".")):
            return key
    raise ValidationError(f"{cls.__name__} has no presets; presets exist for {', '.join(sorted(PRESETS))}")


def build_preset(model: str, name: str, params: dict | None = None):
    """An unfitted estimator: preset ``name`` of ``model`` with ``params`` overriding its parameters."""
    preset = get_preset(model, name)
    cls = get_model_class(model)
    params = dict(params or {})
    if not preset.is_ensemble:
        return cls(**{**preset.params, **params})
    own = {key: params.pop(key) for key in ("random_state", "verbose") if key in params}
    members = [(member, cls(**{**member_params, **params, "verbose": own.get("verbose", False)}))
               for member, member_params in preset.members]
    return AveragingEnsemble(members, **own)


class HasPresets:
    """Mixin of the models that have presets (:data:`PRESETS`): the class method ``preset``."""

    @classmethod
    def preset(cls, name: str, **params):
        """An unfitted estimator with this model's named configuration ``name`` (``"fast"``,
        ``"paper"`` or ``"best"``; ``bayesmlc info --presets`` lists them with their measured
        figures); ``params`` override the preset's. ``MLGPF.preset("best")`` is an
        :class:`~bayesmlc.ensemble.AveragingEnsemble` of two MLGPF recipes."""
        return build_preset(model_key(cls), name, params)


def presets_as_dicts() -> list[dict]:
    """Every preset as a JSON-ready dict (``bayesmlc info --presets --json``)."""
    out = []
    for model, presets in PRESETS.items():
        for preset in presets.values():
            entry = {"model": model, "preset": preset.name, "summary": preset.summary}
            if preset.is_ensemble:
                entry["ensemble"] = {member: dict(params) for member, params in preset.members}
            else:
                entry["params"] = dict(preset.params)
            entry["measured"] = (None if preset.measured is None else
                                 {"dataset": preset.measured.dataset, "figures": preset.measured.figures,
                                  "command": preset.measured.command, "machine": preset.measured.machine,
                                  "commit": preset.measured.commit})
            out.append(entry)
    return out


def _params_text(params: dict) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in params.items()) or "the model's defaults"


def format_presets() -> str:
    """The presets as text: per model and name, a summary, the parameters and the measured figures."""
    lines = []
    for model, presets in PRESETS.items():
        for preset in presets.values():
            lines.append(f"{model} --preset {preset.name}: {preset.summary}")
            if preset.is_ensemble:
                for member, params in preset.members:
                    lines.append(f"    member {member}: {_params_text(params)}")
            else:
                lines.append(f"    params: {_params_text(preset.params)}")
            lines.append(f"    measured: {preset.measured_line()}")
    return "\n".join(lines)


def check_cli_preset(model: str, name: str, *, resume: bool = False, distributed: bool = False) -> None:
    """Refuse, before any work, a ``train --preset`` the CLI cannot run: an unknown name, or an
    ensemble preset with ``--resume`` or ``--distributed`` (which train one model)."""
    preset = get_preset(model, name, option="--preset")
    for flag, given in (("--resume", resume), ("--distributed", distributed)):
        if given and preset.is_ensemble:
            raise ValidationError(f"--preset {name}: an AveragingEnsemble of {len(preset.members)} {model} fits; "
                                  f"{flag} trains a single model")
