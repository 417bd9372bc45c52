"""The MLGPF estimator: P latent GPs with shared inducing inputs, utilities f = Phi h + b, logistic
likelihood, trained by doubly stochastic variational inference (journal paper; subspace paper).

The estimator holds the settings and the fitted state; the pieces live beside it: the bound in
:mod:`.objective`, the starting values in :mod:`.initialisation`, the loop in :mod:`.training`, the
predictions in :mod:`.prediction`."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import torch

from ..base import LABEL_CARDINALITY, MultiLabelEstimator
from ..distributed import ONE_PROCESS, ParallelContext
from ..exceptions import ValidationError
from ..fitted_state import check_fitted_state
from ..label_statistics import LabelStatistics
from ..parameters import Boolean, Integer, Options, Real, check_parameters
from ..preprocessing import STANDARDIZE_CONSTRAINT, FeaturePreprocessor, legacy_preprocessor_state
from ..presets import HasPresets
from ..safe_io import check_output_target
from ..utils import numpy_rng, resolve_device, torch_threads
from ..validation import check_fit_inputs
from .inducing import INDUCING_NAMES
from .initialisation import (
    module_from_parameters, resolve_epochs, resolve_linear_term, resolved_latent, resolved_structure,
)
from .kernels import KERNEL_NAMES
from .linear_term import OPTIMISER_STATE as LINEAR_OPTIMISER_STATE
from .linear_term import check_linear_term
from .objective import NEGATIVE_SAMPLING
from .prediction import mean_utilities, predictive_probabilities
from .state_checks import MLGPF_FIELDS
from .training import Trainer, TrainingDivergedError
from .variational import VARIATIONAL_NAMES

__all__ = ["MLGPF"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


class MLGPF(HasPresets, MultiLabelEstimator):
    """Multi-label Gaussian-process factor model (MLGPF).

    P independent latent GPs h_p ~ GP(0, k) share M inducing inputs Z; the label utilities are
    f = Phi h + b (L labels) with a logistic likelihood. q(u_p) is Gaussian; the bound is maximised
    with Adam on minibatches of rows and, optionally, sampled negative labels.

    Parameters
    ----------
    n_latent : int or "auto", default "auto"
        P, the number of latent GPs. "auto" (``n_latent_`` holds the choice): min(100, L). f = Phi h
        has rank at most L, so latent GPs beyond L add parameters and prior variance but nothing f can
        express; with 100 on sets of 6-53 labels MLGPF overfitted and was over-confident at the top
        (docs/experiments.md, "MLGPF: the number of latent GPs").
    n_inducing : int, M, number of inducing inputs.
    kernel : {"auto", "linear", "se", "linear+se"}, default "auto"
        "auto" (``kernel_`` holds the choice): the squared exponential for dense features (more than
        half the entries non-zero: audio, image or expression descriptors) and for sparse ones with at
        least 10 training rows a feature column (:data:`bayesmlc.gp.kernels.SE_ROWS_PER_FEATURE`), the
        linear kernel otherwise (text), where it is the papers' choice; on dense descriptors the linear
        kernel ranks below the baselines (docs/experiments.md, "MLGPF: the kernel of dense features"),
        and so it does on delicious's 500 binary features ("MLGPF: the kernel of many rows and few
        features").
    ard : bool, per-dimension weights (per feature for fixed/free inducing inputs; per subspace
        coordinate plus one for the complement for subspace ones).
    inducing : {"subspace", "subspace-fixed", "free", "fixed"}
    subspace_rank : int or "auto", R, rank of the truncated SVD basis (subspace inducing inputs).
        "auto" (the default) is min(1000, training rows, features); an int larger than that is
        lowered with a warning.
    variational : {"shared", "whitened", "cholesky", "preconditioned"} (:mod:`bayesmlc.gp.variational`).
        "shared" (the default) shares one covariance factor among the P GPs, up to a scale each: a
        row costs O(M^2 + P M) instead of the O(P M^2) of the others (the papers' families); why it
        is the default: docs/experiments.md, "MLGPF at scale".
    batch_size : int or "auto", rows per minibatch (at the start when it grows); "auto" is
        ``min(500, max(32, ceil(n_train / 8)))``, at least 8 steps an epoch
        (:func:`bayesmlc.gp.training.resolve_batch_size`); the sizes used are in ``history_["batch_size"]``.
    batch_size_growth, batch_size_every, max_batch_size : the batch grows by ``batch_size_growth``
        rows every ``batch_size_every`` epochs, up to ``max_batch_size`` (0 = fixed size).
    epochs : int or "auto", default "auto"
        Passes over the training rows. "auto": 40 where the labels outnumber the latent GPs (L > P, with
        or without the per-label linear term) or with at least 10,000 training rows, 100 otherwise (small
        sets of few labels); 40 ranked as well as 100 or better on validation rows of five sets in 35-48%
        of the time (docs/experiments.md, "MLGPF: epochs with the linear term" and "MLGPF: the kernel of
        many rows and few features").
    learning_rate : float, Adam step size for kernel, inducing inputs, Phi and b.
    variational_learning_rate : float or None, Adam step size for q(u) (None = ``learning_rate``).
    lr_decay : float in [0, 1], fraction of training (counted in steps, over ``epochs``) at the end
        over which both learning rates decay to zero along a half cosine (0 = constant rates; see
        :func:`bayesmlc.gp.training.learning_rate_factor`). The schedule depends on ``epochs``, so
        a resumed run must keep ``epochs`` when ``lr_decay > 0``.
    negative_samples : int, None or "auto", negatives sampled per row (None = all labels); "auto" keeps
        all up to 1000 labels and samples 500 above (:func:`bayesmlc.gp.objective.resolve_negative_samples`).
    negative_sampling : {"batch", "row"}, "batch" (the default) samples ``negative_samples`` labels once
        per minibatch, and each row uses its negatives among them, weighted L / ``negative_samples``;
        "row" samples that many of each row's negatives (both unbiased; :mod:`bayesmlc.gp.objective`).
        "batch" forms a B x S block of utilities instead of B x L, and on hmc_cellcycle_go and the
        EURLex-4K shape it ranked as well or better (docs/experiments.md, "MLGPF at scale").
    quadrature_points : int, Gauss-Hermite nodes.
    kl_weight : float, weight of sum_p KL: 0.5 (the authors' code's weight) by default, which
        calibrates the top label better than the paper's bound (1) at the same ranking
        (docs/experiments.md, "Calibration: the KL weight").
    init_factors : {"svd", "random"}, Phi from the top-P singular vectors of the label matrix, or
        N(0, 1/P) draws as in the authors' code.
    init_mean : {"ridge", "zero"}, start the mean of q(u) at a ridge-regression fit of the latent
        targets implied by Phi (:func:`bayesmlc.gp.initialisation.warm_start_mean`), or at zero (the
        prior mean).
    idf_weighting : {"auto", True, False}, scale every feature column by its smoothed inverse document
        frequency in the training rows (``preprocessor_.idf_``, None when not applied) before the rows
        are normalised: rare features count more (measured: docs/experiments.md, "MLGPF on Bibtex").
        Dense columns (non-zero in every row) keep weight 1. "auto" (the default) weights from 2,500
        training rows on (``bayesmlc.preprocessing.IDF_MIN_ROWS``): on a few hundred rows it costs P@1
        (docs/experiments.md, "MLGPF: idf on small sets").
    standardize : {"auto", True, False}, centre every feature column and divide it by its standard
        deviation in the training rows (``preprocessor_.mean_``, ``preprocessor_.scale_``; constant
        columns keep scale 1), first, before idf weighting and row normalisation. For dense real-valued
        features (audio or image descriptors: the emotions, scene and yeast sets), whose uncentred rows
        all point nearly the same way once normalised (docs/experiments.md, "MLGPF on small and dense
        sets"). "auto" (the default) standardises when more than half of the training entries are
        non-zero (:class:`bayesmlc.preprocessing.FeaturePreprocessor`), as BNMC and the baselines do.
        Centring makes every entry non-zero, so the rows are densified: for sparse features (at most
        half non-zero) that is refused above ``bayesmlc.preprocessing.MAX_CENTRED_ENTRIES`` entries per
        call; sparse text should use ``idf_weighting``.
    normalize_features : bool, scale every feature row to unit L2 norm (as the authors' code does).
    rank_by : {"mean", "proba"}, what ``decision_function`` (and so ``predict_topk`` and ranking
        metrics) returns: the mean utilities E_q[f] (the papers' and authors' choice), or the
        predictive probabilities E_q[sigmoid(f)] of ``predict_proba``, which use the predictive
        variance (how the two rank: docs/experiments.md, "MLGPF on Bibtex").
    label_cardinality : {"independent", "at_least_one"}, what ``predict_proba`` returns: the model's
        per-label probabilities, or the same conditioned on the row having at least one label
        (:func:`bayesmlc.base.at_least_one_label`), for data where every row has a label. Rankings are
        unchanged; measured: docs/experiments.md, "Calibration".
    jitter : float, relative jitter added to K_ZZ before its Cholesky factorisation (grown x10 on
        failure, recorded in ``history_["jitter"]``).
    svd_max_rows : int or None, rows the subspace SVD, the label SVD (``init_factors="svd"``) and the
        k-means initialisation see at most.
    validation_fraction : float in [0, 1), rows held out for validation metrics / early stopping.
    validation_every : int, epochs between validation evaluations.
    early_stopping_patience : int or None, stop when validation P@1 has not improved for this many
        evaluations (the best parameters are kept).
    checkpoint_every : int or None, epochs between checkpoints written to ``checkpoint_path``.
    checkpoint_path : str or None
    linear_term : bool or "auto", default "auto"
        Add a per-label linear term, f_l(x) = sum_p Phi_lp h_p(x) + w_l^T x + b_l with
        w_l ~ N(0, ``linear_prior_variance`` I): an independent linear-kernel GP per label beside the
        shared latent GPs, estimated by MAP (the prior as an L2 penalty) with sparse steps
        (:mod:`bayesmlc.gp.linear_term`). Needs labels x ``linear_features`` (x features for a dense
        W) <= ``linear_max_entries``, one process and ``negative_sampling="batch"``. "auto"
        (``linear_term_`` holds the choice): on when the labels outnumber the latent GPs (L > P, where
        the rank-P loadings cannot give each label a direction of its own), the latent GPs have the
        linear kernel (``kernel_``; beside SE ones it ranked lower) and the fit can take it (one
        process, batch-shared negatives), off otherwise (docs/experiments.md, "MLGPF: the linear
        term on a per-label support").
    linear_prior_variance : float > 0 or "evidence", default "evidence", s2 of the linear term's prior
        (its penalty |W|^2 / (2 s2)). "evidence" starts at 16 and sets s2 to MacKay's evidence update
        |W|^2 / gamma five times before the learning rate decays
        (:func:`bayesmlc.gp.linear_term.evidence_prior_variance`): it turns the term down where the data
        do not support it. A fixed s2 = 16 ranks best on the EURLex-4K shape but loses on delicious.
    linear_learning_rate : float or None, default 0.1, the linear term's (lazy) Adam step size
        (None = ``learning_rate``); it follows the same schedule (``lr_decay``).
    linear_max_entries : int, the largest L x D (L x ``linear_features``) the linear term is allowed
        (12 bytes an entry in float32 with its Adam moments, 8 more for a support; 2^26 is 805 MB).
    linear_features : int or None, default 128, K: each label's w_l is restricted to the K feature
        columns with the largest standardised logistic gradient at w = 0 among those of its positive
        rows (lasso strong-rule screening; :mod:`bayesmlc.gp.linear_support`), so W holds L x K
        weights and a step costs O(labels x K x the columns' batch entries). None: every column
        (a dense W, the most accurate where it fits). For wide features or many labels
        (AmazonCat-13K's 13,330 x 203,882 W does not fit densely); measured in docs/experiments.md
        ("MLGPF: the linear term on a per-label support").
    dtype : {"float32", "float64"}, working precision (M x M factorisations always in float64).
    n_threads : int or None, torch threads during fit and prediction (None = torch's setting).
    random_state, device, verbose : as for every bayesmlc estimator.

    Attributes
    ----------
    preprocessor_ : :class:`~bayesmlc.preprocessing.FeaturePreprocessor`, the feature standardisation,
        idf weighting and row normalisation fitted on the training rows (the rows the kernel sees are
        ``preprocessor_.transform(X)``).
    kernel_ : str, the kernel used ("auto" resolved from the training features' density).
    n_latent_ : int, the number of latent GPs used ("auto" resolved: min(100, L)).
    linear_term_ : bool, whether the fit has the per-label linear term ("auto" resolved).
    parameters_ : dict of name -> tensor, the fitted parameters.
    jitter_ : float, relative jitter the last factorisation needed.
    history_ : per-epoch lists: ``epoch``, ``wall_time``, ``objective`` (mean minibatch ELBO estimate),
        ``kl``, ``batch_size``, ``jitter``, ``train_P@1`` (running, on the first ``TRAIN_SCORE_ENTRIES`` x
        steps // L rows of each epoch's first batch), ``val_P@1/3/5`` (NaN when not evaluated).
    step_history_ : per-step lists ``step``, ``wall_time``, ``elbo``.
    """

    def __init__(
        self,
        n_latent="auto", n_inducing=200, kernel="auto", ard=False, inducing="subspace", subspace_rank="auto",
        variational="shared",
        batch_size="auto", batch_size_growth=0, batch_size_every=10, max_batch_size=None, epochs="auto",
        learning_rate=0.03, variational_learning_rate=None, lr_decay=0.5,
        negative_samples="auto", negative_sampling="batch", quadrature_points=10, kl_weight=0.5,
        init_factors="svd", init_mean="ridge", idf_weighting="auto", standardize="auto", normalize_features=True,
        rank_by="mean", label_cardinality="independent", jitter=1e-5, svd_max_rows=100_000,
        linear_term="auto", linear_prior_variance="evidence", linear_learning_rate=0.1, linear_max_entries=2**26,
        linear_features=128,
        validation_fraction=0.0, validation_every=1, early_stopping_patience=None,
        checkpoint_every=None, checkpoint_path=None,
        dtype="float32", n_threads=None, random_state=None, device="auto", verbose=False,
    ):
        self.n_latent = n_latent
        self.n_inducing = n_inducing
        self.kernel = kernel
        self.ard = ard
        self.inducing = inducing
        self.subspace_rank = subspace_rank
        self.variational = variational
        self.batch_size = batch_size
        self.batch_size_growth = batch_size_growth
        self.batch_size_every = batch_size_every
        self.max_batch_size = max_batch_size
        self.epochs = epochs
        self.learning_rate = learning_rate
        self.variational_learning_rate = variational_learning_rate
        self.lr_decay = lr_decay
        self.negative_samples = negative_samples
        self.negative_sampling = negative_sampling
        self.quadrature_points = quadrature_points
        self.kl_weight = kl_weight
        self.init_factors = init_factors
        self.init_mean = init_mean
        self.idf_weighting = idf_weighting
        self.standardize = standardize
        self.normalize_features = normalize_features
        self.rank_by = rank_by
        self.label_cardinality = label_cardinality
        self.jitter = jitter
        self.svd_max_rows = svd_max_rows
        self.linear_term = linear_term
        self.linear_prior_variance = linear_prior_variance
        self.linear_learning_rate = linear_learning_rate
        self.linear_max_entries = linear_max_entries
        self.linear_features = linear_features
        self.validation_fraction = validation_fraction
        self.validation_every = validation_every
        self.early_stopping_patience = early_stopping_patience
        self.checkpoint_every = checkpoint_every
        self.checkpoint_path = checkpoint_path
        self.dtype = dtype
        self.n_threads = n_threads
        self.random_state = random_state
        self.device = device
        self.verbose = verbose

    # ---- parameter checks ---------------------------------------------------------------------
    _parameter_constraints = {
        "kernel": [Options("auto", *KERNEL_NAMES)],
        "inducing": [Options(*INDUCING_NAMES)],
        "variational": [Options(*VARIATIONAL_NAMES)],
        "init_factors": [Options("svd", "random")],
        "init_mean": [Options("ridge", "zero")],
        "rank_by": [Options("mean", "proba")],
        "label_cardinality": [Options(*LABEL_CARDINALITY)],
        "negative_sampling": [Options(*NEGATIVE_SAMPLING)],
        "dtype": [Options(*_DTYPES)],
        "standardize": STANDARDIZE_CONSTRAINT,
        "idf_weighting": ["auto", Boolean()],
        "normalize_features": [Boolean()],
        "linear_term": [Boolean(), "auto"],
        "linear_prior_variance": [Real(0, low_open=True), "evidence"],
        "linear_learning_rate": [None, Real(0, low_open=True)],
        "linear_max_entries": [Integer(1)],
        "linear_features": [None, Integer(1)],
        "n_latent": ["auto", Integer(1)],
        **{name: [Integer(1)] for name in ("n_inducing", "batch_size_every", "quadrature_points",
                                           "validation_every")},
        "epochs": [Integer(0), "auto"],
        **{name: [Integer(0)] for name in ("batch_size_growth",)},
        **{name: [None, Integer(1)] for name in ("max_batch_size", "early_stopping_patience", "checkpoint_every",
                                                 "svd_max_rows", "n_threads")},
        "subspace_rank": [Integer(1), "auto"],
        "batch_size": [Integer(1), "auto"],
        "negative_samples": [Integer(1), None, "auto"],
        "learning_rate": [Real(0, low_open=True)],
        "variational_learning_rate": [None, Real(0, low_open=True)],
        **{name: [Real(0)] for name in ("kl_weight", "jitter")},
        "lr_decay": [Real(0, 1)],
        "validation_fraction": [Real(0, 1, high_open=True)],
    }

    def _check_against_data(self, n_rows: int, first_batch: bool = False):
        """The checks between parameters, and between ``n_inducing`` and the ``n_rows`` training rows
        (``fit`` checked the declared constraints). The ``first_batch`` of ``partial_fit`` may have
        fewer rows than ``n_inducing`` unless the inducing inputs are a fixed subset of its rows."""
        if self.early_stopping_patience is not None and self.validation_fraction == 0:
            raise ValidationError("early_stopping_patience needs validation_fraction > 0 (a held-out set to watch)")
        if self.checkpoint_every is not None and not self.checkpoint_path:
            raise ValidationError("checkpoint_every is set but checkpoint_path is not: say where to write checkpoints")
        if self.checkpoint_path:
            check_output_target(self.checkpoint_path, "checkpoint_path")  # a device or FIFO: refused before fitting
        if self.n_inducing > n_rows and first_batch and self.inducing == "fixed":
            raise ValidationError(
                f"inducing='fixed' keeps n_inducing={self.n_inducing} of the first partial_fit batch's rows as "
                f"inducing inputs, but it has {n_rows}: pass at least {self.n_inducing} rows first, lower "
                "n_inducing, or use inducing='subspace' or 'free'"
            )
        if self.n_inducing > n_rows and not first_batch:
            raise ValidationError(
                f"n_inducing={self.n_inducing} exceeds the n_samples={n_rows} training rows available to initialise "
                "the inducing inputs; lower n_inducing"
            )

    # ---- features -----------------------------------------------------------------------------
    def _preprocessor(self) -> FeaturePreprocessor:
        return FeaturePreprocessor(standardize=self.standardize, idf=self.idf_weighting, normalize=self.normalize_features)

    # ---- fit ----------------------------------------------------------------------------------
    def _fit(self, X, Y, label_mask, resume=False, parallel=None):
        """``parallel``: a :mod:`bayesmlc.distributed` strategy; None = one process. Under
        ``DataParallel`` every rank passes the same settings and either its shard of the rows
        (:func:`bayesmlc.data.shard.read_shard`) or the whole data set (it then keeps its shard),
        and computes the bound on its rows of each global batch (:class:`~bayesmlc.gp.training.Trainer`)."""
        parallel = ONE_PROCESS if parallel is None else parallel
        with torch_threads(self.n_threads):
            try:
                X, Y, label_mask, shard = parallel.local_data(X, Y, label_mask)
                self._check_against_data(shard.n_total)
                if parallel.world_size > 1:  # the label statistics of all processes' rows (fit counted this one's)
                    self._set_label_statistics(LabelStatistics.of_labels(Y, label_mask).summed(parallel.reduce_sum))
                self.kernel_, self.n_latent_ = resolved_structure(self.get_params(), X, Y.shape[1], shard.n_total,
                                                                  parallel.reduce_sum)
                self.n_rows_seen_ = shard.n_total  # all processes' rows; epochs="auto" reads it
                self._resolve_linear_term(Y.shape[1], X.shape[1], parallel.world_size)
                self.preprocessor_ = self._preprocessor().fit(X, n_rows=shard.n_total, reduce=parallel.reduce_sum)
                trainer = self._trainer()
                try:
                    trainer.fit(self.preprocessor_.transform(X), Y, label_mask, ParallelContext(shard, parallel), resume)
                except TrainingDivergedError:
                    self._keep_parameters(trainer.module, trainer.jitter)
                    raise
                finally:
                    self.history_, self.step_history_ = trainer.history, trainer.steps
            except Exception as exc:
                parallel.sync_failure(exc)  # the other processes raise RankFailedError naming this one
                raise
            parallel.sync_failure(None)  # all finished: none is left waiting for a failed one
        self._keep_parameters(trainer.module, trainer.jitter)
        self._stream = None  # a later partial_fit starts a fresh optimizer from these parameters
        return self

    def partial_fit(self, X, Y, label_mask=None, n_total=None, classes=None):
        """Continue stochastic variational training on a batch of rows as it arrives.

        The first call on an unfitted model fixes the features and the label set (the columns of
        ``Y``, as scikit-learn's ``partial_fit(classes=...)`` does) and sets the model up from this
        batch as ``fit`` does (feature statistics, subspace basis, k-means, bias, Phi, ridge warm
        start; ``kernel="auto"`` counts this batch's rows a feature column). A first batch may have
        fewer rows than ``n_inducing``: every row is then an inducing input (or, for subspace ones,
        its projection) and the others start at random rows plus Gaussian noise of the rows' spread
        (:func:`~bayesmlc.gp.inducing.padding_centres`), which training moves (except with ``inducing="subspace-fixed"``); the subspace basis then has
        rank at most the batch's rows, and ``inducing="fixed"`` (a fixed subset of the rows) is
        refused. On a fitted model (``fit``, a loaded model or an earlier ``partial_fit``) it
        continues from the fitted parameters.

        Each call takes one pass over the given rows in random minibatches of ``batch_size`` rows
        (``"auto"`` resolved on this call's rows), with Adam at ``learning_rate`` and
        ``variational_learning_rate`` as they are set at the call (``lr_decay`` needs the total
        number of steps, which a stream does not have: anneal with ``set_params`` between calls;
        Adam's state is kept between calls, not across ``save``/``load``), and the bound of
        :class:`~bayesmlc.gp.objective.VariationalELBO` with N = ``n_total`` or else ``n_rows_seen_``, the rows seen so far including these
        (the training rows after ``fit``): the posterior given the data seen. The label
        statistics (``label_frequencies_``, ``label_prior_``, ``empty_labels_``) accumulate over
        calls; the feature statistics (idf, standardisation) stay those of the set-up (``"auto"``
        settings are judged on the first call's rows).

        Parameters
        ----------
        X : (n, D) features, Y : (n, L) 0/1 labels, label_mask : (n, L) 0/1 or None, as for ``fit``.
        n_total : int or None, N in the bound when the stream passes over a data set of known size
            more than once (repeated rows must not count as new data); None = ``n_rows_seen_``.
        classes : None or a subset of [0, 1], scikit-learn's ``partial_fit`` argument (see
            ``MultiLabelEstimator._check_partial_fit_classes``); the label set is the columns of ``Y``.

        Returns
        -------
        self
        """
        first, Y = self._start_partial_fit(Y, classes)
        X, Y, label_mask = check_fit_inputs(X, Y, label_mask)
        if first:  # before the model takes any fitted attribute, so a refused first batch leaves it unfitted
            check_parameters(self)
            self._check_against_data(X.shape[0], first_batch=True)
        if not first and X.shape[1] != self.n_features_in_:
            raise ValidationError(f"X has {X.shape[1]} features, but MLGPF is expecting {self.n_features_in_} "
                                  "features as input (fixed by its first fit)")
        if not first and Y.shape[1] != self.n_labels_:
            raise ValidationError(f"Y has {Y.shape[1]} labels, but MLGPF has {self.n_labels_} labels "
                                  "(fixed by its first fit)")
        if n_total is not None and (not isinstance(n_total, (int, np.integer)) or n_total < X.shape[0]):
            raise ValidationError(f"n_total must be an integer >= the rows of this call ({X.shape[0]}), got {n_total!r}")
        if not first and not hasattr(self, "n_rows_seen_"):  # a model saved before partial_fit existed
            self.n_rows_seen_ = LabelStatistics.of_fitted(self).n_rows
        self._add_label_statistics(LabelStatistics.of_labels(Y, label_mask), first, X.shape[1])
        if first:
            self.n_rows_seen_ = 0
        start = time.perf_counter()
        with torch_threads(self.n_threads):
            if first:
                self.kernel_, self.n_latent_ = resolved_structure(self.get_params(), X, Y.shape[1])
                self._resolve_linear_term(Y.shape[1], X.shape[1])
                self.preprocessor_ = self._preprocessor().fit(X)
            if first or getattr(self, "_stream", None) is None:  # kept between calls, with its optimizer
                self._stream = self._trainer(None if first else self._ensure_module())
            stream = self._stream
            stream.settings = SimpleNamespace(**self._settings())  # read on every call: a caller anneals with set_params
            self.n_rows_seen_ += X.shape[0]
            try:
                total = stream.stream_pass(self.preprocessor_.transform(X), Y, label_mask,
                                           self.n_rows_seen_ if n_total is None else int(n_total))
            except TrainingDivergedError:  # keep the parameters before the failed step
                self._keep_parameters(stream.module, stream.jitter)
                raise
            self._keep_parameters(stream.module, stream.jitter)
        self.history_.setdefault("objective", []).append(total)
        previous = self.history_.setdefault("wall_time", [])
        previous.append((previous[-1] if previous else 0.0) + time.perf_counter() - start)
        return self

    def _resolve_linear_term(self, n_labels: int, n_features: int, world_size: int = 1) -> None:
        """Set ``linear_term_`` ("auto" resolved by the labels and the resolved ``kernel_``) and refuse a
        term that cannot run."""
        n_latent = resolved_latent(self.n_latent, n_labels)
        self.linear_term_ = resolve_linear_term(self.get_params(), n_labels, n_latent, self.kernel_, world_size)
        check_linear_term(SimpleNamespace(**self._settings()), n_labels, n_features, world_size)

    def _trainer(self, module=None) -> Trainer:
        """A :class:`~bayesmlc.gp.training.Trainer` with these settings and seed, of ``module`` (None: it
        sets the module up from the training rows)."""
        return Trainer(self._settings(), numpy_rng(self.random_state), resolve_device(self.device),
                       _DTYPES[self.dtype], module=module, jitter=None if module is None else self.jitter_)

    def _settings(self) -> dict:
        """The parameters with the fitted kernel, number of latent GPs, linear term and epochs in place of
        "auto" (files written before ``kernel_``, ``n_latent_`` and ``linear_term_`` existed named them
        themselves)."""
        linear_term = getattr(self, "linear_term_", self.linear_term)
        return {**self.get_params(), "kernel": getattr(self, "kernel_", self.kernel),
                "n_latent": getattr(self, "n_latent_", self.n_latent), "linear_term": linear_term,
                "epochs": resolve_epochs(self.epochs, linear_term,
                                         getattr(self, "n_rows_seen_", None),
                                         getattr(self, "n_labels_", 0) > getattr(self, "n_latent_", np.inf))}

    def _keep_parameters(self, module, jitter):
        self._module = module
        optimiser_state = {f"linear.{name}" for name in LINEAR_OPTIMISER_STATE}  # kept by checkpoints, not models
        self.parameters_ = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()
                            if k not in optimiser_state}
        self.jitter_ = float(jitter)
        self._prediction_cache = {}

    # ---- prediction ---------------------------------------------------------------------------
    def _ensure_module(self):
        if getattr(self, "_module", None) is None:
            self._device = resolve_device(self.device)
            self._module = module_from_parameters(SimpleNamespace(**self._settings()), self.parameters_, self._device,
                                                  _DTYPES[self.dtype])
        return self._module

    def _mean_utilities(self, X) -> np.ndarray:
        """E_q[f] for a batch of (already prepared) rows: (b, L) float32."""
        # a memo of a function of the fitted parameters, filled in place: predicting leaves the
        # model's attributes as they were (scikit-learn's check_dict_unchanged)
        cache = self.__dict__.setdefault("_prediction_cache", {})
        scores, cache["mean_weights"] = mean_utilities(self._ensure_module(), X, self.jitter_, cache.get("mean_weights"))
        return scores

    def _decision_function(self, X) -> np.ndarray:
        if self.rank_by == "proba":
            return self._predict_proba(X)
        with torch_threads(self.n_threads):
            return self._mean_utilities(self.preprocessor_.transform(X))

    def _predict_proba(self, X) -> np.ndarray:
        """E[sigmoid(f)] under q(f), by Gauss-Hermite quadrature over the predictive variance
        (:func:`bayesmlc.gp.prediction.predictive_probabilities`)."""
        with torch_threads(self.n_threads):
            return self._predictive_probabilities(self.preprocessor_.transform(X))

    def _predictive_probabilities(self, prepared, return_mean: bool = False):
        return predictive_probabilities(self._ensure_module(), prepared, self.jitter_, self.quadrature_points,
                                        return_mean=return_mean)

    def _scores_and_proba(self, X):
        """The scores and probabilities of a batch from one pass of the model: the mean utilities
        come with the probabilities (equal to ``decision_function``'s to float rounding), and with
        ``rank_by="proba"`` the probabilities are the scores."""
        with torch_threads(self.n_threads):
            proba, mean = self._predictive_probabilities(self.preprocessor_.transform(X), return_mean=True)
            return (proba if self.rank_by == "proba" else mean), proba

    # ---- persistence --------------------------------------------------------------------------
    def __getstate__(self):
        """Pickle (and ``joblib``-dump) what :meth:`save` keeps: the fitted parameters, without the torch
        module built from them (rebuilt from ``parameters_`` on first use), the prediction memo, or a
        ``partial_fit`` stream's trainer and Adam state (which ``save`` does not keep either: a later
        ``partial_fit`` starts a fresh optimiser). A pickled model ships light to scoring workers."""
        state = super().__getstate__()
        for name in ("_module", "_device", "_prediction_cache", "_stream"):
            state.pop(name, None)
        return state

    def _set_state(self, state: dict) -> None:
        # files written before FeaturePreprocessor held feature_mean_, feature_scale_ = 1 / standard
        # deviation and feature_idf_ (older ones only some of them)
        super()._set_state(legacy_preprocessor_state(state, self._preprocessor().get_params(), reciprocal_scale=True))
        self.parameters_ = {k: torch.as_tensor(v) for k, v in self.parameters_.items()}
        self._module = None
        self._prediction_cache = {}
        self._stream = None

    def _check_fitted_state(self) -> None:
        """The declared fields of :data:`bayesmlc.gp.state_checks.MLGPF_FIELDS` (files written before
        ``kernel_`` and ``n_latent_`` existed have neither: their parameters name both)."""
        check_fitted_state(self, MLGPF_FIELDS)
