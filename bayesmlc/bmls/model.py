"""The :class:`BMLS` estimator: Bernoulli-Poisson label factorisation with sparse binary features and
optional label co-occurrence (Zhao, Rai, Du & Buntine, AISTATS 2018), trained by Gibbs sampling."""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp
import torch

from ..base import MultiLabelEstimator
from ..exceptions import ValidationError
from ..utils import iter_batches, numpy_rng, resolve_device
from .gibbs import SweepData, gibbs_sweep, init_state

__all__ = ["BMLS", "cooccurrence_matrix"]

SAMPLE_CHUNK = 16  # posterior samples evaluated together at prediction time


def cooccurrence_matrix(Y, diagonal: bool = False) -> sp.csr_matrix:
    """Label co-occurrence counts from a label matrix: the upper triangle of C = Y^T Y (entry (i, j),
    i < j, = number of rows carrying both labels). ``diagonal=False`` keeps the strict upper triangle,
    as the authors' code does; ``diagonal=True`` also keeps c_ii = the number of rows carrying label i
    (the paper's C = Y^T Y). Returns CSR int64 (L, L)."""
    Y = sp.csr_matrix(Y)
    Y = sp.csr_matrix((np.ones(Y.nnz), Y.indices, Y.indptr), shape=Y.shape)  # clip to 0/1
    C = sp.triu(sp.csr_matrix(Y.T @ Y), k=0 if diagonal else 1, format="csr")
    C.data = np.rint(C.data)
    C.eliminate_zeros()
    return C.astype(np.int64)


def _pairs_from_matrix(C, n_labels: int, diagonal: bool = False):
    """(first, second, counts) of the unordered label pairs of a user co-occurrence matrix.

    A symmetric matrix contributes its strict upper triangle; a non-symmetric one counts (i, j) and
    (j, i) together as the unordered pair. The diagonal is ignored (as in the authors' code) unless
    ``diagonal``, where the pairs (i, i) with c_ii > 0 are kept too (then the diagonal must not be all
    zero: a zero there would be modelled as "label i was never seen").
    """
    C = sp.csr_matrix(C, dtype=np.float64)
    if C.shape != (n_labels, n_labels):
        raise ValidationError(f"cooccurrence matrix has shape {C.shape}; it must be (n_labels, n_labels) = {(n_labels, n_labels)}")
    if C.nnz and (not np.all(np.isfinite(C.data)) or C.data.min() < 0 or not np.all(C.data == np.rint(C.data))):
        raise ValidationError("cooccurrence matrix must hold non-negative integer counts")
    symmetric = (C != C.T).nnz == 0
    upper = sp.triu(C, k=1) if symmetric else sp.triu(C, k=1) + sp.tril(C, k=-1).T
    if diagonal:
        if not np.any(C.diagonal()):
            raise ValidationError(
                "cooccurrence_diagonal=True but the cooccurrence matrix has an all-zero diagonal; build it "
                "with cooccurrence_matrix(Y, diagonal=True) (c_ii = rows carrying label i)"
            )
        upper = upper + sp.diags(C.diagonal())
    upper = sp.coo_matrix(upper)
    upper.sum_duplicates()
    keep = upper.data > 0
    return upper.row[keep].astype(np.int64), upper.col[keep].astype(np.int64), np.rint(upper.data[keep]).astype(np.int64)


class BMLS(MultiLabelEstimator):
    """Bayesian multi-label learning with sparse features and labels (BMLS / BMLS-co).

    Model (paper eqs. (1)-(12)): y_ln = 1[z_ln > 0], z_ln ~ Poisson(sum_k phi_lk theta_kn),
    phi_k ~ Dirichlet_L(beta0), theta_kn = b_k prod_d h_dk^{x_nd} over binary features with
    h_dk, b_k ~ Gamma(mu0, rate nu0); optionally the label co-occurrence counts c_ij ~
    Poisson(sum_k phi_ik lambda_k phi_jk) share phi. Trained by the Gibbs sweep of
    :mod:`bayesmlc.bmls.gibbs`, whose cost grows with nnz(Y), nnz(X) and nnz(C). Predictions are
    1 - exp(-phi theta(x)) averaged over the kept posterior samples.

    Parameters
    ----------
    n_topics : int, K, the number of label topics.
    mu0, nu0 : float, shape and rate of the gamma prior on h and the bias b (paper: mu0 = nu0 = 10).
    beta0 : float, Dirichlet concentration of the topics; the initial value when ``sample_beta0``.
    sample_beta0 : bool, resample beta0 each sweep under a Gamma(0.01, 0.01) prior (authors' code)
        instead of keeping it fixed (paper).
    cooccurrence : bool or (L, L) matrix. ``True``: co-factorise the co-occurrence counts of the
        observed training labels (strict upper triangle of Y^T Y); a matrix: use these counts (e.g.
        from an external corpus, or from the complete labels as in the paper's missing-label runs,
        see :func:`cooccurrence_matrix`); ``False``: plain BMLS.
    cooccurrence_diagonal : bool. ``False`` (the authors' code): only the pairs i < j of C are modelled.
        ``True``: the diagonal c_ii (the number of rows carrying label i, part of the paper's
        C = Y^T Y) is modelled too, c_ii ~ Poisson(sum_k phi_ik^2 lambda_k); a user matrix must then
        carry its diagonal (``cooccurrence_matrix(Y, diagonal=True)``).
    phi_step : ``"dirichlet"`` or ``"metropolis"``. With co-occurrence, the exposure
        exp(-sum_k lambda_k E_k(phi_k)) of eq. (25) depends on phi; ``"dirichlet"`` (paper and code)
        draws phi from eq. (26), which ignores it (an approximation); ``"metropolis"`` uses that draw
        as an independence proposal and accepts it with the exposure ratio (exact). Without C both are
        the exact Gibbs step of eq. (24).
    n_burnin : int, sweeps discarded before collecting.
    n_samples : int, posterior samples kept (each costs (L + D + 1) K values of ``sample_dtype`` in
        memory and on disk).
    thin : int, sweeps between kept samples.
    binarize_threshold : None or float. The model needs binary features; with ``None`` any other value
        is an error, with a number t a feature is on when x > t.
    sample_dtype : ``"float32"`` or ``"float16"``, storage of the kept samples. float16 halves the
        fitted model (Bibtex, 250 samples: about 100 MB instead of 200 MB) at a rounding error of at
        most 2^-11 relative per stored value (<= 0.001 absolute for |log h| < 4); ``phi_`` and
        ``log_h_`` are averaged before rounding. Predictions are computed in float32 either way.
    recompute_theta_every : int, sweeps between recomputing theta = exp(X log h) from scratch in log
        space (between them theta is updated multiplicatively, eq. (23)).
    random_state : int, Generator or None.
    device : "auto", "cpu" or "cuda": where predictions are computed. The sampler itself runs on the
        CPU (numba): its h step is sequential over features.
    verbose : bool, progress bar on stderr.

    Attributes
    ----------
    phi_ : (L, K) posterior mean of the topics.
    log_h_ : (D + 1, K) posterior mean of log h; the last row is the bias log b.
    phi_samples_ : (S, L, K) kept samples of phi (``sample_dtype``).
    log_h_samples_ : (S, D + 1, K) kept samples of log h (``sample_dtype``).
    beta0_ : float, the last beta0. topic_usage_ : (K,) mean label tokens per topic over kept sweeps.
    history_ : per sweep "objective" (log-likelihood of the observed training labels), "wall_time",
        "sweep", "sweep_time", "beta0", "phi_acceptance" (share of topics whose phi proposal was
        accepted; always 1 with ``phi_step="dirichlet"`` or without C).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = (rng.random((60, 8)) < 0.3).astype(float); Y = X[:, :3]
    >>> model = BMLS(n_topics=4, n_burnin=20, n_samples=5, thin=2, random_state=0).fit(X, Y)
    >>> model.predict_proba(X).shape
    (60, 3)
    """

    def __init__(
        self,
        n_topics=100,
        mu0=10.0,
        nu0=10.0,
        beta0=0.1,
        sample_beta0=True,
        cooccurrence=False,
        cooccurrence_diagonal=False,
        n_burnin=200,
        n_samples=250,
        thin=10,
        binarize_threshold=None,
        recompute_theta_every=10,
        phi_step="dirichlet",
        sample_dtype="float32",
        random_state=None,
        device="auto",
        verbose=False,
    ):
        self.n_topics = n_topics
        self.mu0 = mu0
        self.nu0 = nu0
        self.beta0 = beta0
        self.sample_beta0 = sample_beta0
        self.cooccurrence = cooccurrence
        self.cooccurrence_diagonal = cooccurrence_diagonal
        self.n_burnin = n_burnin
        self.n_samples = n_samples
        self.thin = thin
        self.binarize_threshold = binarize_threshold
        self.recompute_theta_every = recompute_theta_every
        self.phi_step = phi_step
        self.sample_dtype = sample_dtype
        self.random_state = random_state
        self.device = device
        self.verbose = verbose

    # ---- validation -------------------------------------------------------------------------
    def _check_params(self):
        def positive_int(name, minimum=1):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
                raise ValidationError(f"{name} must be an integer >= {minimum}, got {value!r}")

        def positive_float(name):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not np.isfinite(value) or value <= 0:
                raise ValidationError(f"{name} must be a positive number, got {value!r}")

        positive_int("n_topics")
        positive_int("n_burnin", 0)
        positive_int("n_samples")
        positive_int("thin")
        positive_int("recompute_theta_every")
        for name in ("mu0", "nu0", "beta0"):
            positive_float(name)
        if self.sample_dtype not in ("float32", "float16"):
            raise ValidationError(f"sample_dtype must be 'float32' or 'float16', got {self.sample_dtype!r}")
        if self.phi_step not in ("dirichlet", "metropolis"):
            raise ValidationError(f"phi_step must be 'dirichlet' or 'metropolis', got {self.phi_step!r}")
        for name in ("sample_beta0", "cooccurrence_diagonal"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValidationError(f"{name} must be True or False, got {getattr(self, name)!r}")
        threshold = self.binarize_threshold
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.number))):
            raise ValidationError(f"binarize_threshold must be None or a number, got {threshold!r}")
        resolve_device(self.device)

    def _binary_features(self, X: sp.csr_matrix) -> sp.csr_matrix:
        """The 0/1 feature pattern the model uses; non-binary input is an error unless binarised."""
        X = sp.csr_matrix(X, dtype=np.float32, copy=True)
        if self.binarize_threshold is None:
            X.eliminate_zeros()
            if X.nnz and not np.all(X.data == 1):
                bad = np.unique(X.data[X.data != 1])[:3].tolist()
                raise ValidationError(
                    f"BMLS needs binary (0/1) features; X holds other values such as {bad}. "
                    "Set binarize_threshold=t to turn on every feature with x > t."
                )
            return X
        X.data = (X.data > float(self.binarize_threshold)).astype(np.float32)
        X.eliminate_zeros()
        return X

    @staticmethod
    def _with_bias(X: sp.csr_matrix) -> sp.csr_matrix:
        """X' = [X, 1]: the bias b_k of eq. (8) is the weight of an always-on feature."""
        return sp.hstack([X, np.ones((X.shape[0], 1), dtype=np.float32)], format="csr")

    def _cooccurrence_pairs(self, Y: sp.csr_matrix):
        spec = self.cooccurrence
        if spec is None or (isinstance(spec, (bool, np.bool_)) and not spec):
            return None
        if isinstance(spec, (bool, np.bool_)):
            matrix = cooccurrence_matrix(Y, diagonal=bool(self.cooccurrence_diagonal))
        elif sp.issparse(spec) or isinstance(spec, (np.ndarray, list, tuple)):
            matrix = sp.csr_matrix(np.asarray(spec)) if isinstance(spec, (list, tuple)) else spec
        else:
            raise ValidationError(f"cooccurrence must be True, False or an (L, L) matrix, got {type(spec).__name__}")
        return _pairs_from_matrix(matrix, Y.shape[1], diagonal=bool(self.cooccurrence_diagonal))

    # ---- training -----------------------------------------------------------------------------
    def _fit(self, X, Y, label_mask, **fit_params):
        if fit_params:
            raise ValidationError(f"BMLS.fit takes no extra arguments, got {sorted(fit_params)}")
        self._check_params()
        X_bias = self._with_bias(self._binary_features(X))
        if label_mask is not None and label_mask.nnz == label_mask.shape[0] * label_mask.shape[1]:
            label_mask = None  # everything observed: the exact fast path
        data = SweepData.build(
            X_bias, Y, label_mask, self._cooccurrence_pairs(Y), pair_diagonal=bool(self.cooccurrence_diagonal)
        )
        rng = numpy_rng(self.random_state)
        n_topics = int(self.n_topics)
        state = init_state(data, n_topics, X_bias.shape[1], float(self.beta0), rng)

        n_sweeps = int(self.n_burnin) + int(self.n_samples) * int(self.thin)
        phi_samples = np.empty((int(self.n_samples), data.n_labels, n_topics), dtype=np.float32)
        log_h_samples = np.empty((int(self.n_samples), X_bias.shape[1], n_topics), dtype=np.float32)
        usage = np.zeros(n_topics)
        kept = 0
        history = self.history_
        for key in ("sweep", "sweep_time", "beta0", "phi_acceptance"):
            history[key] = []
        progress = None
        if self.verbose:
            from tqdm.auto import tqdm

            progress = tqdm(total=n_sweeps, desc="BMLS Gibbs", unit="sweep")
        start = time.perf_counter()
        try:
            for sweep in range(1, n_sweeps + 1):
                tic = time.perf_counter()
                log_lik = gibbs_sweep(
                    data,
                    state,
                    rng,
                    float(self.mu0),
                    float(self.nu0),
                    bool(self.sample_beta0),
                    recompute_theta=sweep % int(self.recompute_theta_every) == 0,
                    phi_step=self.phi_step,
                )
                toc = time.perf_counter()
                history["objective"].append(log_lik)
                history["wall_time"].append(toc - start)
                history["sweep"].append(sweep)
                history["sweep_time"].append(toc - tic)
                history["beta0"].append(state.beta0)
                history["phi_acceptance"].append(state.phi_acceptance)
                past_burnin = sweep - int(self.n_burnin)
                if past_burnin > 0 and past_burnin % int(self.thin) == 0:
                    phi_samples[kept] = state.phi
                    log_h_samples[kept] = np.log(state.h)
                    usage += state.topic_tokens
                    kept += 1
                if progress is not None:
                    progress.update(1)
                    if sweep % 10 == 0 or sweep == n_sweeps:
                        progress.set_postfix(loglik=f"{log_lik:.1f}", beta0=f"{state.beta0:.3g}")
        finally:
            if progress is not None:
                progress.close()
        self.phi_ = phi_samples.mean(axis=0, dtype=np.float64)
        self.log_h_ = log_h_samples.mean(axis=0, dtype=np.float64)
        self.phi_samples_ = phi_samples.astype(self.sample_dtype, copy=False)
        self.log_h_samples_ = log_h_samples.astype(self.sample_dtype, copy=False)
        self.beta0_ = float(state.beta0)
        self.topic_usage_ = usage / kept
        self.n_sweeps_ = n_sweeps
        if data.uses_cooccurrence:
            self.cooccurrence_weights_ = np.asarray(state.r, dtype=np.float64)
        return self

    # ---- prediction ---------------------------------------------------------------------------
    def _sample_probabilities(self, X: sp.csr_matrix, device: torch.device):
        """Yield (chunk of samples) probabilities 1 - exp(-phi theta(x)), tensors (c, b, L) on ``device``."""
        X_bias = self._with_bias(self._binary_features(X)).tocoo()
        x = torch.sparse_coo_tensor(
            torch.from_numpy(np.vstack([X_bias.row, X_bias.col]).astype(np.int64)),
            torch.from_numpy(X_bias.data.astype(np.float32)),
            size=X_bias.shape,
            device=device,
            check_invariants=False,  # built from a valid scipy matrix
        ).coalesce()
        n_samples, n_features, n_topics = self.log_h_samples_.shape
        for lo in range(0, n_samples, SAMPLE_CHUNK):
            hi = min(lo + SAMPLE_CHUNK, n_samples)
            log_h = torch.as_tensor(self.log_h_samples_[lo:hi], device=device, dtype=torch.float32)  # (c, D', K)
            phi = torch.as_tensor(self.phi_samples_[lo:hi], device=device, dtype=torch.float32)  # (c, L, K)
            stacked = log_h.permute(1, 0, 2).reshape(n_features, (hi - lo) * n_topics)
            theta = torch.exp(torch.sparse.mm(x, stacked)).reshape(-1, hi - lo, n_topics)  # (b, c, K), eq. (8)
            rate = torch.einsum("bck,clk->cbl", theta, phi)
            yield -torch.expm1(-rate)

    def _mean_probability(self, X) -> np.ndarray:
        device = resolve_device(self.device)
        total = None
        with torch.no_grad():
            for probs in self._sample_probabilities(X, device):
                part = probs.to(torch.float64).sum(dim=0)
                total = part if total is None else total + part
        return (total / self.log_h_samples_.shape[0]).cpu().numpy()

    def _predict_proba(self, X) -> np.ndarray:
        """Posterior predictive Pr(y_l = 1 | x) = mean over kept samples of 1 - exp(-sum_k phi_lk theta_k(x))."""
        return self._mean_probability(X).astype(np.float32)

    def _decision_function(self, X) -> np.ndarray:
        """Log-odds of the posterior predictive probability (same ranking, the scale of the base's prior logit)."""
        proba = np.clip(self._mean_probability(X), 1e-12, 1.0 - 1e-12)
        return (np.log(proba) - np.log1p(-proba)).astype(np.float32)

    def predict_interval(self, X, coverage: float = 0.9, batch_size: int = 256):
        """Equal-tailed posterior interval of Pr(y_l = 1 | x, phi, h) over the kept samples.

        Returns (lower, upper), each float32 (n_samples, n_labels). Labels without a training positive
        get the base's prior for both bounds.
        """
        if not isinstance(coverage, (int, float)) or not 0.0 < float(coverage) < 1.0:
            raise ValidationError(f"coverage must be in (0, 1), got {coverage!r}")
        X = self._validated(X)
        device = resolve_device(self.device)
        tail = (1.0 - float(coverage)) / 2.0
        lower = np.empty((X.shape[0], self.n_labels_), dtype=np.float32)
        upper = np.empty_like(lower)
        with torch.no_grad():
            for rows in iter_batches(X.shape[0], batch_size):
                draws = torch.cat(list(self._sample_probabilities(X[rows], device)), dim=0)  # (S, b, L)
                quantiles = torch.quantile(draws, torch.tensor([tail, 1.0 - tail], device=device, dtype=draws.dtype), dim=0)
                lower[rows] = quantiles[0].cpu().numpy()
                upper[rows] = quantiles[1].cpu().numpy()
        if self.empty_labels_.size:
            lower[:, self.empty_labels_] = self.label_prior_[self.empty_labels_]
            upper[:, self.empty_labels_] = self.label_prior_[self.empty_labels_]
        return lower, upper

    # ---- interpretation -----------------------------------------------------------------------
    def topics(self, n_top: int = 10):
        """Topics ordered by usage (mean label tokens per kept sweep), each a dict with

        ``topic`` (index k), ``usage``, ``labels``: the ``n_top`` (label index, phi_lk) pairs with the
        largest posterior-mean weight, ``features``: the ``n_top`` (feature index, E[log h_dk]) pairs
        that most increase theta_k (the bias row excluded), ``bias``: E[log b_k].
        """
        self._check_is_fitted()
        if not isinstance(n_top, (int, np.integer)) or n_top < 1:
            raise ValidationError(f"n_top must be a positive integer, got {n_top!r}")
        n_top_labels = min(int(n_top), self.phi_.shape[0])
        n_top_features = min(int(n_top), self.log_h_.shape[0] - 1)
        out = []
        for k in np.argsort(-self.topic_usage_, kind="stable"):
            labels = np.argsort(-self.phi_[:, k], kind="stable")[:n_top_labels]
            features = np.argsort(-self.log_h_[:-1, k], kind="stable")[:n_top_features]
            out.append(
                {
                    "topic": int(k),
                    "usage": float(self.topic_usage_[k]),
                    "labels": [(int(l), float(self.phi_[l, k])) for l in labels],
                    "features": [(int(d), float(self.log_h_[d, k])) for d in features],
                    "bias": float(self.log_h_[-1, k]),
                }
            )
        return out
