"""The BMLS Gibbs sweep as small step functions on an explicit state.

Notation (paper: Zhao, Rai, Du & Buntine, AISTATS 2018; layout follows the authors' code):
N instances, L labels, D' = D + 1 binary features (the last one is the all-ones bias feature of
eq. (8)), K topics.

* ``phi`` (L, K): topics over labels, columns on the simplex (eq. (7)).
* ``h`` (D', K): feature weights; theta_kn = prod_{d: x_nd = 1} h_dk (eq. (8)); ``theta`` is stored
  transposed as (N, K) so that the rows touched by a feature are contiguous.
* y_ln = 1[z_ln > 0], z_ln ~ Poisson(sum_k phi_lk theta_kn) (eqs. (1), (2), (4)).

Missing labels. ``mask`` marks the *observed* label entries. An unobserved entry contributes no
likelihood term. With the Bernoulli-Poisson link the zeros enter only through the exposure, so

* theta / h see the per-instance exposure e_nk = sum_{l observed for n} phi_lk (instead of 1):
  h_dk | . ~ Gamma(mu0 + c_dk, nu0 + sum_{n: x_nd=1} e_nk theta_kn / h_dk), exact;
* phi is not conjugate any more (the exposure sum_l phi_lk W_lk has W_lk = sum of theta_kn over the
  instances where l is observed, which differs between labels). We augment: the latent counts of the
  unobserved entries are drawn from their prior predictive, z_lnk ~ Poisson(phi_lk theta_kn); only
  their per-(label, topic) totals Z^u_lk ~ Poisson(phi_lk W^u_lk), W^u_lk = sum over instances where
  l is unobserved of theta_kn, enter phi's conditional, which becomes Dirichlet(beta0 + B + Z^u)
  because the complete-data exposure sum_l phi_lk sum_n theta_kn = sum_n theta_kn no longer
  depends on phi. The augmented counts are discarded after the phi draw (a data-augmentation step
  for p(phi | rest), which leaves the target invariant); h is then drawn with them integrated out.

Label co-occurrence (BMLS-co, eqs. (10)-(12), (17)-(18), (25)-(27)): c_ij ~ Poisson(sum_k phi_ik
lambda_k phi_jk) for the pairs i < j (the authors' code) or i <= j (``pair_diagonal``: the diagonal
c_ii of C = Y^T Y, the number of instances carrying label i, is modelled too, as the paper's C = Y^T Y
and the sum over all (l, m) in eq. (25) include it). The exposure of topic k per unit of lambda_k is
E_k = sum_{i<j} phi_ik phi_jk = (1 - |phi_k|^2) / 2, or (1 + |phi_k|^2) / 2 with the diagonal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import numba
import numpy as np
import scipy.sparse as sp

from .samplers import (
    allocate_label_tokens,
    allocate_pair_tokens,
    crt,
    dirichlet_columns,
    positive_rates,
    standard_gamma_draw,
    zero_truncated_poisson,
)
from .support_term import (
    SupportData,
    initial_support_weights,
    sample_support_weights,
    split_support_tokens,
    support_rates,
)

__all__ = [
    "SweepData",
    "SamplerState",
    "positive_rates",
    "add_feature_token_counts",
    "sweep_feature_weights",
    "theta_from_log_h",
    "label_log_likelihood",
    "gibbs_sweep",
    "heldout_log_likelihood",
    "init_state",
    "sample_topic_parameters",
    "unobserved_tokens_from_mass",
]

HYPER_SHAPE = 1.0  # gamma0 ~ Gamma(1, 1), c0 ~ Gamma(1, 1) (authors' code)
HYPER_RATE = 1.0
BETA0_PRIOR = 0.01  # beta0 ~ Gamma(0.01, 0.01) when sampled (authors' code)


@dataclass
class SweepData:
    """Everything about the data the sweep needs, prepared once.

    x_csr_indptr/x_csr_indices : pattern of X' (N, D') by rows (bias column included).
    x_csc_indptr/x_csc_indices : pattern of X' by columns (rows where feature d is on).
    x_csr : scipy CSR X' (float64) for theta = exp(X' log h).
    pos_rows, pos_cols : (E,) instance and label of each positive observed entry.
    mask_obs : None (all observed) or CSR (N, L) with ones at observed entries.
    pair_first, pair_second, pair_counts : co-occurrence triples (i < j, or i <= j), or None.
    pair_diagonal : whether the triples may include the diagonal (i = i); sets the exposure E_k.
    support : the per-label support term's data (:mod:`bayesmlc.bmls.support_term`) or None (no term).
    """

    n_instances: int
    n_labels: int
    x_csr_indptr: np.ndarray
    x_csr_indices: np.ndarray
    x_csc_indptr: np.ndarray
    x_csc_indices: np.ndarray
    x_csr: sp.csr_matrix
    pos_rows: np.ndarray
    pos_cols: np.ndarray
    mask_obs: Optional[sp.csr_matrix] = None
    mask_obs_t: Optional[sp.csr_matrix] = None
    pair_first: Optional[np.ndarray] = None
    pair_second: Optional[np.ndarray] = None
    pair_counts: Optional[np.ndarray] = None
    pair_diagonal: bool = False
    support: Optional[SupportData] = None

    @classmethod
    def build(
        cls, X_bias: sp.csr_matrix, Y: sp.csr_matrix, mask: Optional[sp.csr_matrix], pairs=None, pair_diagonal=False
    ):
        """``X_bias`` binary CSR (N, D') with the bias column; ``Y`` CSR (N, L) of observed positives;
        ``mask`` CSR of observed entries or None; ``pairs`` (first, second, counts) or None, with
        first <= second when ``pair_diagonal`` else first < second."""
        x_csr = sp.csr_matrix(X_bias, dtype=np.float64)
        x_csc = x_csr.tocsc()
        x_csc.sort_indices()
        y = sp.coo_matrix(Y)
        mask_obs = None if mask is None else sp.csr_matrix(mask, dtype=np.float64)
        data = cls(
            n_instances=x_csr.shape[0],
            n_labels=Y.shape[1],
            x_csr_indptr=x_csr.indptr.astype(np.int64),
            x_csr_indices=x_csr.indices.astype(np.int64),
            x_csc_indptr=x_csc.indptr.astype(np.int64),
            x_csc_indices=x_csc.indices.astype(np.int64),
            x_csr=x_csr,
            pos_rows=y.row.astype(np.int64),
            pos_cols=y.col.astype(np.int64),
            mask_obs=mask_obs,
            mask_obs_t=None if mask_obs is None else sp.csr_matrix(mask_obs.T),
        )
        if pairs is not None:
            data.pair_first, data.pair_second, data.pair_counts = (np.asarray(a, dtype=np.int64) for a in pairs)
            data.pair_diagonal = bool(pair_diagonal)
            on_diagonal = data.pair_first == data.pair_second
            if np.any(data.pair_first > data.pair_second) or (not pair_diagonal and np.any(on_diagonal)):
                raise ValueError("co-occurrence pairs must satisfy first < second (first <= second with the diagonal)")
        return data

    @property
    def uses_cooccurrence(self) -> bool:
        return self.pair_counts is not None and self.pair_counts.size > 0


@dataclass
class SamplerState:
    """The Markov chain's state. ``rates`` caches sum_k phi_lk theta_kn at the positive entries."""

    phi: np.ndarray  # (L, K)
    h: np.ndarray  # (D', K)
    theta: np.ndarray  # (N, K) = Theta^T
    beta0: float
    r: np.ndarray  # (K,) lambda_k of eq. (12)
    gamma0: float
    c0: float  # f0 of eq. (12)
    rates: np.ndarray = field(default=None)  # (E,)
    topic_tokens: np.ndarray = field(default=None)  # (K,) label tokens per topic in the last sweep
    phi_acceptance: float = 1.0  # share of topics whose phi proposal was accepted in the last sweep
    shape_counts: np.ndarray = field(default=None)  # (D', K) int64 work buffer of c_dk; all 0 between sweeps
    # the support term (None without it): weights w (L S,), their prior rates b (L,), the term's rates at
    # the positives (E,) and the last sweep's tokens per slot T (L S,)
    support_weights: Optional[np.ndarray] = None
    support_rate: Optional[np.ndarray] = None
    direct_rates: Optional[np.ndarray] = None
    support_tokens: Optional[np.ndarray] = None


@numba.njit(cache=True, nogil=True)
def add_feature_token_counts(x_indptr, x_indices, tokens, counts):
    """counts[d, k] += c_dk = sum_n x_nd A_nk (the shape increment of eq. (22)), from the CSR pattern of X'.

    ``tokens`` (N, K) int64 = A; ``counts`` (D', K) int64, updated in place. Cost O(N K) plus the label
    tokens' (row, topic) pairs times the features per row; no (D', K) temporary (the buffer is reused).
    """
    n_rows, n_topics = tokens.shape
    for n in range(n_rows):
        for k in range(n_topics):
            token_count = tokens[n, k]
            if token_count != 0:
                for p in range(x_indptr[n], x_indptr[n + 1]):
                    counts[x_indices[p], k] += token_count


@numba.njit(cache=True, nogil=True)
def sweep_feature_weights(csc_indptr, csc_indices, shape_counts, h, theta, exposure, use_exposure, mu0, nu0, rng):
    """Sequential exact Gibbs update of every h_dk, keeping theta consistent (eqs. (21)-(23)), drawing
    the gamma variates inside the pass over features.

    For d = 0 .. D'-1 in order (the K topics of one d are independent given the rest), over the rows
    n with x_nd = 1 (the CSC pattern of X'):
        S_dk  = sum_n e_nk theta_nk                        (e = 1 when all labels are observed)
        G_dk ~ Gamma(mu0 + c_dk, 1), drawn here for k = 0 .. K-1 (:func:`standard_gamma_draw`)
        h'_dk = G_dk / (nu0 + S_dk / h_dk)  ~ Gamma(mu0 + c_dk, rate nu0 + S_dk / h_dk)
        theta_nk *= h'_dk / h_dk.
    ``shape_counts`` (D', K) int64 = c (:func:`add_feature_token_counts`), reset to 0 as it is read;
    ``h`` (D', K) and ``theta`` (N, K) are updated in place; ``exposure`` (N, K) is read only when
    ``use_exposure``; ``rng`` a NumPy ``Generator``. Cost O(nnz(X') K) and D' K gamma draws; no (D', K)
    array of variates.
    """
    n_features, n_topics = h.shape
    rate_sum = np.empty(n_topics)
    for d in range(n_features):
        start = csc_indptr[d]
        stop = csc_indptr[d + 1]
        rate_sum[:] = 0.0
        if use_exposure:
            for p in range(start, stop):
                n = csc_indices[p]
                for k in range(n_topics):
                    rate_sum[k] += theta[n, k] * exposure[n, k]
        else:
            for p in range(start, stop):
                n = csc_indices[p]
                for k in range(n_topics):
                    rate_sum[k] += theta[n, k]
        for k in range(n_topics):
            # h' = G / (nu0 + S / h), as the ratio h' / h = G / (nu0 h + S) (one division)
            ratio = standard_gamma_draw(rng, mu0 + shape_counts[d, k]) / (nu0 * h[d, k] + rate_sum[k])
            shape_counts[d, k] = 0
            h[d, k] *= ratio
            rate_sum[k] = ratio  # the buffer now holds the ratio h' / h
        for p in range(start, stop):
            n = csc_indices[p]
            for k in range(n_topics):
                theta[n, k] *= rate_sum[k]


def theta_from_log_h(x_csr: sp.csr_matrix, h: np.ndarray) -> np.ndarray:
    """theta (N, K) = exp(X' log h), eq. (8) computed in log space (no accumulated rounding)."""
    return np.exp(np.asarray(x_csr @ np.log(h)))


def exposure_matrix(data: SweepData, phi: np.ndarray) -> Optional[np.ndarray]:
    """e_nk = sum_{l observed for n} phi_lk, (N, K); None when every entry is observed (then e = 1)."""
    if data.mask_obs is None:
        return None
    return np.asarray(data.mask_obs @ phi)


def label_log_likelihood(data: SweepData, state: SamplerState, exposure: Optional[np.ndarray]) -> float:
    """log p(observed labels | phi, theta) = sum_pos log(1 - exp(-rho)) - sum_observed-zeros rho (eq. (3)),
    the support term's rates in rho when the state has them."""
    rates = state.rates
    if exposure is None:
        total_rate = float(state.theta.sum())  # columns of phi sum to 1
    else:
        total_rate = float(np.sum(state.theta * exposure))
    if state.direct_rates is not None:  # the term's exposure: every label observed
        rates = rates + state.direct_rates
        total_rate += float(state.support_weights @ data.support.exposure)
    log_pos = float(np.sum(np.log(-np.expm1(-np.maximum(rates, 1e-300)))))
    return log_pos - (total_rate - float(rates.sum()))


def init_state(data: SweepData, n_topics: int, n_features_bias: int, beta0: float, rng) -> SamplerState:
    """Initial values of the authors' code: h = 1 (theta = 1), phi from normalised Gamma(0.1) draws,
    lambda = 1/K, gamma0 = c0 = 1; the support term's w from
    :func:`~bayesmlc.bmls.support_term.initial_support_weights` when ``data`` has one."""
    phi = dirichlet_columns(np.full((data.n_labels, n_topics), 0.1), rng)
    h = np.ones((n_features_bias, n_topics))
    theta = np.ones((data.n_instances, n_topics))
    state = SamplerState(
        phi=phi, h=h, theta=theta, beta0=float(beta0), r=np.full(n_topics, 1.0 / n_topics), gamma0=1.0, c0=1.0,
        shape_counts=np.zeros((n_features_bias, n_topics), dtype=np.int64),
    )
    state.rates = positive_rates(data.pos_rows, data.pos_cols, state.phi, state.theta)
    if data.support is not None:
        state.support_weights = initial_support_weights(data.support)
        state.support_rate = np.ones(data.n_labels)
        state.direct_rates = support_rates(data.support, state.support_weights)
        state.support_tokens = np.zeros(state.support_weights.size, dtype=np.int64)
    return state


def sample_label_tokens(data: SweepData, state: SamplerState, rng):
    """Eqs. (13)-(16): z_ln ~ Poisson_+(rho_ln) at the positives, then its split over topics.
    Returns (A (N, K), B (L, K)) token counts. With the support term, rho includes its rates, the
    count is first split between the topics and the slots (:func:`split_support_tokens`), the slots'
    tokens kept in ``state.support_tokens``, and w and b drawn from them (:func:`sample_support_weights`)."""
    if state.direct_rates is None:
        counts = zero_truncated_poisson(state.rates, rng)
    else:
        counts, state.support_tokens = split_support_tokens(
            data.support, state.support_weights, zero_truncated_poisson(state.rates + state.direct_rates, rng),
            state.rates, state.direct_rates, rng)
        state.support_weights, state.support_rate = sample_support_weights(
            data.support, state.support_tokens, state.support_rate, rng)
        state.direct_rates = support_rates(data.support, state.support_weights)
    uniforms = rng.random(int(counts.sum()))
    return allocate_label_tokens(data.pos_rows, data.pos_cols, counts, state.phi, state.theta, uniforms, data.n_instances,
                                 state.rates)


def sample_unobserved_label_tokens(data: SweepData, state: SamplerState, rng) -> np.ndarray:
    """Data augmentation for missing labels: Z^u_lk ~ Poisson(phi_lk W^u_lk), W^u_lk = sum of theta_kn
    over the instances n where label l is unobserved. (L, K) int64."""
    observed_mass = np.asarray(data.mask_obs_t @ state.theta)  # (L, K): sum over observed instances
    return unobserved_tokens_from_mass(state.phi, observed_mass, state.theta.sum(axis=0), rng)


def unobserved_tokens_from_mass(phi: np.ndarray, observed_mass: np.ndarray, theta_total: np.ndarray, rng) -> np.ndarray:
    """Z^u_lk ~ Poisson(phi_lk W^u_lk) with W^u_lk = ``theta_total``_k - ``observed_mass``_lk (clipped at
    0): the sum of theta_kn over all instances less its sum over those where l is observed. Both are
    sums over rows, so over row shards they are all-reduced and the draw is the one-process one."""
    unobserved_mass = np.maximum(theta_total[None, :] - observed_mass, 0.0)
    return rng.poisson(phi * unobserved_mass)


def sample_beta0(label_topic_counts: np.ndarray, beta0: float, rng) -> float:
    """beta0 | counts with phi integrated out (Dirichlet-multinomial per topic column; not in the paper).

    With n_k = sum_l N_lk: q_k ~ Beta(L beta0, n_k) for every topic with n_k > 0, ell = sum CRT(N_lk, beta0),
    beta0 ~ Gamma(0.01 + ell, rate 0.01 - L sum_k log q_k). Each phi_k is an L-dimensional Dirichlet,
    so the Beta uses L beta0 (the authors' code uses K beta0 per label row; see docs/bmls.md).
    """
    n_labels = label_topic_counts.shape[0]
    per_topic = label_topic_counts.sum(axis=0)
    used = per_topic > 0
    q = rng.beta(n_labels * beta0, per_topic[used])
    tables = int(crt(label_topic_counts, beta0, rng).sum())
    rate = BETA0_PRIOR - n_labels * np.sum(np.log(np.maximum(q, np.finfo(float).tiny)))
    # a Gamma(0.01) draw can underflow to 0 when no topic holds a token (the support term took them all)
    return max(float(rng.gamma(BETA0_PRIOR + tables) / rate), np.finfo(float).tiny)


def cooccurrence_exposure(phi: np.ndarray, diagonal: bool) -> np.ndarray:
    """The Poisson exposure of topic k per unit of lambda_k over the modelled pairs of C, (K,)
    (eq. (25) restricted to i < j, or i <= j with the diagonal):
    E_k = sum_{i<j} phi_ik phi_jk = (1 - |phi_k|^2) / 2, or sum_{i<=j} phi_ik phi_jk = (1 + |phi_k|^2) / 2."""
    sign = 1.0 if diagonal else -1.0
    return 0.5 * (1.0 + sign * np.sum(phi**2, axis=0))


def sample_phi_metropolis(alpha: np.ndarray, phi: np.ndarray, weights: np.ndarray, diagonal: bool, rng):
    """Exact update of phi given the token counts and lambda when C is co-factorised.

    The full conditional of column k is p(phi_k | .) oc Dir(phi_k; alpha_k) exp(-lambda_k E_k(phi_k))
    (eqs. (24)-(26) with the exposure of eq. (25) kept): E_k depends on phi_k, which eq. (26) and the
    authors' code drop. Independence Metropolis-Hastings with the Dirichlet of eq. (26) as proposal:
    the Dirichlet factors cancel and a proposal phi'_k is accepted with probability
    min(1, exp(-lambda_k (E_k(phi'_k) - E_k(phi_k)))), E_k of :func:`cooccurrence_exposure`.

    alpha (L, K) Dirichlet parameters; phi (L, K) current value; weights (K,) lambda; diagonal: the
    pairs include i = j.
    Returns (new phi (L, K), accepted (K,) bool).
    """
    proposal = dirichlet_columns(alpha, rng)
    log_ratio = weights * (cooccurrence_exposure(phi, diagonal) - cooccurrence_exposure(proposal, diagonal))
    accepted = np.log(rng.random(phi.shape[1])) < log_ratio
    return np.where(accepted[None, :], proposal, phi), accepted


def sample_cooccurrence_hyper(state: SamplerState, endpoint: np.ndarray, rng, diagonal: bool = False) -> None:
    """lambda (r), gamma0, f0 (c0) given the co-occurrence tokens (eqs. (12), (27)), in place.

    E_k: the exposure of :func:`cooccurrence_exposure` (pairs i < j, or i <= j with ``diagonal``), from
    the current phi; ``endpoint`` (L, K) counts each token at both its labels (twice on the diagonal).
    Order: gamma0 with lambda integrated out (CRT augmentation), then lambda | gamma0, then f0 | lambda,
    gamma0, so that every draw conditions on current values (a valid partially collapsed Gibbs order).
    """
    n_topics = state.phi.shape[1]
    exposure = cooccurrence_exposure(state.phi, diagonal)
    tokens = endpoint.sum(axis=0) // 2
    shape_k = state.gamma0 / n_topics
    tables = int(crt(tokens, shape_k, rng).sum())
    log_ratio = np.log(np.maximum(state.c0 / (state.c0 + exposure), np.finfo(float).tiny))
    state.gamma0 = float(rng.gamma(HYPER_SHAPE + tables) / (HYPER_RATE - log_ratio.sum() / n_topics))
    state.r = rng.gamma(state.gamma0 / n_topics + tokens) / (state.c0 + exposure)
    state.c0 = float(rng.gamma(HYPER_SHAPE + state.gamma0) / (HYPER_RATE + state.r.sum()))


def sample_topic_parameters(data: SweepData, state: SamplerState, label_topic: np.ndarray, rng, sample_beta0_flag: bool,
                            phi_step: str, timings: Optional[dict], tic: float) -> float:
    """The sweep's steps on the shared topic parameters, in place, given the label tokens per (label,
    topic) ``label_topic`` (L, K) of all rows: co-occurrence tokens (eqs. (17)-(18)) -> beta0 (phi
    collapsed, optional) -> phi (eqs. (24)/(26)) -> lambda, gamma0, f0. Every draw reads only
    ``label_topic``, the co-occurrence triples and the shared state, so processes that share ``rng``
    and ``label_topic`` draw the same values. Returns the clock for :func:`_lap`."""
    endpoint = None
    if data.uses_cooccurrence:
        uniforms = rng.random(int(data.pair_counts.sum()))
        endpoint = allocate_pair_tokens(data.pair_first, data.pair_second, data.pair_counts, state.phi, state.r, uniforms)
        label_topic = label_topic + endpoint
    tic = _lap(timings, "cooccurrence", tic)
    if sample_beta0_flag:
        state.beta0 = sample_beta0(label_topic, state.beta0, rng)
    if endpoint is not None and phi_step == "metropolis":
        # eq. (26) as a proposal, corrected for the exposure of eq. (25) (exact)
        state.phi, accepted = sample_phi_metropolis(
            state.beta0 + label_topic, state.phi, state.r, data.pair_diagonal, rng
        )
        state.phi_acceptance = float(accepted.mean())
    else:
        # eq. (24) / (26): phi_k ~ Dir(beta0 + z_{l.k} (+ c_{l.k})); with C this drops the exposure
        state.phi = dirichlet_columns(state.beta0 + label_topic, rng)
    tic = _lap(timings, "labels", tic)
    if endpoint is not None:
        sample_cooccurrence_hyper(state, endpoint, rng, data.pair_diagonal)
    return _lap(timings, "cooccurrence", tic)


def gibbs_sweep(
    data: SweepData,
    state: SamplerState,
    rng,
    mu0: float,
    nu0: float,
    sample_beta0_flag: bool,
    recompute_theta: bool,
    phi_step: str = "dirichlet",
    timings: Optional[dict] = None,
) -> float:
    """One full Gibbs sweep, in place. Returns the log-likelihood of the observed labels afterwards.

    Order: label tokens (eqs. (13)-(16); with the support term, its split and w, b first) ->
    unobserved-label augmentation (missing labels only) ->
    co-occurrence tokens (eqs. (17)-(18)) -> beta0 (phi collapsed, optional) -> phi (eqs. (24)/(26)) ->
    lambda, gamma0, f0 -> h and theta (eqs. (21)-(23)) -> rates at the positives for the next sweep.

    ``timings``: a dict to which the seconds of each step are added under ``"topics"`` (latent counts
    at the positives and their allocation to topics), ``"cooccurrence"`` (C's tokens, lambda, gamma0,
    f0), ``"labels"`` (unobserved-label augmentation, beta0, phi), ``"features"`` (c, the gamma draws,
    the h sweep, theta) and ``"likelihood"`` (rates at the positives and the log-likelihood).
    """
    clock = time.perf_counter
    tic = clock()
    tokens_nk, tokens_lk = sample_label_tokens(data, state, rng)
    tic = _lap(timings, "topics", tic)
    label_topic = tokens_lk
    if data.mask_obs is not None:
        label_topic = label_topic + sample_unobserved_label_tokens(data, state, rng)
    tic = _lap(timings, "labels", tic)
    tic = sample_topic_parameters(data, state, label_topic, rng, sample_beta0_flag, phi_step, timings, tic)

    exposure = exposure_matrix(data, state.phi)
    add_feature_token_counts(data.x_csr_indptr, data.x_csr_indices, tokens_nk, state.shape_counts)
    sweep_feature_weights(
        data.x_csc_indptr,
        data.x_csc_indices,
        state.shape_counts,
        state.h,
        state.theta,
        exposure if exposure is not None else state.theta,  # placeholder array, unused when e = 1
        exposure is not None,
        mu0,
        nu0,
        rng,
    )
    if recompute_theta:
        state.theta = theta_from_log_h(data.x_csr, state.h)
    tic = _lap(timings, "features", tic)
    state.topic_tokens = tokens_lk.sum(axis=0)
    state.rates = positive_rates(data.pos_rows, data.pos_cols, state.phi, state.theta)
    log_lik = label_log_likelihood(data, state, exposure)
    _lap(timings, "likelihood", tic)
    return log_lik


def _lap(timings: Optional[dict], step: str, tic: float) -> float:
    """Add the seconds since ``tic`` to ``timings[step]`` (when timing); return the new start."""
    toc = time.perf_counter()
    if timings is not None:
        timings[step] = timings.get(step, 0.0) + toc - tic
    return toc


def heldout_log_likelihood(x_csr: sp.csr_matrix, pos_rows, pos_cols, phi: np.ndarray, h: np.ndarray,
                           support: Optional[SupportData] = None, weights: Optional[np.ndarray] = None) -> float:
    """log p(Y_val | phi, h) of held-out rows with all labels observed (eq. (3)), without any
    (N_val, L) array: theta_val = exp(X'_val log h) (N_val, K), rates at the positives only, and the
    total rate sum_nl rho_ln = sum_nk theta_nk because the columns of phi sum to 1.
    Cost O(nnz(X_val) K + nnz(Y_val) K). ``x_csr`` (N_val, D') binary with the bias column; ``pos_rows``,
    ``pos_cols`` (E_val,) the positives; ``support`` (of these rows) and ``weights``: the support term's
    data and w, or None."""
    theta = theta_from_log_h(x_csr, h)
    rates = positive_rates(pos_rows, pos_cols, phi, theta)
    total = float(theta.sum())
    if support is not None:
        rates = rates + support_rates(support, weights)
        total += float(weights @ support.exposure)
    return float(np.sum(np.log(-np.expm1(-np.maximum(rates, 1e-300)))) - (total - rates.sum()))
