"""The :class:`BMLS` estimator: Bernoulli-Poisson label factorisation with sparse binary features and
optional label co-occurrence (Zhao, Rai, Du & Buntine, AISTATS 2018), trained by Gibbs sampling."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import scipy.sparse as sp
import torch

from ..base import LABEL_CARDINALITY, MultiLabelEstimator
from ..exceptions import ValidationError
from ..fitted_state import check_fitted_state
from ..parameters import Boolean, Integer, Options, Real
from ..preprocessing import resolve_standardize
from ..presets import HasPresets
from ..utils import iter_batches, logit, numpy_rng, resolve_device
from .chain import GibbsChain
from .distributed_gibbs import fit_sharded
from .gibbs import SweepData, init_state
from .state_checks import BMLS_FIELDS
from .schedule import AUTO_MIN_PREDICTIVE_DRAWS, AUTO_WINDOW, Schedule, draw_capacity
from .support_term import attach_support, support_exponent, support_width
from .topics import auto_topics

__all__ = ["BMLS", "cooccurrence_matrix"]

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


class BMLS(HasPresets, MultiLabelEstimator):
    """Bayesian multi-label learning with sparse features and labels (BMLS / BMLS-co).

    Model (paper eqs. (1)-(12)): y_ln = 1[z_ln > 0], z_ln ~ Poisson(sum_k phi_lk theta_kn),
    phi_k ~ Dirichlet_L(beta0), theta_kn = b_k prod_d h_dk^{x_nd} over binary features with
    h_dk, b_k ~ Gamma(mu0, rate nu0); optionally the label co-occurrence counts c_ij ~
    Poisson(sum_k phi_ik lambda_k phi_jk) share phi. Trained by the Gibbs sweep of
    :mod:`bayesmlc.bmls.gibbs`, whose cost grows with nnz(Y), nnz(X) and nnz(C).

    Two schedules (docs/bmls.md, "Schedules"):

    * ``"auto"`` (default): burn-in stops when the training log-likelihood (and the held-out one, with
      ``validation_fraction``) plateaus; collection stops when the posterior-mean predictions at the
      training positives stop moving. Predictions average 1 - exp(-phi theta(x)) over the draws kept
      evenly spread over the collection (at most ``max_kept_draws``: the Monte Carlo posterior
      predictive). With fewer than 16 kept draws (``AUTO_MIN_PREDICTIVE_DRAWS``) they come from the
      posterior moments instead: Pr(y_l = 1 | x) = 1 - exp(-sum_k E[phi_lk] E[theta_k(x)]) with
      E[theta_k(x)] = exp(sum_d x_d (E[log h_dk] + Var[log h_dk] / 2)) (log h treated as Gaussian and
      independent across d), which ranks far worse on small sets. ``predictor_`` says which.
    * ``"fixed"``: the authors' demo protocol, ``n_burnin`` sweeps then ``n_draws`` draws every
      ``thin`` sweeps; predictions average 1 - exp(-phi theta(x)) over the kept draws (paper and code).

    Parameters
    ----------
    n_topics : ``"auto"`` or int, K, the number of label topics. ``"auto"``: the square root of the number
        of positive (observed) label entries of the training rows, at least 10 and at most 100, or at
        most one per 10 labels where that is more and a draw's (L + D + 1) K values stay within 2^22
        (:func:`auto_topics`; Bibtex: 100, the papers' K; medical's 418 positives: 20; the EURLex-4K
        shape: 287); stored as ``n_topics_``.
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
    support_features : ``"auto"`` or int >= 0, S: each label's rate gains nonnegative weights on the S
        features of its strong-rule support, beside the topics (:mod:`bayesmlc.bmls.support_term`:
        z_ln ~ Poisson(phi_l theta_n + sum_j x_{n, s_lj} w_lj), w_lj ~ Gamma(2, rate b_l), sampled in the
        sweep). ``"auto"``: 128 where there are more than 10 labels a topic and fewer than 10 training
        rows a feature (features that occur), else 0; 0: no term. One process only, every label
        observed: with ``label_mask`` or several processes there is no term (an explicit S > 0 there is
        named in a warning). Stored as ``support_columns_``, ``support_shape_`` and ``support_rate_``
        (None without the term).
    schedule : ``"auto"`` or ``"fixed"`` (see above).
    n_burnin, n_draws, thin : int, the ``"fixed"`` schedule: sweeps discarded, Gibbs draws kept, sweeps
        between kept draws (each draw costs (L + D + 1) K values of ``sample_dtype``). Unused by ``"auto"``.
    max_sweeps : ``"auto"`` or int >= 40, the ``"auto"`` schedule's most sweeps in all; burn-in takes at
        most half of them. ``"auto"``: the sweeps that about one minute of one core buys by a cost model
        of the sweep in the data's shape (deterministic), at least 100 and at most 2000.
    plateau_tol : float, ``"auto"``: burn-in ends at the end of a window of 20 sweeps whose mean
        log-likelihood gained less than ``plateau_tol`` x |mean| over the previous window (training and,
        with ``validation_fraction``, held-out).
    predictive_tol : float, ``"auto"``: collection ends at the end of a window (after at least 3) where
        the posterior-mean rates at the training positives moved by less than ``predictive_tol`` in mean
        absolute log since the previous window.
    validation_fraction : None or float in (0, 0.5], ``"auto"``: hold out this share of the training rows
        (drawn from ``random_state``; not trained on) and require their log-likelihood to plateau too.
        Not available with ``label_mask``.
    max_kept_draws : ``"auto"`` or int >= 0, ``"auto"`` schedule: draws kept for prediction and
        :meth:`predict_interval`, spread over the collection (thinning doubles whenever the store is
        full, so between half of it and all of it is kept). ``"auto"``: at most 400 and at most 128 MB
        of ``sample_dtype``. 0 keeps none (a small file; predictions from the moments).
    binarize_threshold : ``"auto"``, None or float. The model needs binary features. ``"auto"``: on
        sparse features (at most half of the training entries non-zero) a feature is on when x > 0;
        on dense ones (audio, image or expression descriptors, where x > 0 holds almost everywhere) when
        x exceeds the feature's median over the training rows (``feature_thresholds_``); one warning
        at fit when X is not already 0/1. A number t: on when x > t; None: any non-binary value is an
        error.
    sample_dtype : ``"float16"`` or ``"float32"``, storage of the kept draws (the moments stay float64).
        float16 halves the file and, within the same bytes, doubles the draws ``"auto"`` keeps; on
        Bibtex the predictions moved by at most 9e-5.
    label_cardinality : {"independent", "at_least_one"}, what ``predict_proba`` returns: the model's
        per-label probabilities, or the same conditioned on the row having at least one label
        (:func:`bayesmlc.base.at_least_one_label`), for data where every row has a label. Rankings are
        unchanged; measured: docs/experiments.md, "Calibration".
    recompute_theta_every : int, sweeps between recomputing theta = exp(X log h) from scratch in log
        space (between them theta is updated multiplicatively, eq. (23)).
    n_threads : int or None, default None
        CPU threads of torch and the BLAS during fit and prediction; None: one per idle core, fewer
        when other processes keep the cores busy (:func:`bayesmlc.threads.compute_threads`). The same
        seed gives the same result at a fixed count.
    random_state : int, Generator or None.
    device : "auto", "cpu" or "cuda": where predictions are computed. The sampler itself runs on the
        CPU (numba): its h step is sequential over features.
    verbose : bool, progress bar on stderr.
    n_samples : int or "deprecated", the former name of ``n_draws`` (``n_samples`` means rows elsewhere):
        an int is used as ``n_draws``, with a FutureWarning at ``fit``; it will be removed. A model file
        that names it loads with its value as ``n_draws``.

    Attributes
    ----------
    feature_thresholds_ : (D,) float64 or None, the training medians a dense feature must exceed to be
        on (``binarize_threshold="auto"`` on dense features; None: the threshold of ``binarize_threshold``).
    n_topics_ : int, K, the number of topics (``n_topics`` resolved).
    phi_ : (L, K) posterior mean of the topics.
    log_h_ : (D + 1, K) posterior mean of log h; the last row is the bias log b. Features never on in
        the training rows keep their prior and are fixed at h = E[h] = mu0 / nu0 (not sampled).
    log_h_var_ : (D + 1, K) posterior variance of log h (0 for features never on in training).
    phi_samples_ : (S, L, K) kept draws of phi (``sample_dtype``); S may be 0 with ``"auto"``.
    log_h_samples_ : (S, D + 1, K) kept draws of log h (``sample_dtype``).
    predictor_ : ``"draws"`` (the mean over the kept draws) or ``"moments"`` (the posterior moments'
        lognormal formula above), what ``predict_proba`` and ``decision_function`` use.
    n_sweeps_, n_burnin_, n_collected_ : sweeps in all, burn-in sweeps, sweeps averaged into the moments.
    sweep_step_seconds_ : dict, seconds per step summed over the fit ("topics", "labels", "features",
        "cooccurrence", "likelihood"; see :func:`bayesmlc.bmls.gibbs.gibbs_sweep`).
    beta0_ : float, the last beta0. topic_usage_ : (K,) mean label tokens per topic over collected sweeps.
    history_ : per sweep "objective" (log-likelihood of the observed training labels), "wall_time",
        "sweep", "sweep_time", "beta0", "phi_acceptance" (share of topics whose phi proposal was
        accepted; always 1 with ``phi_step="dirichlet"`` or without C), and "heldout" (held-out
        log-likelihood, NaN without ``validation_fraction``).
    schedule_trace_ : dict, ``"auto"``: the window ends ("window_end"), the relative gains of the
        burn-in windows ("burnin_gain", "heldout_gain") and the collection's moves ("predictive_change").

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = (rng.random((60, 8)) < 0.3).astype(float); Y = X[:, :3]
    >>> model = BMLS(n_topics=4, max_sweeps=200, random_state=0).fit(X, Y)
    >>> model.predict_proba(X).shape
    (60, 3)
    """

    def __init__(
        self,
        n_topics="auto",
        mu0=10.0,
        nu0=10.0,
        beta0=0.1,
        sample_beta0=True,
        cooccurrence=False,
        cooccurrence_diagonal=False,
        schedule="auto",
        n_burnin=200,
        n_draws=250,
        thin=10,
        max_sweeps="auto",
        plateau_tol=1e-3,
        predictive_tol=0.015,
        validation_fraction=None,
        max_kept_draws="auto",
        binarize_threshold="auto",
        recompute_theta_every=10,
        phi_step="dirichlet",
        support_features="auto",
        sample_dtype="float16",
        label_cardinality="independent",
        n_threads=None,
        random_state=None,
        device="auto",
        verbose=False,
        n_samples="deprecated",
    ):
        self.n_topics = n_topics
        self.mu0 = mu0
        self.nu0 = nu0
        self.beta0 = beta0
        self.sample_beta0 = sample_beta0
        self.cooccurrence = cooccurrence
        self.cooccurrence_diagonal = cooccurrence_diagonal
        self.schedule = schedule
        self.n_burnin = n_burnin
        self.n_draws = n_draws
        self.thin = thin
        self.max_sweeps = max_sweeps
        self.plateau_tol = plateau_tol
        self.predictive_tol = predictive_tol
        self.validation_fraction = validation_fraction
        self.max_kept_draws = max_kept_draws
        self.binarize_threshold = binarize_threshold
        self.recompute_theta_every = recompute_theta_every
        self.phi_step = phi_step
        self.support_features = support_features
        self.sample_dtype = sample_dtype
        self.label_cardinality = label_cardinality
        self.n_threads = n_threads
        self.random_state = random_state
        self.device = device
        self.verbose = verbose
        self.n_samples = n_samples

    #: a model file's parameters under earlier names (old -> current), renamed at load
    _renamed_parameters = {"n_samples": "n_draws"}

    _parameter_constraints = {
        "label_cardinality": [Options(*LABEL_CARDINALITY)],
        "n_threads": [None, Integer(1)],
        "n_topics": ["auto", Integer(1)],
        **{name: [Integer(1)] for name in ("n_draws", "thin", "recompute_theta_every")},
        "n_samples": ["deprecated", Integer(1)],
        "n_burnin": [Integer(0)],
        "max_sweeps": ["auto", Integer(2 * AUTO_WINDOW)],
        **{name: [Real(0, low_open=True)] for name in ("mu0", "nu0", "beta0", "plateau_tol", "predictive_tol")},
        "schedule": [Options("auto", "fixed")],
        "validation_fraction": [None, Real(0, 0.5, low_open=True)],
        "max_kept_draws": ["auto", Integer(0)],
        "support_features": ["auto", Integer(0)],
        "sample_dtype": [Options("float32", "float16")],
        "phi_step": [Options("dirichlet", "metropolis")],
        "sample_beta0": [Boolean()],
        "cooccurrence_diagonal": [Boolean()],
        "binarize_threshold": ["auto", None, Real()],
    }

    def _fit_feature_thresholds(self, X: sp.csr_matrix) -> None:
        """``feature_thresholds_``: with ``binarize_threshold="auto"`` and dense training features
        (more than half of the entries non-zero, the rule of ``standardize="auto"``), each column's
        median over the training rows (zeros included); else None. On dense descriptors x > 0 is
        on almost everywhere and says nothing (docs/experiments.md, "BMLS: binary features from
        dense descriptors")."""
        self.feature_thresholds_ = None
        if self.binarize_threshold == "auto" and resolve_standardize("auto", X.nnz, X.shape[0] * X.shape[1]):
            self.feature_thresholds_ = np.median(X.toarray(), axis=0).astype(np.float64)

    def _binary_features(self, X: sp.csr_matrix, warn: bool = False) -> sp.csr_matrix:
        """The 0/1 feature pattern the model uses (CSR float32, same shape as ``X``).

        ``binarize_threshold="auto"``: x above the feature's training median on dense features
        (``feature_thresholds_``), else x > 0 (with one warning when ``warn`` and X is not 0/1); a
        number t: x > t; None: non-binary input is an error."""
        medians = getattr(self, "feature_thresholds_", None)  # absent from files written before it
        if medians is not None:
            if warn:
                warnings.warn("BMLS models binary features: X is dense and not 0/1, so a feature is taken as on "
                              "where x exceeds its training median (binarize_threshold='auto'; pass a number t "
                              "for x > t)", UserWarning, stacklevel=4)
            dense = np.asarray(sp.csr_matrix(X).toarray() > medians[None, :], dtype=np.float32)
            return sp.csr_matrix(dense)
        X = sp.csr_matrix(X, dtype=np.float32, copy=True)
        X.eliminate_zeros()
        threshold = self.binarize_threshold
        if threshold is None or threshold == "auto":
            if X.nnz and not np.all(X.data == 1):
                if threshold is None:
                    bad = np.unique(X.data[X.data != 1])[:3].tolist()
                    raise ValidationError(
                        f"BMLS needs binary (0/1) features; X holds other values such as {bad}. "
                        "Set binarize_threshold=t to turn on every feature with x > t, or 'auto' for x > 0."
                    )
                if warn:
                    warnings.warn(
                        "BMLS models binary features: X is not 0/1, so a feature is taken as on where x > 0 "
                        "(binarize_threshold='auto'; pass a number t for x > t)",
                        UserWarning,
                        stacklevel=4,
                    )
            threshold = 0.0
        X.data = (X.data > float(threshold)).astype(np.float32)
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
    def _fit(self, X, Y, label_mask, parallel=None, **fit_params):
        """``parallel``: a :mod:`bayesmlc.distributed` strategy; None (or one process) runs the chain
        here. Under ``DataParallel`` every process passes the same settings and its shard of the rows
        (or the whole data set, of which it keeps its shard) and runs data-parallel Gibbs
        (:func:`bayesmlc.bmls.distributed_gibbs.fit_sharded`): every process ends with the same model."""
        if fit_params:
            raise ValidationError(f"BMLS.fit takes no extra arguments, got {sorted(fit_params)}")
        resolve_device(self.device)  # checks the setting before the work starts
        if parallel is not None and parallel.world_size > 1:
            try:
                fit_sharded(self, X, Y, label_mask, parallel, auto_topics)
            except Exception as exc:
                parallel.sync_failure(exc)  # the other processes raise RankFailedError naming this one
                raise
            parallel.sync_failure(None)
            return self
        auto = self.schedule == "auto"
        if auto and self.validation_fraction is not None and label_mask is not None:
            raise ValidationError("validation_fraction cannot be combined with label_mask")
        rng = numpy_rng(self.random_state)
        self._fit_feature_thresholds(X)
        X_bias, Y, validation, seen = self._training_rows(X, Y, rng)
        if label_mask is not None and label_mask.nnz == label_mask.shape[0] * label_mask.shape[1]:
            label_mask = None  # everything observed: the exact fast path
        data = SweepData.build(
            X_bias, Y, label_mask, self._cooccurrence_pairs(Y), pair_diagonal=bool(self.cooccurrence_diagonal)
        )
        n_topics = (auto_topics(Y.nnz, Y.shape[1], X.shape[1] + 1) if self.n_topics == "auto" else int(self.n_topics))
        self.n_topics_ = n_topics
        rows_per_feature = X_bias.shape[0] / max(1, X_bias.shape[1] - 1)  # the features that occur
        width = support_width(self.support_features, data.n_labels, n_topics, rows_per_feature,
                              label_mask is not None and "label_mask")
        validation = attach_support(data, X_bias, Y, width, validation)
        state = init_state(data, n_topics, X_bias.shape[1], float(self.beta0), rng)
        settings = self._schedule_settings()
        schedule = Schedule.of(settings, X_bias, n_topics, validating=validation is not None, n_labels=data.n_labels,
                               n_positives=data.pos_rows.size)
        capacity = draw_capacity(settings, data.n_labels, X_bias.shape[1], n_topics)
        chain = GibbsChain(self, data, state, rng, schedule, capacity, validation).run(self.history_)
        self._keep_posterior(chain, seen, X.shape[1])
        return self

    def _schedule_settings(self):
        """The parameters the schedule reads: the model's, or with the deprecated ``n_samples`` given,
        a copy whose ``n_draws`` is its value (and a FutureWarning, scikit-learn's deprecation)."""
        if isinstance(self.n_samples, str) and self.n_samples == "deprecated":
            return self
        warnings.warn("BMLS's n_samples was renamed n_draws (the Gibbs draws kept); n_samples is deprecated and "
                      "will be removed: pass n_draws instead", FutureWarning, stacklevel=4)
        return SimpleNamespace(**{**self.get_params(), "n_draws": self.n_samples})

    def _training_rows(self, X, Y, rng):
        """The chain's training rows: (X' = the binary features that occur in them plus the bias column,
        their labels Y (CSR), the held-out rows of ``validation_fraction`` (``"auto"``) as (X' CSR
        float64, positive rows, positive columns, None: no support term yet) or None, the indices of the
        features that occur).
        Features never on in the training rows keep their prior: they are not sampled (h = E[h])."""
        X_binary = self._binary_features(X, warn=True)
        n_rows = X_binary.shape[0]
        Y = sp.csr_matrix(Y)
        held_out = None
        if self.schedule == "auto" and self.validation_fraction is not None:
            n_val = max(1, int(round(float(self.validation_fraction) * n_rows)))
            if n_val >= n_rows:
                raise ValidationError("validation_fraction leaves no training rows")
            order = rng.permutation(n_rows)
            val_rows, train_rows = np.sort(order[:n_val]), np.sort(order[n_val:])
            held_out = (X_binary[val_rows], Y[val_rows])
            X_binary, Y = X_binary[train_rows], Y[train_rows]
        seen = np.flatnonzero(np.diff(X_binary.tocsc().indptr) > 0)
        validation = None
        if held_out is not None:
            val_y = sp.coo_matrix(held_out[1])
            validation = (sp.csr_matrix(self._with_bias(held_out[0][:, seen]), dtype=np.float64),
                          val_y.row.astype(np.int64), val_y.col.astype(np.int64), None)
        return self._with_bias(X_binary[:, seen]), Y, validation, seen

    def _keep_posterior(self, chain: GibbsChain, seen: np.ndarray, n_features: int) -> None:
        """The fitted attributes from a finished ``chain`` run on the ``seen`` features."""
        prior_log_h = float(np.log(float(self.mu0) / float(self.nu0)))
        for name, value in chain.posterior(seen, n_features, prior_log_h, self.sample_dtype).items():
            setattr(self, name, value)
        moments, schedule = chain.moments, chain.schedule
        enough = self.phi_samples_.shape[0] >= AUTO_MIN_PREDICTIVE_DRAWS
        self.predictor_ = "draws" if not schedule.auto or enough else "moments"
        self.beta0_ = float(chain.state.beta0)
        self.topic_usage_ = moments.usage_sum / moments.count
        self.n_sweeps_ = chain.sweeps
        self.n_burnin_ = int(schedule.burnin_end) if schedule.burnin_end is not None else chain.sweeps
        self.n_collected_ = moments.count
        self.sweep_step_seconds_ = {key: float(value) for key, value in chain.timings.items()}
        self.schedule_trace_ = {key: np.asarray(value, dtype=np.float64) for key, value in schedule.trace.items()}
        if chain.data.uses_cooccurrence:
            self.cooccurrence_weights_ = np.asarray(chain.state.r, dtype=np.float64)

    # ---- prediction ---------------------------------------------------------------------------
    def _batch_inputs(self, X: sp.csr_matrix, device: torch.device):
        """(x, r) of a batch on ``device``, from one binarisation of ``X``: x the binary X' = [x, 1] as a
        sparse torch tensor (b, D + 1); r the support term's exponent (b, L)
        (:func:`~bayesmlc.bmls.support_term.support_exponent`), or 0 for a model without the term (or a
        file written before it)."""
        X_binary = self._binary_features(X)
        X_bias = self._with_bias(X_binary).tocoo()
        x = torch.sparse_coo_tensor(
            torch.from_numpy(np.vstack([X_bias.row, X_bias.col]).astype(np.int64)),
            torch.from_numpy(X_bias.data.astype(np.float32)),
            size=X_bias.shape,
            device=device,
            check_invariants=False,  # built from a valid scipy matrix
        ).coalesce()
        if getattr(self, "support_columns_", None) is None:
            return x, 0.0
        exponent = support_exponent(X_binary, self.support_columns_, self.support_shape_, self.support_rate_)
        return x, torch.from_numpy(exponent).to(device)

    def _draw_probabilities(self, X: sp.csr_matrix, device: torch.device):
        """Yield, per kept draw, the probabilities 1 - exp(-phi theta(x) - r(x)) of the batch, (b, L) on
        ``device`` (r: the support term integrated out, :meth:`_batch_inputs`)."""
        x, support = self._batch_inputs(X, device)
        for s in range(self.log_h_samples_.shape[0]):
            log_h = torch.as_tensor(self.log_h_samples_[s], device=device, dtype=torch.float32)  # (D', K)
            phi = torch.as_tensor(self.phi_samples_[s], device=device, dtype=torch.float32)  # (L, K)
            theta = torch.exp(torch.sparse.mm(x, log_h))  # (b, K), eq. (8)
            yield -torch.expm1(-(theta @ phi.T + support))

    def _mean_probability(self, X) -> np.ndarray:
        """Posterior predictive of a batch, (b, L) float64: one (b, L) buffer plus the current draw's."""
        device = resolve_device(self.device)
        with torch.no_grad():
            if self.predictor_ == "moments":
                # E[theta_k(x)] = exp(x' (E[log h_k] + Var[log h_k] / 2)) (log h Gaussian, independent over d)
                x, support = self._batch_inputs(X, device)
                log_mean_h = torch.as_tensor(self.log_h_ + 0.5 * self.log_h_var_, device=device, dtype=torch.float32)
                theta = torch.exp(torch.sparse.mm(x, log_mean_h))
                phi = torch.as_tensor(self.phi_, device=device, dtype=torch.float32)
                rates = theta @ phi.T + support
                return (-torch.expm1(-rates)).to(torch.float64).cpu().numpy()
            total = None
            for probs in self._draw_probabilities(X, device):
                total = probs.to(torch.float64) if total is None else total.add_(probs)
            return (total / self.log_h_samples_.shape[0]).cpu().numpy()

    def _predict_proba(self, X) -> np.ndarray:
        """Posterior predictive Pr(y_l = 1 | x): the mean over kept draws of 1 - exp(-sum_k phi_lk
        theta_k(x)) (``predictor_ == "draws"``) or the posterior moments' formula (``"moments"``)."""
        return self._mean_probability(X).astype(np.float32)

    def _decision_function(self, X) -> np.ndarray:
        """Log-odds of the posterior predictive probability (same ranking, the scale of the base's prior logit)."""
        return logit(self._mean_probability(X), 1e-12).astype(np.float32)

    def _scores_and_proba(self, X):
        mean = self._mean_probability(X)  # once for both
        return logit(mean, 1e-12).astype(np.float32), mean.astype(np.float32)

    def predict_interval(self, X, coverage: float = 0.9, batch_size: int = 256):
        """Equal-tailed posterior interval of Pr(y_l = 1 | x, phi, h) over the kept draws.

        Returns (lower, upper), each float32 (n_samples, n_labels). Labels without a training positive
        get the base's prior for both bounds. Needs kept draws (``max_kept_draws`` > 0 with ``"auto"``).
        """
        if not isinstance(coverage, (int, float)) or not 0.0 < float(coverage) < 1.0:
            raise ValidationError(f"coverage must be in (0, 1), got {coverage!r}")
        X = self._validated(X)
        if self.log_h_samples_.shape[0] < 2:
            raise ValidationError(
                f"predict_interval needs kept posterior draws; this model kept {self.log_h_samples_.shape[0]} "
                "(fit with max_kept_draws >= 2, or schedule='fixed')"
            )
        device = resolve_device(self.device)
        tail = (1.0 - float(coverage)) / 2.0
        lower = np.empty((X.shape[0], self.n_labels_), dtype=np.float32)
        upper = np.empty_like(lower)
        with torch.no_grad():
            for rows in iter_batches(X.shape[0], batch_size):
                draws = torch.stack(list(self._draw_probabilities(X[rows], device)), dim=0)  # (S, b, L)
                quantiles = torch.quantile(draws, torch.tensor([tail, 1.0 - tail], device=device, dtype=draws.dtype), dim=0)
                lower[rows] = quantiles[0].cpu().numpy()
                upper[rows] = quantiles[1].cpu().numpy()
        if self.empty_labels_.size:
            lower[:, self.empty_labels_] = self.label_prior_[self.empty_labels_]
            upper[:, self.empty_labels_] = self.label_prior_[self.empty_labels_]
        return lower, upper

    # ---- persistence ---------------------------------------------------------------------------
    def _check_fitted_state(self) -> None:
        """The declared fields of :data:`bayesmlc.bmls.state_checks.BMLS_FIELDS`."""
        check_fitted_state(self, BMLS_FIELDS)

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
