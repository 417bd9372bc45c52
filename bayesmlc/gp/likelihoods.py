"""The logistic (Bernoulli-logit) likelihood, its expectations under a Gaussian and predictive mean.

With f ~ N(mean, var) and y in {-1, +1}, the expected log-likelihood is computed in one of two ways:

* Gauss-Hermite quadrature (journal paper sec. 4.2, ten points there)::

      E[log sigmoid(y f)] = sum_j (w_j / sqrt(pi)) log sigmoid(y (mean + sqrt(2 var) xi_j))

* in the far tail, where sigmoid(y f) is almost surely close to 1 (a confident label: most negatives
  of a large label set), by the series log sigmoid(y f) = -log(1 + z) with z = exp(g), g = -y f,
  log(1 + z) = z - z^2/2 + z^3/3 - z^4/4 + ..., and the Gaussian moments E[z^k] = exp(k m + k^2 v / 2)
  (m = -y mean, v = var)::

      E[log sigmoid(y f)] = -sum_{k=1..4} (-1)^(k+1) exp(k m + k^2 v / 2) / k

  used where the first omitted term is below ``TAIL_RELATIVE_ERROR`` of the first (m + 3 v <= -3.05
  below; derivation in :func:`tail_entries`) and nearly all of the Gaussian's mass has z < 1
  (m + 5 sqrt(v) <= 0). It costs a few element-wise operations per entry instead of Q log-sigmoids
  and their backward pass; on the negatives of a large label set most entries are in this tail
  (docs/experiments.md, "MLGPF at scale").

The predictive probability E[sigmoid(f)] uses the quadrature.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.nn.functional import logsigmoid

__all__ = ["BernoulliLogit", "GRID_BLOCK_ENTRIES", "TAIL_RELATIVE_ERROR", "tail_entries"]

VAR_FLOOR = 1e-10
#: The series is used where its first omitted term, E[z^5] / 5, is at most this fraction of E[z].
TAIL_RELATIVE_ERROR = 1e-6
#: ... and where mean + TAIL_SIGMAS standard deviations of g = -y f is at most 0 (z < 1 there).
TAIL_SIGMAS = 5.0
_TAIL_BOUND = math.log(5.0 * TAIL_RELATIVE_ERROR) / 4.0  # m + 3 v <= this (about -3.05)
#: The quadrature grids (entries, Q) are formed in blocks of at most this many values. Temporaries
#: above glibc's largest mmap threshold (32 MB) are mapped afresh by every allocation and returned by
#: every free, and the kernel then zero-fills each page on first touch: on large label sets that
#: page-fault cost was over half of MLGPF's prediction time (docs/experiments.md). 2 MB blocks are
#: reused from the allocator's heap instead.
GRID_BLOCK_ENTRIES = 1 << 19


def tail_entries(g_mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """Where the four-term series is accurate, for g ~ N(g_mean, var): a boolean tensor.

    E[z^5] / 5 / E[z] = exp(4 m + 12 v) / 5 <= TAIL_RELATIVE_ERROR  <=>  m + 3 v <= log(5 eps) / 4,
    and m + TAIL_SIGMAS sqrt(v) <= 0.
    """
    near = torch.add(g_mean, var, alpha=3.0).le(_TAIL_BOUND)
    # a negative variance (rounding) gives a NaN root, and the entry is left to the quadrature
    return near.logical_and_(torch.add(g_mean, var.sqrt(), alpha=TAIL_SIGMAS).le(0.0))


def _expected_log_sigmoid(mean, var, sign, nodes, weights, use_tail: bool):
    """E[log sigmoid(sign f)] for f ~ N(mean, var), element-wise, and its derivatives with respect to
    ``mean`` and ``var``: three tensors of the shape of ``mean``, formed together (no Q-wide tensors
    are kept for a backward pass).

    Entries in the tail (:func:`tail_entries`) take the four-term series; with E_k = exp(k m + k^2 v / 2),
    m = -sign mean:

        value = -(E_1 - E_2 / 2 + E_3 / 3 - E_4 / 4)
        d value / d m = -(E_1 - E_2 + E_3 - E_4),   d value / d v = -(E_1 / 2 - E_2 + 3 E_3 / 2 - 2 E_4)

    The others take the Gauss-Hermite rule and its exact derivative: with x_j = sign (mean + s xi_j),
    s = sqrt(var), d log sigmoid(x) / dx = sigmoid(-x), so d/d mean = sign sum_j w_j sigmoid(-x_j) and
    d/d s = sign sum_j w_j xi_j sigmoid(-x_j) (zero below ``VAR_FLOOR``, where the variance is floored).
    ``mean``, ``var`` and ``sign`` must have one shape.
    """
    shape = mean.shape
    mean, var, sign = mean.reshape(-1), var.reshape(-1), sign.reshape(-1)
    if not use_tail:
        value, d_mean, d_var = _quadrature_and_derivatives(mean, var, sign, nodes, weights)
        return value.reshape(shape), d_mean.reshape(shape), d_var.reshape(shape)
    # the series on every entry (cheaper than gathering the tail), its arguments clamped so that the
    # entries outside the tail stay finite; those are overwritten by the quadrature below. Written
    # with in-place and fused operations: on large label sets this is a fifth of a training step.
    g_mean = sign.neg().mul_(mean)
    rest = torch.nonzero(~tail_entries(g_mean, var)).squeeze(-1)
    m = g_mean.clamp_(max=_TAIL_BOUND)
    v = torch.minimum(var, m.neg().add_(_TAIL_BOUND).div_(3.0))  # unchanged in the tail (m + 3 v <= bound)
    # E_k = exp(k m + k^2 v / 2) from two exponentials: E_1 = exp(m + v / 2), b = exp(v),
    # E_2 = E_1^2 b, E_3 = E_2 E_1 b^2, E_4 = E_3 E_1 b^3 (every factor below 1 in the tail)
    e1 = torch.add(m, v, alpha=0.5).exp_()
    b = v.exp_()
    e2 = e1.square().mul_(b)
    b_squared = b.square()
    e3 = e2.mul(e1).mul_(b_squared)
    e4 = e3.mul(e1).mul_(b_squared.mul_(b))
    value = e4.mul(0.25).add_(e2, alpha=0.5).sub_(e1).sub_(e3, alpha=1.0 / 3.0)
    d_mean = (e1 - e2).add_(e3).sub_(e4).mul_(sign)  # d value / d m times d m / d mean = -sign
    d_var = e4.mul_(2.0).add_(e2).sub_(e1, alpha=0.5).sub_(e3, alpha=1.5)
    if rest.numel():
        picked = (t.index_select(0, rest) for t in (mean, var, sign))
        for target, part in zip((value, d_mean, d_var), _quadrature_and_derivatives(*picked, nodes, weights)):
            target.index_copy_(0, rest, part)
    return value.reshape(shape), d_mean.reshape(shape), d_var.reshape(shape)


def _quadrature_and_derivatives(mean, var, sign, nodes, weights):
    """The Gauss-Hermite value of E[log sigmoid(sign f)] and its exact derivatives with respect to
    ``mean`` and ``var`` (:func:`_expected_log_sigmoid`), for 1-D tensors of one length."""
    sd = var.clamp_min(VAR_FLOOR).sqrt()
    x = (mean.unsqueeze(-1) + sd.unsqueeze(-1) * nodes).mul_(sign.unsqueeze(-1))  # (R, Q)
    value = logsigmoid(x) @ weights
    slope = torch.sigmoid(x.neg_()).mul_(weights)  # w_j d log sigmoid / dx at the nodes
    d_sd = sign * (slope @ nodes)
    return value, sign * slope.sum(-1), torch.where(var > VAR_FLOOR, d_sd / (2.0 * sd), torch.zeros_like(sd))


class _ExpectedLogSigmoid(torch.autograd.Function):
    """:func:`_expected_log_sigmoid`'s value, whose backward pass multiplies the incoming gradient by
    the derivatives formed with it (two products; the forward keeps only those two tensors)."""

    @staticmethod
    def forward(ctx, mean, var, sign, nodes, weights, use_tail):
        value, d_mean, d_var = _expected_log_sigmoid(mean, var, sign, nodes, weights, use_tail)
        ctx.save_for_backward(d_mean, d_var)
        return value

    @staticmethod
    def backward(ctx, grad):
        d_mean, d_var = ctx.saved_tensors
        needs_mean, needs_var = ctx.needs_input_grad[:2]
        return (grad * d_mean if needs_mean else None, grad * d_var if needs_var else None,
                None, None, None, None)


class BernoulliLogit:
    """p(y | f) = sigmoid(y f).

    Parameters
    ----------
    quadrature_points : int, number of Gauss-Hermite nodes Q.
    tail_series : bool, use the closed-form series for entries in the far tail (module docstring);
        False computes every entry by quadrature.
    """

    def __init__(self, quadrature_points: int = 10, tail_series: bool = True):
        nodes, weights = np.polynomial.hermite.hermgauss(quadrature_points)
        self.nodes = torch.as_tensor(nodes * math.sqrt(2.0))  # f = mean + sqrt(var) * node
        self.weights = torch.as_tensor(weights / math.sqrt(math.pi))
        self.tail_series = tail_series

    def _grid(self, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        nodes = self.nodes.to(mean.device, mean.dtype)
        # the floor keeps the gradient of the square root finite where a variance rounds to 0
        return mean.unsqueeze(-1) + var.clamp_min(VAR_FLOOR).sqrt().unsqueeze(-1) * nodes  # (..., Q)

    def expected_log_lik(self, mean: torch.Tensor, var: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
        """E_{N(f; mean, var)}[log sigmoid(sign * f)], element-wise; all arguments broadcast."""
        mean, var, sign = torch.broadcast_tensors(mean, var, sign.to(mean.dtype))
        nodes = self.nodes.to(mean.device, mean.dtype)
        weights = self.weights.to(mean.device, mean.dtype)
        if not (mean.requires_grad or var.requires_grad):
            with torch.no_grad():
                return _expected_log_sigmoid(mean, var, sign, nodes, weights, self.tail_series)[0]
        return _ExpectedLogSigmoid.apply(mean, var, sign.detach(), nodes, weights, self.tail_series)

    def predictive_mean(self, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        """E_{N(f; mean, var)}[sigmoid(f)], element-wise; ``mean`` and ``var`` broadcast.

        The grid is formed in blocks of at most ``GRID_BLOCK_ENTRIES`` values, one block at a time.
        """
        mean, var = torch.broadcast_tensors(mean, var)
        weights = self.weights.to(mean.device, mean.dtype)
        flat_mean, flat_var = mean.reshape(-1), var.reshape(-1)
        out = torch.empty_like(flat_mean)
        step = max(1, GRID_BLOCK_ENTRIES // weights.numel())
        for start in range(0, flat_mean.numel(), step):
            block = slice(start, start + step)
            out[block] = self._grid(flat_mean[block], flat_var[block]).sigmoid_() @ weights
        return out.reshape(mean.shape)
