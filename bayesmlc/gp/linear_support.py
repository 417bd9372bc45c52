"""MLGPF's per-label linear term on a per-label support of K features (``linear_features=K``).

The term of :mod:`bayesmlc.gp.linear_term`, f_l(x) = sum_p Phi_lp h_p(x) + w_l^T x + b_l with
w_l ~ N(0, s2 I), with each w_l restricted to K columns S_l chosen before training: the prior puts
w_lj = 0 off S_l (an independent linear-kernel GP per label on the inputs x_{S_l}, Rasmussen and
Williams 2006, sec. 2.1-2.2). A dense W of L x D entries grows with both sides (AmazonCat-13K:
2.7e9 entries); this one holds L x K, and a minibatch step costs O(|T| K df_B) for the batch's labels
T and the support columns' entries in the batch, not O(nnz(X_B) |T| + |T| |C|).

**The support** of label l (:func:`bayesmlc.feature_support.gradient_support`): the K columns with the
largest standardised logistic gradient at w = 0 among those of its positive rows (lasso strong-rule
screening).

**Steps.** The minibatch's block is the labels T of its likelihood entries, each with its K weights:
the data term's gradient is formed by compiled passes over the support columns' entries in the batch
(a CSC copy of the batch), and the penalty's gradient W / (s2 N) per training row enters as an
unbiased estimate on the sampled labels S (each in S with probability |S| / L, weighted L / |S|),
whole rows of W, so no column probability is needed. W takes a lazy Adam step on the block (the rule
of ``torch.optim.SparseAdam``).
"""

from __future__ import annotations

import math
import warnings

import numba
import numpy as np
import scipy.sparse as sp
import torch

from ..feature_support import gradient_support, label_blocks, support_products
from .linear_term import ADAM_BETAS, ADAM_EPS, PenalisedLinearWeights

__all__ = ["SupportLinearTerm", "SupportBlock", "gradient_support", "support_problem"]

#: A block's utilities are one sparse-times-dense product X_B W_full^T, with W (T, K) scattered into a
#: dense (T, D) W_full, where that holds at most DENSE_PRODUCT_MAX_ENTRIES values and costs at most
#: DENSE_PRODUCT_COST_RATIO times the multiply-adds of the passes over the support columns' entries
#: (each of those is a scattered scalar update; the dense product's run vectorised, about 10x faster
#: apiece: docs/experiments.md, "MLGPF: element-wise passes and large temporaries").
DENSE_PRODUCT_MAX_ENTRIES = 1 << 22
DENSE_PRODUCT_COST_RATIO = 4.0


def support_problem(value, n_features: int) -> str | None:
    """What is wrong with ``value`` as a stored support (model files and checkpoints check it the same
    way): it must be a 2-d integer tensor of feature columns in [0, ``n_features``) or -1. None if
    nothing."""
    if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.is_complex() \
            or value.dtype == torch.bool or value.dim() != 2:
        shown = f"a {value.dtype} tensor of {value.dim()} dimensions" if isinstance(value, torch.Tensor) \
            else type(value).__name__
        return f"must be a 2-d integer tensor, got {shown}"
    if value.numel() and (int(value.min()) < -1 or int(value.max()) >= n_features):
        return (f"must hold feature columns in [0, {n_features}) or -1, got values in "
                f"[{int(value.min())}, {int(value.max())}]")
    return None


@numba.njit(cache=True, nogil=True)
def _support_gradient(colptr, rows, values, support, grad_out, grad, start, stop):
    """grad[t, s] = sum_i grad_out[t, i] x_{i, support[t, s]} for labels t in [start, stop)."""
    for t in range(start, stop):
        g = grad_out[t]
        for s in range(support.shape[1]):
            j = support[t, s]
            acc = 0.0
            if j >= 0:
                for p in range(colptr[j], colptr[j + 1]):
                    acc += g[rows[p]] * values[p]
            grad[t, s] = acc


@numba.njit(cache=True, nogil=True)
def _pair_values(indptr, indices, data, n_columns, pair_rows, pair_labels, support, out):
    """out[e, s] = x_{pair_rows[e], support[pair_labels[e], s]} (0 where not stored), from a CSR of
    ``n_columns`` columns (the support's columns lie below it). Each
    run of equal ``pair_rows`` (a row's positives, which come together) scatters its row into a dense
    scratch once and reads the K columns of each of its labels from it: O(nnz of the rows + E K)."""
    scratch = np.zeros(n_columns, dtype=out.dtype)
    e, n_pairs = 0, pair_rows.size
    while e < n_pairs:
        row = pair_rows[e]
        lo, hi = indptr[row], indptr[row + 1]
        for p in range(lo, hi):
            scratch[indices[p]] = data[p]
        while e < n_pairs and pair_rows[e] == row:
            q = pair_labels[e]
            for s in range(support.shape[1]):
                j = support[q, s]
                out[e, s] = scratch[j] if j >= 0 else 0.0
            e += 1
        for p in range(lo, hi):
            scratch[indices[p]] = 0.0


class _SupportTimes(torch.autograd.Function):
    """(B, T) utilities of a batch (CSC) for the block's weights (T, K), with the gradient in them."""

    @staticmethod
    def forward(ctx, weight, X_csc, support):
        ctx.X_csc, ctx.support, ctx.device = X_csc, support, weight.device
        return torch.from_numpy(support_products(X_csc, support, weight.detach().cpu().numpy())).T.to(weight.device)

    @staticmethod
    def backward(ctx, grad_out):
        X_csc, support = ctx.X_csc, ctx.support
        grad_t = grad_out.T.contiguous().cpu().numpy()
        grad = np.empty(support.shape, dtype=grad_t.dtype)
        values = X_csc.data.astype(grad_t.dtype, copy=False)
        label_blocks(support.shape[0], lambda a, b: _support_gradient(X_csc.indptr, X_csc.indices, values, support,
                                                                       grad_t, grad, a, b))
        return torch.from_numpy(grad).to(ctx.device), None, None


class SupportBlock:
    """The rows of W that one minibatch touches (its labels T, K weights each), as a leaf tensor whose
    gradient the bound fills. Parameters as :class:`~bayesmlc.gp.linear_term.LinearBlock`'s. The
    products run on the CPU (compiled passes over the batch's stored entries); on another device the
    block's weights and the utilities travel to and from it."""

    def __init__(self, term: SupportLinearTerm, X_rows: sp.csr_matrix, sampled: np.ndarray,
                 positive_rows: np.ndarray, positive_labels: np.ndarray):
        X = sp.csr_matrix(X_rows)
        X.sort_indices()
        self.X, self.X_csc = X, X.tocsc()
        self.labels = np.union1d(sampled, positive_labels).astype(np.int64)  # T
        self.sampled_positions = np.searchsorted(self.labels, sampled)
        self.all_sampled = self.labels.size == sampled.size
        self.positive_rows = np.asarray(positive_rows, dtype=np.int64)
        self.positive_positions = np.searchsorted(self.labels, positive_labels)
        labels_t = torch.as_tensor(self.labels, device=term.weight.device)
        self.support = term.support.index_select(0, labels_t).cpu().numpy()
        self.weight = term.weight.index_select(0, labels_t).requires_grad_()

    def sampled_utilities(self) -> torch.Tensor:
        """w_l^T x_i for the batch's rows and the sampled labels: (B, S)."""
        if self.all_sampled:
            return self._times(self.weight, self.support)
        positions = self.sampled_positions
        return self._times(self.weight[torch.as_tensor(positions, device=self.weight.device)], self.support[positions])

    def _times(self, weight: torch.Tensor, support: np.ndarray) -> torch.Tensor:
        """(B, T) utilities of the batch for ``weight`` (T, K) on ``support`` (T, K): by the compiled passes
        over the support columns' entries, or as one dense product where that is cheaper (the rule of
        ``DENSE_PRODUCT_MAX_ENTRIES`` and ``DENSE_PRODUCT_COST_RATIO``); the two are equal to rounding."""
        n_labels, n_features = support.shape[0], self.X.shape[1]
        if n_labels * n_features > DENSE_PRODUCT_MAX_ENTRIES:
            return _SupportTimes.apply(weight, self.X_csc, support)
        passes_cost = float(np.diff(self.X_csc.indptr)[support[support >= 0]].sum())  # their multiply-adds
        if self.X.nnz * n_labels > DENSE_PRODUCT_COST_RATIO * passes_cost:
            return _SupportTimes.apply(weight, self.X_csc, support)
        device = weight.device
        valid = torch.as_tensor(support >= 0, device=device)
        columns = torch.as_tensor(np.maximum(support, 0), device=device)
        # padding (-1) adds an exact 0 at column 0, so a label's own column 0 keeps its weight
        full = weight.new_zeros((n_labels, n_features)).scatter_add(1, columns, weight * valid)
        X = self.X
        with warnings.catch_warnings():  # torch calls its sparse CSR layout beta
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)
            rows = torch.sparse_csr_tensor(torch.as_tensor(X.indptr, dtype=torch.int64),
                                           torch.as_tensor(X.indices, dtype=torch.int64),
                                           torch.as_tensor(X.data, dtype=weight.dtype), size=X.shape, device=device,
                                           check_invariants=False)  # a checked scipy CSR
        return rows @ full.T

    def positive_utilities(self) -> torch.Tensor:
        """w_l^T x_i for the positive entries: (E,)."""
        values = np.empty((self.positive_rows.size, self.support.shape[1]), dtype=np.float64)
        _pair_values(self.X.indptr, self.X.indices, self.X.data.astype(np.float64, copy=False), self.X.shape[1],
                     self.positive_rows, self.positive_positions, self.support, values)
        device = self.weight.device
        values_t = torch.as_tensor(values, dtype=self.weight.dtype, device=device)
        return (self.weight[torch.as_tensor(self.positive_positions, device=device)] * values_t).sum(-1)


class SupportLinearTerm(PenalisedLinearWeights):
    """W (L, K) on the columns ``support`` (L, K) of the per-label linear term, with its lazy Adam state
    (module docstring).

    Parameters
    ----------
    support : int64 (L, K), each label's columns (:func:`gradient_support`), -1 for none
    prior_variance : s2 of w_l ~ N(0, s2 I)
    """

    block_class = SupportBlock

    def __init__(self, support: np.ndarray, prior_variance: float):
        support = torch.as_tensor(np.asarray(support, dtype=np.int64))
        super().__init__(tuple(support.shape), prior_variance)
        self.register_buffer("support", support)
        self._tensor_steps = False  # True: the tensor-operation Adam step on the CPU too (the test of that path)

    def set_training_rows(self, X: sp.csr_matrix) -> None:
        """The number of rows the batches are drawn from."""
        self.n_rows = X.shape[0]

    def utilities(self, X: sp.csr_matrix) -> torch.Tensor:
        """X W^T (n, L) for prepared rows ``X`` (n, D), without gradients."""
        weight = self.weight.detach().cpu()
        out = support_products(sp.csc_matrix(X), self.support.cpu().numpy(), weight.numpy())
        return torch.from_numpy(out).T.contiguous().to(self.weight.device)

    def prior_gradient(self, block: SupportBlock, n_total: int) -> torch.Tensor:
        """The unbiased estimate, on ``block``, of the gradient of |W|^2 / (2 s2 N): whole rows of the
        sampled labels, weighted L / |S| (module docstring)."""
        label_weight = self.weight.shape[0] / block.sampled_positions.size
        gradient = torch.zeros_like(block.weight)
        rows = torch.as_tensor(block.sampled_positions, device=gradient.device)
        gradient[rows] = block.weight.detach()[rows] * (label_weight / (self.prior_variance * n_total))
        return gradient

    @torch.no_grad()
    def adam_step(self, block: SupportBlock, gradient: torch.Tensor, learning_rate: float) -> None:
        """One lazy Adam step on the block's rows of W (all K entries of each) with ``gradient``."""
        beta1, beta2 = ADAM_BETAS
        self.step += 1
        t = float(self.step)
        step_size = learning_rate / (1.0 - beta1**t)
        gradient = gradient.detach().to(self.weight.dtype)
        if self.weight.device.type == "cpu" and not self._tensor_steps:
            change = _lazy_adam_rows(self.weight.numpy(), self.exp_avg.numpy(), self.exp_avg_sq.numpy(), block.labels,
                                     gradient.contiguous().numpy(), step_size, beta1, beta2, 1.0 - beta2**t, ADAM_EPS)
        else:  # the same update by tensor operations, on any device
            rows = torch.as_tensor(block.labels, device=self.weight.device)
            m = self.exp_avg[rows].mul_(beta1).add_(gradient, alpha=1.0 - beta1)
            v = self.exp_avg_sq[rows].mul_(beta2).addcmul_(gradient, gradient, value=1.0 - beta2)
            old = self.weight[rows]
            new = old - step_size * m / (v / (1.0 - beta2**t)).sqrt_().add_(ADAM_EPS)
            change = float(new.double().pow(2).sum() - old.double().pow(2).sum())
            self.weight[rows], self.exp_avg[rows], self.exp_avg_sq[rows] = new, m, v
        if self._sq_norm is not None:
            self._sq_norm += change

    def curvature(self, X: sp.csr_matrix, lam: np.ndarray, labels: slice) -> np.ndarray:
        """d_ls = sum_i lam_il x_{i, S_ls}^2 (labels, K) for the labels ``labels``: the diagonal of the
        logistic log-likelihood's negative Hessian in the support weights
        (:func:`~bayesmlc.gp.linear_term.utility_curvature`'s, on the support), from the prepared rows
        ``X`` (n, D) and the weights lam (n, labels) of their entries."""
        squared = sp.csc_matrix(sp.csr_matrix(X, dtype=np.float64).multiply(X))
        support = self.support[labels].cpu().numpy()
        lam_t = np.ascontiguousarray(np.asarray(lam, dtype=np.float64).T)
        out = np.empty(support.shape)
        _support_gradient(squared.indptr, squared.indices, squared.data, support, lam_t, out, 0, support.shape[0])
        return out


@numba.njit(cache=True, nogil=True)
def _lazy_adam_rows(weight, exp_avg, exp_avg_sq, labels, gradient, step_size, beta1, beta2, bias_correction2, eps):
    """Adam's update (Kingma and Ba 2015, Algorithm 1) of the rows ``weight[labels[a]]`` with
    ``gradient[a]``, in place with their moments; returns the change of |W|^2 (float64)."""
    change = 0.0
    for a in range(labels.size):
        row = labels[a]
        for b in range(weight.shape[1]):
            g = gradient[a, b]
            m = beta1 * exp_avg[row, b] + (1.0 - beta1) * g
            v = beta2 * exp_avg_sq[row, b] + (1.0 - beta2) * g * g
            exp_avg[row, b] = m
            exp_avg_sq[row, b] = v
            old = float(weight[row, b])
            weight[row, b] = old - step_size * m / (math.sqrt(v / bias_correction2) + eps)
            new = float(weight[row, b])
            change += new * new - old * old
    return change
