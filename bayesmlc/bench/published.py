"""Published numbers to print beside measured ones.

Transcribed from the papers' tables (and the Extreme Classification Repository), so that a report
needs no external file at run time. Values use the CLI's metric names and scale: rankings,
F1 and exact match as fractions in [0, 1] (the report prints them as percentages), AUC as a fraction.

``kind`` is ``"published"`` for numbers from a paper or the Extreme Classification Repository, and
``"reference run"`` for third-party tools run once on this project's development machine (2 cores)
with the same metric definitions; they are single runs, so one standard error of P@1 is about one
point on Bibtex and 1.5-3 points on the small sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PublishedResult", "PUBLISHED", "published_for"]


@dataclass(frozen=True)
class PublishedResult:
    """One published row: ``metrics`` maps CLI metric names (``"P@1"``, ``"AUC_micro"``, ...) to values."""

    dataset: str
    method: str
    source: str
    metrics: dict = field(default_factory=dict)
    note: str = ""
    kind: str = "published"


def _pk(p1, p3, p5, psp1=None, psp3=None, psp5=None) -> dict:
    values = {"P@1": p1, "P@3": p3, "P@5": p5, "PSP@1": psp1, "PSP@3": psp3, "PSP@5": psp5}
    return {key: value / 100.0 for key, value in values.items() if value is not None}


_MLGPF = "MLGPF subspace-inducing-inputs paper, Table 3"
_XC = "Extreme Classification Repository, Bibtex"
_BMLS = "BMLS paper (AISTATS 2018), AUC table, K=100"
_BNMC = "BNMC paper (ACML 2016), Tables 2-3, mean of 10 runs"
_HERE = "a single run on the 2-core development machine"

PUBLISHED: tuple[PublishedResult, ...] = (
    PublishedResult(
        "bibtex_xc", "MLGPF (linear kernel)", _MLGPF, _pk(59.31, 36.73, 27.40),
        "P=30, M=500, batch 500, R=1000, 400 epochs; 0.94 min per epoch on a Xeon E5-2667 v3",
    ),
    PublishedResult("bibtex_xc", "SLEEC", _XC, _pk(65.08, 39.64, 28.87, 51.12, 53.95, 59.56)),
    PublishedResult("bibtex_xc", "ProXML", _XC, _pk(64.60, 39.00, 28.20, 50.10, 52.00, 58.30)),
    PublishedResult("bibtex_xc", "Parabel", _XC, _pk(64.53, 38.56, 27.94, 50.88, 52.42, 57.36)),
    PublishedResult("bibtex_xc", "PfastreXML", _XC, _pk(63.46, 39.22, 29.14, 52.28, 54.36, 60.55)),
    PublishedResult("bibtex_xc", "1-vs-All", _XC, _pk(62.62, 39.09, 28.79, 48.84, 52.96, 59.29)),
    PublishedResult("bibtex", "BMLS", _BMLS, {"AUC_micro": 0.9379}, "AUC over all (instance, label) pairs"),
    PublishedResult("bibtex", "BMLPL", _BMLS, {"AUC_micro": 0.9210}),
    PublishedResult("bibtex", "LEML", _BMLS, {"AUC_micro": 0.9040}),
    PublishedResult(
        "bibtex", "BNMC-S", _BNMC, {"F1_example": 0.410, "exact_match": 0.165},
        "Mulan split; the paper says example F1, the authors' code computes micro F1; 295 s in total",
    ),
    PublishedResult("bibtex", "BNMC-L", _BNMC, {"F1_example": 0.403, "exact_match": 0.176}),
    PublishedResult(
        "emotions", "BNMC-S", _BNMC, {"F1_example": 0.360, "exact_match": 0.102},
        "paper: example F1, authors' code: micro F1; 0.6 s in total",
    ),
    PublishedResult("emotions", "BNMC-L", _BNMC, {"F1_example": 0.320, "exact_match": 0.090}),
    PublishedResult(
        "scene", "BNMC-S", _BNMC, {"F1_example": 0.704, "exact_match": 0.662},
        "paper: example F1, authors' code: micro F1; 2.5 s in total",
    ),
    PublishedResult("scene", "BNMC-L", _BNMC, {"F1_example": 0.715, "exact_match": 0.632}),
    # Reference runs of tools a user would pick instead (single runs on this project's machine).
    PublishedResult(
        "bibtex_xc", "omikuji (Parabel)", _HERE,
        {**_pk(64.37, 38.77, 28.14, 50.53, None, 57.65), "AUC_micro": 0.9285, "train_seconds": 1.9},
        kind="reference run",
    ),
    PublishedResult(
        "bibtex_xc", "scikit-learn one-vs-rest logistic", _HERE,
        {**_pk(62.82, 39.03, 28.91, 48.91, None, 58.79), "AUC_micro": 0.9464, "train_seconds": 5.2},
        kind="reference run",
    ),
    PublishedResult(
        "bibtex", "libpecos XR-Linear", _HERE,
        {**_pk(63.74, 38.89, 28.17, 50.36, None, 58.50), "AUC_micro": 0.9264, "train_seconds": 0.9},
        kind="reference run",
    ),
    PublishedResult(
        "bibtex", "scikit-learn one-vs-rest logistic", _HERE,
        {**_pk(62.39, 39.19, 28.81, 48.69, None, 59.45), "AUC_micro": 0.9476, "train_seconds": 4.9},
        kind="reference run",
    ),
    PublishedResult(
        "emotions", "napkinXC PLT", _HERE,
        {**_pk(74.26, 57.59, 38.81, 71.94, None, 98.23), "AUC_micro": 0.8534, "train_seconds": 0.02},
        "features standardised", kind="reference run",
    ),
    PublishedResult(
        "scene", "cosine kNN vote", _HERE,
        {**_pk(76.00, 34.53, 21.54, 76.18, None, 99.13), "AUC_micro": 0.9380, "train_seconds": 0.0},
        "features standardised", kind="reference run",
    ),
    PublishedResult(
        "yeast", "napkinXC PLT", _HERE,
        {**_pk(75.90, 69.83, 59.54, 65.38, None, 72.72), "AUC_micro": 0.8258, "train_seconds": 0.12},
        "features standardised", kind="reference run",
    ),
    PublishedResult(
        "yeast", "cosine kNN vote", _HERE,
        {**_pk(74.70, 71.54, 60.81, 63.75, None, 74.17), "AUC_micro": 0.8406, "train_seconds": 0.0},
        "features standardised", kind="reference run",
    ),
    PublishedResult(
        "medical", "omikuji (Parabel)", _HERE,
        {**_pk(84.34, 37.78, 23.32, 71.40, None, 89.07), "AUC_micro": 0.9688, "train_seconds": 0.03},
        kind="reference run",
    ),
    PublishedResult(
        "medical", "napkinXC PLT", _HERE,
        {**_pk(82.64, 37.47, 23.44, 68.80, None, 88.88), "AUC_micro": 0.9752, "train_seconds": 0.02},
        kind="reference run",
    ),
    PublishedResult(
        "enron", "scikit-learn one-vs-rest logistic", _HERE,
        {**_pk(79.79, 60.45, 45.77, 47.42, None, 57.90), "AUC_micro": 0.9167, "train_seconds": 0.35},
        kind="reference run",
    ),
    PublishedResult(
        "enron", "napkinXC PLT (tuned)", _HERE,
        {**_pk(76.51, 61.26, 46.46, 46.58, None, 60.61), "AUC_micro": 0.9234, "train_seconds": 0.62},
        kind="reference run",
    ),
)


def published_for(dataset: str) -> list[PublishedResult]:
    """The published and reference rows for ``dataset``, in table order."""
    return [row for row in PUBLISHED if row.dataset == dataset]
