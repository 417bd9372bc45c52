"""bayesmlc: Bayesian multi-label classification at scale.

Models: :class:`MLGPF` (multi-label Gaussian-process factor model), :class:`BMLS` (Bernoulli-Poisson
label factorisation, Gibbs sampling), :class:`BNMC` (Dirichlet-process mixture with Bayesian per-label
classifiers), and the baseline :class:`LogisticRegression` (one logistic regression per label).
:class:`CalibratedClassifier` recalibrates any of them on held-out rows.
"""

__version__ = "0.1.0"

from .data.dataset import Dataset
from .exceptions import DataFormatError, ModelFormatError, NotFittedError, ValidationError

__all__ = [
    "Dataset",
    "DataFormatError",
    "ModelFormatError",
    "NotFittedError",
    "ValidationError",
    "LogisticRegression",
    "BMLS",
    "BNMC",
    "MLGPF",
    "CalibratedClassifier",
    "load_model",
    "__version__",
]


def load_model(path, allow_native: bool = False):
    """The fitted model saved in ``path`` (any bayesmlc model; :func:`bayesmlc.persistence.load_model`).
    ``allow_native=True`` is needed for a napkinXC or omikuji baseline, whose embedded model files a
    native library reads trusting them: pass it only for files you trust."""
    from .persistence import load_model as load

    return load(path, allow_native=allow_native)


def __getattr__(name):
    # Models import torch and their own modules lazily, so `import bayesmlc` stays light.
    from .models import MODEL_CLASSES, get_model_class

    if name == "CalibratedClassifier":
        from .calibration import CalibratedClassifier

        return CalibratedClassifier
    for key, path in MODEL_CLASSES.items():
        if path.endswith(":" + name):
            return get_model_class(key)
    raise AttributeError(f"module 'bayesmlc' has no attribute {name!r}")
