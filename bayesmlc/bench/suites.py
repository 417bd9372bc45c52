"""Benchmark suites: which datasets, which models, with which settings.

``quick``
    The five small real sets (emotions, scene, yeast, medical, enron), every landed model with small
    settings and the baselines. Minutes on a 2-core machine.
``standard``
    Adds bibtex, bibtex_xc, goemotions (43k rows) and hmc_cellcycle_go (4,125 labels), with each model's paper settings (see :data:`PAPER_SETTINGS`).
``scale``
    Synthetic sets shaped like EURLex-4K and AmazonCat-13K, plus sweeps in N, D and L; speed and memory
    only (quality on synthetic data says little).
``scale-full``
    Opt-in: the full-size EURLex-4K and AmazonCat-13K shapes (1.19M rows); hours on 2 cores.

A configuration's parameters are passed to ``bayesmlc train`` as ``--set key=value``; the CLI rejects
unknown keys, so a renamed parameter shows up as a failed run, never as a silently ignored setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..exceptions import ValidationError

__all__ = [
    "DatasetSpec",
    "ModelConfig",
    "Suite",
    "SUITES",
    "BASELINE_MODELS",
    "PAPER_SETTINGS",
    "get_suite",
]

#: Models that count as baselines: a model's training time is reported as a ratio to the fastest of these.
BASELINE_MODELS = ("logistic", "knn", "napkinxc_plt", "omikuji_parabel", "omikuji_bonsai")

#: The quick suite's real sets, a few hundred to a few thousand rows each.
SMALL_SET_NAMES = ("emotions", "scene", "yeast", "medical", "enron")

#: Real sets with dense real-valued features: linear baselines standardise them first.
DENSE_FEATURE_SETS = ("emotions", "scene", "yeast", "hmc_cellcycle_go")

#: The standard suite's larger real sets: many rows (goemotions, 43k) and many labels (hmc_cellcycle_go, 4,125).
LARGE_SET_NAMES = ("goemotions", "hmc_cellcycle_go")


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset of a suite.

    ``synthetic`` is ``None`` for a real set read from ``<data root>/<name>/{train,test}.txt``; for a
    generated one it holds the generator call: ``{"preset": "eurlex-4k", "scale": 0.1}`` for
    ``bayesmlc.data.synthetic.make_shape``, or ``{"n_samples": .., "n_features": .., "n_labels": ..}``
    for ``make_multilabel``; ``"test_fraction"`` (default 0.2) sets the held-out share. ``files`` is
    ``(train path, test path)`` of a user's set (``bayesmlc bench --dataset``, :mod:`.user_data`).
    """

    name: str
    synthetic: dict | None = None
    files: tuple | None = None


@dataclass(frozen=True)
class ModelConfig:
    """A model with one named configuration.

    ``params`` apply everywhere; ``per_dataset`` maps a dataset name to parameters that override them
    there (a paper's per-dataset settings, standardisation of dense features, ...). ``exclude`` maps
    a dataset name to the reason the configuration is not run there (recorded as a skipped run).
    """

    model: str
    config: str
    params: dict = field(default_factory=dict)
    per_dataset: dict = field(default_factory=dict)
    exclude: dict = field(default_factory=dict)
    timeout_s: float | None = None

    @property
    def baseline(self) -> bool:
        return self.model in BASELINE_MODELS

    def params_for(self, dataset: str) -> dict:
        return {**self.params, **self.per_dataset.get(dataset, {})}


@dataclass(frozen=True)
class Suite:
    """A named list of datasets and model configurations; every configuration runs on every dataset."""

    name: str
    description: str
    datasets: tuple
    configs: tuple
    timeout_s: float = 600.0
    quality: bool = True  # False: the report shows speed and memory only

    def dataset(self, name: str) -> DatasetSpec:
        for spec in self.datasets:
            if spec.name == name:
                return spec
        raise ValidationError(f"suite {self.name!r} has no dataset {name!r}; it has {', '.join(self.dataset_names)}")

    @property
    def dataset_names(self) -> list[str]:
        return [spec.name for spec in self.datasets]

    @property
    def model_names(self) -> list[str]:
        return list(dict.fromkeys(config.model for config in self.configs))


def _standardise_dense(extra: dict | None = None) -> dict:
    return {name: {"standardize": True, **(extra or {})} for name in DENSE_FEATURE_SETS}


# ---- baselines ----------------------------------------------------------------------------------
_BASELINES = (
    ModelConfig("logistic", "default", per_dataset=_standardise_dense()),
    ModelConfig("knn", "default"),
    ModelConfig("napkinxc_plt", "default"),
    ModelConfig("omikuji_parabel", "default"),
    ModelConfig("omikuji_bonsai", "default"),
)

# ---- the library's models -----------------------------------------------------------------------
#: BMLS models binary features; the dense real-valued sets are binarised at about their median
#: feature value (x > t is on). A crude choice, stated in the report's settings column.
BMLS_BINARISE = {"emotions": {"binarize_threshold": 0.35}, "scene": {"binarize_threshold": 0.25},
                 "yeast": {"binarize_threshold": 0.0}, "hmc_cellcycle_go": {"binarize_threshold": 0.0}}

#: Small settings for the quick suite: seconds to a minute per small dataset on 2 cores.
QUICK_SETTINGS = (
    ModelConfig("bmls", "quick", {"n_topics": 50, "schedule": "fixed", "n_burnin": 100, "n_draws": 20, "thin": 5},
                per_dataset=BMLS_BINARISE),
    ModelConfig("bnmc", "quick", {"n_passes": 2}),
    # MLGPF's automatic batch size gives these small sets 8 or more steps an epoch; dense sets standardised
    ModelConfig("mlgpf", "quick", {"n_inducing": 100, "n_latent": 20, "epochs": 20}, per_dataset=_standardise_dense()),
)

#: The papers' settings; per dataset where the paper differs. BMLS: K=100, 200 burn-in sweeps, 2500
#: collection sweeps thinned by 10 (the authors' demo, ``schedule="fixed"``). BNMC: truncation 15, 2 passes (authors' code),
#: BNMC-L (Polya-Gamma logistic) and BNMC-S (Bayesian SVM). MLGPF: P=30, M=500, batch 500, R=1000
#: (subspace-inducing-inputs paper, Table 3), with 100 of the paper's 400 epochs on bibtex and
#: bibtex_xc so that the suite fits in about an hour on 2 cores (`--set epochs=400` for the paper's
#: length; docs/benchmarks.md has both), and 200 epochs on the small sets (1-4 steps per epoch). Each model's
#: defaults (configuration ``default``) run beside its paper settings.
PAPER_SETTINGS = (
    ModelConfig("bmls", "paper", {"n_topics": 100, "schedule": "fixed", "n_burnin": 200, "n_draws": 250, "thin": 10},
                per_dataset=BMLS_BINARISE, timeout_s=3600),
    # the estimator's defaults: schedule="auto", binarize_threshold="auto" (x > 0; the training medians on dense sets)
    ModelConfig("bmls", "default", {}, timeout_s=900),
    ModelConfig("bnmc", "paper-L", {"truncation": 15, "n_passes": 2, "classifier": "logistic"}, timeout_s=3600),
    ModelConfig("bnmc", "paper-S", {"truncation": 15, "n_passes": 2, "classifier": "svm"}, timeout_s=3600),
    ModelConfig("bnmc", "default", {}, timeout_s=900),
    ModelConfig(
        "mlgpf", "paper", {"n_latent": 30, "n_inducing": 500, "batch_size": 500, "subspace_rank": 1000, "epochs": 200,
                           "idf_weighting": False, "variational": "whitened", "kl_weight": 1.0},
        # the small sets have fewer than 500 training rows (medical: 333), too few for M=500 inducing rows
        per_dataset={"bibtex": {"epochs": 100}, "bibtex_xc": {"epochs": 100},
                     **{name: {"n_inducing": 200} for name in SMALL_SET_NAMES}},
        timeout_s=7200,
    ),
    # the estimator's defaults (variational="shared", epochs="auto", negative_samples="auto")
    ModelConfig("mlgpf", "default", {}, timeout_s=1800),
)

_NO_DENSE_WEIGHTS = "skipped by the suite: one-vs-rest logistic holds a dense D x L weight matrix (10.9 GB here)"

#: Speed settings for the scale suite: a few epochs or sweeps are enough to time one.
SCALE_SET_NAMES = ("eurlex-4k-0.1", "eurlex-4k-0.3", "eurlex-4k-1.0", "amazoncat-13k-0.01", "sweep-n2000", "sweep-n8000",
                   "sweep-d8000", "sweep-l1600")

SCALE_SETTINGS = (
    ModelConfig("logistic", "default", {"max_iter": 20}, exclude={"amazoncat-13k-0.01": _NO_DENSE_WEIGHTS}),
    ModelConfig("napkinxc_plt", "default", {"predict_top_k": 100}),
    ModelConfig("omikuji_parabel", "default", {"predict_top_k": 100}),
    ModelConfig("bmls", "speed", {"n_topics": 100, "schedule": "fixed", "n_burnin": 5, "n_draws": 2, "thin": 2,
                                  "binarize_threshold": 0.0}),
    ModelConfig("bnmc", "speed", {"n_passes": 1}),
    ModelConfig("mlgpf", "speed", {"n_inducing": 500, "batch_size": 500, "epochs": 2}),
)

_SMALL_SETS = tuple(DatasetSpec(name) for name in SMALL_SET_NAMES)

_FULL_SCALE = "skipped by the suite: a complete default MLGPF fit of the full AmazonCat-13K shape is 100 epochs"
#: The full-size shapes (opt-in, hours on 2 cores): a complete default MLGPF fit on EURLex-4K, one
#: default epoch on AmazonCat-13K (1.19M training rows), the tree baselines on both.
SCALE_FULL_SETTINGS = (
    ModelConfig("napkinxc_plt", "default", {"predict_top_k": 100}),
    ModelConfig("omikuji_parabel", "default", {"predict_top_k": 100}),
    ModelConfig("mlgpf", "default", {}, exclude={"amazoncat-13k-1.0": _FULL_SCALE}),
    ModelConfig("mlgpf", "one-epoch", {"epochs": 1}),
)

SUITES = {
    "quick": Suite(
        "quick",
        "five small real sets, every landed model with small settings, and the baselines",
        _SMALL_SETS,
        _BASELINES + QUICK_SETTINGS,
        timeout_s=240.0,
    ),
    "standard": Suite(
        "standard",
        "the small sets plus bibtex, bibtex_xc, goemotions and hmc_cellcycle_go, each model with its paper's settings, and the baselines",
        _SMALL_SETS + (DatasetSpec("bibtex"), DatasetSpec("bibtex_xc")) + tuple(DatasetSpec(n) for n in LARGE_SET_NAMES),
        _BASELINES + PAPER_SETTINGS,
        timeout_s=3600.0,
    ),
    "scale": Suite(
        "scale",
        "synthetic sets shaped like EURLex-4K and AmazonCat-13K, and sweeps in N, D and L: speed and memory",
        (
            DatasetSpec("eurlex-4k-0.1", {"preset": "eurlex-4k", "scale": 0.1}),
            DatasetSpec("eurlex-4k-0.3", {"preset": "eurlex-4k", "scale": 0.3}),
            DatasetSpec("eurlex-4k-1.0", {"preset": "eurlex-4k", "scale": 1.0}),
            DatasetSpec("amazoncat-13k-0.01", {"preset": "amazoncat-13k", "scale": 0.01}),
            DatasetSpec("sweep-n2000", {"n_samples": 2000, "n_features": 2000, "n_labels": 400}),
            DatasetSpec("sweep-n8000", {"n_samples": 8000, "n_features": 2000, "n_labels": 400}),
            DatasetSpec("sweep-d8000", {"n_samples": 2000, "n_features": 8000, "n_labels": 400}),
            DatasetSpec("sweep-l1600", {"n_samples": 2000, "n_features": 2000, "n_labels": 1600}),
        ),
        SCALE_SETTINGS,
        timeout_s=900.0,
        quality=False,
    ),
    "scale-full": Suite(
        "scale-full",
        "opt-in: the full EURLex-4K and AmazonCat-13K shapes (generated once into the output folder and "
        "reused): speed and memory",
        (
            DatasetSpec("eurlex-4k-1.0", {"preset": "eurlex-4k", "scale": 1.0}),
            DatasetSpec("amazoncat-13k-1.0", {"preset": "amazoncat-13k", "scale": 1.0}),
        ),
        SCALE_FULL_SETTINGS,
        timeout_s=7200.0,
        quality=False,
    ),
}


def get_suite(name: str) -> Suite:
    """The suite called ``name``."""
    if name not in SUITES:
        raise ValidationError(f"unknown suite {name!r}; choose one of {', '.join(SUITES)}")
    return SUITES[name]
