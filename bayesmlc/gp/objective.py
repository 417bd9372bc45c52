"""The doubly stochastic evidence lower bound of MLGPF.

For a minibatch B of the N training rows (journal paper sec. 4.2):

    ELBO_hat = (N / |B|) sum_{i in B} [ sum_{k in P_i} E log sigmoid(f_ik)
                                       + (|N_i| / |L_i|) sum_{l in L_i} E log sigmoid(-f_il) ]
               - kl_weight * sum_p KL[q(u_p) || p(u_p)]

with P_i the observed positives of row i, N_i its observed negatives and L_i either N_i (all labels,
``negative_samples=None``) or a uniform sample of ``negative_samples`` of them drawn without
replacement, which makes ELBO_hat an unbiased estimate of the bound. Label entries masked out by
``label_mask`` are in neither set: they leave the likelihood.

``negative_sampling="batch"`` draws one sample S of ``negative_samples`` labels per minibatch,
uniformly without replacement from all L labels, and every row of the batch uses it:

    sum_{k in P_i} E log sigmoid(f_ik) + (L / |S|) sum_{l in S cap N_i} E log sigmoid(-f_il)

Each label is in S with probability |S| / L, so the expectation over S of the second sum is the sum
over all of N_i: the estimate is unbiased as well (tests/gp/test_gp_objective.py checks it by Monte
Carlo). Its negatives form a dense B x |S| block of utility moments, two (B, P) x (P, |S|) products,
with no per-row sampling or gathering.

The utilities are f_i = Phi h_i + b with q(h_ip) = N(mean_ip, var_ip) independent over p, so
q(f_ik) = N(sum_p Phi_kp mean_ip + b_k, sum_p Phi_kp^2 var_ip).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from ..distributed import ONE_PROCESS
from .inducing import FeatureBatch
from .likelihoods import BernoulliLogit

__all__ = [
    "AUTO_NEGATIVE_LABELS", "AUTO_NEGATIVE_SAMPLES", "NEGATIVE_SAMPLING", "resolve_negative_samples", "LabelEntries",
    "SharedNegatives", "sample_label_entries", "sample_shared_negatives", "data_term_full", "data_term_sampled",
    "data_term_shared", "utility_moments",
]

#: ``negative_sampling``: "batch" draws one set of labels per minibatch (the default), "row" negatives for each row.
NEGATIVE_SAMPLING = ("batch", "row")


#: ``negative_samples="auto"``: all labels enter the bound up to this many labels; above it each row
#: takes its positives and ``AUTO_NEGATIVE_SAMPLES`` sampled negatives.
AUTO_NEGATIVE_LABELS = 1000
AUTO_NEGATIVE_SAMPLES = 500
#: :func:`data_term_sampled` forms the batch's utility moments densely up to this many B x L entries.
DENSE_MOMENT_ENTRIES = 1 << 26


def resolve_negative_samples(setting, n_labels: int) -> int | None:
    """The negatives sampled per row (None = all labels) for ``negative_samples=setting``.

    ``"auto"``: None when ``n_labels <= AUTO_NEGATIVE_LABELS`` (1000), otherwise
    ``AUTO_NEGATIVE_SAMPLES`` (500). Above 1000 labels the full data term (B L Q quadrature nodes and
    two B x P x L products) costs more per row than the kernel and variational work at the default
    P, M, R; 500 negatives cut it by at least half and by 8x on EURLex-4K (L = 3,993), 27x on
    AmazonCat-13K (L = 13,330), and the estimator stays unbiased (module docstring).
    """
    if isinstance(setting, str) and setting == "auto":
        return None if n_labels <= AUTO_NEGATIVE_LABELS else AUTO_NEGATIVE_SAMPLES
    return setting


@dataclass
class LabelEntries:
    """Label entries of a minibatch that enter the likelihood, in coordinate form (E entries).

    rows, labels : int64 (E,), batch row and label index
    signs : (E,) +1 for a positive, -1 for a negative
    weights : (E,) 1 for positives, |N_i| / |L_i| for sampled negatives
    """

    rows: np.ndarray
    labels: np.ndarray
    signs: np.ndarray
    weights: np.ndarray


@dataclass
class SharedNegatives:
    """Label entries of a minibatch whose rows share one sample of labels (``negative_sampling="batch"``).

    positives : LabelEntries, every positive of the batch (signs +1, weights 1)
    labels : int64 (S,), the sampled labels, sorted
    weights : (B, S), L / S where ``labels[s]`` is an observed negative of row i, 0 elsewhere (a
        positive, or an entry masked out); 1 instead of L / S when S = L (every label taken)
    """

    positives: LabelEntries
    labels: np.ndarray
    weights: np.ndarray


def _complement_from_ranks(ranks: np.ndarray, positives: np.ndarray) -> np.ndarray:
    """Map ranks k in [0, L - |P|) to the k-th smallest label not in ``positives`` (sorted)."""
    shifted = positives - np.arange(positives.size)
    return ranks + np.searchsorted(shifted, ranks, side="right")


def sample_label_entries(
    Y: sp.csr_matrix, label_mask: sp.csr_matrix | None, negative_samples: int, rng: np.random.Generator
) -> LabelEntries:
    """All positives and a uniform sample of ``negative_samples`` negatives per row (sec. 4.2).

    Parameters
    ----------
    Y : CSR (B, L), observed positives (sorted indices)
    label_mask : CSR (B, L) of observed entries, or None (all observed)
    negative_samples : int >= 1, |L_i| (rows with fewer negatives use all of them, weight 1)
    rng : the generator the draws come from
    """
    n_rows, n_labels = Y.shape
    rows, labels, signs, weights = [], [], [], []
    for i in range(n_rows):
        positives = Y.indices[Y.indptr[i] : Y.indptr[i + 1]].astype(np.int64)
        if label_mask is None:
            n_negatives = n_labels - positives.size
            if n_negatives <= negative_samples:
                negatives = _complement_from_ranks(np.arange(n_negatives), positives)
            else:
                ranks = np.sort(rng.choice(n_negatives, negative_samples, replace=False))
                negatives = _complement_from_ranks(ranks, positives)
        else:
            observed = label_mask.indices[label_mask.indptr[i] : label_mask.indptr[i + 1]].astype(np.int64)
            all_negatives = np.setdiff1d(observed, positives, assume_unique=True)
            n_negatives = all_negatives.size
            if n_negatives <= negative_samples:
                negatives = all_negatives
            else:
                negatives = np.sort(rng.choice(all_negatives, negative_samples, replace=False))
        weight = n_negatives / negatives.size if negatives.size else 0.0
        rows.append(np.full(positives.size + negatives.size, i, dtype=np.int64))
        labels.append(np.concatenate([positives, negatives]))
        signs.append(np.concatenate([np.ones(positives.size), -np.ones(negatives.size)]))
        weights.append(np.concatenate([np.ones(positives.size), np.full(negatives.size, weight)]))
    return LabelEntries(
        rows=np.concatenate(rows),
        labels=np.concatenate(labels),
        signs=np.concatenate(signs),
        weights=np.concatenate(weights),
    )


def sample_shared_negatives(
    Y: sp.csr_matrix, label_mask: sp.csr_matrix | None, n_sampled: int, rng: np.random.Generator
) -> SharedNegatives:
    """All positives of the batch and one uniform sample of ``n_sampled`` labels (without
    replacement, from all L; every label when ``n_sampled >= L``, with no draw) for all of its rows.

    Parameters
    ----------
    Y : CSR (B, L), observed positives
    label_mask : CSR (B, L) of observed entries, or None (all observed)
    n_sampled : int >= 1, |S|
    rng : the generator the draw comes from (one draw per batch, whatever B is)
    """
    n_rows, n_labels = Y.shape
    if n_sampled >= n_labels:
        labels, weight = np.arange(n_labels, dtype=np.int64), 1.0
    else:
        labels, weight = np.sort(rng.choice(n_labels, n_sampled, replace=False)).astype(np.int64), n_labels / n_sampled
    negative = 1.0 - Y[:, labels].toarray()
    if label_mask is not None:
        negative *= label_mask[:, labels].toarray() != 0
    counts = np.diff(Y.indptr)
    positives = LabelEntries(
        rows=np.repeat(np.arange(n_rows, dtype=np.int64), counts),
        labels=Y.indices.astype(np.int64),
        signs=np.ones(Y.indices.size),
        weights=np.ones(Y.indices.size),
    )
    return SharedNegatives(positives=positives, labels=labels, weights=weight * negative)


def utility_moments(mean_h: torch.Tensor, var_h: torch.Tensor, Phi: torch.Tensor, bias: torch.Tensor):
    """Mean and variance of q(f) for every label: each (B, L), from (B, P) latent marginals."""
    return mean_h @ Phi.T + bias, var_h @ Phi.pow(2).T


def data_term_full(
    likelihood: BernoulliLogit,
    mean_h: torch.Tensor,
    var_h: torch.Tensor,
    Phi: torch.Tensor,
    bias: torch.Tensor,
    Y: torch.Tensor,
    mask: torch.Tensor | None,
    linear=None,
) -> torch.Tensor:
    """sum_i sum_k E log p(y_ik | f_ik) over all (observed) labels; ``Y``, ``mask`` dense (B, L) 0/1;
    ``linear``: the batch's :class:`~bayesmlc.gp.linear_term.LinearBlock` (its w_l^T x_i added to the
    means) or None."""
    f_mean, f_var = utility_moments(mean_h, var_h, Phi, bias)
    if linear is not None:
        f_mean = f_mean + linear.sampled_utilities()
    expected = likelihood.expected_log_lik(f_mean, f_var, 2.0 * Y - 1.0)
    return expected.sum() if mask is None else (expected * mask).sum()


def _gathered_moments(mean_h, var_h, Phi, bias, rows, labels):
    """Mean and variance of the utilities f_il of the entries (rows[e], labels[e]), from the gathered
    rows of Phi (E, P) and of the latent moments: no B x L block is formed."""
    Phi_e = Phi[labels]  # (E, P)
    return (mean_h[rows] * Phi_e).sum(-1) + bias[labels], (var_h[rows] * Phi_e.pow(2)).sum(-1)


def data_term_sampled(
    likelihood: BernoulliLogit,
    mean_h: torch.Tensor,
    var_h: torch.Tensor,
    Phi: torch.Tensor,
    bias: torch.Tensor,
    entries: LabelEntries,
) -> torch.Tensor:
    """The weighted sum over the sampled entries (positives + reweighted negatives).

    When the batch's B x L utility moments take at most ``DENSE_MOMENT_ENTRIES`` entries they are
    formed densely (two (B, P) x (P, L) products) and the E sampled entries are gathered from them:
    on one CPU thread at B = 500, P = 100, L = 3,993, E = 252,650 that took 0.07 s forward and
    backward against 0.97 s for gathering (E, P) rows of Phi and of the marginals, whose backward
    scatters E x P values. Above the limit (hundreds of thousands of labels) the rows are gathered.
    """
    device, dtype = mean_h.device, mean_h.dtype
    rows = torch.as_tensor(entries.rows, device=device)
    labels = torch.as_tensor(entries.labels, device=device)
    n_labels = Phi.shape[0]
    if mean_h.shape[0] * n_labels <= DENSE_MOMENT_ENTRIES:
        f_mean_all, f_var_all = utility_moments(mean_h, var_h, Phi, bias)  # (B, L) each
        flat = rows * n_labels + labels
        f_mean = f_mean_all.reshape(-1).index_select(0, flat)
        f_var = f_var_all.reshape(-1).index_select(0, flat)
    else:
        f_mean, f_var = _gathered_moments(mean_h, var_h, Phi, bias, rows, labels)
    signs = torch.as_tensor(entries.signs, device=device, dtype=dtype)
    weights = torch.as_tensor(entries.weights, device=device, dtype=dtype)
    return (likelihood.expected_log_lik(f_mean, f_var, signs) * weights).sum()


def data_term_shared(
    likelihood: BernoulliLogit,
    mean_h: torch.Tensor,
    var_h: torch.Tensor,
    Phi: torch.Tensor,
    bias: torch.Tensor,
    entries: SharedNegatives,
    linear=None,
) -> torch.Tensor:
    """The positives' expected log-likelihoods plus the weighted B x S block of the shared negatives.

    The positives gather their rows of Phi (a few per row); the negatives take two (B, P) x (P, S)
    products and B S quadratures. ``mean_h``, ``var_h``: (B, P); ``Phi``: (L, P); ``bias``: (L,);
    ``linear``: the batch's :class:`~bayesmlc.gp.linear_term.LinearBlock` (its w_l^T x_i added to the
    means) or None.
    """
    device, dtype = mean_h.device, mean_h.dtype
    rows = torch.as_tensor(entries.positives.rows, device=device)
    positive_labels = torch.as_tensor(entries.positives.labels, device=device)
    f_mean, f_var = _gathered_moments(mean_h, var_h, Phi, bias, rows, positive_labels)
    if linear is not None:
        f_mean = f_mean + linear.positive_utilities()
    one = torch.ones((), device=device, dtype=dtype)
    positive = likelihood.expected_log_lik(f_mean, f_var, one).sum()
    sampled = torch.as_tensor(entries.labels, device=device)
    f_mean_s, f_var_s = utility_moments(mean_h, var_h, Phi[sampled], bias[sampled])  # (B, S) each
    if linear is not None:
        f_mean_s = f_mean_s + linear.sampled_utilities()
    weights = torch.as_tensor(entries.weights, device=device, dtype=dtype)
    return positive + (likelihood.expected_log_lik(f_mean_s, f_var_s, -one) * weights).sum()


# ---- the parameters, the conditional and the minibatch bound ----------------------------------------
__all__ += ["MLGPFModule", "StageClock", "latent_marginals", "BoundEstimate", "minibatch_elbo", "VariationalELBO"]


class MLGPFModule(nn.Module):
    """The parameters of the bound: kernel, inducing inputs, q(u), loadings Phi (L, P), bias b (L,),
    and the per-label linear term (a :class:`~bayesmlc.gp.linear_term.LinearTerm`, or None)."""

    def __init__(self, kernel, inducing, variational, Phi: np.ndarray, bias: np.ndarray, linear=None):
        super().__init__()
        self.kernel = kernel
        self.inducing = inducing
        self.variational = variational
        self.Phi = nn.Parameter(torch.as_tensor(np.asarray(Phi, dtype=np.float32)))
        self.bias = nn.Parameter(torch.as_tensor(np.asarray(bias, dtype=np.float32)))
        self.linear = linear


class StageClock:
    """Adds the wall time of each stage of a step to ``timings`` (a dict: stage -> seconds) when one is
    given; otherwise does nothing."""

    def __init__(self, timings: dict | None):
        self.timings = timings
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        """Add the time since the last lap (or restart) to stage ``name``."""
        if self.timings is not None:
            now = time.perf_counter()
            self.timings[name] = self.timings.get(name, 0.0) + now - self.last
            self.last = now

    def restart(self) -> None:
        """Start the next stage now (the time since the last lap was counted elsewhere)."""
        self.last = time.perf_counter()


def latent_marginals(module: MLGPFModule, batch: FeatureBatch, jitter: float, timings: dict | None = None,
                     need_var: bool = True):
    """The conditional: the marginals q(h_p(x_i)) = N(mean_ip, var_ip) of q(h) = int p(h | u) q(u) du
    for the B rows of ``batch`` (journal paper eqs. (9)-(10); the family's form in
    :mod:`bayesmlc.gp.variational`).

    Returns (mean_h (B, P), var_h (B, P) or None when ``need_var`` is False, the step's
    :class:`~bayesmlc.gp.variational.Prepared` factorisations). ``timings``: seconds per stage
    ("kernels", "factorisations", "marginals") are added to it.
    """
    clock = StageClock(timings)
    inner = module.inducing.inner_products(batch, module.kernel.input_weights())
    blocks = module.kernel(inner)
    clock.lap("kernels")
    prep = module.variational.prepare(blocks.zz, jitter)
    clock.lap("factorisations")
    if not need_var:
        return blocks.xz @ module.variational.mean_weights(prep), None, prep
    mean_h, var_h = module.variational.marginals(prep, blocks.xz, blocks.xx)
    clock.lap("marginals")
    return mean_h, var_h, prep


class BoundEstimate(NamedTuple):
    """One minibatch estimate of the bound: ``elbo`` (scalar tensor, with gradients), ``kl`` (sum_p KL),
    ``mean_h`` (B, P) latent means of the batch, ``jitter`` (the relative jitter K_ZZ needed)."""

    elbo: torch.Tensor
    kl: torch.Tensor
    mean_h: torch.Tensor
    jitter: float


def minibatch_elbo(module: MLGPFModule, likelihood: BernoulliLogit, batch: FeatureBatch, targets, n_total: float,
                   kl_weight: float, jitter: float, timings: dict | None = None, linear=None) -> BoundEstimate:
    """The doubly stochastic ELBO estimate for one minibatch (module docstring):
    (n_total / B) * data term - kl_weight * sum_p KL, and with the linear term - |W|^2 / (2 s2).

    ``targets`` is ``("full", Y_dense, mask_dense_or_None)``, ``("sampled", LabelEntries)`` or
    ``("shared", SharedNegatives)``. ``timings`` as in :func:`latent_marginals`, plus "quadrature"
    and "kl". ``linear``: the batch's :class:`~bayesmlc.gp.linear_term.LinearBlock` when the module
    has a linear term (its gradient fills the block; the penalty enters the value only, its gradient
    is :meth:`~bayesmlc.gp.linear_term.LinearTerm.prior_gradient`).
    """
    mean_h, var_h, prep = latent_marginals(module, batch, jitter, timings)
    clock = StageClock(timings)
    if targets[0] == "full":
        data = data_term_full(likelihood, mean_h, var_h, module.Phi, module.bias, targets[1], targets[2], linear)
    elif targets[0] == "shared":
        data = data_term_shared(likelihood, mean_h, var_h, module.Phi, module.bias, targets[1], linear)
    else:
        data = data_term_sampled(likelihood, mean_h, var_h, module.Phi, module.bias, targets[1])
    clock.lap("quadrature")
    kl = module.variational.kl(prep).sum()
    clock.lap("kl")
    n_batch = batch.sq_norm.shape[0]
    scale = n_total / n_batch if n_batch else 0.0  # a data-parallel rank may get no rows of a short batch
    penalty = module.linear.penalty() if linear is not None else 0.0
    return BoundEstimate(scale * data - kl_weight * kl - penalty, kl, mean_h, prep.jitter)


class VariationalELBO:
    """The evidence lower bound of ``num_data`` training rows as a training objective: each call
    estimates it on one minibatch (:func:`minibatch_elbo`), and :meth:`loss` is the negated estimate
    per training row, the quantity the optimiser minimises.

    Parameters
    ----------
    likelihood : BernoulliLogit, with its quadrature
    num_data : int, N, the training rows the minibatch stands for
    kl_weight : float, weight of sum_p KL (1 = the bound itself)
    """

    def __init__(self, likelihood: BernoulliLogit, num_data: int, kl_weight: float = 1.0):
        self.likelihood = likelihood
        self.num_data = num_data
        self.kl_weight = kl_weight

    def __call__(self, module: MLGPFModule, batch: FeatureBatch, targets, jitter: float, rows_in_batch: int | None = None,
                 strategy=ONE_PROCESS, timings: dict | None = None, linear=None) -> BoundEstimate:
        """The estimate on ``batch``; under data parallelism ``batch`` holds this process's rows of a
        global minibatch of ``rows_in_batch`` rows (None: all of them) and ``strategy`` weighs the
        terms so that the processes' estimates sum to the one-process estimate
        (:meth:`~bayesmlc.distributed.DataParallel.bound_weights`). ``linear``: as for
        :func:`minibatch_elbo`."""
        n_here = batch.sq_norm.shape[0]
        n_scale, kl_weight = strategy.bound_weights(self.num_data, self.kl_weight, n_here,
                                                    n_here if rows_in_batch is None else rows_in_batch)
        return minibatch_elbo(module, self.likelihood, batch, targets, n_scale, kl_weight, jitter, timings, linear)

    def loss(self, estimate: BoundEstimate) -> torch.Tensor:
        """-ELBO / N: the bound per training row, negated."""
        return -estimate.elbo / self.num_data
