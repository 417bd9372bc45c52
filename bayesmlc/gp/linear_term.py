"""MLGPF's per-label linear term: f_l(x) = sum_p Phi_lp h_p(x) + w_l^T x + b_l.

The shared latent GPs h of the journal paper (eq. (4)) rank through a rank-P map Phi, so a label
whose evidence is a few words of its own, outside the shared directions, is hard to express. The
term adds to each label an independent linear-kernel GP g_l(x) = w_l^T x with w_l ~ N(0, s2 I)
(Bayesian linear regression as a GP with the kernel s2 x^T x', Rasmussen and Williams 2006,
sec. 2.1-2.2): f stays a GP, with covariance Cov(f_l(x), f_k(x')) = k(x, x') sum_p Phi_lp Phi_kp +
[l = k] s2 x^T x'. This is the one-vs-rest linear model with an L2 penalty of the extreme-
classification literature (DiSMEC, Babbar and Schoelkopf 2017; the node classifiers of Parabel,
Prabhu et al. 2018), trained jointly with the factor model on the same minibatches.

W is a **MAP estimate**: the Gaussian prior enters as the penalty log p(W) = -|W|_F^2 / (2 s2) + c,
and the objective is the bound on log p(Y | W) from :mod:`bayesmlc.gp.objective` plus log p(W), a
lower bound on log p(Y, W) maximised over q(u) and W jointly (a point mass q(W), so W adds no
predictive variance).

**Sparse steps.** A step touches only the block T x C of W: T the labels of the minibatch's
likelihood entries (its positives and the shared sample of negatives), C the feature columns
present in its rows (stored entries). The data term's gradient is zero outside the block. The penalty's gradient
W / (s2 N) (per training row) is not; it enters as an unbiased estimate that lives inside the block:
on the sampled labels S (each in S with probability |S| / L) and the present columns (column j in
a uniform batch of B of the N rows with probability p_j = 1 - C(N - df_j, B) / C(N, B), df_j its
rows with a stored entry), weighted (L / |S|) / p_j, so its expectation over the draws is the full
gradient. W then takes a lazy Adam step on the block (the rule of ``torch.optim.SparseAdam``: the
moments of untouched entries are left as they are). The products X_b W_S^T and X_b^T G are
compiled gathers over the batch's stored entries (:func:`bayesmlc.linalg._csr_rows_times_dense`),
so a step costs O(nnz(X_b) |S| + |T| |C|), not O(L D).

**Memory.** W is dense (L, D) with two Adam moments: 12 bytes per entry in float32. The term is
allowed when L x D is at most ``linear_max_entries`` (default 2^26: 805 MB in float32; EURLex-4K's
3,993 x 5,000 takes 240 MB, AmazonCat-13K's 13,330 x 203,882 would take 33 GB and is refused).
"""

from __future__ import annotations

import math

import numba
import numpy as np
import scipy.sparse as sp
import torch
from scipy.special import gammaln
from torch import nn

from ..exceptions import ValidationError
from ..linalg import _csr_rows_times_dense
from ..utils import csr_to_torch

__all__ = ["OPTIMISER_STATE", "LinearTerm", "LinearBlock", "PenalisedLinearWeights", "check_linear_term",
           "column_inclusion_probability", "sparse_times_block"]

#: the module's state dict entries of W's training state (its lazy Adam's moments and step, and the prior
#: variance s2 that ``linear_prior_variance="evidence"`` updates): in checkpoints (exact resume), not in
#: model files (predictions do not use them)
OPTIMISER_STATE = ("exp_avg", "exp_avg_sq", "step", "prior_variance_now")
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


def check_linear_term(settings, n_labels: int, n_features: int, world_size: int = 1) -> None:
    """Refuse ``linear_term=True`` where it cannot run: L x D above ``linear_max_entries``, several
    processes (its sparse steps are not reduced over processes), or per-row negative sampling (whose
    label inclusion probabilities the penalty's estimate does not know)."""
    if not getattr(settings, "linear_term", False):
        return
    n_features = min(n_features, getattr(settings, "linear_features", None) or n_features)
    if n_labels * n_features > settings.linear_max_entries:
        raise ValidationError(
            f"linear_term=True needs labels x features <= linear_max_entries={settings.linear_max_entries}, got "
            f"{n_labels} x {n_features} = {n_labels * n_features} (a dense W with two Adam moments takes 12 bytes "
            "an entry); raise linear_max_entries or set linear_term=False")
    if world_size > 1:
        raise ValidationError("linear_term=True trains in one process only; set linear_term=False for a "
                              "data-parallel fit")
    if uses_row_negatives(settings):
        raise ValidationError('linear_term=True needs negative_sampling="batch" (or negative_samples=None)')


def uses_row_negatives(settings) -> bool:
    """Whether ``settings`` sample negatives per row (whose label inclusion probabilities the linear
    term's penalty estimate does not know)."""
    return settings.negative_sampling == "row" and settings.negative_samples is not None


def column_inclusion_probability(doc_freq: np.ndarray, n_rows: int, batch_rows: int) -> np.ndarray:
    """P(column j has a non-zero in a batch of ``batch_rows`` rows drawn uniformly without replacement
    from ``n_rows``) = 1 - C(n - df_j, B) / C(n, B), for the columns' row counts ``doc_freq``."""
    df = np.asarray(doc_freq, dtype=np.float64)
    n, b = float(n_rows), float(batch_rows)
    spare = n - df
    log_none = gammaln(np.maximum(spare, 0) + 1) - gammaln(np.maximum(spare - b, 0) + 1) - gammaln(n + 1) \
        + gammaln(n - b + 1)
    return np.where(spare >= b, -np.expm1(log_none), 1.0)


class _SparseTimesBlockT(torch.autograd.Function):
    """X W^T for a scipy CSR X (B, C) and a dense W (S, C) on the CPU, with the gradient for W only,
    both products compiled gathers over X's stored entries (X^T G from a CSR copy of X^T)."""

    @staticmethod
    def forward(ctx, weight, X, X_t):
        dense = weight.detach().T.contiguous().numpy()  # (C, S): a row per stored entry's column
        out = np.empty((X.shape[0], weight.shape[0]), dtype=dense.dtype)
        _csr_rows_times_dense(X.indptr, X.indices, X.data.astype(dense.dtype, copy=False), dense, out, 0, X.shape[0])
        ctx.X_t = X_t
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx, grad_out):
        X_t = ctx.X_t
        grad = grad_out.contiguous().numpy()
        out = np.empty((X_t.shape[0], grad.shape[1]), dtype=grad.dtype)
        _csr_rows_times_dense(X_t.indptr, X_t.indices, X_t.data.astype(grad.dtype, copy=False), grad, out, 0,
                              X_t.shape[0])
        return torch.from_numpy(out).T, None, None


def sparse_times_block(weight: torch.Tensor, X: sp.csr_matrix, X_t: sp.csr_matrix | None = None) -> torch.Tensor:
    """X W^T (B, S) for a CSR ``X`` (B, C) and ``weight`` (S, C), differentiable in ``weight``;
    ``X_t`` a CSR copy of X^T (made here when None). CPU tensors take the compiled gathers, others
    PyTorch's sparse product."""
    if weight.device.type != "cpu":
        return torch.sparse.mm(csr_to_torch(X, weight.device, weight.dtype), weight.T)
    return _SparseTimesBlockT.apply(weight, X, sp.csr_matrix(X.T) if X_t is None else X_t)


class LinearBlock:
    """The block of W that one minibatch touches, as a leaf tensor whose gradient the bound fills.

    Parameters
    ----------
    term : LinearTerm
    X_rows : CSR (B, D), the batch's prepared rows
    sampled : int64 (S,), sorted, the labels whose B x S block of utilities the bound forms (all L
        labels when every label enters the bound)
    positive_rows, positive_labels : int64 (E,), the positive entries gathered one by one (empty
        arrays when the B x S block holds them)
    """

    def __init__(self, term: LinearTerm, X_rows: sp.csr_matrix, sampled: np.ndarray, positive_rows: np.ndarray,
                 positive_labels: np.ndarray):
        X_rows = sp.csr_matrix(X_rows)
        self.columns = np.unique(X_rows.indices).astype(np.int64)  # C
        self.labels = np.union1d(sampled, positive_labels).astype(np.int64)  # T
        self.X = sp.csr_matrix((X_rows.data, np.searchsorted(self.columns, X_rows.indices), X_rows.indptr),
                               shape=(X_rows.shape[0], self.columns.size))
        self.X_t = sp.csr_matrix(self.X.T)
        self.sampled_positions = np.searchsorted(self.labels, sampled)
        self.all_sampled = self.labels.size == sampled.size
        self.positive_rows = np.asarray(positive_rows, dtype=np.int64)
        self.positive_positions = np.searchsorted(self.labels, positive_labels)
        device = term.weight.device
        self._labels_t = torch.as_tensor(self.labels, device=device)
        self._columns_t = torch.as_tensor(self.columns, device=device)
        self.weight = term.weight.index_select(0, self._labels_t).index_select(1, self._columns_t).requires_grad_()

    def sampled_utilities(self) -> torch.Tensor:
        """w_l^T x_i for the batch's rows and the sampled labels: (B, S)."""
        weight = self.weight if self.all_sampled else self.weight[torch.as_tensor(self.sampled_positions)]
        return sparse_times_block(weight, self.X, self.X_t)

    def positive_utilities(self) -> torch.Tensor:
        """w_l^T x_i for the positive entries: (E,), each a sum over its row's stored entries."""
        X, rows = self.X, self.positive_rows
        lengths = np.diff(X.indptr)[rows]
        entry = np.repeat(np.arange(rows.size), lengths)
        offsets = np.arange(entry.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        stored = np.repeat(X.indptr[rows], lengths) + offsets
        flat = self.positive_positions[entry] * self.columns.size + X.indices[stored]
        values = torch.as_tensor(X.data[stored], dtype=self.weight.dtype, device=self.weight.device)
        terms = self.weight.reshape(-1)[torch.as_tensor(flat, device=self.weight.device)] * values
        out = torch.zeros(rows.size, dtype=self.weight.dtype, device=self.weight.device)
        return out.index_add(0, torch.as_tensor(entry, device=self.weight.device), terms)


class PenalisedLinearWeights(nn.Module):
    """What both forms of the linear term share: the weights W of ``shape`` (zeros at the start) with
    their lazy Adam moments and step, the prior variance s2 of w_l ~ N(0, s2 I), the penalty |W|^2 /
    (2 s2) and the minibatch's block (of the subclass's ``block_class``)."""

    block_class = None

    def __init__(self, shape: tuple, prior_variance: float):
        super().__init__()
        self.register_buffer("prior_variance_now", torch.tensor(float(prior_variance), dtype=torch.float64))
        self.register_buffer("weight", torch.zeros(shape))
        self.register_buffer("exp_avg", torch.zeros(shape))
        self.register_buffer("exp_avg_sq", torch.zeros(shape))
        self.register_buffer("step", torch.zeros(()))
        self.n_rows = None
        self._sq_norm = None  # |W|_F^2, kept up to date by adam_step

    @property
    def prior_variance(self) -> float:
        """s2 of the prior w_l ~ N(0, s2 I) (a buffer, so that a checkpoint keeps an evidence-updated one)."""
        return float(self.prior_variance_now)

    @prior_variance.setter
    def prior_variance(self, value: float) -> None:
        self.prior_variance_now.fill_(float(value))

    def _load_from_state_dict(self, *args, **kwargs):
        self._sq_norm = None  # W is replaced: form |W|^2 again when asked
        super()._load_from_state_dict(*args, **kwargs)

    def penalty(self) -> float:
        """-log p(W) up to its constant: |W|_F^2 / (2 s2) (|W|^2 formed once, then updated by each step)."""
        if self._sq_norm is None:
            self._sq_norm = float(self.weight.double().pow(2).sum())
        return self._sq_norm / (2.0 * self.prior_variance)

    def block(self, X_rows, targets):
        """The block (a ``block_class``) of a minibatch with ``targets`` of
        :func:`~bayesmlc.gp.training.minibatch_targets` ("full" or "shared")."""
        if targets[0] == "full":
            empty = np.zeros(0, dtype=np.int64)
            return self.block_class(self, X_rows, np.arange(self.weight.shape[0], dtype=np.int64), empty, empty)
        if targets[0] != "shared":
            raise ValidationError('linear_term=True needs negative_sampling="batch" (or negative_samples=None)')
        entries = targets[1]
        return self.block_class(self, X_rows, entries.labels, entries.positives.rows, entries.positives.labels)


class LinearTerm(PenalisedLinearWeights):
    """W (L, D) of the per-label linear term with its lazy Adam state (module docstring).

    Parameters
    ----------
    n_labels, n_features : the shape of W (zeros at the start)
    prior_variance : s2 of w_l ~ N(0, s2 I)
    """

    block_class = LinearBlock

    def __init__(self, n_labels: int, n_features: int, prior_variance: float):
        super().__init__((n_labels, n_features), prior_variance)
        self.doc_freq = None

    def set_training_rows(self, X: sp.csr_matrix) -> None:
        """The rows the batches are drawn from: their count and each column's rows with a stored entry
        (the columns a batch's block holds are those of its stored entries, zeros included)."""
        X = sp.csr_matrix(X)
        self.doc_freq = np.bincount(X.indices, minlength=X.shape[1])
        self.n_rows = X.shape[0]

    def utilities(self, X: sp.csr_matrix) -> torch.Tensor:
        """X W^T (n, L) for prepared rows ``X`` (n, D), without gradients."""
        with torch.no_grad():
            return torch.sparse.mm(csr_to_torch(X, self.weight.device, self.weight.dtype), self.weight.T)

    def curvature(self, X: sp.csr_matrix, lam: np.ndarray, labels: slice) -> np.ndarray:
        """d_lj = sum_i lam_il x_ij^2 (labels, D) for the labels ``labels`` (:func:`utility_curvature`),
        from the prepared rows ``X`` (n, D) and the weights lam (n, labels) of their entries."""
        squared = sp.csr_matrix(X, dtype=np.float64).multiply(X).tocsr()
        return np.asarray((squared.T @ lam).T)

    def prior_gradient(self, block: LinearBlock, n_total: int) -> torch.Tensor:
        """The unbiased estimate, on ``block``, of the gradient of |W|^2 / (2 s2 N) (per training row):
        non-zero on the sampled labels and present columns, weighted by their inverse inclusion
        probabilities (module docstring). ``n_total``: N."""
        n_labels = self.weight.shape[0]
        label_weight = n_labels / block.sampled_positions.size
        inclusion = column_inclusion_probability(self.doc_freq[block.columns], self.n_rows, block.X.shape[0])
        column_weight = torch.as_tensor(label_weight / inclusion, dtype=self.weight.dtype, device=self.weight.device)
        gradient = torch.zeros_like(block.weight)
        rows = torch.as_tensor(block.sampled_positions, device=self.weight.device)
        gradient[rows] = block.weight.detach()[rows] * column_weight / (self.prior_variance * n_total)
        return gradient

    @torch.no_grad()
    def adam_step(self, block: LinearBlock, gradient: torch.Tensor, learning_rate: float) -> None:
        """One lazy Adam step (``torch.optim.SparseAdam``'s rule) on ``block``'s entries of W with
        ``gradient`` (the loss's, per training row); untouched entries and their moments stay. On the
        CPU one compiled pass over the block (:func:`_lazy_adam_block`): the gathers and scatters of
        three (T, C) blocks by advanced indexing took 0.43 s of a 0.63 s step at the EURLex-4K shape
        (scale 0.25, 311-row batches, one thread)."""
        beta1, beta2 = ADAM_BETAS
        self.step += 1
        t = float(self.step)
        step_size = learning_rate / (1.0 - beta1**t)
        if self.weight.device.type == "cpu":
            change = _lazy_adam_block(self.weight.numpy(), self.exp_avg.numpy(), self.exp_avg_sq.numpy(),
                                      block.labels, block.columns,
                                      gradient.detach().to(self.weight.dtype).contiguous().numpy(),
                                      step_size, beta1, beta2, 1.0 - beta2**t, ADAM_EPS)
            if self._sq_norm is not None:
                self._sq_norm += change
            return
        rows, cols = block._labels_t[:, None], block._columns_t[None, :]
        m = self.exp_avg[rows, cols].mul_(beta1).add_(gradient, alpha=1.0 - beta1)
        v = self.exp_avg_sq[rows, cols].mul_(beta2).addcmul_(gradient, gradient, value=1.0 - beta2)
        denominator = (v / (1.0 - beta2**t)).sqrt_().add_(ADAM_EPS)
        old = block.weight.detach()
        new = old - step_size * m / denominator
        if self._sq_norm is not None:
            self._sq_norm += float(new.double().pow(2).sum() - old.double().pow(2).sum())
        self.weight[rows, cols] = new
        self.exp_avg[rows, cols] = m
        self.exp_avg_sq[rows, cols] = v


@numba.njit(cache=True, nogil=True)
def _lazy_adam_block(weight, exp_avg, exp_avg_sq, labels, columns, gradient, step_size, beta1, beta2,
                     bias_correction2, eps):
    """Adam's update (Kingma and Ba 2015, Algorithm 1) of the entries ``weight[labels[a], columns[b]]``
    with ``gradient[a, b]``, in place with their moments, in one pass; ``step_size`` is the rate over
    the first moment's bias correction. Returns the change of |W|^2 (in float64)."""
    change = 0.0
    for a in range(labels.size):
        row = labels[a]
        for b in range(columns.size):
            col = columns[b]
            g = gradient[a, b]
            m = beta1 * exp_avg[row, col] + (1.0 - beta1) * g
            v = beta2 * exp_avg_sq[row, col] + (1.0 - beta2) * g * g
            exp_avg[row, col] = m
            exp_avg_sq[row, col] = v
            old = float(weight[row, col])
            weight[row, col] = old - step_size * m / (math.sqrt(v / bias_correction2) + eps)
            new = float(weight[row, col])
            change += new * new - old * old
    return change


def curvature_weights(f_mean: np.ndarray, label_mask: sp.csr_matrix | None = None) -> np.ndarray:
    """lambda_il = sigmoid(f_il) (1 - sigmoid(f_il)) at the utilities ``f_mean`` (n, L), 0 outside
    ``label_mask`` (entries without a likelihood)."""
    lam = 1.0 / (1.0 + np.exp(-np.asarray(f_mean, dtype=np.float64)))
    lam *= 1.0 - lam
    if label_mask is not None:
        lam *= sp.csr_matrix(label_mask).toarray() != 0
    return lam


def utility_curvature(X: sp.csr_matrix, f_mean: np.ndarray, label_mask: sp.csr_matrix | None = None) -> np.ndarray:
    """d_lj = sum_i lambda_il x_ij^2 (L, D): the diagonal of the logistic log-likelihood's negative
    Hessian in w_l (the Gauss-Newton / Laplace curvature, lambda of :func:`curvature_weights` at the
    utilities ``f_mean`` (n, L) of the prepared rows ``X`` (n, D))."""
    squared = sp.csr_matrix(X, dtype=np.float64).multiply(X).tocsr()
    return np.asarray((squared.T @ curvature_weights(f_mean, label_mask)).T)


def evidence_prior_variance(weight: np.ndarray, curvature: np.ndarray, prior_variance: float):
    """MacKay's evidence update of s2 for w_l ~ N(0, s2 I) at the MAP ``weight`` (L, D) fitted with
    ``prior_variance``, under the Laplace approximation with the diagonal ``curvature`` d of
    :func:`utility_curvature` (MacKay 1992, "Bayesian interpolation"; Bishop 2006, eqs. (3.91)-(3.92);
    for a logistic likelihood Tipping 2001, sec. 2.4): gamma = sum_lj s2 d_lj / (1 + s2 d_lj), the
    number of well-determined weights, and s2_new = |W|^2 / gamma. Returns (s2_new, gamma)."""
    d = np.asarray(curvature, dtype=np.float64)
    gamma = float(np.sum(prior_variance * d / (1.0 + prior_variance * d)))
    sq_norm = float(np.sum(np.asarray(weight, dtype=np.float64) ** 2))
    return (sq_norm / gamma if gamma > 0 else 0.0), gamma


#: :func:`evidence_update` forms the curvature of at most this many (label, feature) entries at a time.
CURVATURE_BLOCK_ENTRIES = 1 << 23


def evidence_update(term: LinearTerm, X: sp.csr_matrix, f_mean: np.ndarray, label_mask: sp.csr_matrix | None,
                    row_weight: float):
    """MacKay's update of ``term``'s s2 (:func:`evidence_prior_variance`) from the prepared rows ``X``
    (n, D), a uniform sample of the training rows, their utilities ``f_mean`` (n, L) and
    ``label_mask`` (or None); each row stands for ``row_weight`` training rows (N / n), so the
    curvature is an unbiased estimate of the training rows'. The curvature is formed a block of
    labels at a time (:data:`CURVATURE_BLOCK_ENTRIES`). Returns (s2_new, gamma); ``term`` is left as
    it is."""
    weight = term.weight.detach().cpu().double().numpy()
    n_labels, n_features = weight.shape
    step = max(1, CURVATURE_BLOCK_ENTRIES // n_features)
    s2, gamma = term.prior_variance, 0.0
    for start in range(0, n_labels, step):
        labels = slice(start, start + step)
        mask = None if label_mask is None else sp.csr_matrix(label_mask)[:, labels]
        curvature = row_weight * term.curvature(X, curvature_weights(f_mean[:, labels], mask), labels)
        gamma += evidence_prior_variance(weight[labels], curvature, s2)[1]
    sq_norm = float(np.sum(weight**2))
    return (sq_norm / gamma if gamma > 0 else 0.0), gamma
