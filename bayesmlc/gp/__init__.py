"""MLGPF: the multi-label Gaussian-process factor model, with every scalability technique of the
subspace-inducing-inputs paper. Pieces mirror the maths: :mod:`.kernels`, :mod:`.inducing`,
:mod:`.variational`, :mod:`.likelihoods`, :mod:`.objective`, :mod:`.training`, :mod:`.model`."""

from .model import MLGPF, MLGPFModule
from .training import TrainingDivergedError

__all__ = ["MLGPF", "MLGPFModule", "TrainingDivergedError"]
