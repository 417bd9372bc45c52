"""Truncated stick-breaking Dirichlet-process mixture over feature/label patterns {phi_k, psi_k}.

Section 3.3 of the BNMC paper (Nguyen et al., ACML 2016). Each row i has a pattern z_i ~ pi,
features x_i ~ F(phi_{z_i}) and labels y_i ~ Mult(psi_{z_i}). The variational family is

* q(v_k) = Beta(a_k, b_k), k < K, with v_K = 1 (Blei and Jordan's truncation; pi_k = v_k prod_{j<k} (1 - v_j));
* q(psi_k) = Dir(label_conc[k]) over the L labels (prior Dir(omega_psi));
* q(phi_k): Dir(conc[k]) over the D features (Dirichlet-multinomial emission, prior Dir(omega_phi)),
  or, for real-valued features, an independent Normal-Gamma per feature (conjugate diagonal Gaussian);
* q(z_i) = Mult(r_i).

Fitting is stochastic variational inference (Hoffman et al. 2013): a minibatch E-step (eq. 2) then a
natural-gradient step on every global factor, lambda <- (1 - rho_t) lambda + rho_t lambda_hat with
lambda_hat = prior + (N / |B|) * minibatch statistics (eqs. 3-5) and rho_t = (t + tau)^(-kappa).
Every global factor is stored by parameters that are affine in its natural parameters, so the
convex combination is exactly the natural-gradient step.

Rows without observed labels contribute nothing to the label term (their label count vector is empty),
so they inform pi and phi only, as in section 3.4.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.special import digamma, gammaln

__all__ = ["DirichletEmission", "GaussianEmission", "DPMixture"]

LOG_2PI = np.log(2.0 * np.pi)


def _dirichlet_expected_log(conc: np.ndarray) -> np.ndarray:
    """E[log theta] under Dir(conc) for each row of ``conc`` (K, V)."""
    return digamma(conc) - digamma(conc.sum(axis=1, keepdims=True))


class LazyConcentration:
    """A Dirichlet concentration matrix (K, V) kept as ``prior + scale * base`` with the row sums of
    ``base``, so that the natural-gradient step conc <- (1 - rho) conc + rho (prior + stats) (eqs. 3-4)
    costs K x (the columns its statistics touch), not K x V: the decay goes into the scalar ``scale``
    and the statistics into ``base`` at rho / scale (the scaled-vector form of sparse stochastic
    updates with a decay; Shalev-Shwartz, Singer and Srebro 2007, section 2.4). A minibatch of a bag of
    words touches a few thousand of 200,000 columns."""

    #: ``base`` is folded back into a unit ``scale`` below this (the decays multiply up)
    MIN_SCALE = 1e-100

    def __init__(self, values: np.ndarray, prior: float):
        self.prior = float(prior)
        self.scale = 1.0
        # the array as given until first used: a model file's array keeps the dtype its load-time checks
        # judge (no coercion), and ``base`` is formed from it only when a step or an expectation needs it
        self._given = np.asarray(values)
        self._base = self._base_sums = None

    def _ensure_base(self) -> None:
        if self._base is None:
            self._base = np.array(self._given, dtype=np.float64) - self.prior
            self._base_sums = self._base.sum(axis=1)
            self._given = None

    def dense(self) -> np.ndarray:
        return self._given if self._base is None else self.prior + self.scale * self._base

    def columns(self, columns: np.ndarray) -> np.ndarray:
        self._ensure_base()
        return self.prior + self.scale * self._base[:, columns]

    def row_sums(self) -> np.ndarray:
        self._ensure_base()
        return self.prior * self._base.shape[1] + self.scale * self._base_sums

    def step(self, rho: float, stats: np.ndarray, columns=None) -> None:
        """conc <- (1 - rho) conc + rho (prior + stats), ``stats`` (K, V) or (K, |columns|) when only the
        ``columns`` (distinct indices) are non-zero."""
        self._ensure_base()
        if rho >= 1.0:
            self._base[:] = 0.0
            self._base_sums[:] = 0.0
            self.scale = 1.0
        else:
            self.scale *= 1.0 - rho
        weight = rho / self.scale
        if columns is None:
            self._base += weight * stats
        else:
            self._base[:, columns] += weight * stats
        self._base_sums += weight * stats.sum(axis=1)
        if self.scale < self.MIN_SCALE:
            self._base *= self.scale
            self._base_sums *= self.scale
            self.scale = 1.0


def used_columns(X):
    """The sorted columns a sparse ``X`` uses, or None (all) for a dense one or one using half of them."""
    if not sp.issparse(X):
        return None
    indices = sp.csr_matrix(X).indices
    if indices.size >= X.shape[1] // 2:
        return None
    columns = np.unique(indices)
    return columns if columns.size < X.shape[1] // 2 else None


def _narrow(X, columns: np.ndarray):
    """The sparse ``X`` (n, V) restricted to its ``columns`` (:func:`used_columns`), (n, |columns|)."""
    X = sp.csr_matrix(X)
    return sp.csr_matrix((X.data, np.searchsorted(columns, X.indices), X.indptr), shape=(X.shape[0], columns.size))


def _expected_log_counts(X, conc: LazyConcentration) -> np.ndarray:
    """(n, K): sum_d x_d E[log theta_kd] under Dir(conc_k) (K, V) for the rows of ``X`` (n, V). For a
    sparse ``X`` using few of the V columns (a minibatch of a bag of words, or of label sets), the
    digammas are taken over those columns only: sum_d x_d (psi(conc_kd) - psi(sum_d conc_kd))."""
    columns = used_columns(X)
    if columns is not None:
        e_log = digamma(conc.columns(columns)) - digamma(conc.row_sums())[:, None]
        return np.asarray(_narrow(X, columns) @ e_log.T)
    return np.asarray(X @ _dirichlet_expected_log(conc.dense()).T)


def _dirichlet_kl(conc: np.ndarray, prior: float) -> float:
    """sum_k KL(Dir(conc_k) || Dir(prior, ..., prior))."""
    n_dims = conc.shape[1]
    totals = conc.sum(axis=1)
    return float(
        np.sum(gammaln(totals) - gammaln(conc).sum(axis=1) - gammaln(n_dims * prior) + n_dims * gammaln(prior))
        + np.sum((conc - prior) * _dirichlet_expected_log(conc))
    )


class DirichletEmission:
    """Dirichlet-multinomial emission for non-negative features: x_i ~ Mult(phi_k), phi_k ~ Dir(omega).

    ``expected_loglik`` is sum_d x_d E[log phi_kd] (eq. 2; the multinomial coefficient does not
    depend on k and is left out of the ELBO as a constant).
    """

    def __init__(self, n_features: int, prior: float):
        self.prior = float(prior)
        self._conc = None  # LazyConcentration (K, D)
        self.n_features = n_features

    @property
    def conc(self):
        """q(phi)'s concentrations (K, D), dense."""
        return None if self._conc is None else self._conc.dense()

    @conc.setter
    def conc(self, values) -> None:
        self._conc = None if values is None else LazyConcentration(values, self.prior)

    def init_from_stats(self, stats: np.ndarray) -> None:
        self.conc = self.prior + stats

    def statistics(self, X, resp: np.ndarray, columns=None) -> np.ndarray:
        """Sufficient statistics sum_i r_ik x_i, shape (K, D), or (K, |columns|) over the given columns
        of a sparse ``X`` (:func:`used_columns`)."""
        if columns is not None:
            X = _narrow(X, columns)
        return np.asarray((X.T @ resp).T)

    def natural_step(self, stats: np.ndarray, rho: float, columns=None) -> None:
        self._conc.step(rho, stats, columns)

    def expected_loglik(self, X) -> np.ndarray:
        """(n, K) matrix of E_q[log p(x_i | phi_k)] up to a k-independent constant
        (:func:`_expected_log_counts`)."""
        return _expected_log_counts(X, self._conc)

    def kl(self) -> float:
        return _dirichlet_kl(self.conc, self.prior)

    def state(self) -> dict:
        return {"conc": self.conc}

    def set_state(self, state: dict) -> None:
        self.conc = np.asarray(state["conc"])  # no coercion: BNMC's state table refuses a non-float dtype


class GaussianEmission:
    """Diagonal Gaussian emission with a Normal-Gamma prior per feature and pattern.

    x_d | k ~ N(m_kd, 1 / tau_kd), (m_kd, tau_kd) ~ NG(mean0, kappa0, shape0, rate0). q keeps the
    Normal-Gamma posterior in the affine-in-natural-parameter form

        kappa = kappa0 + n,  h = kappa0 mean0 + s1,  twice_shape = 2 shape0 + n,
        g = kappa0 mean0^2 + 2 rate0 + s2,

    with (n, s1, s2) = sum_i r_ik (1, x_id, x_id^2); the mean is h / kappa, the shape twice_shape / 2
    and the rate (g - h^2 / kappa) / 2.
    """

    def __init__(self, n_features: int, mean0: np.ndarray, kappa0: float, shape0: float, rate0: np.ndarray):
        self.n_features = n_features
        self.mean0 = np.asarray(mean0, dtype=np.float64)
        self.kappa0 = float(kappa0)
        self.shape0 = float(shape0)
        self.rate0 = np.asarray(rate0, dtype=np.float64)
        self.kappa = self.h = self.twice_shape = self.g = None

    def _prior_natural(self):
        return (
            self.kappa0,
            self.kappa0 * self.mean0,
            2.0 * self.shape0,
            self.kappa0 * self.mean0**2 + 2.0 * self.rate0,
        )

    def init_from_stats(self, stats) -> None:
        k0, h0, a0, g0 = self._prior_natural()
        n, s1, s2 = stats
        self.kappa = k0 + np.broadcast_to(n[:, None], s1.shape).copy()
        self.h = h0 + s1
        self.twice_shape = a0 + np.broadcast_to(n[:, None], s1.shape).copy()
        self.g = g0 + s2

    def statistics(self, X, resp: np.ndarray):
        """(n_k (K,), s1 (K, D), s2 (K, D)) weighted by the responsibilities."""
        n = resp.sum(axis=0)
        s1 = np.asarray((X.T @ resp).T)
        Xsq = X.multiply(X) if sp.issparse(X) else X * X
        s2 = np.asarray((Xsq.T @ resp).T)
        return n, s1, s2

    def natural_step(self, stats, rho: float) -> None:
        k0, h0, a0, g0 = self._prior_natural()
        n, s1, s2 = stats
        self.kappa = (1.0 - rho) * self.kappa + rho * (k0 + n[:, None])
        self.h = (1.0 - rho) * self.h + rho * (h0 + s1)
        self.twice_shape = (1.0 - rho) * self.twice_shape + rho * (a0 + n[:, None])
        self.g = (1.0 - rho) * self.g + rho * (g0 + s2)

    def moments(self):
        mean = self.h / self.kappa
        shape = self.twice_shape / 2.0
        rate = np.maximum((self.g - self.h * mean) / 2.0, 1e-12)
        return mean, shape, rate

    def expected_loglik(self, X) -> np.ndarray:
        """(n, K): sum_d E_q[log N(x_d | m_kd, 1/tau_kd)]."""
        mean, shape, rate = self.moments()
        e_tau = shape / rate
        e_log_tau = digamma(shape) - np.log(rate)
        const = 0.5 * np.sum(e_log_tau - LOG_2PI - 1.0 / self.kappa - e_tau * mean**2, axis=1)
        Xsq = X.multiply(X) if sp.issparse(X) else X * X
        quad = np.asarray(Xsq @ e_tau.T) - 2.0 * np.asarray(X @ (e_tau * mean).T)
        return const[None, :] - 0.5 * quad

    def kl(self) -> float:
        mean, shape, rate = self.moments()
        gamma_kl = (
            (shape - self.shape0) * digamma(shape)
            - gammaln(shape)
            + gammaln(self.shape0)
            + self.shape0 * (np.log(rate) - np.log(self.rate0))
            + shape * (self.rate0 - rate) / rate
        )
        ratio = self.kappa0 / self.kappa
        normal_kl = 0.5 * (ratio - 1.0 - np.log(ratio) + self.kappa0 * (shape / rate) * (mean - self.mean0) ** 2)
        return float(np.sum(gamma_kl + normal_kl))

    def state(self) -> dict:
        return {
            "kappa": self.kappa, "h": self.h, "twice_shape": self.twice_shape, "g": self.g,
            "mean0": self.mean0, "rate0": self.rate0, "kappa0": self.kappa0, "shape0": self.shape0,
        }

    def set_state(self, state: dict) -> None:
        for key in ("kappa", "h", "twice_shape", "g", "mean0", "rate0"):  # BNMC's state table checks each
            setattr(self, key, np.asarray(state[key]))
        self.kappa0 = state["kappa0"]
        self.shape0 = state["shape0"]


class DPMixture:
    """The truncated DP mixture and its SVI updates.

    Parameters
    ----------
    truncation : int, K, the cap on the number of patterns.
    emission : DirichletEmission or GaussianEmission, the feature part phi.
    n_labels : int, L.
    label_prior : float, omega_psi.
    concentration : float, alpha of the stick-breaking prior.
    reduce : callable or None, sums a numpy array over processes when the rows are split over
        processes (:meth:`bayesmlc.distributed.DataParallel.reduce_sum`); None in one process. Every
        sum over rows (statistics, ELBO, merge profiles) goes through it, so each process holds the
        same global parameters.
    """

    def __init__(self, truncation: int, emission, n_labels: int, label_prior: float, concentration: float,
                 reduce=None):
        self.reduce = _identity if reduce is None else reduce
        self.truncation = int(truncation)
        self.emission = emission
        self.n_labels = n_labels
        self.label_prior = float(label_prior)
        self.concentration = float(concentration)
        self._label_conc = None  # LazyConcentration (K, L)
        self.stick_a = None  # (K - 1,)
        self.stick_b = None

    @property
    def label_conc(self):
        """q(psi)'s concentrations (K, L), dense."""
        return None if self._label_conc is None else self._label_conc.dense()

    @label_conc.setter
    def label_conc(self, values) -> None:
        self._label_conc = None if values is None else LazyConcentration(values, self.label_prior)

    def __getstate__(self):
        """Pickle without ``reduce``: after a data-parallel fit it is the strategy's all-reduce, bound to a
        process group that cannot travel; the copy is a one-process mixture (its sums are its own)."""
        state = dict(self.__dict__)
        state["reduce"] = _identity
        return state

    # ---- expectations ---------------------------------------------------------------------
    def expected_log_weights(self) -> np.ndarray:
        """E[log pi_k] = E[log v_k] + sum_{j<k} E[log(1 - v_j)], with v_K = 1 (K,)."""
        total = digamma(self.stick_a + self.stick_b)
        e_log_v = digamma(self.stick_a) - total
        e_log_1mv = digamma(self.stick_b) - total
        out = np.zeros(self.truncation)
        out[:-1] = e_log_v
        out[1:] += np.cumsum(e_log_1mv)
        return out

    def expected_weights(self) -> np.ndarray:
        """E[pi_k] under the stick-breaking q (K,)."""
        e_v = self.stick_a / (self.stick_a + self.stick_b)
        out = np.ones(self.truncation)
        out[:-1] = e_v
        out[1:] *= np.cumprod(1.0 - e_v)
        return out

    def label_means(self) -> np.ndarray:
        """E[psi_kc] = conc_kc / sum_c conc_kc (K, L)."""
        return self.label_conc / self._label_conc.row_sums()[:, None]

    def log_scores(self, X, Y=None) -> np.ndarray:
        """Unnormalised log responsibilities, eq. (2): E log pi_k + E log p(x|phi_k) [+ E log p(y|psi_k)]."""
        scores = self.emission.expected_loglik(X) + self.expected_log_weights()[None, :]
        if Y is not None and Y.nnz:
            scores += _expected_log_counts(Y, self._label_conc)
        return scores

    @staticmethod
    def _normalise(scores: np.ndarray):
        top = scores.max(axis=1, keepdims=True)
        resp = np.exp(scores - top)
        norm = resp.sum(axis=1, keepdims=True)
        resp /= norm
        log_norm = (top + np.log(norm)).ravel()
        return resp, log_norm

    def responsibilities(self, X, Y=None) -> np.ndarray:
        """q(z_i = k), shape (n, K). With ``Y=None`` only features (and pi) are used: section 3.4 and the
        test-time p(z = k | x) of eq. (8)."""
        return self._normalise(self.log_scores(X, Y))[0]

    def pattern_evidence(self, X, label_share: np.ndarray) -> np.ndarray:
        """BNMC's pattern evidence of the rows ``X`` (eq. 8): s_c = log(sum_k q(z = k | x) E[psi_kc]) -
        log(label_share_c), (n, L), with q(z | x) from the features alone and ``label_share`` (L,) the
        labels' marginal share sum_k E[pi_k] E[psi_kc]."""
        share = self.responsibilities(X) @ self.label_means()
        return np.log(share + 1e-300) - np.log(label_share)[None, :]

    # ---- SVI -------------------------------------------------------------------------------
    def _stick_targets(self, counts: np.ndarray):
        """(1 + N_k, alpha + sum_{j>k} N_j) for k < K: the Beta natural-gradient targets of eq. (5)."""
        tail = np.cumsum(counts[::-1])[::-1]
        return 1.0 + counts[:-1], self.concentration + tail[1:]

    def initialise(self, X, Y, scale: float, rng: np.random.Generator) -> None:
        """Global parameters from hard assignments to K seeds chosen k-means++-style on a subsample
        of at most 2000 rows (features centred and scaled to unit row norm), scaled to the data size."""
        take = rng.choice(X.shape[0], size=min(X.shape[0], 2000), replace=False)
        self.initialise_from_sample(X[take], Y[take], scale, rng)

    def initialise_from_sample(self, X_sample, Y_sample, scale: float, rng: np.random.Generator) -> None:
        """:meth:`initialise` from given sampled rows (every process passes the same ones)."""
        K = self.truncation
        take = np.arange(X_sample.shape[0])
        X, Y = X_sample, Y_sample
        unit_gram = _centred_unit_gram(X[take])
        unit_sq = np.clip(np.diag(unit_gram), 0.0, None)  # 1, or 0 for a row equal to the mean
        seeds = [int(rng.integers(len(take)))]
        dist = np.clip(unit_sq + unit_sq[seeds[0]] - 2.0 * unit_gram[:, seeds[0]], 0.0, None)
        for _ in range(1, min(K, len(take))):
            probs = dist / dist.sum() if dist.sum() > 0 else np.full(len(take), 1.0 / len(take))
            seeds.append(int(rng.choice(len(take), p=probs)))
            dist = np.minimum(dist, np.clip(unit_sq + unit_sq[seeds[-1]] - 2.0 * unit_gram[:, seeds[-1]], 0.0, None))
        sims = unit_gram[:, seeds]
        resp = np.zeros((len(take), K))
        resp[np.arange(len(take)), np.argmax(sims, axis=1)] = 1.0
        factor = scale / len(take)
        stats = self.emission.statistics(X[take], resp)
        self.emission.init_from_stats(_scale_stats(stats, factor))
        label_stats = np.asarray((Y[take].T @ resp).T)
        self.label_conc = self.label_prior + factor * label_stats
        a, b = self._stick_targets(factor * resp.sum(axis=0))
        self.stick_a, self.stick_b = a, b

    def minibatch_statistics(self, X, Y):
        """Local step (eq. 2) on the rows (X, Y) and their sufficient statistics, summed over
        processes: (emission statistics, label statistics, pattern counts (K,), feature columns, label
        columns). In one process the count statistics cover only the columns the minibatch uses
        (:func:`used_columns`; None: all), (K, |columns|); over processes every column, (K, D) and (K, L)."""
        resp = self.responsibilities(X, Y)
        one_process = self.reduce is _identity
        x_columns = used_columns(X) if one_process and isinstance(self.emission, DirichletEmission) else None
        y_columns = used_columns(Y) if one_process else None
        label_rows = Y if y_columns is None else _narrow(Y, y_columns)
        stats = (self.emission.statistics(X, resp, x_columns) if x_columns is not None else self.emission.statistics(X, resp),
                 np.asarray((label_rows.T @ resp).T), resp.sum(axis=0))
        return self._reduce_stats(stats) + (x_columns, y_columns)

    def _reduce_stats(self, stats):
        """Sum a (nested) tuple of arrays over processes with one reduction."""
        if self.reduce is _identity:
            return stats
        parts = _flatten(stats)
        summed = self.reduce(np.concatenate([np.ravel(np.asarray(p, dtype=np.float64)) for p in parts]))
        out, start = [], 0
        for part in parts:
            size = np.size(part)
            out.append(summed[start:start + size].reshape(np.shape(part)))
            start += size
        return _unflatten(stats, iter(out))

    def svi_step(self, X, Y, scale: float, rho: float) -> None:
        """One natural-gradient step (eqs. 2-5) from the minibatch (X, Y) (this process's rows of
        it); ``scale`` = N / |B| with |B| the global minibatch size."""
        stats, label_stats, counts, x_columns, y_columns = self.minibatch_statistics(X, Y)
        if x_columns is None:
            self.emission.natural_step(_scale_stats(stats, scale), rho)
        else:
            self.emission.natural_step(_scale_stats(stats, scale), rho, x_columns)
        self._label_conc.step(rho, scale * label_stats, y_columns)
        a, b = self._stick_targets(scale * counts)
        self.stick_a = (1.0 - rho) * self.stick_a + rho * a
        self.stick_b = (1.0 - rho) * self.stick_b + rho * b

    def set_from_responsibilities(self, X, Y, resp: np.ndarray) -> None:
        """The full-data coordinate-ascent update of every global factor from responsibilities (n, K)."""
        stats, label_stats, counts = self._reduce_stats(
            (self.emission.statistics(X, resp), np.asarray((Y.T @ resp).T), resp.sum(axis=0)))
        self.emission.init_from_stats(stats)
        self.label_conc = self.label_prior + label_stats
        self.stick_a, self.stick_b = self._stick_targets(counts)

    def merge_moves(self, X, Y, max_trials: int) -> int:
        """Merge moves (in the spirit of Hughes and Sudderth 2013): for the ``max_trials`` most similar
        pairs of patterns (cosine similarity of their feature and label statistics), move the
        responsibilities of one into the other, redo the full-data update and keep the result only if
        the full ELBO increases. Coordinate-ascent VI cannot merge duplicated patterns by itself.
        Returns the number of merges accepted."""
        current = self.local_elbo(X, Y) - self.global_kl()
        resp = self.responsibilities(X, Y)
        used = np.flatnonzero(self.reduce(resp.sum(axis=0)) > 1e-3)
        if used.size < 2:
            return 0
        profile = self.reduce(np.hstack([np.asarray((X.T @ resp[:, used]).T), np.asarray((Y.T @ resp[:, used]).T)]))
        profile = profile / (np.linalg.norm(profile, axis=1, keepdims=True) + 1e-12)
        similarity = profile @ profile.T
        first, second = np.triu_indices(used.size, k=1)
        order = np.argsort(-similarity[first, second])[:max_trials]
        accepted, gone = 0, set()
        for a, b in zip(used[first[order]], used[second[order]]):
            if a in gone or b in gone:
                continue
            saved = (self.state(), self.emission.state())
            merged = resp.copy()
            merged[:, a] += merged[:, b]
            merged[:, b] = 0.0
            self.set_from_responsibilities(X, Y, merged)
            candidate = self.local_elbo(X, Y) - self.global_kl()
            if candidate > current:
                current, accepted = candidate, accepted + 1
                gone.add(b)
                resp = self.responsibilities(X, Y)
            else:
                self.set_state(saved[0])
                self.emission.set_state(saved[1])
        return accepted

    # ---- objective -------------------------------------------------------------------------
    def local_elbo(self, X, Y) -> float:
        """sum_i max_{q(z_i)} (E[log p(x_i, y_i, z_i | globals)] - E[log q(z_i)]) = sum_i logsumexp_k(scores)."""
        _, log_norm = self._normalise(self.log_scores(X, Y))
        return float(self.reduce(np.array([log_norm.sum()]))[0])

    def global_kl(self) -> float:
        a0, b0 = 1.0, self.concentration
        a, b = self.stick_a, self.stick_b
        beta_kl = (
            gammaln(a + b) - gammaln(a) - gammaln(b) - (gammaln(a0 + b0) - gammaln(a0) - gammaln(b0))
            + (a - a0) * (digamma(a) - digamma(a + b))
            + (b - b0) * (digamma(b) - digamma(a + b))
        )
        return float(beta_kl.sum()) + _dirichlet_kl(self.label_conc, self.label_prior) + self.emission.kl()

    def state(self) -> dict:
        return {"label_conc": self.label_conc, "stick_a": self.stick_a, "stick_b": self.stick_b}

    def set_state(self, state: dict) -> None:
        # no coercion: BNMC's state table (bnmc/state_checks.py) refuses a non-float dtype
        self.label_conc = np.asarray(state["label_conc"])
        self.stick_a = np.asarray(state["stick_a"])
        self.stick_b = np.asarray(state["stick_b"])


def _identity(array):
    return array


def _flatten(stats) -> list:
    if isinstance(stats, tuple):
        return [leaf for part in stats for leaf in _flatten(part)]
    return [stats]


def _unflatten(template, leaves):
    if isinstance(template, tuple):
        return tuple(_unflatten(part, leaves) for part in template)
    return next(leaves)


def _centred_unit_gram(X) -> np.ndarray:
    """Inner products (m, m) of the rows of X (m, D) after centring (column means of these rows)
    and scaling each to unit norm, from the sparse Gram X X^T: (x_i - c)^T (x_j - c) =
    x_i^T x_j - x_i^T c - x_j^T c + c^T c, so a sparse X is never densified (m x D dense rows of a
    D = 203,882 set would be 3.2 GB)."""
    gram = np.asarray((X @ X.T).toarray() if sp.issparse(X) else X @ X.T, dtype=np.float64)
    centre = np.asarray(X.mean(axis=0), dtype=np.float64).ravel()
    cross = np.asarray(X @ centre, dtype=np.float64).ravel()
    gram = gram - cross[:, None] - cross[None, :] + centre @ centre
    norms = np.sqrt(np.clip(np.diag(gram), 0.0, None)) + 1e-12
    return gram / norms[:, None] / norms[None, :]


def _scale_stats(stats, factor: float):
    if isinstance(stats, tuple):
        return tuple(factor * s for s in stats)
    return factor * stats
