"""BNMC's classifier fits: the :class:`ClassifierFitter` (validation split or cross-fitting, the choice of
solver and likelihood, label blocks, the refit, online SGD passes, calibration) and the small pieces it
is made of.

The estimator (:class:`bayesmlc.bnmc.BNMC`) fits its mixture, then hands the classifier features to a
:class:`ClassifierFitter`, which runs the per-label Bayesian classifiers of
:mod:`bayesmlc.bnmc.classifiers` and fits the calibration of :mod:`bayesmlc.bnmc.rank_calibration` and
the label-set rules of :mod:`bayesmlc.bnmc.label_sets` on held-out evidence, writing the fitted
attributes onto the estimator.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import scipy.sparse as sp
import torch

from ..data.shard import RowShard
from ..distributed import ONE_PROCESS
from ..linalg import top_singular_vectors
from ..preprocessing import row_square_sums
from ..utils import iter_batches, sigmoid
from .classifiers import (LOW_RANKS, SUPPORT_LOW_RANK, Design, LowRankDesign, SGDClassifier, choose_auto_solver,
                          choose_low_rank, gibbs_classifier)
from .label_sets import choose_count_rule, choose_threshold
from .labels import ObservedEntries
from .lowrank_fit import variational_logistic
from .support_term import (SUPPORT_PRIOR_SHARE, SupportTerm, fit_support_block, resolve_support_features,
                           select_supports, support_term_possible)
from .rank_calibration import (
    TOP_LABEL_IDENTITY, bernoulli_log_likelihood, fit_calibration, fit_top_label_map, top_positions,
)

__all__ = [
    "CLASSIFIER_CHOICES",
    "FEATURE_WEIGHTINGS",
    "ClassifierFitter",
    "calibration_fold_count",
    "classifier_steps",
    "compared_classifiers",
    "resolve_feature_weighting",
]

#: Dense (rows x labels) entries a label block of the low-rank classifiers, and the validation
#: split, may hold: label blocks have at most BLOCK_ENTRIES / n labels; the validation split at most
#: VALIDATION_ENTRIES / L rows.
BLOCK_ENTRIES = 2**22
VALIDATION_ENTRIES = 2**22
#: Online SGD keeps two (D+1) x L float64 weight matrices; above this many weights per matrix it
#: works on the shared low-rank representation instead.
SGD_DENSE_WEIGHTS = 2e7
#: ``calibration_folds="auto"``: cross-fit the calibration over this many folds when fewer than
#: CROSS_FIT_MAX_ROWS rows are labelled (the 20% split then holds under 500 rows: 67 on medical, 78 on
#: emotions), else fit it on the single validation split (docs/experiments.md, "Calibration: BNMC's
#: cross-fitted evidence"), and the labelled rows times the labels are at most CROSS_FIT_MAX_ENTRIES:
#: the 20% split of more entries holds enough of them for the calibration's 10 coefficients (EURLex-4K
#: shape at 2,486 rows: 2M entries), where five more fits of thousands of labels took 5x the time.
#: The refit on every labelled row after calibration on the single split is skipped when the validation
#: rows are fewer than this share of them (many labels cap the split at VALIDATION_ENTRIES / L rows):
#: on the 8,000-label word-count shape (12,800 rows, 4.1% held out) it took a quarter of the fit and
#: moved validation P@1 by -0.16 and P@5 by +0.41 (docs/experiments.md, "BNMC on thousands of labels").
REFIT_MIN_SHARE = 0.05
CROSS_FIT_FOLDS = 5
CROSS_FIT_MAX_ROWS = 2500
CROSS_FIT_MAX_ENTRIES = 2**22
#: ``classifier="auto"``: the likelihoods compared on the cross-fitted evidence, the first also the
#: choice where they are not compared (docs/experiments.md, "BNMC: the classifier's likelihood").
CLASSIFIER_CHOICES = ("logistic", "svm")
#: ``classifier="auto"`` compares the likelihoods only when the labelled rows times the labels are at
#: most this many: a second cross-fit costs about as much as the first (on hmc_cellcycle_go's 2,473 x
#: 4,125 entries it added about six minutes to 3.5).
CLASSIFIER_CHOICE_MAX_ENTRIES = 2**22


#: BNMC's ``feature_weighting`` settings other than "auto" (see :func:`resolve_feature_weighting`).
FEATURE_WEIGHTINGS = ("none", "l2", "idf")


def resolve_feature_weighting(setting: str, X, reduce=None) -> str:
    """BNMC's ``feature_weighting`` for the training features ``X`` (this process's rows; ``reduce``
    sums counts over processes): "auto" is "idf" for count features (every stored value a whole
    number and some above 1) and "none" otherwise; any other setting is kept. Binary features stay
    "none": idf then unit rows moved validation P@1 by +2.3 on bibtex and -0.7 on delicious, no
    better than noise either way; on word counts it gave +16.3 (docs/experiments.md, "BNMC: count
    features")."""
    if setting != "auto":
        return setting
    data = X.data if hasattr(X, "data") and not isinstance(X, np.ndarray) else np.asarray(X).ravel()
    tallies = np.array([np.count_nonzero(data != np.round(data)), np.count_nonzero(data > 1)], dtype=np.float64)
    if reduce is not None:
        tallies = reduce(tallies)
    return "idf" if tallies[0] == 0 and tallies[1] > 0 else "none"


# ---- the plan of a fit, from the settings alone ----------------------------------------------------
def calibration_fold_count(settings, n_labelled: int, world_size: int = 1, n_labels: int = 1) -> int:
    """The folds the calibration's evidence is cross-fitted over (1: the single validation split;
    ``calibration_folds`` of the BNMC ``settings`` resolved), for ``n_labelled`` labelled rows of
    ``n_labels`` labels over ``world_size`` processes."""
    if settings.online or world_size > 1 or float(settings.validation_fraction) <= 0:
        return 1
    if settings.calibration_folds == "auto":
        small = n_labelled < CROSS_FIT_MAX_ROWS and n_labelled * n_labels <= CROSS_FIT_MAX_ENTRIES
        return CROSS_FIT_FOLDS if small else 1
    return min(int(settings.calibration_folds), n_labelled)


def compared_classifiers(settings, folds: int, n_labelled: int, n_labels: int) -> tuple:
    """The likelihoods the cross-fitting compares: both of :data:`CLASSIFIER_CHOICES` with
    ``classifier="auto"``, cross-fitted evidence (``folds`` > 1) and ``n_labelled`` rows times the
    ``n_labels`` labels at most :data:`CLASSIFIER_CHOICE_MAX_ENTRIES`; else the one in use."""
    if settings.classifier == "auto" and folds > 1 and n_labelled * n_labels <= CLASSIFIER_CHOICE_MAX_ENTRIES:
        return CLASSIFIER_CHOICES
    return (CLASSIFIER_CHOICES[0] if settings.classifier == "auto" else settings.classifier,)


def validation_rows(settings, n_labelled: int, n_labels: int) -> int:
    """Rows of the single validation split of ``n_labelled`` labelled rows and ``n_labels`` labels:
    ``validation_fraction`` of them, at most VALIDATION_ENTRIES / L (none if that leaves no training row)."""
    n_val = int(round(float(settings.validation_fraction) * n_labelled))
    if n_val >= 1:
        n_val = min(n_val, max(1, VALIDATION_ENTRIES // n_labels))
    return n_val if n_val >= 1 and n_labelled - n_val >= 1 else 0


def refits(settings, n_labelled: int, n_labels: int) -> bool:
    """Whether the classifiers are refitted on every labelled row after calibration on the single split:
    ``refit``, a validation split, and at least :data:`REFIT_MIN_SHARE` of the rows held out."""
    n_val = validation_rows(settings, n_labelled, n_labels)
    return bool(settings.refit) and n_val >= 1 and n_val >= REFIT_MIN_SHARE * n_labelled


def refit_sweeps(n_sweeps: int) -> int:
    """Sweeps of the refit on every labelled row after calibration: max(2, n_sweeps // 2)."""
    return max(2, n_sweeps // 2)


def classifier_steps(settings, n_labelled: int, n_labels: int, world_size: int = 1) -> int:
    """The progress steps of the classifier fits of the BNMC ``settings`` on ``n_labelled`` rows: the
    SGD minibatches online, else the mode steps and sweeps of every fit (folds, likelihoods, refit)."""
    if settings.online:
        return settings.n_passes * -(-n_labelled // settings.batch_size)
    folds = calibration_fold_count(settings, n_labelled, world_size, n_labels)
    refit = refit_sweeps(settings.n_sweeps) + 1 if folds > 1 or refits(settings, n_labelled, n_labels) else 0
    kinds = len(compared_classifiers(settings, folds, n_labelled, n_labels))
    return kinds * folds * (settings.n_mode_steps + settings.n_sweeps) + refit


def _reducing(reduce) -> dict:
    return {} if reduce is None else {"reduce": reduce}


def _mean_sq_norm(inputs) -> float:
    """Mean squared row norm of a sparse or dense (n, d) matrix."""
    squares = inputs.multiply(inputs).sum() if sp.issparse(inputs) else float(np.sum(np.square(inputs, dtype=np.float64)))
    return float(squares) / max(inputs.shape[0], 1)


def absent_label_weights(observed, prior: np.ndarray, n_labels: int, n_keep: int, inference: str):
    """The low-rank classifiers of labels with no positive among the fitted rows, before the others are
    filled in: (means (n_keep, r + 1, L) float32, variances (r + 1, L) float32 or None for Gibbs
    inference). Such a label gets no weights and the bias logit(1/2 / (m + 1)), m its observed
    entries (``observed`` (L,); None: no label is absent), the Krichevsky-Trofimov estimate of a rate
    with no positive in m trials, with no spread; fitting it would cost a share of every sweep for a
    classifier whose evidence only says "rare" (on the 8,000-label synthetic set at 5,000 rows 27% of
    the labels had no positive)."""
    means = np.zeros((n_keep, prior.size, n_labels), dtype=np.float32)
    variances = None if inference != "variational" else np.zeros((prior.size, n_labels), dtype=np.float32)
    if observed is not None:
        means[:, -1, :] = np.log(0.5 / (np.asarray(observed, dtype=np.float64) + 0.5))
    return means, variances


class ClassifierFitter:
    """The classifier fits of a :class:`~bayesmlc.bnmc.BNMC` whose mixture is fitted.

    :meth:`fit` is the classifier half of ``BNMC.fit``: the prior precision, a validation split (or
    cross-fitting folds), the solver, the fits (Gibbs or variational, label block by label block on
    the low-rank design; or online SGD), the calibration on the held-out evidence, and the refit on
    every labelled row. :meth:`stream` is the classifier half of one ``partial_fit`` call. The fitted
    attributes (``classifier_samples_``, ``evidence_weights_``, ``threshold_``, ...) are written onto the
    estimator, whose settings (its parameters) are read from it.

    Parameters
    ----------
    model : BNMC, with ``n_labels_``, ``preprocessor_`` and the mixture fitted.
    rng : numpy Generator, the fit's random stream (continued from the mixture's fit).
    device : torch device of the classifier linear algebra.
    progress : tqdm bar (or None) that the sweeps and SGD minibatches advance.
    parallel : :mod:`bayesmlc.distributed` strategy; sums over rows are summed over its processes.
    """

    def __init__(self, model, rng: np.random.Generator, device=None, progress=None, parallel=ONE_PROCESS):
        self.model = model
        self.rng = rng
        self.device = device
        self.progress = progress
        self.parallel = parallel
        self.reduce = None if parallel.world_size == 1 else parallel.reduce_sum

    # ---- batch --------------------------------------------------------------------------------
    def fit(self, Z, Y, entries: ObservedEntries, labelled: np.ndarray, shard: RowShard | None = None,
            raw=None) -> None:
        """Z (classifier features), Y (CSR), entries: this process's rows; ``labelled``: (N,) flags of
        all rows; ``raw``: the rows' raw features (the mixture's evidence of held-out rows is taken on
        them where Z cannot be mapped back: weighted features). Splits off the validation rows (at
        most VALIDATION_ENTRIES / L of them), fits, calibrates and refits. Row ids are global;
        ``shard`` maps them to this process's rows."""
        model = self.model
        self.Z, self.Y, self.entries, self.raw = Z, Y, entries, raw
        self.shard = RowShard.whole(Z.shape[0]) if shard is None else shard
        self._set_weight_precision(Z, self.shard.n_total)
        rows = np.flatnonzero(labelled)
        model.calibration_folds_ = calibration_fold_count(model, rows.size, self.parallel.world_size, model.n_labels_)
        model.classifier_ = CLASSIFIER_CHOICES[0] if model.classifier == "auto" else model.classifier
        val_rows, train_rows = self._validation_split(rows)
        model._reset_calibration()
        model.classifier_basis_ = None
        SupportTerm.clear(model)
        if model.online:  # one process (checked by BNMC.fit)
            self._fit_online(rows, val_rows, train_rows)
            return
        fit = self._fit_function(rows)
        if model.calibration_folds_ > 1:
            samples, variances, traces = self._cross_fit(fit, rows)
        else:
            samples, variances, traces = self._fit_on_split(fit, rows, val_rows, train_rows)
        model.classifier_samples_, model.classifier_variances_ = samples, variances
        model.classifier_trace_ = np.asarray(traces)

    def _local(self, global_ids: np.ndarray) -> np.ndarray:
        """This process's row indices of the global row ids ``global_ids``."""
        return self.shard.select(global_ids)[0]

    def _set_weight_precision(self, Z, n_total: int) -> None:
        """``weight_precision_``: ``weight_precision``, or for "auto" mean_i |z_i|^2 / 7 over the
        ``n_total`` rows (at least 1e-3) of the classifiers' inputs ``Z`` (sparse, or dense (n, r)
        projections X V for the low-rank solver: the basis keeps a share of each row's squared norm,
        30% at r = 256 on the EURLex-4K shape, and a prior set on |x|^2 held the margins x^T V u to
        that share of the intended spread; validation P@1 39.6 -> 43.0 there, docs/experiments.md,
        "BNMC on thousands of labels")."""
        model = self.model
        if model.weight_precision == "auto":
            local = row_square_sums(Z.data, Z.indptr).sum() if sp.issparse(Z) else np.square(Z, dtype=np.float64).sum()
            squares = self.parallel.reduce_sum(np.array([local], dtype=np.float64))[0]  # float64 sums
            mean_sq_norm = float(squares) / max(n_total, 1)
            model.weight_precision_ = max(mean_sq_norm / 7.0, 1e-3)
        else:
            model.weight_precision_ = float(model.weight_precision)

    def _validation_split(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(validation rows, training rows), sorted global ids: ``validation_fraction`` of the labelled
        ``rows`` (at most VALIDATION_ENTRIES / L) with a single split, none with cross-fitting."""
        model = self.model
        n_val = validation_rows(model, rows.size, model.n_labels_) if model.calibration_folds_ == 1 else 0
        if n_val >= 1:
            shuffled = self.rng.permutation(rows)
            return np.sort(shuffled[:n_val]), np.sort(shuffled[n_val:])
        return np.array([], dtype=np.int64), rows

    def _fit_function(self, rows: np.ndarray):
        """The solver (``solver_``, resolved on the labelled ``rows``) and the function
        ``fit(fit_on, n_iter, n_keep, init, n_mode, generator)`` that fits the classifiers of every
        label on the global rows ``fit_on`` and returns :func:`gibbs_classifier`'s (samples, variances,
        trace); the low-rank solver first sets the shared basis from ``rows``."""
        model, Z, Y, entries, local = self.model, self.Z, self.Y, self.entries, self._local
        solver, rank = model.solver, model.low_rank
        if solver == "auto":
            nnz = int(self.parallel.reduce_sum(np.array([Z[local(rows)].nnz], dtype=np.float64))[0])
            solver, full_rank = choose_auto_solver(rows.size, model.n_features_in_, model.n_labels_, nnz)
            rank = full_rank if full_rank is not None and rank == "auto" else rank
        if self.parallel.world_size > 1 and solver in ("dense", "woodbury"):
            solver = "cg"  # the samplers whose sums over rows are split over processes
        model.solver_ = solver
        prior = np.full(model.n_features_in_ + 1, model.weight_precision_)
        prior[-1] = 1e-2
        if solver == "lowrank":
            ranks = LOW_RANKS + (SUPPORT_LOW_RANK,) if support_term_possible(
                model.support_features, self.parallel.world_size, model.classifier_, model.inference) else LOW_RANKS
            self._set_basis(Z[local(rows)], rows.size, self.parallel, rank, ranks)
            inputs = model._classifier_inputs(Z)
            self._set_weight_precision(inputs, self.shard.n_total)  # the rows the classifiers see: XV
            prior = np.full(inputs.shape[1] + 1, model.weight_precision_)
            prior[-1] = 1e-2

            self._check_support_features(inputs.shape[1])

            def fit(fit_on, n_iter, n_keep, init, n_mode, generator=self.rng):
                design = LowRankDesign(inputs[local(fit_on)], self.device, **_reducing(self.reduce))
                return self._fit_label_blocks(design, local(fit_on), fit_on.size, prior, n_iter, n_keep, generator,
                                              init, n_mode)
            return fit

        self._check_support_features(None)

        def fit(fit_on, n_iter, n_keep, init, n_mode, generator=self.rng):
            mine = local(fit_on)
            design = Design(Z[mine], self.device, dense=solver != "cg", **_reducing(self.reduce))
            return gibbs_classifier(
                design, Y[mine].toarray().astype(np.float64), entries.block(mine), model.classifier_, prior,
                n_iter, n_keep, generator, solver, init=init, progress=self.progress, n_mode_steps=n_mode,
                inference=model.inference)
        return fit

    def _check_support_features(self, rank: int | None) -> None:
        """Warn where an explicit ``support_features`` K > 0 gives no term (``rank``: the basis's, or None)."""
        model = self.model
        if model.support_features not in ("auto", 0) and not resolve_support_features(
                model.support_features, model.solver_, rank, model.n_features_in_, self.parallel.world_size,
                model.classifier_, model.inference):
            warnings.warn(f"support_features={model.support_features} is not used: the support term needs solver "
                          f"'lowrank' with a basis narrower than the features (here solver_={model.solver_!r}, rank "
                          f"{rank}), variational logistic classifiers and one process", UserWarning, stacklevel=2)

    def _fit_on_split(self, fit, rows, val_rows, train_rows):
        """The fit on ``train_rows``, calibrated on ``val_rows`` (if any) and then, with ``refit``,
        refitted on every labelled ``rows``. Returns (samples, variances, trace) of the last fit, the
        trace holding every fit's sweeps."""
        model = self.model
        samples, variances, trace = fit(train_rows if val_rows.size else rows, model.n_sweeps, model.n_keep, None,
                                        model.n_mode_steps)
        traces = list(trace)
        if val_rows.size:
            model.classifier_samples_, model.classifier_variances_ = samples, variances
            mine, val_shard = self.shard.select(val_rows)
            gather = None if self.reduce is None else (
                lambda part: val_shard.gather(part, np.arange(val_rows.size), self.reduce))
            self.calibrate(self.Z[mine], self.Y[mine].toarray().astype(np.float64), self.entries.block(mine), gather,
                           self._raw_rows(mine))
        if val_rows.size and refits(model, rows.size, model.n_labels_):
            # refit on every labelled row, starting from the posterior mean of the first fit
            samples, variances, trace = self._refit(fit, rows, samples.mean(axis=0))
            traces += list(trace)
        return samples, variances, traces

    def _cross_fit(self, fit, rows):
        """Calibration on cross-fitted evidence (one process): ``calibration_folds_`` fits, each
        without one fold of the labelled ``rows``, score that fold; the maps are fitted on every
        row's held-out evidence (:meth:`fit_calibration_maps`); then the classifiers of all rows,
        warm-started from the folds' mean. With ``classifier="auto"`` the folds are fitted with each
        likelihood of :data:`CLASSIFIER_CHOICES`, on the same folds with the same seeds, and the one
        whose calibrated held-out probabilities have the highest log-likelihood
        (:meth:`_held_out_log_likelihood`) is kept. ``fit`` as :meth:`_fit_function` returns. Returns
        (samples, variances, trace) of the final fit, the trace holding the kept likelihood's fits."""
        model, rng = self.model, self.rng
        model._finish_mixture()
        folds = [np.sort(held_out) for held_out in np.array_split(rng.permutation(rows), model.calibration_folds_)]
        kinds = compared_classifiers(model, model.calibration_folds_, rows.size, model.n_labels_)
        seeds = copy.deepcopy(rng)  # the state every likelihood's folds start from (the first draws from rng)
        best = None
        for index, kind in enumerate(kinds):
            model.classifier_ = kind
            evidence, means, traces = self._fold_evidence(fit, folds, rows, rng if index == 0 else copy.deepcopy(seeds))
            self.fit_calibration_maps(*evidence)
            score = self._held_out_log_likelihood(*evidence) if len(kinds) > 1 else 0.0
            if best is None or score > best[0]:
                best = (score, kind, evidence, means, traces)
        _, model.classifier_, evidence, means, traces = best
        if model.classifier_ != kinds[-1]:  # the maps of the kept likelihood (the fit is deterministic)
            self.fit_calibration_maps(*evidence)
        samples, variances, trace = self._refit(fit, rows, np.mean(means, axis=0))
        return samples, variances, traces + list(trace)

    def _fold_evidence(self, fit, folds, rows, generator):
        """One classifier fit per fold of ``folds`` (sorted row ids), without that fold, scoring it.
        Returns the held-out (s_clf, s_pattern, Y, observed) of every fold's rows, concatenated, the
        folds' posterior means and their sweeps' trace."""
        model = self.model
        evidence, means, traces = [], [], []
        for held_out in folds:
            samples, variances, trace = fit(np.setdiff1d(rows, held_out), model.n_sweeps, model.n_keep, None,
                                            model.n_mode_steps, generator=generator)
            model.classifier_samples_, model.classifier_variances_ = samples, variances
            Z_fold = self.Z[held_out]
            evidence.append(model._evidence(Z_fold, self._raw_rows(held_out))
                            + (self.Y[held_out].toarray().astype(np.float64), self.entries.block(held_out)))
            means.append(samples.mean(axis=0))
            traces += list(trace)
        return tuple(np.concatenate(part) for part in zip(*evidence)), means, traces

    def _held_out_log_likelihood(self, s_clf, s_pat, Y, observed) -> float:
        """sum over the ``observed`` entries of log p(y | calibrated probability) of held-out evidence
        (all (n, L)), under the fitted calibration: how ``classifier="auto"`` compares likelihoods."""
        logits = self.model._calibrated_logits(s_clf, s_pat, probability=True)
        return float(np.sum(bernoulli_log_likelihood(Y, logits)[observed > 0]))

    def _raw_rows(self, rows: np.ndarray):
        """The raw features of this process's ``rows``, for the mixture's evidence: those given to
        :meth:`fit` where the classifier features are weighted (``feature_weighting_`` other than
        "none"), else the classifier features mapped back (:meth:`_raw_features`)."""
        if self.raw is not None and self.model.preprocessor_.normalize:
            return self.raw[rows]
        return self._raw_features(self.Z[rows])

    def _raw_features(self, Z):
        """The classifier features ``Z`` of held-out rows back to raw features, for the mixture's evidence."""
        preprocessor = self.model.preprocessor_
        return preprocessor.inverse_transform(Z) if preprocessor.standardized_ else Z

    def _refit(self, fit, rows, init):
        """The classifiers of every labelled ``rows``, warm-started at ``init`` (the first fit's or the
        folds' posterior mean): one mode step and :func:`refit_sweeps` sweeps. ``fit`` as
        :meth:`_fit_function` returns; returns its (samples, variances, trace)."""
        n_refit = refit_sweeps(self.model.n_sweeps)
        return fit(rows, n_refit, min(self.model.n_keep, n_refit), init, 1)

    def _fit_label_blocks(self, design, rows, n_rows, prior, n_iter, n_keep, rng, init, n_mode_steps):
        """The variational (or Gibbs) classifiers of every label with a positive among the fitted rows on a
        low-rank design, label block by label block, so no dense (rows x L) array is formed: blocks of
        at most BLOCK_ENTRIES / n_rows labels (``rows``: this process's rows of the ``n_rows`` fitted).
        A label with no positive there is not fitted (:func:`absent_label_weights`). The variational
        logistic classifiers (the default) are fitted by
        :func:`~bayesmlc.bnmc.lowrank_fit.variational_logistic`. Returns what :func:`gibbs_classifier` returns, for all labels (the
        trace: that of the labels fitted)."""
        model = self.model
        SupportTerm.clear(model)  # this fit's term, if any, is set by _variational_blocks
        Y_rows = self.Y[rows].tocsc()
        counts = self.parallel.reduce_sum(np.diff(Y_rows.indptr).astype(np.float64))
        fitted = np.flatnonzero(counts > 0)
        observed = self.parallel.reduce_sum(self.entries.per_label(rows).astype(np.float64)) if fitted.size < counts.size else None
        means, variances = absent_label_weights(observed, prior, model.n_labels_, n_keep, model.inference)
        width = max(1, BLOCK_ENTRIES // max(1, n_rows))
        trace = np.zeros(n_mode_steps + n_iter)
        if model.classifier_ != "logistic" or model.inference != "variational":
            for start in range(0, fitted.size, width):
                labels = fitted[start:start + width]
                block_means, block_var, block_trace = gibbs_classifier(
                    design, Y_rows[:, labels].toarray().astype(np.float64), self.entries.block(rows, labels),
                    model.classifier_, prior, n_iter, n_keep, rng, "cg", init=None if init is None else init[:, labels],
                    n_mode_steps=n_mode_steps, inference=model.inference)
                means[:, :, labels] = block_means
                if variances is not None:
                    variances[:, labels] = block_var
                trace = trace + np.asarray(block_trace)
            return means, variances, list(trace)

        return self._variational_blocks(design, rows, Y_rows, fitted, width, (means, variances, trace),
                                        prior, n_iter, n_keep, init, n_mode_steps)

    def _variational_blocks(self, design, rows, Y_rows, fitted, width, out, prior, n_iter, n_keep, init,
                            n_mode_steps):
        """The variational logistic classifiers (:func:`~bayesmlc.bnmc.lowrank_fit.variational_logistic`)
        of the ``fitted`` labels, ``width`` a block, written into ``out`` = (means, variances, trace); then,
        where :func:`~bayesmlc.bnmc.support_term.resolve_support_features` gives K > 0, each block's
        support term (:func:`~bayesmlc.bnmc.support_term.fit_support_block`), set on the model
        (``support_columns_``, ``support_means_``, ``support_variances_``)."""
        model = self.model
        means, variances, trace = out
        K = resolve_support_features(model.support_features, model.solver_, design.D1 - 1, model.n_features_in_,
                                     self.parallel.world_size, model.classifier_, model.inference)
        if K:
            Z_rows = self.Z[rows]
            columns = select_supports(Z_rows, Y_rows, fitted, K)
            Z_csc, term = sp.csc_matrix(Z_rows, dtype=np.float32), SupportTerm.empty(model.n_labels_, K)
        for start in range(0, fitted.size, width):
            labels = fitted[start:start + width]
            Y = torch.from_numpy(Y_rows[:, labels].toarray().astype(np.float32))
            observed = None if self.entries.label_mask is None else torch.from_numpy(
                self.entries.block(rows, labels).astype(np.float32))  # else every labelled row's entry
            block_means, variances[:, labels], block_trace = variational_logistic(
                design, Y, observed, prior, n_iter, n_keep, None if init is None else init[:, labels], n_mode_steps)
            means[:, :, labels] = block_means
            trace = trace + np.asarray(block_trace)
            if K:
                margins = design.matmul(torch.from_numpy(block_means.mean(axis=0)))
                block_columns = columns[start:start + width]
                term.columns[labels] = block_columns
                term.means[labels], term.variances[labels] = fit_support_block(
                    Z_csc, block_columns, Y, observed, margins, model.weight_precision_ * SUPPORT_PRIOR_SHARE)
        if K:
            term.store(model)
        return means, variances, list(trace)

    def _set_basis(self, Z, n_rows: int, parallel=None, rank="auto", ranks=LOW_RANKS) -> None:
        """``classifier_basis_`` (D, r) float32: the top-r right singular vectors of the classifier
        features of the given rows (:func:`~bayesmlc.linalg.top_singular_vectors`, summed over
        processes by ``parallel.reduce_sum``; None: one process); r is ``rank``, or with "auto"
        :func:`~bayesmlc.bnmc.classifiers.choose_low_rank` among ``ranks`` for the ``n_rows`` rows of all
        processes."""
        model = self.model
        if rank == "auto":
            stored = Z.nnz if sp.issparse(Z) else np.count_nonzero(Z)
            if parallel is not None:
                stored = parallel.reduce_sum(np.array([stored], dtype=np.float64))[0]
            rank = choose_low_rank(n_rows, Z.shape[1], model.n_labels_, nnz_per_row=float(stored) / max(n_rows, 1),
                                   ranks=ranks)
        rank = int(min(rank, Z.shape[1]))
        seed = int(self.rng.integers(0, 2**31 - 1))
        Vt, _ = top_singular_vectors(Z, rank, seed, parallel, dtype=np.float32)
        model.classifier_basis_ = np.ascontiguousarray(Vt.T)

    # ---- online -------------------------------------------------------------------------------
    def _fit_online(self, rows, val_rows, train_rows) -> None:
        """``online=True``: SGD passes over the training rows (on the shared low-rank representation
        when dense weights would exceed SGD_DENSE_WEIGHTS), the calibration on the validation rows,
        then one pass over those."""
        model, Z, Y, entries = self.model, self.Z, self.Y, self.entries
        model.solver_ = "sgd"
        self._check_support_features(None)
        if (Z.shape[1] + 1) * model.n_labels_ > SGD_DENSE_WEIGHTS:
            self._set_basis(Z[rows], rows.size, rank=model.low_rank)
        inputs = model._classifier_inputs(Z)
        model._sgd = self._new_sgd(inputs[rows], 1.0 / max(rows.size, 1))
        self.sgd_passes(inputs, Y, entries, train_rows)
        model.classifier_samples_ = model.classifier_variances_ = None
        if val_rows.size:
            self.calibrate(Z[val_rows], Y[val_rows].toarray().astype(np.float64), entries.block(val_rows), None,
                           self._raw_rows(val_rows))
            # the held-out rows are then streamed in like any later data
            self.sgd_passes(inputs, Y, entries, val_rows, passes=1)
        model.classifier_trace_ = np.zeros(0)

    def stream(self, Z, Y, entries: ObservedEntries, labelled: np.ndarray, first: bool) -> None:
        """One ``partial_fit`` batch (classifier features ``Z``, labels ``Y``): one SGD epoch over its
        ``labelled`` rows. The first SGD batch sets up the SGD classifiers (on the shared basis of the
        ``first`` batch of a stream where dense weights would exceed SGD_DENSE_WEIGHTS), warm-started at
        the posterior mean of a batch fit's classifiers."""
        model = self.model
        if first:  # a new stream: no batch classifiers, the calibration's defaults
            model._reset_calibration()
            model.classifier_samples_ = model.classifier_variances_ = model.classifier_basis_ = None
            SupportTerm.clear(model)
            model.classifier_trace_ = np.zeros(0)
            model.solver_ = "sgd"
            model.classifier_ = model._classifier_kind()
        if getattr(model, "_sgd", None) is None:
            if first and (Z.shape[1] + 1) * model.n_labels_ > SGD_DENSE_WEIGHTS:
                self._set_basis(Z, Z.shape[0], rank=model.low_rank)  # the stream's basis: its first batch's
            model._sgd = self._new_sgd(model._classifier_inputs(Z), 1e-3)
            if model.classifier_samples_ is not None:
                model._sgd.W[...] = model.classifier_samples_.mean(axis=0)
                model._sgd.W_avg[...] = model._sgd.W
                model.classifier_samples_ = model.classifier_variances_ = None
                SupportTerm.clear(model)
            model.solver_ = "sgd"
        self.sgd_passes(model._classifier_inputs(Z), Y, entries, np.flatnonzero(labelled), passes=1)

    def _new_sgd(self, inputs, alpha_default: float) -> SGDClassifier:
        """SGD classifiers on ``inputs`` (classifier features, or their projections on the basis)."""
        model = self.model
        alpha = float(model.sgd_alpha) if model.sgd_alpha is not None else alpha_default
        mean_sq_norm = _mean_sq_norm(inputs) + 1.0  # + the bias column
        return SGDClassifier(inputs.shape[1], model.n_labels_, model._classifier_kind(), alpha,
                             float(model.sgd_eta0) / mean_sq_norm)

    def sgd_passes(self, inputs, Y, entries, rows, passes=None) -> None:
        """SGD epochs over ``rows`` (``n_passes``, or ``passes``); Y (CSR) and the observed entries
        densified a minibatch at a time."""
        model = self.model
        for _ in range(model.n_passes if passes is None else passes):
            order = self.rng.permutation(rows)
            for batch in iter_batches(order.size, model.batch_size):
                take = order[batch]
                model._sgd.step(inputs[take], Y[take].toarray().astype(np.float64), entries.block(take))
                if self.progress is not None:
                    self.progress.update(1)

    # ---- calibration --------------------------------------------------------------------------
    def calibrate(self, Z_val, Y_val, mask_val, gather=None, X_val=None) -> None:
        """The calibration from the validation rows' evidence (:meth:`fit_calibration_maps`).
        ``gather``: this process's validation rows of an (n_val_local, L) array -> all validation
        rows (several processes); ``X_val``: their raw features (None: mapped back from ``Z_val``)."""
        model = self.model
        model._finish_mixture()
        X_val = self._raw_features(Z_val) if X_val is None else X_val
        s_clf, s_pat = model._evidence(Z_val, X_val)
        if gather is not None:
            s_clf, s_pat, Y_val, mask_val = (gather(part) for part in (s_clf, s_pat, Y_val, mask_val))
        self.fit_calibration_maps(s_clf, s_pat, Y_val, mask_val)

    def fit_calibration_maps(self, s_clf, s_pat, Y_val, mask_val) -> None:
        """Fit (a, b, d) of logit p = a s_clf + b s_pattern + d and the rank terms (:func:`fit_calibration`)
        on the observed held-out entries, the leading label's map (:func:`fit_top_label_map`); then the
        threshold (:func:`~bayesmlc.bnmc.label_sets.choose_threshold`) and, with ``count_rule="auto"``,
        the rule (:func:`~bayesmlc.bnmc.label_sets.choose_count_rule`). ``s_clf``, ``s_pat``: (n_val, L)
        evidence, ``Y_val`` labels, ``mask_val`` observed entries, of the held-out rows."""
        model = self.model
        model.evidence_weights_, model.probability_evidence_weights_, terms = fit_calibration(s_clf, s_pat, Y_val, mask_val > 0)
        model._set_rank_terms(terms)
        model.top_label_map_ = TOP_LABEL_IDENTITY.copy()
        if s_clf.size:
            rows = np.arange(s_clf.shape[0])
            leading = top_positions(model._calibrated_logits(s_clf, s_pat), 1)[:, 0]
            logits = model._calibrated_logits(s_clf, s_pat, probability=True)[rows, leading]
            observed = mask_val[rows, leading] > 0
            model.top_label_map_ = fit_top_label_map(logits[observed], Y_val[rows, leading][observed])
        proba = sigmoid(model._calibrated_logits(s_clf, s_pat, probability=True))
        model.threshold_ = choose_threshold(proba, Y_val, mask_val)
        if model.count_rule == "auto":
            model.count_rule_ = choose_count_rule(proba, Y_val, mask_val, model.threshold_, model.label_count_mean_)
