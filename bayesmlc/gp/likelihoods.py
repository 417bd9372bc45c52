"""The logistic (Bernoulli-logit) likelihood, its Gauss-Hermite expectations and predictive mean.

With f ~ N(mean, var) and y in {-1, +1}:

    E[log sigmoid(y f)] = sum_j (w_j / sqrt(pi)) log sigmoid(y (mean + sqrt(2 var) xi_j))

(xi_j, w_j) the Gauss-Hermite nodes and weights (journal paper sec. 4.2, ten points there), and the
predictive probability E[sigmoid(f)] uses the same rule.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.nn.functional import logsigmoid

__all__ = ["BernoulliLogit"]

VAR_FLOOR = 1e-10


class BernoulliLogit:
    """p(y | f) = sigmoid(y f).

    Parameters
    ----------
    quadrature_points : int, number of Gauss-Hermite nodes Q.
    """

    def __init__(self, quadrature_points: int = 10):
        nodes, weights = np.polynomial.hermite.hermgauss(quadrature_points)
        self.nodes = torch.as_tensor(nodes * math.sqrt(2.0))  # f = mean + sqrt(var) * node
        self.weights = torch.as_tensor(weights / math.sqrt(math.pi))

    def _grid(self, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        nodes = self.nodes.to(mean.device, mean.dtype)
        # the floor keeps the gradient of the square root finite where a variance rounds to 0
        return mean.unsqueeze(-1) + var.clamp_min(VAR_FLOOR).sqrt().unsqueeze(-1) * nodes  # (..., Q)

    def expected_log_lik(self, mean: torch.Tensor, var: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
        """E_{N(f; mean, var)}[log sigmoid(sign * f)], element-wise; all arguments broadcast."""
        weights = self.weights.to(mean.device, mean.dtype)
        return logsigmoid(sign.unsqueeze(-1) * self._grid(mean, var)) @ weights

    def predictive_mean(self, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        """E_{N(f; mean, var)}[sigmoid(f)], element-wise."""
        weights = self.weights.to(mean.device, mean.dtype)
        return torch.sigmoid(self._grid(mean, var)) @ weights
