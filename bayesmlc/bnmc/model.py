"""The BNMC estimator: Dirichlet-process mixture of feature/label patterns plus per-label Bayesian
classifiers (Nguyen, Gupta, Rana, Li and Venkatesh, "A Bayesian Nonparametric Approach for
Multi-label Classification", ACML 2016). See docs/bnmc.md for every choice the paper leaves open.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp
from tqdm.auto import tqdm

from ..base import LABEL_CARDINALITY, PREDICTION_BLOCK_ENTRIES, MultiLabelEstimator
from ..data.shard import RowShard
from ..distributed import ONE_PROCESS
from ..exceptions import ValidationError
from ..fitted_state import check_fitted_state
from ..label_statistics import LabelStatistics
from ..parameters import Boolean, Integer, Options, Real, check_parameters
from ..preprocessing import STANDARDIZE_CONSTRAINT, FeaturePreprocessor, legacy_preprocessor_state
from ..presets import HasPresets
from ..utils import iter_batches, numpy_rng, resolve_device, sigmoid
from ..validation import check_features, check_fit_inputs
from .classifiers import SGDClassifier, classifier_evidence
from .classifier_fitting import (
    CLASSIFIER_CHOICES, FEATURE_WEIGHTINGS, ClassifierFitter, classifier_steps, resolve_feature_weighting,
)
from .label_sets import COUNT_RULES, rule_predictions
from .labels import (
    ObservedEntries, label_count_moments, label_count_sums, observed_entries, pad_columns, stream_labels,
)
from .mixture import DirichletEmission, DPMixture, GaussianEmission
from .rank_calibration import (TOP_LABEL_IDENTITY, RankTerms, calibrated_probability_logits, rank_adjusted_logits,
                               scores_and_probability_logits)
from .state_checks import BNMC_FIELDS, RANK_TERMS  # the fitted attributes of RankTerms, in its order
from .support_term import SupportTerm
from .svi import MixtureFitter

__all__ = ["BNMC"]

_RULE_CHOICES = ("auto",) + COUNT_RULES


class BNMC(HasPresets, MultiLabelEstimator):
    """Bayesian nonparametric multi-label classification (BNMC), batch and online.

    A truncated stick-breaking DP mixture over patterns {phi_k, psi_k} (features and labels) is fitted
    by stochastic variational inference; per-label Bayesian linear classifiers (Polya-Gamma logistic
    regression or the Polson-Scott SVM, Gibbs-sampled; SGD in online mode) are fitted for all labels
    at once. Predictions combine both (eq. 8) and pick the number of labels per row from the fitted
    label-count distribution (eq. 9).

    Parameters
    ----------
    truncation : int, default 20
        K, the cap on the number of patterns; ``n_patterns_`` reports how many are used.
    emission : {"auto", "dirichlet", "gaussian"}, default "auto"
        Feature emission. "dirichlet": the paper's Dirichlet-multinomial (features must be
        non-negative); "gaussian": conjugate diagonal Gaussian on standardised features. "auto" picks
        "dirichlet" when every feature value is >= 0, else "gaussian".
    classifier : {"auto", "logistic", "svm"}, default "auto"
        Polya-Gamma logistic regression (BNMC-L) or Polson-Scott Bayesian SVM (BNMC-S). "auto": where
        the calibration's evidence is cross-fitted (``calibration_folds_`` > 1, under 2,500 labelled
        rows by default) and the labelled rows times the labels are at most 2^22, the folds are
        fitted with both likelihoods (the same folds and seeds) and the one whose calibrated
        held-out probabilities give the observed labels the higher log-likelihood is kept, for about
        twice the time of the folds; elsewhere (a single split, more entries, several processes,
        ``online=True``, ``partial_fit``) "logistic". ``classifier_`` holds the choice
        (docs/experiments.md, "BNMC: the classifier's likelihood").
    online : bool, default False
        False: SVI mixture + Gibbs-sampled classifiers. True: single-sweep-per-pass SVI + averaged SGD
        classifiers (eq. 7), the cost of ``partial_fit`` on the data.
    n_passes : int, default 3
        Passes of SVI over the data (and of SGD in online mode).
    batch_size : int, default 64
        SVI / SGD minibatch size.
    tau, kappa : float, default 1.0 and 0.7
        Robbins-Monro step size rho_t = (t + tau)^(-kappa), t counting minibatch steps (kappa in (0.5, 1]).
    concentration : float, default 1.0
        alpha of the stick-breaking prior (paper: 1).
    merge_trials : int, default 5
        After each pass of ``fit``, the most similar pairs of patterns tried as merge moves (kept only
        when the full-data ELBO increases); 0 disables. Variational updates alone cannot merge
        duplicated patterns.
    feature_prior : float, default 0.1
        omega_phi, Dirichlet prior of the feature patterns (paper: 0.1). For the Gaussian emission,
        the Normal-Gamma prior strength kappa0 = shape0 = ``feature_prior``, mean 0, rate chosen so
        the prior mean precision is 1 on standardised features.
    label_prior : float, default 0.01
        omega_psi, Dirichlet prior of the label patterns (paper: 0.01).
    weight_precision : float or "auto", default "auto"
        Prior precision of each classifier weight (w ~ N(0, I / weight_precision)); the bias has
        precision 1e-2. "auto": mean_i |x_i|^2 / 7 over the (scaled) training features, so that
        the prior standard deviation of a margin x^T w is about 2.6 whatever the feature scale.
    n_sweeps : int, default 4
        Gibbs sweeps (or variational updates) of the batch classifiers after the mode steps; the
        last ``n_keep`` are averaged at prediction.
    n_keep : int, default 2
    n_mode_steps : int, default 6
        Damped Newton (logistic) or EM (svm) steps to the posterior mode before the sweeps, so the
        short chain (or the variational updates) start in the bulk of the posterior.
    inference : {"gibbs", "variational"}, default "variational"
        Batch classifier posterior: the paper's Gibbs sampler (Polya-Gamma / inverse-Gaussian
        augmentation; predictions average the Rao-Blackwellised conditional means of the last
        ``n_keep`` sweeps), or its mean-field variational counterpart (factorised Gaussian q(w),
        q(omega) = PG(1, xi); moderated predictive sigma(mu / sqrt(1 + pi v / 8))).
    solver : {"auto", "dense", "woodbury", "cg", "lowrank"}, default "auto"
        How each Gibbs draw (or variational update) of the weights is made (see ``bnmc.classifiers``).
        "dense", "woodbury" and "cg" are exact in the D + 1 feature dimensions; "lowrank" fits the
        same model with the weights restricted to the span of the top ``low_rank`` right singular
        vectors of the classifier features (cost per sweep O(n r L), fitted state O(D r + r L)),
        label block by label block. "auto": an exact sampler whose estimated sweep costs at most 3e10
        flops (``cg`` as "lowrank" at r = D where D <= 1024: the same prior and likelihood on all D
        singular directions, by the faster low-rank fit), else "lowrank" (``classifiers.choose_auto_solver``).
    low_rank : int or "auto", default "auto"
        r, the dimension of the shared representation of ``solver="lowrank"`` (capped at D), and of
        online SGD when a dense (D + 1) x L weight matrix would exceed 2e7 entries. "auto": the
        largest of 1024, 768, 512 and 256 whose sweep (about 15 n (r + 1) L operations) stays within
        the exact solvers' budget or whose products cost at most 2^14 passes over the sparse features
        ((r + 1) L <= 2^14 x mean stored entries a row), else 256; 128 too beside the support term.
    support_features : int >= 0 or "auto", default "auto"
        K of the support term beside a ``lowrank`` basis of r < D vectors (``bnmc.support_term``): each
        label's margin gains x_S^T v on K feature columns S of its own. 0: none; "auto": 128.
    standardize : {"auto", True, False}, default "auto"
        Standardise features for the classifiers (and the Gaussian emission). "auto": when the
        features are dense (over half the entries non-zero); sparse features are left as they are.
    feature_weighting : {"auto", "none", "l2", "idf"}, default "auto"
        How the classifiers see sparse features (the mixture keeps the raw values): "none" as given,
        "l2" each row scaled to unit L2 norm, "idf" each column times its smoothed idf in the training
        rows, then rows at unit L2 norm (tf-idf; Salton and Buckley 1988). "auto": "idf" for count
        features (every value a whole number, some above 1: word counts), else "none" (binary and
        real-valued features, tf-idf as the extreme-classification sets ship them, are left alone).
        On a synthetic word-count set with 8,000 labels raw counts gave validation P@1 26.6 and idf
        42.9 (docs/experiments.md, "BNMC: count features"). ``feature_weighting_`` holds the choice.
    count_rule : {"auto", "threshold", "count", "expected", "sample"}, default "auto"
        How :meth:`predict` sizes the label set of a row (eq. 9) when no ``threshold`` / ``top_k`` is
        given. "threshold": calibrated probability >= a threshold tuned on the validation split (at
        least one label); "count": the top round(sum_c p_c) labels, the row's expected label count
        under the calibrated probabilities; "expected": the top round(mean training label count);
        "sample": the paper's eq. (9), T ~ round(N(mean, std)), labels ~ Mult(nu, T) (random).
        "auto" picks among the three deterministic rules the one with the best example-F1 + exact
        match on the validation split (``count_rule_``).
    validation_fraction : float, default 0.2
        Share of the labelled training rows held out to calibrate the combination of classifier and
        pattern evidence and to tune the threshold (and the count rule). 0 disables calibration
        (the plain product of eq. 8; "threshold" then uses 0.5 and "auto" means "expected").
    refit : bool, default True
        After calibration on the single validation split, refit the batch classifiers on all labelled rows
        (warm-started: one mode step, max(2, n_sweeps // 2) sweeps) unless the split holds under 5% of them
        (it is capped at 2^22 / L rows). Online mode instead streams the held-out rows into SGD.
    calibration_folds : int >= 1 or "auto", default "auto"
        Where the calibration's evidence comes from (batch mode with calibration on,
        ``validation_fraction > 0``). 1: the single held-out split of ``validation_fraction``. K >= 2:
        K-fold cross-fitting: K classifier fits, each without one fold of the labelled rows, score
        that fold; the calibration, threshold and count rule are fitted on every labelled row's
        held-out evidence, and the classifiers are then fitted on all labelled rows, warm-started
        from the folds' mean (one mode step and max(2, n_sweeps // 2) sweeps): about K + 1 fits in
        time. "auto": 5 folds below 2,500 labelled rows (``CROSS_FIT_MAX_ROWS``), where a 20% split
        leaves the seven rank terms a few hundred rows or fewer, if those rows times the labels are at
        most 2^22 (``CROSS_FIT_MAX_ENTRIES``: many labels give the split entries enough), else 1; always 1 with several
        processes or ``online=True``. ``calibration_folds_`` holds the choice.
    sgd_alpha : float or None, default None
        lambda of the online SGD (eq. 7). None: 1 / n_train in ``fit`` (the paper's 32 / n_train
        underfits here, see docs/bnmc.md) and 1e-3 when ``partial_fit`` starts a model.
    sgd_eta0 : float, default 200
        First SGD step times the mean squared row norm of the classifier features (so the step
        adapts to the feature scale); sets t0 = 1 / (lambda * first step).
    unlabeled_rows : {"missing", "negative"}, default "missing"
        Rows with no positive label (and no ``label_mask``) are treated as missing label vectors
        (section 3.4: they inform the feature patterns only) or as observed all-negative rows.
    label_cardinality : {"independent", "at_least_one"}, default "independent"
        What ``predict_proba`` returns: the model's per-label probabilities, or the same conditioned on
        the row having at least one label (:func:`bayesmlc.base.at_least_one_label`), for data where
        every row has a label. Rankings are unchanged; measured: docs/experiments.md, "Calibration".
    n_threads : int or None, default None
        CPU threads of torch and the BLAS during fit and prediction; None: one per idle core, fewer
        when other processes keep the cores busy (:func:`bayesmlc.threads.compute_threads`). The same
        seed gives the same result at a fixed count.
    random_state : int, Generator or None
    device : {"auto", "cpu", "cuda"}, default "auto"
        Where the classifier linear algebra runs.
    verbose : bool, default False
        Progress bar on stderr.

    Fitted attributes
    -----------------
    n_patterns_ : int, patterns with an expected share of at least 1 % of the rows (or 1 row)
    pattern_weights_ : ndarray (K,), E[pi_k]
    label_count_mean_, label_count_std_ : label-count distribution of the labelled training rows
    threshold_ : float, the tuned probability threshold
    calibration_folds_ : int, the folds the calibration's evidence was cross-fitted over (1: the single
        validation split; ``calibration_folds`` resolved)
    evidence_weights_ : ndarray (3,), (a, b, d) of the ranking logit z = a * s_clf + b * s_pattern + d:
        the weights of the classifiers' and the pattern's evidence (files written before the name
        was given call it ``calibration_``; they load)
    probability_evidence_weights_ : ndarray (3,), (a', b', d') of the probability's logit z' = a' s_clf +
        b' s_pattern + d', to which the rank terms below are added (formerly ``probability_calibration_``)
    top_label_offset_, top_label_slope_, top_label_runner_up_, second_label_offset_, second_label_slope_,
    next_labels_offset_, next_labels_slope_ : float, the rank terms r >= 0, c, e, g_2, h_2, g, h
        (:class:`~bayesmlc.bnmc.rank_calibration.RankTerms`, fitted with (a', b', d') by
        :func:`~bayesmlc.bnmc.rank_calibration.fit_calibration`): the leading label's probability is
        sigmoid(z' + r + c z + e z_2) (z_2 the runner-up's z; its ranking score z + r), the runner-up's
        sigmoid(z' + g_2 + h_2 z), that of ranks 3 to 5 sigmoid(z' + g + h z), the others' sigmoid(z');
        capped so that the top five keep the order of ``decision_function``
    top_label_map_ : ndarray (3,), (alpha, beta, gamma) >= (0, 0, -inf): the leading label's probability
        logit l becomes alpha log sigmoid(l) - beta log sigmoid(-l) + gamma, a beta calibration map
        (1, 1, 0: none), taken only where the validation rows show it is needed
        (:func:`~bayesmlc.bnmc.rank_calibration.fit_top_label_map`)
    history_ : per pass (pass 0: right after initialisation): ``wall_time``, ``objective`` (the
        mixture ELBO over the training data), ``pass``, ``n_patterns``; ``partial_fit`` appends one
        entry per call (ELBO estimated from the batch)
    solver_ : str, the solver used ("sgd" for online classifiers)
    classifier_ : str, "logistic" or "svm": the likelihood of the classifiers (``classifier`` resolved)
    classifier_basis_ : ndarray (D, r) float32 or None, the shared basis of the low-rank classifiers
        (their weights are in r + 1 coordinates: ``classifier_samples_`` (S, r + 1, L))
    support_columns_, support_means_, support_variances_ : ndarray (L, K) or None, the support term
    classifier_trace_ : ndarray, per Gibbs sweep the log-likelihood (logistic) or minus the hinge
        sum (svm) of the observed training labels
    """

    def __init__(
        self,
        truncation=20, emission="auto", classifier="auto", online=False,
        n_passes=3, batch_size=64, tau=1.0, kappa=0.7, concentration=1.0, merge_trials=5,
        feature_prior=0.1, label_prior=0.01, weight_precision="auto",
        n_sweeps=4, n_keep=2, n_mode_steps=6, inference="variational", solver="auto", low_rank="auto",
        support_features="auto",
        standardize="auto", feature_weighting="auto", count_rule="auto", validation_fraction=0.2, refit=True, calibration_folds="auto",
        sgd_alpha=None, sgd_eta0=200.0, unlabeled_rows="missing", label_cardinality="independent",
        n_threads=None, random_state=None, device="auto", verbose=False,
    ):
        self.truncation = truncation
        self.emission = emission
        self.classifier = classifier
        self.online = online
        self.n_passes = n_passes
        self.batch_size = batch_size
        self.tau = tau
        self.kappa = kappa
        self.concentration = concentration
        self.merge_trials = merge_trials
        self.feature_prior = feature_prior
        self.label_prior = label_prior
        self.weight_precision = weight_precision
        self.n_sweeps = n_sweeps
        self.n_keep = n_keep
        self.n_mode_steps = n_mode_steps
        self.inference = inference
        self.solver = solver
        self.low_rank = low_rank
        self.support_features = support_features
        self.standardize = standardize
        self.feature_weighting = feature_weighting
        self.count_rule = count_rule
        self.validation_fraction = validation_fraction
        self.refit = refit
        self.calibration_folds = calibration_folds
        self.sgd_alpha = sgd_alpha
        self.sgd_eta0 = sgd_eta0
        self.unlabeled_rows = unlabeled_rows
        self.label_cardinality = label_cardinality
        self.n_threads = n_threads
        self.random_state = random_state
        self.device = device
        self.verbose = verbose

    #: fitted attributes of model files written under earlier names (old -> current), renamed at load
    _renamed_attributes = {"calibration_": "evidence_weights_", "probability_calibration_": "probability_evidence_weights_"}
    _prediction_block_entries = PREDICTION_BLOCK_ENTRIES  # its dense float64 temporaries (base.py)

    _parameter_constraints = {
        "label_cardinality": [Options(*LABEL_CARDINALITY)],
        "n_threads": [None, Integer(1)],
        **{name: [Integer(1)] for name in ("n_passes", "batch_size", "n_sweeps", "n_keep")},
        "low_rank": ["auto", Integer(1)],
        "support_features": ["auto", Integer(0)],
        **{name: [Real(0, low_open=True)] for name in ("tau", "concentration", "feature_prior", "label_prior", "sgd_eta0")},
        "truncation": [Integer(2)],
        "weight_precision": ["auto", Real(0, low_open=True)],
        "kappa": [Real(0.5, 1, low_open=True)],
        "emission": [Options("auto", "dirichlet", "gaussian")],
        "classifier": [Options("auto", *CLASSIFIER_CHOICES)],
        "solver": [Options("auto", "dense", "woodbury", "cg", "lowrank")],
        "inference": [Options("gibbs", "variational")],
        "count_rule": [Options(*_RULE_CHOICES)],
        "unlabeled_rows": [Options("missing", "negative")],
        "standardize": STANDARDIZE_CONSTRAINT,
        "feature_weighting": [Options("auto", *FEATURE_WEIGHTINGS)],
        **{name: [Integer(0)] for name in ("merge_trials", "n_mode_steps")},
        **{name: [Boolean()] for name in ("online", "refit")},
        "calibration_folds": ["auto", Integer(1)],
        "validation_fraction": [Real(0, 1, high_open=True)],
        "sgd_alpha": [None, Real(0, low_open=True)],
    }

    def _check_n_keep(self):
        """The one constraint between two parameters (``fit`` checks the declared ones)."""
        if self.n_keep > self.n_sweeps:
            raise ValidationError(f"n_keep ({self.n_keep}) cannot exceed n_sweeps ({self.n_sweeps})")

    # ---- preprocessing ------------------------------------------------------------------------
    def _setup_preprocessing(self, X: sp.csr_matrix, parallel=ONE_PROCESS, n_total: int | None = None) -> None:
        """Choose the emission and the classifier feature scaling (``preprocessor_``) from the (first)
        training data (this process's rows; counts and sums over processes)."""
        n_total = X.shape[0] if n_total is None else n_total
        negatives = parallel.reduce_sum(np.array([int(np.sum(X.data < 0))], dtype=np.float64))[0]
        has_negative = negatives > 0
        emission = self.emission
        if emission == "auto":
            emission = "gaussian" if has_negative else "dirichlet"
        if emission == "dirichlet" and has_negative:
            raise ValidationError(
                "emission='dirichlet' needs non-negative features (X has negative values); use 'gaussian' or 'auto'"
            )
        self.emission_ = emission
        reduce = None if parallel.world_size == 1 else parallel.reduce_sum
        self.feature_weighting_ = resolve_feature_weighting(self.feature_weighting, X, reduce)
        self.preprocessor_ = self._preprocessor(self.feature_weighting_).fit(X, n_rows=n_total, reduce=reduce)

    def _preprocessor(self, weighting: str = "none") -> FeaturePreprocessor:
        """The classifier features' scaling: standardisation (``standardize``), or with a
        ``feature_weighting_`` other than "none" idf (for "idf") and unit-L2 rows. float64: the
        mixture's Gaussian emission works on the standardised features in float64."""
        if weighting == "none":
            return FeaturePreprocessor(standardize=self.standardize, dtype="float64")
        return FeaturePreprocessor(standardize=False, idf=weighting == "idf", normalize=True, dtype="float64")

    def _classifier_features(self, X: sp.csr_matrix) -> sp.csr_matrix:
        if self.preprocessor_.normalize:  # feature_weighting_ "l2" or "idf"
            return self.preprocessor_.transform(X).astype(np.float32)
        if not self.preprocessor_.standardized_:
            return X
        return sp.csr_matrix(self.preprocessor_.transform_dense(X).astype(np.float32))

    def _mixture_features(self, X: sp.csr_matrix):
        """Raw counts for the Dirichlet emission; standardised dense features for the Gaussian one."""
        if self.emission_ == "dirichlet":
            return X.astype(np.float64)
        return self.preprocessor_.transform_dense(X) if self.preprocessor_.standardized_ else X.toarray()

    def _new_mixture(self, reduce=None) -> DPMixture:
        D = self.n_features_in_
        if self.emission_ == "dirichlet":
            emission = DirichletEmission(D, self.feature_prior)
        else:
            prior = float(self.feature_prior)
            emission = GaussianEmission(D, np.zeros(D), kappa0=prior, shape0=prior, rate0=np.full(D, prior))
        return DPMixture(self.truncation, emission, self.n_labels_, self.label_prior, self.concentration, reduce)

    def _update_count_stats(self, Y, entries: ObservedEntries, labelled, parallel=ONE_PROCESS) -> None:
        """Add the rows' label counts to ``count_sums_`` and set ``label_count_mean_`` and ``_std_`` (eq. 9)."""
        self.count_sums_ = self.count_sums_ + parallel.reduce_sum(label_count_sums(Y, entries, labelled))
        if self.count_sums_[0] > 0:
            self.label_count_mean_, self.label_count_std_ = label_count_moments(self.count_sums_)

    def _classifier_inputs(self, Z):
        """What the classifiers see: Z itself, or its projection Z V on the basis (dense (n, r))."""
        basis = getattr(self, "classifier_basis_", None)
        if basis is None:
            return Z
        return np.asarray(Z @ basis, dtype=np.float32)

    # ---- fit ----------------------------------------------------------------------------------
    def _fit(self, X, Y, label_mask, parallel=None, **fit_params):
        """``parallel``: a :mod:`bayesmlc.distributed` strategy; None = one process. Under
        ``DataParallel`` every rank passes the same settings and either its shard of the rows
        (:func:`bayesmlc.data.shard.read_shard`) or the whole data set (it then keeps its shard);
        every sum over rows (mixture statistics and ELBO, classifier products, calibration data) is
        summed over ranks, so every rank ends with the single-process model (to rounding)."""
        if fit_params:
            raise ValidationError(f"BNMC.fit got unexpected arguments: {', '.join(fit_params)}")
        self._check_n_keep()
        parallel = ONE_PROCESS if parallel is None else parallel
        if parallel.world_size == 1:
            self._fit_rows(X, Y, label_mask, parallel, RowShard.whole(X.shape[0]))
            return
        try:
            X, Y, label_mask, shard = parallel.local_data(X, Y, label_mask)
            if self.online or self.inference != "variational":
                raise ValidationError("BNMC on several processes fits the batch variational model only "
                                      "(online=False, inference='variational')")
            self._set_label_statistics(LabelStatistics.of_labels(Y, label_mask).summed(parallel.reduce_sum))
            self._fit_rows(X, Y, label_mask, parallel, shard)
        except Exception as exc:
            parallel.sync_failure(exc)  # the other processes raise RankFailedError naming this one
            raise
        parallel.sync_failure(None)

    def _fit_rows(self, X, Y, label_mask, parallel, shard: RowShard) -> None:
        """The fit on this process's rows ``X``, ``Y`` (``shard``: their place among all rows)."""
        start = time.perf_counter()
        rng = numpy_rng(self.random_state)
        device = resolve_device(self.device)
        n = shard.n_total
        self._setup_preprocessing(X, parallel, n)
        entries, labelled = observed_entries(Y, label_mask, self.unlabeled_rows == "missing")
        labelled_all = np.zeros(n)
        labelled_all[shard.start:shard.stop] = labelled
        labelled_all = parallel.reduce_sum(labelled_all) > 0  # every row's flag, on every process
        if not labelled_all.any():
            raise ValidationError("Y has no labelled row: BNMC needs at least one observed label vector")
        # observed entries per label: without a label_mask, only the labelled rows' (empty rows may be missing)
        self.observed_counts_ = parallel.reduce_sum(entries.per_label()).astype(np.int64)
        self._set_label_statistics(LabelStatistics(self.label_frequencies_, self.observed_counts_))
        self.count_sums_ = np.zeros(3)
        self.label_count_mean_, self.label_count_std_ = 1.0, 0.0
        self._update_count_stats(Y, entries, labelled, parallel)
        self.n_seen_ = n
        self.svi_steps_ = 0

        n_batches = -(-n // self.batch_size)
        total_steps = self.n_passes * n_batches + classifier_steps(self, int(labelled_all.sum()), self.n_labels_,
                                                                   parallel.world_size)
        bar = tqdm(total=total_steps, disable=not self.verbose, desc="BNMC", leave=False)
        # masked label entries are already zero, and unlabelled rows are empty: section 3.4
        MixtureFitter(self, rng, bar, parallel).fit(self._mixture_features(X), Y, shard, start)
        ClassifierFitter(self, rng, device, bar, parallel).fit(self._classifier_features(X), Y, entries, labelled_all,
                                                               shard, raw=X)
        bar.close()
        self._finish_mixture()

    def _count_patterns(self, weights) -> int:
        return int(np.sum(weights * self.n_seen_ >= max(1.0, 0.01 * self.n_seen_)))

    def _finish_mixture(self) -> None:
        self.pattern_weights_ = self._mixture.expected_weights()
        self.n_patterns_ = self._count_patterns(self.pattern_weights_)
        self.label_share_ = self.pattern_weights_ @ self._mixture.label_means()  # marginal E[psi] (L,)

    def _reset_calibration(self) -> None:
        """The calibration before one is fitted: the plain product of eq. 8 ((a, b, d) = (1, 1, 0) for
        both logits, no rank terms, no top-label map), threshold 0.5, ``count_rule`` ("auto": "expected")."""
        self.evidence_weights_ = self.probability_evidence_weights_ = np.array([1.0, 1.0, 0.0])
        self._set_rank_terms(RankTerms())
        self.top_label_map_ = TOP_LABEL_IDENTITY.copy()
        self.threshold_ = 0.5
        self.count_rule_ = "expected" if self.count_rule == "auto" else self.count_rule

    # ---- prediction -----------------------------------------------------------------------------
    def _evidence(self, Z, X):
        """Classifier evidence s_clf of the classifier features ``Z`` (the kept draws', or the SGD
        average's: :func:`~bayesmlc.bnmc.classifiers.classifier_evidence`) and pattern evidence s_pattern
        of the raw features ``X`` (:meth:`~bayesmlc.bnmc.mixture.DPMixture.pattern_evidence`), eq. 8,
        both (b, L)."""
        weights = self._sgd.W_avg[None] if self.classifier_samples_ is None else self.classifier_samples_
        term = SupportTerm.of(self)
        s_clf = classifier_evidence(self._classifier_inputs(Z), weights, self.classifier_variances_,
                                    self._classifier_kind(), None if term is None else term.margins(Z))
        return s_clf, self._mixture.pattern_evidence(self._mixture_features(X), self.label_share_)

    def _decision_function(self, X) -> np.ndarray:
        s_clf, s_pat = self._evidence(self._classifier_features(X), X)
        return self._calibrated_logits(s_clf, s_pat).astype(np.float32)

    def _predict_proba(self, X) -> np.ndarray:
        s_clf, s_pat = self._evidence(self._classifier_features(X), X)
        return sigmoid(self._calibrated_logits(s_clf, s_pat, probability=True))

    def _scores_and_proba(self, X):
        """Both hooks' outputs for a batch from one computation of the evidence."""
        s_clf, s_pat = self._evidence(self._classifier_features(X), X)
        scores, logits = scores_and_probability_logits(s_clf, s_pat, self.evidence_weights_,
                                                       *self._probability_calibration())
        return scores.astype(np.float32), sigmoid(logits)

    def _labels_from_proba(self, proba, X) -> sp.csr_matrix:
        """``predict(X)``'s label sets (``count_rule_``, batches of 2048 rows) from ``predict_proba(X)``."""
        batches = (proba[rows] for rows in iter_batches(proba.shape[0], 2048))
        return self._rule_labels(batches, self.count_rule_, numpy_rng(None))

    def _rule_labels(self, proba_batches, rule: str, rng) -> sp.csr_matrix:
        """The label sets of ``rule`` (:func:`~bayesmlc.bnmc.label_sets.rule_predictions`) for the rows of
        each batch of calibrated probabilities in turn, stacked as CSR (n, L)."""
        parts = [rule_predictions(proba, rule, self.threshold_, self.label_count_mean_, self.label_count_std_, rng)
                 for proba in proba_batches]
        return sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, self.n_labels_), dtype=np.float32)

    def _calibrated_logits(self, s_clf, s_pat, probability: bool = False) -> np.ndarray:
        """The ranking score z = a s_clf + b s_pattern + d, + r for each row's leading label (r >= 0 keeps
        it in the lead), or, with ``probability``, the logits of the calibrated probabilities
        (:func:`calibrated_probability_logits`)."""
        if probability:
            return calibrated_probability_logits(s_clf, s_pat, self.evidence_weights_, *self._probability_calibration())
        a, b, d = self.evidence_weights_
        return rank_adjusted_logits(a * s_clf + b * s_pat + d, self._rank_terms())

    def _probability_calibration(self) -> tuple:
        """(probability theta, rank terms, top-label map or None) of the calibrated probabilities; files
        written before the probability's own weights existed used the ranking's for both."""
        theta = getattr(self, "probability_evidence_weights_", self.evidence_weights_)
        top_map = np.asarray(getattr(self, "top_label_map_", TOP_LABEL_IDENTITY), dtype=np.float64)
        return theta, self._rank_terms(), None if np.array_equal(top_map, TOP_LABEL_IDENTITY) else top_map

    def _classifier_kind(self) -> str:
        """The classifiers' likelihood: ``classifier_`` (files written before it existed: ``classifier``;
        a model ``partial_fit`` started with ``classifier="auto"``: logistic)."""
        kind = getattr(self, "classifier_", self.classifier)
        return CLASSIFIER_CHOICES[0] if kind == "auto" else kind

    def _rank_terms(self) -> RankTerms:
        """The fitted :class:`RankTerms` (files written before a term existed load it as 0)."""
        return RankTerms(*(float(getattr(self, name, 0.0)) for name in RANK_TERMS))

    def _check_fitted_state(self) -> None:
        """The declared fields of :data:`bayesmlc.bnmc.state_checks.BNMC_FIELDS`: the calibration and
        label-set rule, the rank terms, the classifiers and the mixture's state."""
        check_fitted_state(self, BNMC_FIELDS)

    def _set_rank_terms(self, terms: RankTerms) -> None:
        for name, value in zip(RANK_TERMS, terms):
            setattr(self, name, float(value))

    def predict(self, X, threshold: float | None = None, top_k: int | None = None, rule: str | None = None,
                random_state=None) -> sp.csr_matrix:
        """Sparse 0/1 label predictions.

        ``top_k`` or a numeric ``threshold`` behave as in the base class (top-k labels; calibrated
        probability >= threshold). With neither, ``rule`` (default: ``count_rule_``, the fitted
        choice) applies: "threshold" (tuned threshold, at least one label), "count" (the top
        round(sum_c p_c) labels: the expected count under the calibrated probabilities), "expected"
        (the top round(mean training count) labels) or "sample" (eq. 9: T ~ round(N(mean, std)),
        labels ~ Mult(nu, T), seeded by ``random_state``). Labels are ranked by nu (eq. 8).
        """
        if top_k is not None or threshold is not None:
            return super().predict(X, threshold=0.5 if threshold is None else threshold, top_k=top_k)
        self._check_is_fitted()
        rule = self.count_rule_ if rule is None else rule
        if rule not in COUNT_RULES:
            raise ValidationError(f"rule must be one of {COUNT_RULES}, got {rule!r}")
        X = self._validated(X)
        batches = (self.predict_proba(X[rows]) for rows in iter_batches(X.shape[0], 2048))
        return self._rule_labels(batches, rule, numpy_rng(random_state))

    # ---- online ---------------------------------------------------------------------------------
    def partial_fit(self, X, Y, label_mask=None, classes=None):
        """Update the model with one batch of a stream, without revisiting earlier data.

        The first call initialises the model from the batch (feature scaling, emission and the
        label count are fixed then). Later calls: one SVI natural-gradient step (eqs. 2-5) with the
        natural gradient scaled to the number of rows seen so far, and one epoch of SGD (eq. 7) on
        the batch in minibatches of ``batch_size``. A model fitted in batch mode continues with SGD
        from the posterior mean of its classifiers. ``classes``: None or a subset of [0, 1],
        scikit-learn's ``partial_fit`` argument; the label set is the columns of ``Y``.
        """
        first, Y = self._start_partial_fit(Y, classes)
        check_parameters(self)
        self._check_n_keep()
        if first:
            X, Y, label_mask = check_fit_inputs(X, Y, label_mask)
        else:
            X = check_features(X, self.n_features_in_, estimator_name="BNMC")
            Y = stream_labels(Y, X.shape[0], self.n_labels_)
            if label_mask is not None:
                _, Y, label_mask = check_fit_inputs(X, Y, pad_columns(label_mask, self.n_labels_, "label_mask"))
        if first or getattr(self, "_stream_rng", None) is None:
            self._stream_rng = numpy_rng(self.random_state)
            self._stream_start = time.perf_counter()
        rng = self._stream_rng
        n = X.shape[0]
        entries, labelled = observed_entries(Y, label_mask, self.unlabeled_rows == "missing")
        batch = LabelStatistics(np.bincount(Y.indices, minlength=Y.shape[1]), entries.per_label())
        self.observed_counts_ = self._add_label_statistics(batch, first, X.shape[1]).observed
        if first:
            self._setup_preprocessing(X)
            self.count_sums_ = np.zeros(3)
            self.label_count_mean_, self.label_count_std_ = 1.0, 0.0
            self.n_seen_ = 0
            self.svi_steps_ = 0
        self._update_count_stats(Y, entries, labelled)
        self.n_seen_ += n

        X_mix, mixture_fit = self._mixture_features(X), MixtureFitter(self, rng)
        mixture_fit.stream(X_mix, Y, first)
        ClassifierFitter(self, rng).stream(self._classifier_features(X), Y, entries, labelled, first)
        self._finish_mixture()
        mixture_fit.record(len(self.history_["objective"]) + 1, X_mix, Y, self._stream_start, self.n_seen_ / n)
        return self

    # ---- persistence ----------------------------------------------------------------------------
    def _get_state(self) -> dict:
        state = super()._get_state()
        state["mixture_state"] = {**self._mixture.state(), **{"emission." + k: v for k, v in self._mixture.emission.state().items()}}
        state["sgd_state"] = None if getattr(self, "_sgd", None) is None else self._sgd.state()
        return state

    def _set_state(self, state: dict) -> None:
        # files written before FeaturePreprocessor held standardized_, feature_mean_, feature_scale_ (the std)
        state = dict(legacy_preprocessor_state(state, self._preprocessor().get_params(), reciprocal_scale=False))
        mixture_state, sgd_state = state.pop("mixture_state"), state.pop("sgd_state")
        super()._set_state(state)
        self._mixture = self._new_mixture()
        self._mixture.set_state(mixture_state)
        self._mixture.emission.set_state({k.split(".", 1)[1]: v for k, v in mixture_state.items() if k.startswith("emission.")})
        self._sgd = None
        if sgd_state is not None:
            self._sgd = SGDClassifier(self.n_features_in_, self.n_labels_, self._classifier_kind(), 1.0, self.sgd_eta0)
            self._sgd.set_state(sgd_state)
