"""BMLS's per-label support term: each label's Poisson rate gains nonnegative weights on a few features.

K topics cannot give each of thousands of labels its own pattern: a tail label whose evidence lies in
a few rare features shares its topics with head labels and ranks as they do. Beside the topics, label
l gets weights w_lj >= 0 on the S columns s_l1 .. s_lS of its strong-rule support
(:func:`bayesmlc.feature_support.gradient_support`, on the binary features):

    z_ln ~ Poisson(sum_k phi_lk theta_kn + sum_j x_{n, s_lj} w_lj),   w_lj ~ Gamma(a, rate b_l),
    b_l ~ Gamma(1, rate 1),

with a = :data:`SUPPORT_SHAPE`. The sum of Poisson rates keeps the model conjugate by the additivity
of the Poisson (Dunson and Herring 2005, "Bayesian latent variable models for mixed discrete
outcomes", Biostatistics 6(1); the same augmentation splits z over topics in eq. (16)): given
z_ln, the counts on the topics and on the support columns are multinomial in their rates, so

* the topic counts are those of the paper's sweep with the topic rates alone (eqs. (13)-(26) unchanged);
* w_lj | . ~ Gamma(a + T_lj, rate b_l + N_lj), T_lj the counts on slot (l, j) and N_lj the rows with
  feature s_lj on (its Poisson exposure over all rows: every label is observed);
* b_l | w ~ Gamma(1 + a S_l, rate 1 + sum_j w_lj) over label l's S_l stored slots (gamma-gamma
  conjugacy): each label's weights share a rate, so a tail label's few co-occurrences are shrunk by
  its own many empty slots.

Prediction integrates w out under its conditional with the collected mean counts T-bar and rate
b_l-bar: E[exp(-sum_j x_j w_lj)] = prod_{j: x_j = 1} (1 + 1 / (b_l-bar + N_lj))^-(a + T-bar_lj) (the
Laplace transform of the Gamma), so Pr(y_l = 1 | x) = 1 - E[exp(-phi_l theta(x))] exp(-r_l(x)) with
r_l(x) = sum_j x_{s_lj} (a + T-bar_lj) log(1 + 1 / (b_l-bar + N_lj)): the topics' draws and the term's
conditional taken as independent.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numba
import numpy as np
import scipy.sparse as sp

from ..feature_support import gradient_support, support_products
from .topics import AUTO_LABELS_PER_TOPIC

__all__ = [
    "SUPPORT_SHAPE",
    "SUPPORT_FEATURES",
    "SUPPORT_MAX_ROWS_PER_FEATURE",
    "SupportData",
    "support_width",
    "attach_support",
    "build_support",
    "initial_support_weights",
    "support_rates",
    "split_support_tokens",
    "sample_support_weights",
    "support_log_factors",
    "support_exponent",
]

#: a, the Gamma shape of each weight's prior: with the label's rate b_l it pulls a slot's weight
#: towards the label's mean weight by a pseudo-count of a (validation: docs/experiments.md, "BMLS: the
#: support term"; 0.1 let single co-occurrences on rare features outrank the head labels)
SUPPORT_SHAPE = 2.0
#: S of ``support_features="auto"`` where labels are many a topic and the features are rare
SUPPORT_FEATURES = 128
#: ``"auto"`` fits the term below this many training rows a feature: on delicious (26 rows a binary
#: feature) the topics' products of feature weights rank better alone
SUPPORT_MAX_ROWS_PER_FEATURE = 10
#: b ~ Gamma(HYPER_SHAPE, rate HYPER_RATE)
HYPER_SHAPE = HYPER_RATE = 1.0


def support_width(setting, n_labels: int, n_topics: int, rows_per_feature: float, unavailable=None) -> int:
    """S for BMLS's ``support_features`` ``setting``: ``"auto"`` gives :data:`SUPPORT_FEATURES` where
    the labels outnumber the topics AUTO_LABELS_PER_TOPIC (10) times over, as where the cap of
    ``n_topics="auto"`` binds (:func:`~bayesmlc.bmls.topics.auto_topic_cap`), and the features are
    many and rare (fewer than :data:`SUPPORT_MAX_ROWS_PER_FEATURE` training rows a feature), else 0;
    an int is itself. 0 where the term is ``unavailable`` (a reason such as "label_mask"; None or
    False: available), with a warning naming it for an explicit S > 0."""
    if setting == "auto":
        many_labels = n_labels > AUTO_LABELS_PER_TOPIC * n_topics
        width = SUPPORT_FEATURES if many_labels and rows_per_feature < SUPPORT_MAX_ROWS_PER_FEATURE else 0
    else:
        width = int(setting)
    if width and unavailable:
        if setting != "auto":
            warnings.warn(f"BMLS: support_features={setting} is not used with {unavailable} (the term needs every "
                          "label observed, in one process); fitting without it", UserWarning, stacklevel=4)
        return 0
    return width


@dataclass
class SupportData:
    """The support term's fixed data for a set of rows.

    columns : (L, S) int64, each label's support columns of X' (ascending; -1 pads a short support).
    exposure : (L S,) float64, N_lj: the rows with column s_lj on (0 for a pad), slot l S + j.
    slot_ptr, slots : each positive entry e's slots (flat l S + j) whose column is on in its row,
        ``slots[slot_ptr[e]:slot_ptr[e + 1]]``, for the positives in the sweep's order.
    """

    columns: np.ndarray
    exposure: np.ndarray
    slot_ptr: np.ndarray
    slots: np.ndarray


@numba.njit(cache=True, nogil=True)
def _positive_slots(x_indptr, x_indices, columns, pos_rows, pos_cols, slot_ptr, slots, fill):
    """Count (``fill`` False: into ``slot_ptr[e + 1]``) or write (``fill`` True: into ``slots`` from
    ``slot_ptr[e]``) the slots of each positive e whose column is on in its row: a merge of the row's
    ascending columns with the label's ascending support."""
    width = columns.shape[1]
    for e in range(pos_rows.shape[0]):
        n = pos_rows[e]
        label = pos_cols[e]
        p, stop = x_indptr[n], x_indptr[n + 1]
        found = 0
        out = slot_ptr[e] if fill else 0
        for j in range(width):
            column = columns[label, j]
            if column < 0:
                continue
            while p < stop and x_indices[p] < column:
                p += 1
            if p == stop:
                break
            if x_indices[p] == column:
                if fill:
                    slots[out + found] = label * width + j
                found += 1
        if not fill:
            slot_ptr[e + 1] = found


def build_support(x_csr: sp.csr_matrix, columns: np.ndarray, pos_rows: np.ndarray, pos_cols: np.ndarray) -> SupportData:
    """:class:`SupportData` of the binary rows ``x_csr`` (N, D') for the support ``columns`` (L, S) of
    X' and the positives (``pos_rows``, ``pos_cols``)."""
    x_csr = sp.csr_matrix(x_csr)
    if not x_csr.has_sorted_indices:
        x_csr = x_csr.sorted_indices()
    indptr, indices = x_csr.indptr.astype(np.int64), x_csr.indices.astype(np.int64)
    columns = np.ascontiguousarray(columns, dtype=np.int64)
    pos_rows, pos_cols = (np.ascontiguousarray(a, dtype=np.int64) for a in (pos_rows, pos_cols))
    counts = np.zeros(pos_rows.size + 1, dtype=np.int64)
    _positive_slots(indptr, indices, columns, pos_rows, pos_cols, counts, np.empty(0, dtype=np.int64), False)
    slot_ptr = np.cumsum(counts)
    slots = np.empty(int(slot_ptr[-1]), dtype=np.int64)
    _positive_slots(indptr, indices, columns, pos_rows, pos_cols, slot_ptr, slots, True)
    rows_on = np.bincount(indices, minlength=x_csr.shape[1]).astype(np.float64)
    exposure = np.where(columns >= 0, rows_on[np.maximum(columns, 0)], 0.0).ravel()
    return SupportData(columns, exposure, slot_ptr, slots)


def attach_support(data, X_bias: sp.csr_matrix, Y: sp.csr_matrix, width: int, validation):
    """With ``width`` S > 0, set the sweep data ``data.support`` for each label's S-column strong-rule
    support among the features of the binary X' = ``X_bias`` (the bias column left out;
    :func:`~bayesmlc.feature_support.gradient_support`) and the labels ``Y``; return ``validation``
    (held-out X', positive rows, positive columns, None) with its rows' :class:`SupportData` last.
    With S = 0, leave both as they are."""
    if not width:
        return validation
    columns = gradient_support(X_bias[:, :-1], Y, width)
    data.support = build_support(X_bias, columns, data.pos_rows, data.pos_cols)
    if validation is None:
        return None
    return (*validation[:3], build_support(validation[0], columns, *validation[1:3]))


@numba.njit(cache=True, nogil=True)
def _slot_sums(slot_ptr, slots, weights, out):
    for e in range(out.shape[0]):
        total = 0.0
        for p in range(slot_ptr[e], slot_ptr[e + 1]):
            total += weights[slots[p]]
        out[e] = total


def support_rates(support: SupportData, weights: np.ndarray) -> np.ndarray:
    """(E,) the term's rate sum_j x_{n, s_lj} w_lj at each positive entry."""
    out = np.empty(support.slot_ptr.size - 1)
    _slot_sums(support.slot_ptr, support.slots, weights, out)
    return out


@numba.njit(cache=True, nogil=True)
def _allocate_slots(slot_ptr, slots, weights, counts, direct_rates, uniforms, tokens):
    """Each of the ``counts[e]`` tokens of entry e picks slot ``slots[p]`` with probability
    weights[slots[p]] / direct_rates[e] (inverse CDF, one uniform a token, in order)."""
    used = 0
    for e in range(counts.shape[0]):
        for _ in range(counts[e]):
            target = uniforms[used] * direct_rates[e]
            used += 1
            acc = 0.0
            chosen = slots[slot_ptr[e + 1] - 1]  # rounding: the last slot
            for p in range(slot_ptr[e], slot_ptr[e + 1]):
                acc += weights[slots[p]]
                if acc > target:
                    chosen = slots[p]
                    break
            tokens[chosen] += 1


def split_support_tokens(support: SupportData, weights: np.ndarray, counts: np.ndarray, topic_rates: np.ndarray,
                         direct_rates: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray]:
    """Split each positive's latent count ``counts`` (E,) between the topics and the support slots in
    proportion to their rates (a binomial, then a multinomial over the slots). Returns (the counts left
    to the topics (E,) int64, the tokens per slot T (L S,) int64)."""
    total = topic_rates + direct_rates
    share = np.divide(direct_rates, total, out=np.zeros_like(total), where=total > 0)
    direct = rng.binomial(counts, np.clip(share, 0.0, 1.0))
    tokens = np.zeros(weights.size, dtype=np.int64)
    uniforms = rng.random(int(direct.sum()))
    _allocate_slots(support.slot_ptr, support.slots, weights, direct, direct_rates, uniforms, tokens)
    return counts - direct, tokens


def sample_support_weights(support: SupportData, tokens: np.ndarray, rates: np.ndarray, rng):
    """w ~ Gamma(a + T, rate b_l + N) on the stored slots (0 on pads), then each label's b_l | w ~
    Gamma(1 + a S_l, rate 1 + sum_j w_lj) over its S_l stored slots. ``rates``: b (L,). Returns
    (w (L S,), b (L,))."""
    n_labels, width = support.columns.shape
    valid = support.columns.ravel() >= 0
    weights = np.zeros(tokens.size)
    slot_rates = np.repeat(rates, width)[valid] + support.exposure[valid]
    weights[valid] = rng.gamma(SUPPORT_SHAPE + tokens[valid]) / slot_rates
    stored = np.count_nonzero(support.columns >= 0, axis=1)
    label_sums = weights.reshape(n_labels, width).sum(axis=1)
    return weights, rng.gamma(HYPER_SHAPE + SUPPORT_SHAPE * stored) / (HYPER_RATE + label_sums)


def initial_support_weights(support: SupportData) -> np.ndarray:
    """The chain's first w: half the posterior mean, b_l = 1, had each positive's one token been shared
    evenly by its slots; 0 on pads. A start near the data keeps the term from having to grow out of
    the topics' shadow over many sweeps."""
    sizes = np.diff(support.slot_ptr)
    shares = np.repeat(1.0 / np.maximum(sizes, 1), sizes)
    tokens = np.bincount(support.slots, weights=shares, minlength=support.exposure.size)
    valid = support.columns.ravel() >= 0
    return np.where(valid, 0.5 * (SUPPORT_SHAPE + tokens) / (HYPER_RATE + support.exposure), 0.0)


def support_log_factors(shape: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """(a + T-bar) log(1 + 1 / (b_l-bar + N)) per slot: -log of the slot's factor of E[exp(-w)] under
    w ~ Gamma(shape, rate) (module docstring); 0 where the shape is 0 (a pad)."""
    return np.where(shape > 0, shape * np.log1p(1.0 / np.maximum(rate, 1e-300)), 0.0)


def support_exponent(X_binary: sp.csr_matrix, columns: np.ndarray, shape: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """r(x) (n, L) float32 of the module docstring for the binary rows ``X_binary`` (n, D), label by
    label over its support columns (:func:`~bayesmlc.feature_support.support_products`: no (D, L)
    matrix, threads over label blocks)."""
    factors = support_log_factors(shape, rate).astype(np.float32)
    return support_products(sp.csc_matrix(X_binary, dtype=np.float32), columns, factors).T
