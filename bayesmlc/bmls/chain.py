"""BMLS's chain runner: the :class:`GibbsChain` (sweeps of :func:`~bayesmlc.bmls.gibbs.gibbs_sweep` under a
:class:`~bayesmlc.bmls.schedule.Schedule`, the held-out log-likelihood, history, progress bar, step
timings), the running :class:`PosteriorMoments` of the collected sweeps and the bounded
:class:`DrawStore` of kept draws, and the posterior summaries the estimator keeps."""

from __future__ import annotations

import time

import numpy as np

from .gibbs import SweepData, gibbs_sweep, heldout_log_likelihood, positive_rates
from .schedule import Schedule
from .support_term import SUPPORT_SHAPE, support_rates

__all__ = ["DrawStore", "GibbsChain", "PosteriorMoments"]


class PosteriorMoments:
    """Running sums over the collected sweeps: E[phi] (L, K), E[log h] and E[(log h)^2] (D', K), the
    label tokens per topic, and with the support term its tokens per slot and its prior rate b.
    Memory independent of the number of sweeps."""

    def __init__(self, n_labels: int, n_features_bias: int, n_topics: int):
        self.count = 0
        self.phi_sum = np.zeros((n_labels, n_topics))
        self.log_h_sum = np.zeros((n_features_bias, n_topics))
        self.log_h_square_sum = np.zeros((n_features_bias, n_topics))
        self.usage_sum = np.zeros(n_topics)
        self.support_token_sum = self.support_rate_sum = None

    def add(self, state) -> None:
        log_h = np.log(state.h)
        self.count += 1
        self.phi_sum += state.phi
        self.log_h_sum += log_h
        log_h *= log_h
        self.log_h_square_sum += log_h
        self.usage_sum += state.topic_tokens
        if state.support_tokens is not None:
            if self.support_token_sum is None:
                self.support_token_sum = np.zeros(state.support_tokens.size)
                self.support_rate_sum = np.zeros(state.support_rate.size)
            self.support_token_sum += state.support_tokens
            self.support_rate_sum += state.support_rate

    def phi_mean(self) -> np.ndarray:
        return self.phi_sum / self.count

    def log_h_mean(self) -> np.ndarray:
        return self.log_h_sum / self.count

    def log_h_var(self) -> np.ndarray:
        mean = self.log_h_mean()
        return np.maximum(self.log_h_square_sum / self.count - mean * mean, 0.0)

    def support_posterior(self, data) -> tuple[np.ndarray, np.ndarray]:
        """The support term's (shape a + T-bar, rate b_l-bar + N) per slot, (L S,) each (shape 0 on pads)."""
        valid = data.support.columns.ravel() >= 0
        shape = np.where(valid, SUPPORT_SHAPE + self.support_token_sum / self.count, 0.0)
        width = data.support.columns.shape[1]
        return shape, np.repeat(self.support_rate_sum / self.count, width) + data.support.exposure

    def rates_at(self, data) -> np.ndarray:
        """Posterior-mean rates E[phi_l.] . E[theta_.n] (plus the support term's E[w] on the row's
        slots) at the training positives (the moment predictor, see :class:`~bayesmlc.bmls.BMLS`), (E,).
        Cost O(nnz(X) K + nnz(Y) K)."""
        theta = np.exp(np.asarray(data.x_csr @ (self.log_h_mean() + 0.5 * self.log_h_var())))
        rates = positive_rates(data.pos_rows, data.pos_cols, self.phi_mean(), theta)
        if data.support is not None and self.support_token_sum is not None:
            shape, rate = self.support_posterior(data)
            rates += support_rates(data.support, shape / rate)
        return np.maximum(rates, 1e-300)


class DrawStore:
    """At most ``capacity`` draws of (phi, log h), float32. Offer i (from 0) is kept when i is a multiple
    of ``thin``; when the store is full, the draws off the grid of 2 ``thin`` are dropped and ``thin``
    doubles, so the kept draws stay evenly spread over the whole collection however long it runs."""

    def __init__(self, capacity: int, thin: int):
        self.capacity = capacity
        self.thin = thin
        self.offers = 0
        self.phi: list = []
        self.log_h: list = []

    def offer(self, state) -> None:
        self.offers += 1
        if self.capacity == 0 or (self.offers - 1) % self.thin:
            return
        if len(self.phi) == self.capacity:
            self.phi, self.log_h = self.phi[::2], self.log_h[::2]  # the draws on the doubled grid
            self.thin *= 2
            if (self.offers - 1) % self.thin:
                return
        self.phi.append(state.phi.astype(np.float32))
        self.log_h.append(np.log(state.h).astype(np.float32))

    def arrays(self):
        """(S, L, K) and (S, D', K) float32 arrays of the kept draws (S may be 0)."""
        if not self.phi:
            return np.empty((0, 0, 0), dtype=np.float32), np.empty((0, 0, 0), dtype=np.float32)
        return np.stack(self.phi), np.stack(self.log_h)


class GibbsChain:
    """One BMLS Gibbs chain from an initial ``state`` (:func:`~bayesmlc.bmls.gibbs.init_state`).

    :meth:`run` sweeps until the ``schedule`` stops it, appending each sweep to the estimator's
    ``history_`` and collecting the sweeps after the burn-in into :attr:`moments` and :attr:`draws`;
    :meth:`posterior` lays the collected moments and draws out over all features.

    Parameters
    ----------
    settings : the BMLS (``mu0``, ``nu0``, ``sample_beta0``, ``recompute_theta_every``, ``phi_step``,
        ``verbose`` are read).
    data : :class:`~bayesmlc.bmls.gibbs.SweepData` of the training rows.
    state : the chain's state, advanced in place.
    rng : numpy Generator, the chain's random stream.
    schedule : :class:`~bayesmlc.bmls.schedule.Schedule`.
    capacity : int, the most draws :attr:`draws` keeps (:func:`~bayesmlc.bmls.schedule.draw_capacity`).
    validation : None or (X' CSR float64, positive rows, positive columns, the support term's
        :class:`~bayesmlc.bmls.support_term.SupportData` of these rows or None) of held-out rows, whose
        log-likelihood is recorded after every sweep.
    sweep : None, or a callable ``sweep(state, recompute_theta, timings)`` that runs one sweep in
        place and returns the training log-likelihood, in place of :func:`~bayesmlc.bmls.gibbs.gibbs_sweep`
        (a data-parallel fit's :class:`~bayesmlc.bmls.distributed_gibbs.ShardedSweep`).
    show_progress : bool, whether ``verbose`` shows a progress bar here (one process of several: rank 0 only).

    Attributes
    ----------
    moments : PosteriorMoments; draws : DrawStore; sweeps : int, sweeps run; timings : dict, seconds
    per step of the sweep summed over the run.
    """

    def __init__(self, settings, data: SweepData, state, rng: np.random.Generator, schedule: Schedule, capacity: int,
                 validation=None, sweep=None, show_progress: bool = True):
        self.settings, self.data, self.state, self.rng = settings, data, state, rng
        self.sweep_step, self.show_progress = sweep, show_progress
        self.schedule, self.validation = schedule, validation
        n_features_bias, n_topics = state.h.shape
        self.moments = PosteriorMoments(data.n_labels, n_features_bias, n_topics)
        self.draws = DrawStore(capacity, thin=1)
        self.sweeps = 0
        self.timings: dict = {}

    def run(self, history: dict) -> "GibbsChain":
        """Sweep until the schedule's end or its stopping rule; ``history`` (with ``"objective"`` and
        ``"wall_time"`` lists) gets ``"sweep"``, ``"sweep_time"``, ``"beta0"``, ``"phi_acceptance"`` and
        ``"heldout"`` anew. A chain stopped inside its burn-in keeps its last state as the one sweep
        collected."""
        for key in ("sweep", "sweep_time", "beta0", "phi_acceptance", "heldout"):
            history[key] = []
        schedule, moments, state = self.schedule, self.moments, self.state
        progress = None
        if self.settings.verbose and self.show_progress:
            from tqdm.auto import tqdm

            progress = tqdm(total=schedule.total, desc="BMLS Gibbs", unit="sweep")
        start = time.perf_counter()
        try:
            while self.sweeps < schedule.total:
                self.sweeps += 1
                log_lik = self._sweep(history, start)
                if schedule.collects(self.sweeps):
                    moments.add(state)
                    if schedule.offers_draw(self.sweeps):
                        self.draws.offer(state)
                if progress is not None:
                    progress.update(1)
                    if self.sweeps % 10 == 0:
                        progress.set_postfix(loglik=f"{log_lik:.1f}", beta0=f"{state.beta0:.3g}")
                if schedule.stops_after(self.sweeps, history, moments, self.data):
                    break
        finally:
            if progress is not None:
                progress.close()
        if moments.count == 0:  # the sweeps ran out inside the burn-in: use the last sweep
            moments.add(state)
            self.draws.offer(state)
        return self

    def _sweep(self, history: dict, start: float) -> float:
        """One Gibbs sweep (eqs. (22)-(26)), recorded in ``history``; returns the training log-likelihood."""
        settings, state = self.settings, self.state
        tic = time.perf_counter()
        recompute_theta = self.sweeps % int(settings.recompute_theta_every) == 0
        if self.sweep_step is not None:
            log_lik = self.sweep_step(state, recompute_theta, self.timings)
        else:
            log_lik = gibbs_sweep(
                self.data, state, self.rng, float(settings.mu0), float(settings.nu0), bool(settings.sample_beta0),
                recompute_theta=recompute_theta, phi_step=settings.phi_step, timings=self.timings,
            )
        heldout = np.nan
        if self.validation is not None:
            x_val, rows, cols, support = self.validation
            heldout = heldout_log_likelihood(x_val, rows, cols, state.phi, state.h, support, state.support_weights)
        toc = time.perf_counter()
        for key, value in (("objective", log_lik), ("wall_time", toc - start), ("sweep", self.sweeps),
                           ("sweep_time", toc - tic), ("beta0", state.beta0),
                           ("phi_acceptance", state.phi_acceptance), ("heldout", heldout)):
            history[key].append(value)
        return log_lik

    def posterior(self, seen: np.ndarray, n_features: int, prior_log_h: float, sample_dtype) -> dict:
        """The collected posterior over all ``n_features`` features and the bias, as BMLS keeps it:
        ``phi_``, ``log_h_``, ``log_h_var_`` (moments) and ``phi_samples_``, ``log_h_samples_`` (the kept
        draws, ``sample_dtype``). The chain ran on the ``seen`` features (and the bias); the others keep
        the prior, log h = ``prior_log_h`` with variance 0. With the support term, also
        ``support_columns_`` (L, S) (features, -1 pads), ``support_shape_`` and ``support_rate_`` (L, S)
        (:meth:`PosteriorMoments.support_posterior`); else these are None."""
        moments = self.moments
        n_topics = moments.usage_sum.size
        rows = np.append(seen, n_features)  # the seen features and the bias, in the full (D + 1) layout
        log_h = np.full((n_features + 1, n_topics), prior_log_h)
        log_h[rows] = moments.log_h_mean()
        log_h_var = np.zeros((n_features + 1, n_topics))
        log_h_var[rows] = moments.log_h_var()
        phi_samples, log_h_seen = self.draws.arrays()
        n_draws = phi_samples.shape[0]
        log_h_samples = np.full((n_draws, n_features + 1, n_topics), prior_log_h, dtype=np.float32)
        if n_draws:
            log_h_samples[:, rows] = log_h_seen
        else:
            phi_samples = np.empty((0, self.data.n_labels, n_topics), dtype=np.float32)
        kept = {"phi_": moments.phi_mean(), "log_h_": log_h, "log_h_var_": log_h_var,
                "phi_samples_": phi_samples.astype(sample_dtype, copy=False),
                "log_h_samples_": log_h_samples.astype(sample_dtype, copy=False),
                "support_columns_": None, "support_shape_": None, "support_rate_": None}
        if self.data.support is not None:
            columns = self.data.support.columns
            shape, rate = moments.support_posterior(self.data)
            kept["support_columns_"] = np.where(columns >= 0, rows[np.maximum(columns, 0)], -1).astype(np.int32)
            kept["support_shape_"] = shape.reshape(columns.shape).astype(np.float32)  # 12 bytes a slot in the file
            kept["support_rate_"] = rate.reshape(columns.shape).astype(np.float32)
        return kept
