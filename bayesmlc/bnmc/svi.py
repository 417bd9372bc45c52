"""Stochastic variational inference of BNMC's DP mixture: the :class:`MixtureFitter` (start from a
sample, passes of minibatch natural-gradient steps with the Robbins-Monro step size, merge moves, the
ELBO history), for ``BNMC.fit`` and for each ``BNMC.partial_fit`` batch.

The mixture itself and its updates (eqs. 2-5 of Nguyen et al.) are :class:`~bayesmlc.bnmc.mixture.DPMixture`;
this module decides which rows each step sees and with which step size.
"""

from __future__ import annotations

import time

import numpy as np

from ..data.shard import RowShard
from ..distributed import ONE_PROCESS
from ..utils import iter_batches

__all__ = ["MixtureFitter", "SAMPLE_ROWS"]

#: The rows (at most) that the mixture's start is computed from (``initialise_from_sample``).
SAMPLE_ROWS = 2000


class MixtureFitter:
    """Fits the DP mixture of a :class:`~bayesmlc.bnmc.BNMC` (``model._mixture``) by SVI.

    :meth:`fit` is the mixture half of ``BNMC.fit``; :meth:`stream` that of one ``partial_fit`` call;
    :meth:`record` appends the ELBO to ``history_``. The step counter ``svi_steps_`` and the history
    are the estimator's; its settings (``n_passes``, ``batch_size``, ``tau``, ``kappa``,
    ``merge_trials``) are read from it.

    Parameters
    ----------
    model : BNMC with ``n_features_in_``, ``n_labels_`` and ``svi_steps_`` set.
    rng : numpy Generator, the fit's random stream (the sample, then the passes' orders).
    progress : tqdm bar (or None) that each minibatch step advances.
    parallel : :mod:`bayesmlc.distributed` strategy; the statistics are summed over its processes.
    """

    def __init__(self, model, rng: np.random.Generator, progress=None, parallel=ONE_PROCESS):
        self.model = model
        self.rng = rng
        self.progress = progress
        self.parallel = parallel

    def fit(self, X_mix, Y_mix, shard: RowShard, start: float) -> None:
        """A new mixture, started from up to :data:`SAMPLE_ROWS` rows drawn from all processes, then
        ``n_passes`` passes over the rows in random minibatches of ``batch_size`` (row ids global;
        ``X_mix``, ``Y_mix``: this process's rows of ``shard``), each pass followed by up to
        ``merge_trials`` merge moves; the ELBO is recorded at the start and after each pass (wall
        time since ``start``)."""
        model, rng, parallel = self.model, self.rng, self.parallel
        n = shard.n_total
        model._mixture = model._new_mixture(None if parallel.world_size == 1 else parallel.reduce_sum)
        take = rng.choice(n, size=min(n, SAMPLE_ROWS), replace=False)
        model._mixture.initialise_from_sample(parallel.gather_rows(X_mix, take, shard),
                                              parallel.gather_rows(Y_mix, take, shard), float(n), rng)
        self.record(0, X_mix, Y_mix, start)
        for pass_index in range(model.n_passes):
            order = rng.permutation(n)
            for rows in iter_batches(n, model.batch_size):
                take = np.sort(order[rows])
                local, _ = shard.select(take)
                self.step(X_mix[local], Y_mix[local], n, take.size)
                if self.progress is not None:
                    self.progress.update(1)
            if model.merge_trials:
                model._mixture.merge_moves(X_mix, Y_mix, int(model.merge_trials))
            self.record(pass_index + 1, X_mix, Y_mix, start)

    def stream(self, X_mix, Y_mix, first: bool) -> None:
        """One ``partial_fit`` batch: the first starts a new mixture from it, later ones take one SVI
        step on it with the natural gradient scaled to the ``n_seen_`` rows seen so far."""
        model = self.model
        if first:
            model._mixture = model._new_mixture()
            model._mixture.initialise(X_mix, Y_mix, float(X_mix.shape[0]), self.rng)
        else:
            self.step(X_mix, Y_mix, model.n_seen_)

    def step(self, X_mix, Y_mix, n_total: int, batch_rows: int | None = None) -> None:
        """Eqs. (2)-(5) on one minibatch (of ``batch_rows`` rows over all processes, this process's
        rows given), natural gradients scaled by n_total / batch_rows, step size rho_t = (t + tau)^-kappa
        (1 for a batch of every row)."""
        model = self.model
        batch_rows = X_mix.shape[0] if batch_rows is None else batch_rows
        rho = 1.0 if batch_rows >= n_total else float((model.svi_steps_ + model.tau) ** (-model.kappa))
        model._mixture.svi_step(X_mix, Y_mix, n_total / batch_rows, rho)
        model.svi_steps_ += 1

    def record(self, pass_index: int, X_mix, Y_mix, start: float, scale: float = 1.0) -> None:
        """Append to ``history_`` the wall time since ``start``, the ELBO (the rows' expected
        log-likelihood times ``scale``, minus the global KL: ``scale`` = rows seen / rows given when
        estimating it from a batch), the pass and the patterns in use."""
        mixture, history = self.model._mixture, self.model.history_
        elbo = mixture.local_elbo(X_mix, Y_mix) * scale - mixture.global_kl()
        history["wall_time"].append(time.perf_counter() - start)
        history["objective"].append(float(elbo))
        history.setdefault("pass", []).append(int(pass_index))
        history.setdefault("n_patterns", []).append(int(self.model._count_patterns(mixture.expected_weights())))
