"""The registry of models, by the names the CLI uses (``--model NAME``)."""

from __future__ import annotations

import importlib
import importlib.util
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

#: The models that need an optional package, which the ``[compare]`` extra installs: name -> package.
COMPARE_MODELS = MappingProxyType({"napkinxc_plt": "napkinxc", "omikuji_parabel": "omikuji",
                                   "omikuji_bonsai": "omikuji"})
INSTALL_COMPARE = "install it with: pip install 'bayesmlc[compare]'"


def missing_optional_package(name: str) -> str | None:
    """Why model ``name`` cannot run in this installation, its optional package (:data:`COMPARE_MODELS`)
    being absent or failing to import, or ``None`` when it can run (every model without one)."""
    package = COMPARE_MODELS.get(name)
    if package is None:
        return None
    if importlib.util.find_spec(package) is None:
        return f"optional package {package!r} is not installed ({INSTALL_COMPARE})"
    try:
        importlib.import_module(package)
    except ImportError as exc:
        return f"optional package {package!r} does not import ({exc}; reinstall it: {INSTALL_COMPARE})"
    return None


def model_label(name: str) -> str:
    """``name``, followed by `` [compare]`` for a model that needs the ``[compare]`` extra."""
    return f"{name} [compare]" if name in COMPARE_MODELS else name


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
    "bayesmlc.risk_control.controller:RiskController",
    "bayesmlc.preprocessing:FeaturePreprocessor",
    "bayesmlc.baselines:KNNBaseline",
    "bayesmlc.baselines:NapkinXCPLT",
    "bayesmlc.baselines:OmikujiParabel",
    "bayesmlc.baselines:OmikujiBonsai",
)
#: The classes whose fitted state holds a native library's own model files (napkinXC's C++ reader,
#: omikuji's Rust one), which that library reads trusting their contents: a model file naming one of
#: them (current or earlier name, at any depth) loads only when the caller opts in
#: (``load_model(path, allow_native=True)``, the CLI's ``--allow-native-baselines``).
NATIVE_CLASSES = frozenset({"bayesmlc.baselines:NapkinXCPLT", "bayesmlc.baselines:OmikujiParabel",
                            "bayesmlc.baselines:OmikujiBonsai"})
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
