"""BMLS's Gibbs sampler over row shards: data-parallel Gibbs, each process holding a contiguous range
of the training rows (:mod:`bayesmlc.distributed`, launched as MLGPF and BNMC are: ``torchrun``, Ray
Train, Spark's ``TorchDistributor``; docs/scaling.md, "BMLS on several processes").

What each process holds. The local variables of its rows: theta (its rows of Theta^T), the latent
label counts at its positives and their topic allocation A, and for missing labels the exposure.
The shared variables, identical on every process: phi, h, beta0 and (with co-occurrence) lambda,
gamma0, f0, drawn from one random stream that every process seeds alike (``shared_rng``); the local
variables are drawn from a stream of the process's own (``local_rng``).

One sweep (:class:`ShardedSweep`), in the order of :func:`~bayesmlc.bmls.gibbs.gibbs_sweep`:

1. label tokens at the process's positives (eqs. (13)-(16)), local; then one all-reduce of their
   counts per (label, topic) B, the shape counts c_dk = sum_n x_nd A_nk of eq. (22) and, for missing
   labels, theta's sums over all rows and over the rows where each label is observed. All are sums
   over rows: the totals are those of one process holding every row (exact, integers in float64).
2. the unobserved-label augmentation, co-occurrence tokens, beta0, phi, lambda, gamma0, f0
   (:func:`~bayesmlc.bmls.gibbs.sample_topic_parameters`) on the shared stream from the totals:
   exact, the one-process conditionals.
3. h over blocks of features (:func:`~bayesmlc.bmls.feature_blocks.sweep_feature_blocks`): per
   block one all-reduce, the draws and decisions on the shared stream, theta scaled locally. A
   block's draws are stale within the block (approximate distributed LDA's staleness; Newman,
   Asuncion, Smyth and Welling, JMLR 2009) and serve as a joint proposal that each topic accepts or
   rejects with the Metropolis-Hastings ratio of the block's exact conditional: an exact
   MH-within-Gibbs step, whose stationary law is the posterior (a block of one feature is the Gibbs
   step itself). The blocks (:func:`~bayesmlc.bmls.feature_blocks.mass_blocks`) hold at most
   ``BLOCK_ROW_SHARE`` N row-feature entries each (the bias alone), so that a row carries on
   average at most that many of a block's other features and most proposals are accepted.
4. theta from log h every ``recompute_theta_every`` sweeps, the rates at the positives, and the
   log-likelihood, summed over processes (one all-reduce).

So every process ends each sweep with the same shared state, and the posterior summaries (moments,
kept draws, schedule decisions from the summed log-likelihood and the summed collection statistic)
are the same on every process. One process (``parallel=None``) runs :func:`gibbs_sweep` itself,
unchanged.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from ..exceptions import ValidationError
from ..label_statistics import LabelStatistics
from ..utils import numpy_rng
from .chain import GibbsChain
from .feature_blocks import block_rows, mass_blocks, sweep_feature_blocks
from .gibbs import (
    SweepData,
    add_feature_token_counts,
    exposure_matrix,
    init_state,
    label_log_likelihood,
    positive_rates,
    sample_label_tokens,
    sample_topic_parameters,
    theta_from_log_h,
    unobserved_tokens_from_mass,
)
from .schedule import Schedule, draw_capacity
from .support_term import support_width

__all__ = ["BLOCK_ROW_SHARE", "ShardedSweep", "fit_sharded"]

#: the row-feature entries of one block of features in the data-parallel h step, as a share of the
#: rows N (docs/scaling.md, "BMLS on several processes": 287 blocks on Bibtex, 93% of the proposals
#: accepted; chosen before the Metropolis-Hastings correction, when 0.5 fit the training labels worse)
BLOCK_ROW_SHARE = 0.25


class ShardedSweep:
    """One data-parallel BMLS sweep (module docstring), a callable for :class:`GibbsChain`'s ``sweep``.

    Parameters
    ----------
    settings : the BMLS (``mu0``, ``nu0``, ``sample_beta0``, ``phi_step`` are read).
    data : :class:`SweepData` of this process's rows (the co-occurrence triples, if any, of all rows).
    blocks : list of int64 arrays, the feature blocks of the h step (the same on every process).
    shared_rng, local_rng : numpy Generators, the stream every process shares and this process's own.
    reduce : the strategy's ``reduce_sum`` (sum over processes, with its failure check).

    Attributes
    ----------
    h_acceptance : list of float, per sweep the share of the h proposals (blocks of several features
        x topics) accepted (nan in a sweep with none).
    """

    def __init__(self, settings, data: SweepData, blocks, shared_rng, local_rng, reduce):
        self.settings, self.data, self.blocks = settings, data, blocks
        self.shared_rng, self.local_rng, self.reduce = shared_rng, local_rng, reduce
        self.rows = block_rows(data.x_csc_indptr, data.x_csc_indices, blocks)
        self.h_acceptance: list = []

    def sufficient_statistics(self, state):
        """Step 1: this process's label tokens, then the all-reduced totals: (B (L, K) int64, c (D', K)
        int64 into ``state.shape_counts``, observed mass (L, K) and theta's total (K,) or None)."""
        data = self.data
        tokens_nk, tokens_lk = sample_label_tokens(data, state, self.local_rng)
        add_feature_token_counts(data.x_csr_indptr, data.x_csr_indices, tokens_nk, state.shape_counts)
        parts = [tokens_lk.astype(np.float64).ravel(), state.shape_counts.astype(np.float64).ravel()]
        if data.mask_obs is not None:
            parts += [np.asarray(data.mask_obs_t @ state.theta).ravel(), state.theta.sum(axis=0)]
        total = self.reduce(np.concatenate(parts))
        sizes = np.cumsum([part.size for part in parts])
        tokens_lk = np.rint(total[: sizes[0]]).astype(np.int64).reshape(tokens_lk.shape)
        state.shape_counts[...] = np.rint(total[sizes[0]: sizes[1]]).reshape(state.shape_counts.shape)
        if data.mask_obs is None:
            return tokens_lk, None, None
        return tokens_lk, total[sizes[1]: sizes[2]].reshape(tokens_lk.shape), total[sizes[2]:]

    def __call__(self, state, recompute_theta: bool, timings: dict) -> float:
        """One sweep in place; returns the log-likelihood of every process's observed labels."""
        settings, data, shared = self.settings, self.data, self.shared_rng
        tic = time.perf_counter()
        tokens_lk, observed_mass, theta_total = self.sufficient_statistics(state)
        tic = _lap(timings, "topics", tic)
        label_topic = tokens_lk
        if observed_mass is not None:
            label_topic = label_topic + unobserved_tokens_from_mass(state.phi, observed_mass, theta_total, shared)
        tic = _lap(timings, "labels", tic)
        tic = sample_topic_parameters(data, state, label_topic, shared, bool(settings.sample_beta0),
                                      settings.phi_step, timings, tic)
        exposure = exposure_matrix(data, state.phi)
        accepted, proposed = sweep_feature_blocks(data, state, exposure, self.blocks, float(settings.mu0),
                                                  float(settings.nu0), shared, rows=self.rows,
                                                  reduce=lambda sums: self.reduce(sums, checked=False))
        self.h_acceptance.append(accepted / proposed if proposed else float("nan"))
        if recompute_theta:
            state.theta = theta_from_log_h(data.x_csr, state.h)
        tic = _lap(timings, "features", tic)
        state.topic_tokens = tokens_lk.sum(axis=0)
        state.rates = positive_rates(data.pos_rows, data.pos_cols, state.phi, state.theta)
        log_lik = float(self.reduce(np.array([label_log_likelihood(data, state, exposure)]))[0])
        _lap(timings, "likelihood", tic)
        return log_lik


def _lap(timings: dict, step: str, tic: float) -> float:
    toc = time.perf_counter()
    timings[step] = timings.get(step, 0.0) + toc - tic
    return toc


def _check_settings(model) -> None:
    """What the data-parallel fit does not do, refused before any work."""
    if model.schedule == "auto" and model.validation_fraction is not None:
        raise ValidationError("BMLS on several processes has no validation_fraction (the held-out rows would be "
                              "split over the processes): leave it None")
    if isinstance(model.cooccurrence, (bool, np.bool_)) and model.cooccurrence:
        raise ValidationError("BMLS on several processes needs the co-occurrence counts of all rows: pass "
                              "cooccurrence=cooccurrence_matrix(Y_all) (the same matrix on every process) instead "
                              "of cooccurrence=True")


def _shared_streams(model, parallel):
    """(shared, local) Generators: the shared stream from a seed drawn by rank 0 from ``random_state``
    (so that every process agrees even with ``random_state=None``), the local one from that seed and
    the rank."""
    seed = int(numpy_rng(model.random_state).integers(2**52)) if parallel.is_main else 0
    seed = int(parallel.reduce_sum(np.array([seed], dtype=np.float64))[0])
    return np.random.default_rng(seed), np.random.default_rng([seed, parallel.rank + 1])


def fit_sharded(model, X, Y, label_mask, parallel, auto_topics) -> None:
    """BMLS's fit on this process's rows under the data-parallel ``parallel`` (every process calls it
    with the same settings and its shard, or the whole data set of which it keeps its shard; see
    :meth:`bayesmlc.distributed.DataParallel.local_data`). Sets the fitted attributes of ``model``,
    the same on every process. ``auto_topics``: ``n_topics="auto"``'s rule
    (:func:`bayesmlc.bmls.model.auto_topics`), from the positives of all rows."""
    _check_settings(model)
    X, Y, label_mask, shard = parallel.local_data(X, Y, label_mask)
    model._set_label_statistics(LabelStatistics.of_labels(Y, label_mask).summed(parallel.reduce_sum))
    model._fit_feature_thresholds(X)
    if model.feature_thresholds_ is not None:
        raise ValidationError("BMLS on several processes needs binary or sparse features (a dense feature's "
                              "threshold is its median over all rows): pass binarize_threshold=t")
    X_binary = model._binary_features(X, warn=parallel.is_main)
    Y = sp.csr_matrix(Y)
    unobserved = 0 if label_mask is None else Y.shape[0] * Y.shape[1] - label_mask.nnz
    column_counts = np.diff(X_binary.tocsc().indptr).astype(np.float64)
    totals = parallel.reduce_sum(np.concatenate([column_counts, [X_binary.nnz, Y.nnz, unobserved]]))
    column_counts, (n_entries, n_positives, unobserved) = totals[:-3], totals[-3:]
    if unobserved == 0:
        label_mask = None  # every entry observed on every process: the exact fast path
    seen = np.flatnonzero(column_counts > 0)
    X_bias = model._with_bias(X_binary[:, seen])
    pairs = model._cooccurrence_pairs(Y)
    data = SweepData.build(X_bias, Y, label_mask, pairs, pair_diagonal=bool(model.cooccurrence_diagonal))
    model.n_topics_ = int(model.n_topics) if model.n_topics != "auto" else \
        auto_topics(int(n_positives), Y.shape[1], X.shape[1] + 1)
    support_width(model.support_features, data.n_labels, model.n_topics_, 0.0, "several processes")  # no term: warns
    shared, local = _shared_streams(model, parallel)
    state = init_state(data, model.n_topics_, X_bias.shape[1], float(model.beta0), shared)
    settings = model._schedule_settings()
    schedule = Schedule.of(settings, X_bias, model.n_topics_, validating=False, n_labels=data.n_labels,
                           n_positives=int(n_positives), n_entries=int(n_entries + shard.n_total))
    schedule.reduce = parallel.reduce_sum
    blocks = mass_blocks(np.append(column_counts[seen], shard.n_total), shard.n_total, BLOCK_ROW_SHARE)
    sweep = ShardedSweep(settings, data, blocks, shared, local, parallel.reduce_sum)
    capacity = draw_capacity(settings, data.n_labels, X_bias.shape[1], model.n_topics_)
    chain = GibbsChain(model, data, state, shared, schedule, capacity, None, sweep=sweep,
                       show_progress=parallel.is_main).run(model.history_)
    model.history_["h_acceptance"] = sweep.h_acceptance
    model._keep_posterior(chain, seen, X.shape[1])
