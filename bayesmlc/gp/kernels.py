"""Covariance functions for MLGPF, evaluated from weighted inner products.

Every kernel here is a function of the (possibly ARD-weighted) inner products between inputs,

    <x, z>_w = sum_d w_d x_d z_d,      |x - z|_w^2 = <x, x>_w + <z, z>_w - 2 <x, z>_w,

so the inducing-input objects (:mod:`bayesmlc.gp.inducing`) compute those inner products in whatever
way is cheapest for them (sparse products for free inputs, the precomputed subspace products of
eqs. (5)-(6) and appendix A.6 of the subspace paper for ``Z = A X~``), and a kernel maps them to
covariances. The ARD weights belong to the kernel (they are hyperparameters) and are handed to the
inducing object that computes the inner products.

All hyperparameters are kept positive through softplus and learnt with the rest of the bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn.functional import softplus

from ..preprocessing import resolve_standardize

__all__ = ["InnerProducts", "KernelBlocks", "Kernel", "Linear", "SquaredExponential", "Sum", "make_kernel", "resolve_kernel", "SE_ROWS_PER_FEATURE"]


def inverse_softplus(value: float) -> float:
    """The raw parameter whose softplus is ``value`` (> 0)."""
    return value + math.log(-math.expm1(-value))


@dataclass
class InnerProducts:
    """Weighted inner products between a batch of inputs X_b and the inducing inputs Z.

    zz : (M, M) <z_m, z_m'>_w
    xz : (B, M) <x_i, z_m>_w
    xx : (B,)   <x_i, x_i>_w
    """

    zz: torch.Tensor
    xz: torch.Tensor
    xx: torch.Tensor


@dataclass
class KernelBlocks:
    """Kernel matrices for one minibatch.

    zz : (M, M) K_ZZ (no jitter)
    xz : (B, M) K_XZ
    xx : (B,)   diag K_XX
    """

    zz: torch.Tensor
    xz: torch.Tensor
    xx: torch.Tensor


class Kernel(nn.Module):
    """Base class: ``forward(inner) -> KernelBlocks``; ``input_weights()`` gives the ARD weights.

    Parameters
    ----------
    n_weights : int or None
        Number of ARD weights (one per input coordinate the inducing object works in), or None for
        an isotropic kernel (all weights 1).
    """

    def __init__(self, n_weights: int | None = None):
        super().__init__()
        self.raw_weights = None if n_weights is None else nn.Parameter(
            torch.full((n_weights,), inverse_softplus(1.0))
        )

    def input_weights(self) -> torch.Tensor | None:
        """ARD weights w (positive, softplus of the raw parameter), or None when isotropic."""
        return None if self.raw_weights is None else softplus(self.raw_weights)

    def forward(self, inner: InnerProducts) -> KernelBlocks:  # pragma: no cover - abstract
        raise NotImplementedError


class Linear(Kernel):
    """Linear kernel k(x, z) = sigma^2 <x, z>_w."""

    def __init__(self, n_weights: int | None = None, variance: float = 1.0):
        super().__init__(n_weights)
        self.raw_variance = nn.Parameter(torch.tensor(inverse_softplus(variance)))

    def variance(self) -> torch.Tensor:
        return softplus(self.raw_variance)

    def forward(self, inner: InnerProducts) -> KernelBlocks:
        variance = self.variance()
        return KernelBlocks(variance * inner.zz, variance * inner.xz, variance * inner.xx)


class SquaredExponential(Kernel):
    """Squared exponential k(x, z) = sigma^2 exp(-|x - z|_w^2 / (2 l^2)) (appendix A.6, eq. (26))."""

    def __init__(self, n_weights: int | None = None, variance: float = 1.0, lengthscale: float = 1.0):
        super().__init__(n_weights)
        self.raw_variance = nn.Parameter(torch.tensor(inverse_softplus(variance)))
        self.raw_lengthscale = nn.Parameter(torch.tensor(inverse_softplus(lengthscale)))

    def variance(self) -> torch.Tensor:
        return softplus(self.raw_variance)

    def lengthscale(self) -> torch.Tensor:
        return softplus(self.raw_lengthscale)

    def forward(self, inner: InnerProducts) -> KernelBlocks:
        variance = self.variance()
        scale = 0.5 / self.lengthscale() ** 2
        z_sq = torch.diagonal(inner.zz)
        # D_Z = DG_Z 1^T + 1 DG_Z^T - 2 K^LIN_Z (appendix A.6); clamp rounding below zero
        dist_zz = (z_sq[:, None] + z_sq[None, :] - 2.0 * inner.zz).clamp_min(0.0)
        dist_xz = (inner.xx[:, None] + z_sq[None, :] - 2.0 * inner.xz).clamp_min(0.0)
        return KernelBlocks(
            variance * torch.exp(-scale * dist_zz),
            variance * torch.exp(-scale * dist_xz),
            variance.expand(inner.xx.shape),
        )


class Sum(Kernel):
    """Sum of kernels sharing one set of ARD weights (the parts are built isotropic)."""

    def __init__(self, parts: list[Kernel], n_weights: int | None = None):
        super().__init__(n_weights)
        if any(part.raw_weights is not None for part in parts):
            raise ValueError("the parts of a Sum kernel must be isotropic; the Sum holds the ARD weights")
        self.parts = nn.ModuleList(parts)

    def forward(self, inner: InnerProducts) -> KernelBlocks:
        blocks = [part(inner) for part in self.parts]
        return KernelBlocks(
            sum(b.zz for b in blocks), sum(b.xz for b in blocks), sum(b.xx for b in blocks)
        )


KERNEL_NAMES = ("linear", "se", "linear+se")


#: ``kernel="auto"`` takes the SE kernel on sparse features too when there are at least this many
#: training rows per feature column: with rows far outnumbering features a non-linear kernel has the
#: data to fit interactions, with features as many as rows (text) the linear one ranks better (Hsu,
#: Chang and Lin, "A Practical Guide to Support Vector Classification", 2003, appendix C). Validation
#: rows: delicious (26 rows a feature) ranks 0.8 P@1 higher with SE, bibtex_xc (2.1) 2.8 and goemotions
#: (2.7) 1.1 lower (docs/experiments.md, "MLGPF: the kernel of many rows and few features").
SE_ROWS_PER_FEATURE = 10


def resolve_kernel(kernel: str, X, n_rows: int | None = None, reduce=None) -> str:
    """The kernel name for ``MLGPF(kernel=...)``: ``kernel`` itself, or for "auto" "se" when the training
    features ``X`` are dense (more than half their entries non-zero, as ``standardize="auto"`` decides)
    or the rows number at least ``SE_ROWS_PER_FEATURE`` times the feature columns, and "linear"
    otherwise. ``X`` may be one process's rows: ``reduce`` sums the count of stored entries over
    processes and ``n_rows`` counts all rows (default: X's)."""
    if kernel != "auto":
        return kernel
    n_nonzero = float(X.nnz) if reduce is None else float(reduce(np.array([X.nnz], dtype=np.float64))[0])
    n_rows = X.shape[0] if n_rows is None else n_rows
    dense = resolve_standardize("auto", n_nonzero, n_rows * X.shape[1])
    return "se" if dense or n_rows >= SE_ROWS_PER_FEATURE * X.shape[1] else "linear"


def make_kernel(name: str, n_weights: int | None) -> Kernel:
    """Build the kernel called ``name`` (one of ``KERNEL_NAMES``); ``n_weights`` as in :class:`Kernel`."""
    if name == "linear":
        return Linear(n_weights)
    if name == "se":
        return SquaredExponential(n_weights)
    if name == "linear+se":
        return Sum([Linear(None, variance=0.5), SquaredExponential(None, variance=0.5)], n_weights)
    raise ValueError(f"kernel must be one of {', '.join(KERNEL_NAMES)}; got {name!r}")
