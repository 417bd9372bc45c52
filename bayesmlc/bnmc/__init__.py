"""BNMC: Bayesian nonparametric multi-label classification (Nguyen et al., ACML 2016).

A truncated Dirichlet-process mixture of feature/label patterns fitted by stochastic variational
inference, plus per-label Bayesian classifiers (Polya-Gamma logistic regression or the Polson-Scott
SVM), in batch and online form. See ``docs/bnmc.md``.
"""

from .model import BNMC

__all__ = ["BNMC"]
