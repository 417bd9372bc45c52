"""MLGPF: the multi-label Gaussian-process factor model, with every scalability technique of the
subspace-inducing-inputs paper. Pieces mirror the maths: :mod:`.kernels`, :mod:`.inducing`,
:mod:`.variational`, :mod:`.likelihoods`, :mod:`.objective` (the bound and the module holding its
parameters), :mod:`.initialisation`, :mod:`.training` (the trainer), :mod:`.prediction`, :mod:`.model` (the estimator)."""

from .model import MLGPF
from .objective import MLGPFModule
from .training import Trainer, TrainingDivergedError

__all__ = ["MLGPF", "MLGPFModule", "Trainer", "TrainingDivergedError"]
