"""The registry of models, by the names the CLI uses (``--model NAME``)."""

from __future__ import annotations

import importlib
from types import MappingProxyType

from .exceptions import ValidationError

MODEL_CLASSES = {
    "logistic": "bayesmlc.linear:LogisticRegression",
    "bmls": "bayesmlc.bmls:BMLS",
    "bnmc": "bayesmlc.bnmc:BNMC",
    "mlgpf": "bayesmlc.gp:MLGPF",
    # comparison baselines (napkinXC and omikuji need the optional [compare] extra)
    "knn": "bayesmlc.baselines:KNNBaseline",
    "napkinxc_plt": "bayesmlc.baselines:NapkinXCPLT",
    "omikuji_parabel": "bayesmlc.baselines:OmikujiParabel",
    "omikuji_bonsai": "bayesmlc.baselines:OmikujiBonsai",
}


# Every class a model file may name, exactly as ``bayesmlc.persistence`` writes it ("module:Class"), mapped
# to where that class lives now. Loading refuses any other name *before* importing anything, so a crafted
# file cannot make Python import a module of its choosing; adding an estimator class means adding it here
# (a test checks the registry). A class that moves keeps its old name here, pointing at the new home.
_CURRENT_CLASSES = (
    "bayesmlc.linear:LogisticRegression",
    "bayesmlc.bmls.model:BMLS",
    "bayesmlc.bnmc.model:BNMC",
    "bayesmlc.gp.model:MLGPF",
    "bayesmlc.ensemble:AveragingEnsemble",
    "bayesmlc.calibration:CalibratedClassifier",
    "bayesmlc.preprocessing:FeaturePreprocessor",
    "bayesmlc.baselines:KNNBaseline",
    "bayesmlc.baselines:NapkinXCPLT",
    "bayesmlc.baselines:OmikujiParabel",
    "bayesmlc.baselines:OmikujiBonsai",
)
#: Names written by earlier versions -> the class's current "module:Class".
_MOVED_CLASSES = {
    "bayesmlc.bench.baselines:KNNBaseline": "bayesmlc.baselines:KNNBaseline",
    "bayesmlc.bench.baselines:NapkinXCPLT": "bayesmlc.baselines:NapkinXCPLT",
    "bayesmlc.bench.baselines:OmikujiParabel": "bayesmlc.baselines:OmikujiParabel",
    "bayesmlc.bench.baselines:OmikujiBonsai": "bayesmlc.baselines:OmikujiBonsai",
}
LOADABLE_CLASSES = MappingProxyType({**{path: path for path in _CURRENT_CLASSES}, **_MOVED_CLASSES})


def get_model_class(name: str):
    """The estimator class registered as ``name``."""
    if name not in MODEL_CLASSES:
        raise ValidationError(f"unknown model {name!r}; choose one of {', '.join(MODEL_CLASSES)}")
    module_name, _, class_name = MODEL_CLASSES[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValidationError(f"model {name!r} is not available in this installation: {exc}") from None
    return getattr(module, class_name)


def available_models() -> list[str]:
    """Names of the models whose modules import."""
    names = []
    for name in MODEL_CLASSES:
        try:
            get_model_class(name)
        except (ValidationError, AttributeError):
            continue
        names.append(name)
    return names
