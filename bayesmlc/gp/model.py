"""The MLGPF estimator: P latent GPs with shared inducing inputs, utilities f = Phi h + b, logistic
likelihood, trained by doubly stochastic variational inference (journal paper; subspace paper)."""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from ..base import MultiLabelEstimator, label_counts
from ..validation import check_fit_inputs
from ..distributed import ONE_PROCESS, RowShard
from ..exceptions import ModelFormatError, ValidationError
from ..utils import column_mean_and_scale, logit, normalize_rows, numpy_rng, resolve_device, resolve_standardize
from .inducing import (
    INDUCING_NAMES,
    FeatureBatch,
    InputSpaceInducing,
    SubspaceInducing,
    kmeans_centres,
    top_singular_vectors,
    truncated_svd,
)
from .kernels import KERNEL_NAMES, make_kernel
from .likelihoods import BernoulliLogit
from .objective import (
    NEGATIVE_SAMPLING, LabelEntries, data_term_full, data_term_sampled, data_term_shared, resolve_negative_samples,
    sample_label_entries, sample_shared_negatives, utility_moments,
)
from .training import (
    TrainingDivergedError,
    all_finite,
    batch_size_at,
    early_stop,
    epoch_batches,
    learning_rate_factor,
    load_checkpoint,
    make_optimizer,
    optimizer_state_from_checkpoint,
    resolve_batch_size,
    save_checkpoint,
    step_progress,
)
from .variational import VARIATIONAL_NAMES, make_variational, robust_cholesky

__all__ = ["MLGPF", "MLGPFModule"]

# Precompute the training rows' subspace projections X X~^T (= U S) when they take at most this many
# entries (200 MB in float32); otherwise they are formed per batch by a sparse product.
PROJECTION_CACHE_ENTRIES = 50_000_000
#: ``subspace_rank="auto"``: this rank, or min(training rows, features) when smaller.
AUTO_SUBSPACE_RANK = 1000
#: ``standardize=True`` densifies the rows it prepares: at most this many entries (1 GB of float32) per call.
MAX_STANDARDIZED_ENTRIES = 1 << 28
#: The running training P@1 scores the first TRAIN_SCORE_ENTRIES // L rows of each batch (all of a
#: 500-row batch up to 2,097 labels), so that it costs no more than a 2^20-entry product per step.
TRAIN_SCORE_ENTRIES = 1 << 20
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


class MLGPFModule(nn.Module):
    """The parameters of the bound: kernel, inducing inputs, q(u), loadings Phi (L, P), bias b (L,)."""

    def __init__(self, kernel, inducing, variational, Phi: np.ndarray, bias: np.ndarray):
        super().__init__()
        self.kernel = kernel
        self.inducing = inducing
        self.variational = variational
        self.Phi = nn.Parameter(torch.as_tensor(np.asarray(Phi, dtype=np.float32)))
        self.bias = nn.Parameter(torch.as_tensor(np.asarray(bias, dtype=np.float32)))

    def latent(self, batch: FeatureBatch, jitter: float, timings: dict | None = None, need_var: bool = True):
        """Kernel blocks, factorisation and the (B, P) marginals of q(h) for a batch."""
        clock = _Clock(timings)
        inner = self.inducing.inner_products(batch, self.kernel.input_weights())
        blocks = self.kernel(inner)
        clock.lap("kernels")
        prep = self.variational.prepare(blocks.zz, jitter)
        clock.lap("factorisations")
        if not need_var:
            return blocks.xz @ self.variational.mean_weights(prep), None, prep
        mean_h, var_h = self.variational.marginals(prep, blocks.xz, blocks.xx)
        clock.lap("marginals")
        return mean_h, var_h, prep


class _Clock:
    """Accumulates wall time per stage into ``timings`` (a dict) when one is given."""

    def __init__(self, timings: dict | None):
        self.timings = timings
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.timings is not None:
            now = time.perf_counter()
            self.timings[name] = self.timings.get(name, 0.0) + now - self.last
            self.last = now


def minibatch_elbo(module, likelihood, batch, targets, n_total, kl_weight, jitter, timings=None):
    """The doubly stochastic ELBO estimate for one minibatch (see :mod:`bayesmlc.gp.objective`).

    ``targets`` is ``("full", Y_dense, mask_dense_or_None)``, ``("sampled", LabelEntries)`` or
    ``("shared", SharedNegatives)``.
    Returns (elbo, sum_p KL, mean_h (B, P), relative jitter used).
    """
    mean_h, var_h, prep = module.latent(batch, jitter, timings)
    clock = _Clock(timings)
    if targets[0] == "full":
        data = data_term_full(likelihood, mean_h, var_h, module.Phi, module.bias, targets[1], targets[2])
    elif targets[0] == "shared":
        data = data_term_shared(likelihood, mean_h, var_h, module.Phi, module.bias, targets[1])
    else:
        data = data_term_sampled(likelihood, mean_h, var_h, module.Phi, module.bias, targets[1])
    clock.lap("quadrature")
    kl = module.variational.kl(prep).sum()
    clock.lap("kl")
    n_batch = batch.sq_norm.shape[0]
    scale = n_total / n_batch if n_batch else 0.0  # a data-parallel rank may get no rows of a short batch
    return scale * data - kl_weight * kl, kl, mean_h, prep.jitter


def _skip_negative_draws(n_negatives: np.ndarray, negative_samples: int, rng: np.random.Generator) -> None:
    """Advance ``rng`` as :func:`sample_label_entries` does for rows with ``n_negatives`` negatives
    (one draw of ``negative_samples`` of them without replacement per row that has more), without
    their labels: the draws for rows another data-parallel process holds."""
    for count in n_negatives:
        if count > negative_samples:
            rng.choice(int(count), negative_samples, replace=False)


def inverse_document_frequency(document_counts: np.ndarray, n_rows: int) -> np.ndarray:
    """Smoothed idf per feature, log((1 + N) / (1 + df)) + 1 (scikit-learn's ``TfidfTransformer``
    form): ``document_counts`` (D,) rows in which each feature is non-zero, of ``n_rows`` rows."""
    counts = np.asarray(document_counts, dtype=np.float64)
    return (np.log((1.0 + n_rows) / (1.0 + counts)) + 1.0).astype(np.float32)


class MLGPF(MultiLabelEstimator):
    """Multi-label Gaussian-process factor model (MLGPF).

    P independent latent GPs h_p ~ GP(0, k) share M inducing inputs Z; the label utilities are
    f = Phi h + b (L labels) with a logistic likelihood. q(u_p) is Gaussian; the bound is maximised
    with Adam on minibatches of rows and, optionally, sampled negative labels.

    Parameters
    ----------
    n_latent : int, P, number of latent GPs.
    n_inducing : int, M, number of inducing inputs.
    kernel : {"linear", "se", "linear+se"}
    ard : bool, per-dimension weights (per feature for fixed/free inducing inputs; per subspace
        coordinate plus one for the complement for subspace ones).
    inducing : {"subspace", "subspace-fixed", "free", "fixed"}
    subspace_rank : int or "auto", R, rank of the truncated SVD basis (subspace inducing inputs).
        "auto" (the default) is min(1000, training rows, features); an int larger than that is
        lowered with a warning.
    variational : {"shared", "whitened", "cholesky", "preconditioned"} (:mod:`bayesmlc.gp.variational`).
        "shared" (the default) shares one covariance factor among the P GPs, up to a scale each: a
        row costs O(M^2 + P M) instead of the O(P M^2) of the others (the papers' families);
        on bibtex_xc it is as accurate as "whitened" at about a ninth of the time (docs/mlgpf.md).
    batch_size : int or "auto", rows per minibatch (at the start when it grows). "auto" (the default)
        is 500 rows, fewer on small sets so that an epoch takes at least 8 steps:
        ``min(500, max(32, ceil(n_train / 8)))`` (:func:`bayesmlc.gp.training.resolve_batch_size`);
        the sizes used are in ``history_["batch_size"]``.
    batch_size_growth, batch_size_every, max_batch_size : the batch grows by ``batch_size_growth``
        rows every ``batch_size_every`` epochs, up to ``max_batch_size`` (0 = fixed size).
    epochs : int
    learning_rate : float, Adam step size for kernel, inducing inputs, Phi and b.
    variational_learning_rate : float or None, Adam step size for q(u) (None = ``learning_rate``).
    lr_decay : float in [0, 1], fraction of training (counted in steps, over ``epochs``) at the end
        over which both learning rates decay to zero along a half cosine (0 = constant rates; see
        :func:`bayesmlc.gp.training.learning_rate_factor`). The schedule depends on ``epochs``, so
        a resumed run must keep ``epochs`` when ``lr_decay > 0``.
    negative_samples : int, None or "auto", negatives sampled per row (None = all labels). "auto" (the
        default) uses all labels up to 1000 labels and samples 500 negatives per row above that
        (:func:`bayesmlc.gp.objective.resolve_negative_samples`). Under ``negative_sampling="batch"``
        it is the number of labels sampled per minibatch instead.
    negative_sampling : {"row", "batch"}, how negatives are sampled when ``negative_samples`` does
        not keep all labels: "row" draws ``negative_samples`` of each row's negatives for that row;
        "batch" draws ``negative_samples`` labels from all L once per minibatch and every row uses
        those among them that are its negatives, weighted L / ``negative_samples`` (unbiased too;
        no per-row sampling, and the negatives' moments are one dense B x S block). See
        :mod:`bayesmlc.gp.objective`.
    quadrature_points : int, Gauss-Hermite nodes.
    kl_weight : float, weight of sum_p KL (1 = the paper's bound; 0.5 = the authors' code).
    init_factors : {"svd", "random"}, Phi from the top-P singular vectors of the label matrix, or
        N(0, 1/P) draws as in the authors' code.
    init_mean : {"ridge", "zero"}, start the mean of q(u) at a ridge-regression fit of the latent
        targets implied by Phi (see ``_warm_start_mean``), or at zero (the prior mean).
    idf_weighting : bool, scale every feature column by its smoothed inverse document frequency in
        the training rows (:func:`inverse_document_frequency`) before the rows are normalised:
        rare features count more (on bibtex_xc +0.4 P@1 and +0.6 P@3 / P@5; docs/mlgpf.md). Dense
        columns (non-zero in every row) keep weight 1.
    standardize : {"auto", True, False}, centre every feature column and divide it by its standard
        deviation in the training rows (``feature_mean_``, ``feature_scale_``; constant columns keep
        scale 1), first, before idf weighting and row normalisation. For dense real-valued features
        (audio or image descriptors: the emotions, scene and yeast sets), whose uncentred rows all
        point nearly the same way once normalised (emotions P@1 57 without, 72 with;
        docs/mlgpf.md). "auto" (the default) standardises when more than half of the training
        entries are non-zero (:func:`bayesmlc.utils.resolve_standardize`), as BNMC and the
        baselines do. Centring makes every entry non-zero, so the rows are densified: for sparse
        features (at most half non-zero) that is refused above ``MAX_STANDARDIZED_ENTRIES``
        entries per call; sparse text should use ``idf_weighting``.
    normalize_features : bool, scale every feature row to unit L2 norm (as the authors' code does).
    rank_by : {"mean", "proba"}, what ``decision_function`` (and so ``predict_topk`` and ranking
        metrics) returns: the mean utilities E_q[f] (the papers' and authors' choice), or the
        predictive probabilities E_q[sigmoid(f)] of ``predict_proba``, which use the predictive
        variance (on Bibtex they ranked 0.6 points of P@1 better; docs/benchmarks.md).
    jitter : float, relative jitter added to K_ZZ before its Cholesky factorisation (grown x10 on
        failure, recorded in ``history_["jitter"]``).
    svd_max_rows : int or None, rows the subspace SVD and the k-means initialisation see at most.
    validation_fraction : float in [0, 1), rows held out for validation metrics / early stopping.
    validation_every : int, epochs between validation evaluations.
    early_stopping_patience : int or None, stop when validation P@1 has not improved for this many
        evaluations (the best parameters are kept).
    checkpoint_every : int or None, epochs between checkpoints written to ``checkpoint_path``.
    checkpoint_path : str or None
    dtype : {"float32", "float64"}, working precision (M x M factorisations always in float64).
    n_threads : int or None, torch threads during fit and prediction (None = torch's setting).
    random_state, device, verbose : as for every bayesmlc estimator.

    Attributes
    ----------
    parameters_ : dict of name -> tensor, the fitted parameters.
    jitter_ : float, relative jitter the last factorisation needed.
    history_ : per-epoch lists: ``epoch``, ``wall_time``, ``objective`` (mean minibatch ELBO
        estimate), ``kl``, ``batch_size``, ``jitter``, ``train_P@1`` (running, on the batches; on their first
        ``TRAIN_SCORE_ENTRIES // L`` rows),
        ``val_P@1``, ``val_P@3``, ``val_P@5`` (NaN when not evaluated).
    step_history_ : per-step lists ``step``, ``wall_time``, ``elbo``.
    """

    def __init__(
        self,
        n_latent=100,
        n_inducing=200,
        kernel="linear",
        ard=False,
        inducing="subspace",
        subspace_rank="auto",
        variational="shared",
        batch_size="auto",
        batch_size_growth=0,
        batch_size_every=10,
        max_batch_size=None,
        epochs=100,
        learning_rate=0.03,
        variational_learning_rate=None,
        lr_decay=0.5,
        negative_samples="auto",
        negative_sampling="row",
        quadrature_points=10,
        kl_weight=1.0,
        init_factors="svd",
        init_mean="ridge",
        idf_weighting=True,
        standardize="auto",
        normalize_features=True,
        rank_by="mean",
        jitter=1e-5,
        svd_max_rows=100_000,
        validation_fraction=0.0,
        validation_every=1,
        early_stopping_patience=None,
        checkpoint_every=None,
        checkpoint_path=None,
        dtype="float32",
        n_threads=None,
        random_state=None,
        device="auto",
        verbose=False,
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
        self.jitter = jitter
        self.svd_max_rows = svd_max_rows
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
    def _check_params(self, n_rows: int):
        def positive_int(name, value, allow_none=False, low=1, allow_auto=False):
            if (value is None and allow_none) or (allow_auto and isinstance(value, str) and value == "auto"):
                return
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                choices = f"an integer >= {low}" + (' or "auto"' if allow_auto else "")
                raise ValidationError(f"{name} must be {choices}, got {value!r}")

        def positive_float(name, value, allow_zero=False):
            ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or value < 0 or (value == 0 and not allow_zero):
                raise ValidationError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} number, got {value!r}")

        for name, choices in (
            ("kernel", KERNEL_NAMES),
            ("inducing", INDUCING_NAMES),
            ("variational", VARIATIONAL_NAMES),
            ("init_factors", ("svd", "random")),
            ("init_mean", ("ridge", "zero")),
            ("rank_by", ("mean", "proba")),
            ("negative_sampling", NEGATIVE_SAMPLING),
            ("dtype", tuple(_DTYPES)),
        ):
            if getattr(self, name) not in choices:
                raise ValidationError(f"{name} must be one of {', '.join(map(repr, choices))}; got {getattr(self, name)!r}")
        resolve_standardize(self.standardize, 0, 0)  # checks the setting
        positive_int("n_latent", self.n_latent)
        positive_int("n_inducing", self.n_inducing)
        positive_int("subspace_rank", self.subspace_rank, allow_auto=True)
        positive_int("batch_size", self.batch_size, allow_auto=True)
        positive_int("batch_size_growth", self.batch_size_growth, low=0)
        positive_int("batch_size_every", self.batch_size_every)
        positive_int("max_batch_size", self.max_batch_size, allow_none=True)
        positive_int("epochs", self.epochs, low=0)
        positive_int("negative_samples", self.negative_samples, allow_none=True, allow_auto=True)
        positive_int("quadrature_points", self.quadrature_points)
        positive_int("validation_every", self.validation_every)
        positive_int("early_stopping_patience", self.early_stopping_patience, allow_none=True)
        positive_int("checkpoint_every", self.checkpoint_every, allow_none=True)
        positive_int("svd_max_rows", self.svd_max_rows, allow_none=True)
        positive_int("n_threads", self.n_threads, allow_none=True)
        positive_float("learning_rate", self.learning_rate)
        if self.variational_learning_rate is not None:
            positive_float("variational_learning_rate", self.variational_learning_rate)
        positive_float("kl_weight", self.kl_weight, allow_zero=True)
        positive_float("lr_decay", self.lr_decay, allow_zero=True)
        if self.lr_decay > 1:
            raise ValidationError(f"lr_decay must be in [0, 1] (a fraction of training), got {self.lr_decay!r}")
        positive_float("jitter", self.jitter, allow_zero=True)
        if not (isinstance(self.validation_fraction, (int, float)) and 0 <= self.validation_fraction < 1):
            raise ValidationError(f"validation_fraction must be in [0, 1), got {self.validation_fraction!r}")
        if self.early_stopping_patience is not None and self.validation_fraction == 0:
            raise ValidationError("early_stopping_patience needs validation_fraction > 0 (a held-out set to watch)")
        if self.checkpoint_every is not None and not self.checkpoint_path:
            raise ValidationError("checkpoint_every is set but checkpoint_path is not: say where to write checkpoints")
        if self.n_inducing > n_rows:
            raise ValidationError(
                f"n_inducing={self.n_inducing} exceeds the n_samples={n_rows} training rows available to initialise "
                "the inducing inputs; lower n_inducing"
            )

    # ---- context ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _threads(self):
        if self.n_threads is None:
            yield
            return
        previous = torch.get_num_threads()
        torch.set_num_threads(int(self.n_threads))
        try:
            yield
        finally:
            torch.set_num_threads(previous)

    def _prepare_features(self, X: sp.csr_matrix) -> sp.csr_matrix:
        """The rows the kernel sees: standardised columns (``feature_mean_``, ``feature_scale_``), then
        idf-weighted columns (``feature_idf_``), then unit rows."""
        mean = getattr(self, "feature_mean_", None)  # absent from models saved before standardize
        if mean is not None:
            entries = X.shape[0] * X.shape[1]
            if entries > MAX_STANDARDIZED_ENTRIES and entries > 2 * X.nnz:  # dense input costs at most 2x
                raise ValidationError(
                    f"standardisation (standardize={self.standardize!r}) centres the features, which densifies "
                    f"them: {X.shape[0]} x {X.shape[1]} = {entries} entries is above MAX_STANDARDIZED_ENTRIES = "
                    f"{MAX_STANDARDIZED_ENTRIES}. Pass fewer rows per call, or for sparse features use "
                    "standardize=False with idf_weighting=True"
                )
            X = sp.csr_matrix(((X.toarray() - mean) * self.feature_scale_).astype(np.float32))
        idf = getattr(self, "feature_idf_", None)  # absent from models saved before idf_weighting
        if idf is not None:
            X = sp.csr_matrix(X @ sp.diags(idf), dtype=np.float32)
        return normalize_rows(X) if self.normalize_features else X

    def _set_feature_statistics(self, X: sp.csr_matrix, n_rows: int, parallel) -> None:
        """The column statistics of all processes' ``n_rows`` training rows: ``feature_mean_`` and
        ``feature_scale_`` (or None), from column sums of x and x^2; ``feature_idf_`` (or None), from
        document frequencies."""
        self.feature_mean_ = self.feature_scale_ = self.feature_idf_ = None
        n_nonzero = int(parallel.reduce_sum(np.array([X.nnz], dtype=np.int64))[0])
        if resolve_standardize(self.standardize, n_nonzero, n_rows * X.shape[1]):
            mean, scale = column_mean_and_scale(X, n_rows, parallel.reduce_sum)
            self.feature_mean_ = mean.astype(np.float32)
            self.feature_scale_ = (1.0 / scale).astype(np.float32)
        if self.idf_weighting:
            counts = np.bincount(X.indices[X.data != 0], minlength=X.shape[1])
            self.feature_idf_ = inverse_document_frequency(parallel.reduce_sum(counts), n_rows)

    # ---- construction -------------------------------------------------------------------------
    @staticmethod
    def _training_projection(module, X) -> np.ndarray | None:
        """X X~^T (= U S) for every training row, when subspace inputs are used and it takes at most
        ``PROJECTION_CACHE_ENTRIES`` entries; the same computation as for test rows, so a resumed run
        and a fresh one see identical numbers."""
        inducing = module.inducing
        if not isinstance(inducing, SubspaceInducing) or X.shape[0] * inducing.rank > PROJECTION_CACHE_ENTRIES:
            return None
        with torch.no_grad():
            return inducing.project(X).cpu().numpy()

    def _initial_arrays(self, X, Y, rng, shard=None, reduce=ONE_PROCESS.reduce_sum) -> dict:
        """Data-driven initial values: inducing inputs, Phi, b.

        ``X``, ``Y`` are this process's training rows, ``shard`` (a RowShard; None = all rows here)
        their place among all training rows, ``reduce`` the sum over processes (the default: one
        process): every statistic below is a sum over rows, so all processes get the values one
        process holding every row computes."""
        shard = RowShard.whole(X.shape[0]) if shard is None else shard
        M = self.n_inducing
        n, D = shard.n_total, X.shape[1]
        seed = int(rng.integers(2**31 - 1))
        arrays = {}
        if self.inducing.startswith("subspace"):
            requested = AUTO_SUBSPACE_RANK if self.subspace_rank == "auto" else self.subspace_rank
            rank = min(requested, n, D)
            if rank < requested and self.subspace_rank != "auto":
                warnings.warn(
                    f"subspace_rank={self.subspace_rank} exceeds min(rows, features) = {rank}; using {rank}",
                    UserWarning,
                    stacklevel=4,
                )
            work_dtype = np.float32 if self.dtype == "float32" else np.float64  # of the (D, R) work arrays
            basis, US, used = truncated_svd(X, rank, seed, self.svd_max_rows, shard, reduce, work_dtype)
            arrays["basis"] = basis
            # A init: k-means on U S (sec. 2.2)
            arrays["A"] = kmeans_centres(US, M, seed, shard=shard if used is None else used, reduce=reduce)
        elif self.inducing == "free":
            arrays["Z"] = kmeans_centres(X, M, seed, shard=shard, reduce=reduce)
        else:  # fixed: a random subset of training rows
            arrays["Z"] = shard.gather(X, np.sort(rng.choice(n, M, replace=False)), reduce)
        positives = reduce(label_counts(Y)[0])
        prior = np.clip((positives + 0.5) / (n + 1.0), 1e-6, 1 - 1e-6)
        arrays["bias"] = logit(prior, floor=0.0).astype(np.float32)
        arrays["Phi"] = self._initial_factors(Y, rng, n, reduce)
        return arrays

    def _initial_factors(self, Y, rng, n_rows=None, reduce=ONE_PROCESS.reduce_sum) -> np.ndarray:
        """(L, P) loadings: N(0, 1/P) draws (the authors' code), or a warm start from the top-P right
        singular vectors of the label matrix scaled by sqrt(singular value / mean) and normalised to
        an average squared row norm of 1, plus 0.1 x the random draw (so the GPs only have to learn
        the leading left singular directions of Y; notes: this speeds convergence). ``Y`` holds
        this process's share of all ``n_rows`` training rows (None: every row is here); ``reduce``
        sums over processes (see ``_initial_arrays``)."""
        n_rows = Y.shape[0] if n_rows is None else n_rows
        L, P = Y.shape[1], self.n_latent
        noise = rng.standard_normal((L, P)) / math.sqrt(P)
        if self.init_factors == "random" or P > min(n_rows, L):  # P = L: the full SVD basis
            return noise.astype(np.float32)
        Vt, s = top_singular_vectors(Y, P, int(rng.integers(2**31 - 1)), reduce)
        Phi = Vt.T * np.sqrt(s / s.mean())
        Phi *= math.sqrt(L) / np.linalg.norm(Phi)
        return (Phi + 0.1 * noise).astype(np.float32)

    def _warm_start_mean(self, module, X, Y, projection, rng, shard=None, reduce=ONE_PROCESS.reduce_sum, max_rows=5000,
                         max_entries=4_000_000):
        """Start E_q[u] at a ridge fit of latent targets (a reduced-rank-regression warm start).

        With a(x) = L_K^{-1} k_Z(x), the whitened mean v gives E[h(x)] = a(x)^T v with prior
        v ~ N(0, I). Targets for h are the least-squares latent values that map to the centred labels
        through Phi, H0 = (Y - ybar) Phi (Phi^T Phi)^{-1} (computed sparsely), scaled by c; then
        v = (A A^T + I)^{-1} A c H0 on at most ``max_rows`` random rows, and c in {0.5, 1, ..., 16}
        is chosen by the expected log-likelihood (under the current variances) on rows x labels up
        to ``max_entries`` entries. ``shard`` and ``reduce`` as in ``_initial_arrays``: ybar Phi, the
        normal equations (A A^T, A H0) and the log-likelihoods are sums over rows, added over
        processes.
        """
        shard = RowShard.whole(X.shape[0]) if shard is None else shard
        n = shard.n_total
        chosen = np.sort(rng.choice(n, min(n, max_rows), replace=False))
        rows, chosen_here = shard.select(chosen)  # this process's chosen rows, and their positions in chosen
        with torch.no_grad():
            batch = self._feature_batch(module, X, rows, projection)
            mean_h, var_h, prep = module.latent(batch, self.jitter)
            blocks = module.kernel(module.inducing.inner_products(batch, module.kernel.input_weights()))
            L_K, _ = robust_cholesky(blocks.zz, self.jitter)
            A = torch.linalg.solve_triangular(L_K, blocks.xz.T, upper=False)  # (M, n)
            Phi = module.Phi
            Y_rows = Y[rows]
            Phi_np = Phi.double().cpu().numpy()
            mean_loading = reduce(np.asarray(Y.sum(axis=0), dtype=np.float64).ravel() @ Phi_np) / n  # ybar Phi
            centred = Y_rows @ Phi_np - mean_loading  # (n, P)
            try:
                H0 = np.linalg.solve(Phi_np.T @ Phi_np, centred.T).T
            except np.linalg.LinAlgError:  # exactly singular (P > L, e.g. one label): minimum-norm solution
                H0 = np.linalg.lstsq(Phi_np.T @ Phi_np, centred.T, rcond=None)[0].T
            H0 = torch.as_tensor(H0, dtype=A.dtype, device=A.device)
            normal = reduce(torch.cat([A @ A.T, A @ H0], dim=1).cpu().numpy())  # [A A^T, A H0], summed
            normal = torch.as_tensor(normal, dtype=A.dtype, device=A.device)
            eye = torch.eye(A.shape[0], dtype=A.dtype, device=A.device)
            V = torch.linalg.solve(normal[:, : A.shape[0]] + eye, normal[:, A.shape[0] :])  # (M, P), whitened ridge
            h_fit = A.T @ V  # (n, P)
            n_eval = max(1, min(len(chosen), max_entries // (Y.shape[1] * self.quadrature_points)))
            n_eval = min(max(n_eval - chosen_here.start, 0), len(rows))  # this process's share of them
            likelihood = BernoulliLogit(self.quadrature_points)
            Y_eval = torch.as_tensor(Y_rows[:n_eval].toarray(), dtype=A.dtype, device=A.device)
            scales = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
            values = reduce([
                float(data_term_full(likelihood, c * h_fit[:n_eval], var_h[:n_eval], Phi, module.bias, Y_eval, None))
                for c in scales
            ])
            best = max(zip(values, scales))
            module.variational.set_mean((best[1] * (L_K @ V)).T, L_K)

    def _module_from_parameters(self, parameters: dict, n_labels: int, device, dtype) -> MLGPFModule:
        """The module holding ``parameters`` (a state dict: a checkpoint's or ``parameters_``) on
        ``device`` in ``dtype``. Cast before loading: the constructors build in float32, which would
        round a float64 model's values."""
        module = self._build_module(_structural_arrays(parameters), n_labels).to(device=device, dtype=dtype)
        module.load_state_dict(parameters)
        return module

    def _build_module(self, arrays: dict, n_labels: int) -> MLGPFModule:
        if "basis" in arrays:
            inducing = SubspaceInducing(arrays["basis"], arrays["A"], trainable=self.inducing == "subspace")
        else:
            inducing = InputSpaceInducing(arrays["Z"], trainable=self.inducing == "free")
        kernel = make_kernel(self.kernel, inducing.n_weights if self.ard else None)
        variational = make_variational(self.variational, self.n_latent, self.n_inducing)
        return MLGPFModule(kernel, inducing, variational, arrays["Phi"], arrays["bias"])

    # ---- batches ------------------------------------------------------------------------------
    def _feature_batch(self, module, X, rows=None, projection=None) -> FeatureBatch:
        X_rows = X if rows is None else X[rows]
        projected = None if (projection is None or rows is None) else projection[rows]
        return module.inducing.make_batch(X_rows, projected)

    def _targets(self, Y, mask, rows, rng, device, dtype, share=None, n_batch=None, parallel=None):
        """Targets of the rows ``rows`` of ``Y``: this process's rows of a global batch of ``n_batch``
        rows (None: ``len(rows)``), at the positions ``share`` of it (None: all of them)."""
        Y_rows = Y[rows]
        mask_rows = None if mask is None else mask[rows]
        negative_samples = resolve_negative_samples(self.negative_samples, Y.shape[1])
        if negative_samples is None:
            Y_dense = torch.as_tensor(Y_rows.toarray(), device=device, dtype=dtype)
            mask_dense = None if mask_rows is None else torch.as_tensor(mask_rows.toarray(), device=device, dtype=dtype)
            return ("full", Y_dense, mask_dense), Y_rows
        if self.negative_sampling == "batch":
            # one draw per global batch: every data-parallel process draws the same labels
            return ("shared", sample_shared_negatives(Y_rows, mask_rows, negative_samples, rng)), Y_rows
        share = slice(0, len(rows)) if share is None else share
        # Negatives are drawn for the whole global batch in row order, so that every data-parallel
        # process consumes the random stream of one process. The other processes' rows only advance
        # it, which needs just their numbers of negatives (summed over processes).
        n_negatives = np.zeros(len(rows) if n_batch is None else n_batch)
        observed = np.full(len(rows), Y.shape[1]) if mask_rows is None else np.diff(mask_rows.indptr)
        n_negatives[share] = observed - np.diff(Y_rows.indptr)  # Y is zero where the mask is
        n_negatives = (parallel or ONE_PROCESS).reduce_sum(n_negatives)
        _skip_negative_draws(n_negatives[: share.start], negative_samples, rng)
        if len(rows):
            entries = sample_label_entries(Y_rows, mask_rows, negative_samples, rng)
        else:  # a process may hold no row of a batch
            entries = LabelEntries(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0))
        _skip_negative_draws(n_negatives[share.stop :], negative_samples, rng)
        return ("sampled", entries), Y_rows

    # ---- fit ----------------------------------------------------------------------------------
    def _fit(self, X, Y, label_mask, resume=False, parallel=None):
        """``parallel``: a :mod:`bayesmlc.distributed` strategy; None = one process. Under
        ``DataParallel`` every rank passes the same settings and either its shard of the rows
        (:func:`bayesmlc.distributed.read_shard`) or the whole data set (it then keeps its shard),
        and computes the bound on its rows of each global batch."""
        self._device = resolve_device(self.device)
        self._torch_dtype = _DTYPES[self.dtype]
        parallel = ONE_PROCESS if parallel is None else parallel
        with self._threads():
            try:
                X, Y, label_mask, shard = parallel.local_data(X, Y, label_mask)
                self._check_params(shard.n_total)
                if parallel.world_size > 1:
                    self._global_label_statistics(Y, label_mask, parallel)
                self._set_feature_statistics(X, shard.n_total, parallel)
                self._train(self._prepare_features(X), Y, label_mask, resume, parallel, shard)
            except Exception as exc:
                parallel.sync_failure(exc)  # the other processes raise RankFailedError naming this one
                raise
            parallel.sync_failure(None)  # all finished: none is left waiting for a failed one
        return self

    def _global_label_statistics(self, Y, label_mask, parallel):
        """The base class's ``label_frequencies_``, ``label_prior_`` and ``empty_labels_`` over all
        processes' rows (``fit`` computed them from this process's rows)."""
        n_labels = Y.shape[1]
        totals = parallel.reduce_sum(np.concatenate(label_counts(Y, label_mask)))
        self._set_label_statistics(totals[:n_labels], totals[n_labels:])

    def _train(self, X, Y, label_mask, resume, parallel, shard):
        """``X``, ``Y``, ``label_mask``: this process's rows, ``shard`` (a RowShard) their place
        among all rows. Row ids below (validation split, batches) are global."""
        device, dtype = self._device, self._torch_dtype
        start_clock = time.perf_counter()
        rng = numpy_rng(self.random_state)
        n_all = shard.n_total
        n_val = int(round(self.validation_fraction * n_all))
        order = rng.permutation(n_all)
        val_rows, train_rows = np.sort(order[:n_val]), np.sort(order[n_val:])
        checkpoint = None
        if resume:
            if not self.checkpoint_path:
                raise ValidationError("resume=True needs checkpoint_path (the checkpoint to continue from)")
            if os.path.exists(self.checkpoint_path):
                checkpoint = load_checkpoint(self.checkpoint_path)
                self._check_checkpoint(checkpoint, n_all, X, Y)
                val_rows = np.asarray(checkpoint["val_rows"], dtype=np.int64)
                train_rows = np.setdiff1d(np.arange(n_all), val_rows)
            else:
                warnings.warn(f"{self.checkpoint_path}: no checkpoint yet; starting from scratch", UserWarning, stacklevel=4)
        local_train, train_shard = shard.select(train_rows)  # positions in train_rows = training row ids
        local_val, _ = shard.select(val_rows)
        X_tr, Y_tr = X[local_train], Y[local_train]
        mask_tr = None if label_mask is None else label_mask[local_train]
        n_train = train_shard.n_total

        if checkpoint is None:
            arrays = self._initial_arrays(X_tr, Y_tr, rng, train_shard, parallel.reduce_sum)
            module = self._build_module(arrays, Y.shape[1]).to(device=device, dtype=dtype)
        else:
            module = self._module_from_parameters(checkpoint["parameters"], Y.shape[1], device, dtype)
        projection = self._training_projection(module, X_tr)
        if checkpoint is None and self.init_mean == "ridge":
            self._warm_start_mean(module, X_tr, Y_tr, projection, rng, train_shard, parallel.reduce_sum)
        likelihood = BernoulliLogit(self.quadrature_points)
        optimizer = make_optimizer(module, self.learning_rate, self.variational_learning_rate)
        base_rates = [group["lr"] for group in optimizer.param_groups]  # before a checkpoint's decayed ones
        history = {
            "epoch": [], "wall_time": [], "objective": [], "kl": [], "batch_size": [], "jitter": [],
            "train_P@1": [], "val_P@1": [], "val_P@3": [], "val_P@5": [],
        }
        steps = {"step": [], "wall_time": [], "elbo": []}
        start_epoch, best_state, elapsed_before = 0, None, 0.0
        jitter = self.jitter
        if checkpoint is not None:
            optimizer.load_state_dict(optimizer_state_from_checkpoint(checkpoint["optimizer"]))
            rng.bit_generator.state = checkpoint["rng_state"]
            history = {k: list(v) for k, v in checkpoint["history"].items()}
            steps = {k: list(v) for k, v in checkpoint["steps"].items()}
            start_epoch = int(checkpoint["epoch"])
            jitter = float(checkpoint["jitter"])
            elapsed_before = float(checkpoint["elapsed"])
            if checkpoint.get("best_state") is not None:
                best_state = {k: torch.as_tensor(v) for k, v in checkpoint["best_state"].items()}
        self._module = module
        self.history_, self.step_history_ = history, steps

        progress = None
        if self.verbose:
            from tqdm.auto import tqdm

            progress = tqdm(total=self.epochs, initial=start_epoch, desc="MLGPF", unit="epoch", leave=False)
        params = [p for p in module.parameters() if p.requires_grad]
        step_count = len(steps["step"])
        first_batch_size = resolve_batch_size(self.batch_size, n_train)
        scored_rows = max(1, TRAIN_SCORE_ENTRIES // Y.shape[1])
        try:
            for epoch in range(start_epoch, self.epochs):
                batch_size = batch_size_at(
                    epoch, first_batch_size, self.batch_size_growth, self.batch_size_every, self.max_batch_size
                )
                epoch_elbo, epoch_kl, hits, seen, max_jitter = 0.0, 0.0, 0, 0, 0.0
                batches = epoch_batches(n_train, batch_size, rng)
                for batch_index, batch_rows in enumerate(batches):
                    factor = learning_rate_factor(
                        step_progress(epoch, batch_index, len(batches), self.epochs), self.lr_decay
                    )
                    for group, base in zip(optimizer.param_groups, base_rates):
                        group["lr"] = base * factor
                    share = train_shard.positions_in(batch_rows)  # the batch's rows this process holds
                    rows = batch_rows[share] - train_shard.start
                    batch = self._feature_batch(module, X_tr, rows, projection)
                    targets, Y_rows = self._targets(
                        Y_tr, mask_tr, rows, rng, device, dtype, share, len(batch_rows), parallel
                    )
                    optimizer.zero_grad(set_to_none=True)
                    n_scale, kl_weight = parallel.bound_weights(n_train, self.kl_weight, len(rows), len(batch_rows))
                    elbo, kl, mean_h, used = minibatch_elbo(
                        module, likelihood, batch, targets, n_scale, kl_weight, jitter
                    )
                    loss = -elbo / n_train
                    loss.backward()
                    if not all_finite(loss, params):
                        self._keep_parameters(module, jitter)
                        raise TrainingDivergedError(
                            f"MLGPF: the bound or its gradient became NaN/inf at epoch {epoch + 1}, step "
                            f"{step_count + 1}; training stopped and the parameters before that step were kept. "
                            "Try a smaller learning_rate, a larger jitter or dtype='float64'."
                        )
                    value = parallel.reduce_gradients(params, elbo.detach())  # sums over processes
                    optimizer.step()
                    jitter = max(jitter, used)  # a jitter that was needed once stays
                    max_jitter = max(max_jitter, used)
                    step_count += 1
                    steps["step"].append(step_count)
                    steps["wall_time"].append(elapsed_before + time.perf_counter() - start_clock)
                    steps["elbo"].append(value)
                    epoch_elbo += value / len(batches)
                    epoch_kl += float(kl.detach()) / len(batches)
                    # running P@1 on the batch's first rows (positions < scored_rows, whichever process holds them)
                    scored = slice(0, max(0, min(len(rows), scored_rows - share.start)))
                    with torch.no_grad():
                        top = (mean_h.detach()[scored] @ module.Phi.T + module.bias).argmax(1).cpu().numpy().copy()
                    hits += int(Y_rows[np.arange(len(top)), top].sum())  # sparse result when no row is scored
                    seen += len(top)
                hits, seen = parallel.sum_counts(hits, seen)
                history["epoch"].append(epoch + 1)
                history["wall_time"].append(elapsed_before + time.perf_counter() - start_clock)
                history["objective"].append(epoch_elbo)
                history["kl"].append(epoch_kl)
                history["batch_size"].append(batch_size)
                history["jitter"].append(max_jitter)
                history["train_P@1"].append(hits / max(seen, 1))
                val = [math.nan] * 3
                if n_val and ((epoch + 1) % self.validation_every == 0 or epoch + 1 == self.epochs):
                    val = self._validation_scores(module, X[local_val], Y[local_val], jitter, n_val, parallel)
                for k, value in zip((1, 3, 5), val):
                    history[f"val_P@{k}"].append(value)
                if n_val and not math.isnan(val[0]):
                    evaluated = [v for v in history["val_P@1"] if not math.isnan(v)]
                    if val[0] >= max(evaluated):
                        best_state = {k: v.detach().clone() for k, v in module.state_dict().items()}
                if progress is not None:
                    progress.update(1)
                    shown = {"ELBO": f"{epoch_elbo:.4g}", "train P@1": f"{history['train_P@1'][-1]:.3f}"}
                    if not math.isnan(val[0]):
                        shown["val P@1"] = f"{val[0]:.3f}"
                    progress.set_postfix(shown)
                stop = self.early_stopping_patience is not None and early_stop(
                    history["val_P@1"], self.early_stopping_patience
                )
                last = epoch + 1 == self.epochs or stop
                if self.checkpoint_every and parallel.is_main and ((epoch + 1) % self.checkpoint_every == 0 or last):
                    save_checkpoint(
                        self.checkpoint_path,
                        {
                            "params": {k: v for k, v in self.get_params().items() if _json_plain(v)},
                            "n_features": X.shape[1],
                            "n_labels": Y.shape[1],
                            "n_rows": n_all,
                            "epoch": epoch + 1,
                            "parameters": {k: v.detach().cpu() for k, v in module.state_dict().items()},
                            "optimizer": optimizer.state_dict(),
                            "rng_state": rng.bit_generator.state,
                            "history": history,
                            "steps": steps,
                            "jitter": jitter,
                            "val_rows": val_rows,
                            "elapsed": elapsed_before + time.perf_counter() - start_clock,
                            "best_state": None if best_state is None else {k: v.cpu() for k, v in best_state.items()},
                        },
                    )
                if stop:
                    break
        finally:
            if progress is not None:
                progress.close()
        if best_state is not None:  # validation was used: keep the best parameters seen
            module.load_state_dict(best_state)
        self._keep_parameters(module, jitter)
        self.n_rows_seen_ = n_all
        self._stream = None  # a later partial_fit starts a fresh optimizer from these parameters

    # ---- streams ------------------------------------------------------------------------------
    def partial_fit(self, X, Y, label_mask=None, n_total=None, classes=None):
        """Continue stochastic variational training on a batch of rows as it arrives.

        The first call on an unfitted model fixes the features and the label set (the columns of
        ``Y``, as scikit-learn's ``partial_fit(classes=...)`` does) and sets the model up from this
        batch as ``fit`` does (feature statistics, subspace basis, k-means, bias, Phi, ridge warm
        start: ``n_inducing`` must not exceed its rows). On a fitted model (``fit``, a loaded model
        or an earlier ``partial_fit``) it continues from the fitted parameters.

        Each call takes one pass over the given rows in random minibatches of ``batch_size`` rows
        (``"auto"`` resolved on this call's rows), with Adam at ``learning_rate`` and
        ``variational_learning_rate`` as they are set at the call (``lr_decay`` needs the total
        number of steps, which a stream does not have: anneal with ``set_params`` between calls;
        Adam's state is kept between calls, not across ``save``/``load``), and the bound of
        :func:`minibatch_elbo` with N = ``n_total`` or else ``n_rows_seen_``, the rows seen so far including these
        (the training rows after ``fit``): the posterior given the data seen. The label
        statistics (``label_frequencies_``, ``label_prior_``, ``empty_labels_``) accumulate over
        calls; the feature statistics (idf, standardisation) stay those of the set-up.

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
        self._check_partial_fit_classes(classes)
        X, Y, label_mask = check_fit_inputs(X, Y, label_mask)
        first = not hasattr(self, "n_labels_")
        if not first and X.shape[1] != self.n_features_in_:
            raise ValidationError(f"X has {X.shape[1]} features, but MLGPF is expecting {self.n_features_in_} "
                                  "features as input (fixed by its first fit)")
        if not first and Y.shape[1] != self.n_labels_:
            raise ValidationError(f"Y has {Y.shape[1]} labels, but MLGPF has {self.n_labels_} labels "
                                  "(fixed by its first fit)")
        positives, observed = label_counts(Y, label_mask)
        if first:
            self.n_features_in_, self.n_labels_ = X.shape[1], Y.shape[1]
            self.history_ = {"wall_time": [], "objective": []}
            self.n_rows_seen_ = 0
        else:  # the observed counts, recovered from the stored smoothed prior
            previous = np.rint((self.label_frequencies_ + 0.5) / self.label_prior_ - 1.0).astype(np.int64)
            if not hasattr(self, "n_rows_seen_"):  # a model saved before partial_fit existed
                self.n_rows_seen_ = int(previous.max())
            positives, observed = positives + self.label_frequencies_, observed + previous
        self._set_label_statistics(positives, observed)
        if n_total is not None and (not isinstance(n_total, (int, np.integer)) or n_total < X.shape[0]):
            raise ValidationError(f"n_total must be an integer >= the rows of this call ({X.shape[0]}), got {n_total!r}")
        with self._threads():
            self._stream_pass(X, Y, label_mask, first, n_total)
        return self

    def _stream_pass(self, X, Y, label_mask, first, n_total=None):
        """One pass of ``partial_fit`` over its rows (see there)."""
        stream = getattr(self, "_stream", None)
        if first:
            self._device, self._torch_dtype = resolve_device(self.device), _DTYPES[self.dtype]
            self._check_params(X.shape[0])
            self._set_feature_statistics(X, X.shape[0], ONE_PROCESS)
            X = self._prepare_features(X)
            rng = numpy_rng(self.random_state)
            module = self._build_module(self._initial_arrays(X, Y, rng), Y.shape[1])
            module = module.to(device=self._device, dtype=self._torch_dtype)
            if self.init_mean == "ridge":
                self._warm_start_mean(module, X, Y, self._training_projection(module, X), rng)
            self.jitter_ = self.jitter
        else:
            self._device, self._torch_dtype = resolve_device(self.device), _DTYPES[self.dtype]
            module = self._ensure_module()
            X = self._prepare_features(X)
            rng = stream["rng"] if stream is not None else numpy_rng(self.random_state)
        if stream is None:
            stream = self._stream = {"rng": rng,
                                     "optimizer": make_optimizer(module, self.learning_rate, self.variational_learning_rate)}
        optimizer = stream["optimizer"]
        variational_rate = self.learning_rate if self.variational_learning_rate is None else self.variational_learning_rate
        for group, rate in zip(optimizer.param_groups, (self.learning_rate, variational_rate)):
            group["lr"] = rate  # read on every call: a caller anneals with set_params(learning_rate=...)
        self.n_rows_seen_ += X.shape[0]
        projection = self._training_projection(module, X)
        likelihood = BernoulliLogit(self.quadrature_points)
        params = [p for p in module.parameters() if p.requires_grad]
        jitter, total, start = self.jitter_, 0.0, time.perf_counter()
        n_bound = self.n_rows_seen_ if n_total is None else int(n_total)
        batches = epoch_batches(X.shape[0], resolve_batch_size(self.batch_size, X.shape[0]), rng)
        for rows in batches:
            batch = self._feature_batch(module, X, rows, projection)
            targets, _ = self._targets(Y, label_mask, rows, rng, self._device, self._torch_dtype)
            optimizer.zero_grad(set_to_none=True)
            elbo, _, _, used = minibatch_elbo(module, likelihood, batch, targets, n_bound, self.kl_weight, jitter)
            loss = -elbo / n_bound
            loss.backward()
            if not all_finite(loss, params):
                self._keep_parameters(module, jitter)
                raise TrainingDivergedError(
                    "MLGPF.partial_fit: the bound or its gradient became NaN/inf; the parameters before that step "
                    "were kept. Try a smaller learning_rate, a larger jitter or dtype='float64'."
                )
            optimizer.step()
            jitter = max(jitter, used)
            total += float(elbo.detach()) / len(batches)
        self.history_.setdefault("objective", []).append(total)
        previous = self.history_.setdefault("wall_time", [])
        previous.append((previous[-1] if previous else 0.0) + time.perf_counter() - start)
        self._keep_parameters(module, jitter)

    def _check_checkpoint(self, checkpoint, n_rows, X, Y):
        mine = {k: v for k, v in self.get_params().items() if _json_plain(v)}
        ignored = {"epochs", "verbose", "checkpoint_every", "checkpoint_path", "n_threads", "device",
                   "early_stopping_patience", "validation_every", "rank_by"}
        written = {"negative_sampling": "row", **checkpoint["params"]}  # checkpoints from before the setting
        different = sorted(k for k in mine if k not in ignored and written.get(k) != mine[k])
        if self.lr_decay > 0 and checkpoint["params"].get("epochs") != self.epochs:
            different.append("epochs (the learning-rate decay depends on it)")
        if different:
            raise ValidationError(
                f"{self.checkpoint_path}: checkpoint was written with different parameters ({', '.join(different)}); "
                "resume needs the same model settings"
            )
        if (checkpoint["n_rows"], checkpoint["n_features"], checkpoint["n_labels"]) != (n_rows, X.shape[1], Y.shape[1]):
            raise ValidationError(
                f"{self.checkpoint_path}: checkpoint is for data of shape rows={checkpoint['n_rows']}, "
                f"features={checkpoint['n_features']}, labels={checkpoint['n_labels']}, not "
                f"{n_rows}, {X.shape[1]}, {Y.shape[1]}"
            )

    def _validation_scores(self, module, X_val, Y_val, jitter, n_val, parallel):
        """P@1, P@3, P@5 over all ``n_val`` validation rows, of which this process holds ``X_val``."""
        from ..metrics import precision_at_k

        self._keep_parameters(module, jitter)
        sums = np.zeros(3)
        if X_val.shape[0]:
            scores = np.vstack([
                self._mean_utilities(X_val[start : start + 2048]) for start in range(0, X_val.shape[0], 2048)
            ])
            sums = np.array([precision_at_k(Y_val, scores, k) * X_val.shape[0] for k in (1, 3, 5)])
        return [float(v) for v in parallel.reduce_sum(sums) / n_val]

    def _keep_parameters(self, module, jitter):
        self._module = module
        self.parameters_ = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        self.jitter_ = float(jitter)
        self._prediction_cache = {}

    # ---- prediction ---------------------------------------------------------------------------
    def _ensure_module(self):
        if getattr(self, "_module", None) is None:
            self._device = resolve_device(self.device)
            self._module = self._module_from_parameters(self.parameters_, self.n_labels_, self._device,
                                                        _DTYPES[self.dtype])
        return self._module

    def _mean_utilities(self, X) -> np.ndarray:
        """E_q[f] for a batch of (already prepared) rows: (b, L) float32."""
        module = self._ensure_module()
        with torch.no_grad():
            batch = module.inducing.make_batch(X)
            blocks = module.kernel(module.inducing.inner_products(batch, module.kernel.input_weights()))
            # a memo of a function of the fitted parameters: filling it leaves the model as it was
            cache = self.__dict__.setdefault("_prediction_cache", {})
            if "mean_weights" not in cache:
                cache["mean_weights"] = module.variational.mean_weights(module.variational.prepare(blocks.zz, self.jitter_))
            mean_h = blocks.xz @ cache["mean_weights"]
            scores = mean_h @ module.Phi.T + module.bias
        return scores.float().cpu().numpy()

    def _decision_function(self, X) -> np.ndarray:
        if self.rank_by == "proba":
            return self._predict_proba(X)
        with self._threads():
            return self._mean_utilities(self._prepare_features(X))

    def _predict_proba(self, X) -> np.ndarray:
        """E[sigmoid(f)] under q(f), by Gauss-Hermite quadrature over the predictive variance.

        Rows are processed in chunks so the (rows, L, Q) quadrature grid stays under 2^24 entries.
        """
        module = self._ensure_module()
        likelihood = BernoulliLogit(self.quadrature_points)
        chunk = max(1, (1 << 24) // (self.n_labels_ * self.quadrature_points))
        X = self._prepare_features(X)
        out = np.empty((X.shape[0], self.n_labels_), dtype=np.float32)
        with self._threads(), torch.no_grad():
            for start in range(0, X.shape[0], chunk):
                batch = module.inducing.make_batch(X[start : start + chunk])
                mean_h, var_h, _ = module.latent(batch, self.jitter_)
                f_mean, f_var = utility_moments(mean_h, var_h, module.Phi, module.bias)
                out[start : start + chunk] = likelihood.predictive_mean(f_mean, f_var).float().cpu().numpy()
        return out

    # ---- persistence --------------------------------------------------------------------------
    def _set_state(self, state: dict) -> None:
        super()._set_state(state)
        self.parameters_ = {k: torch.as_tensor(v) for k, v in self.parameters_.items()}
        self._module = None
        self._prediction_cache = {}
        self._stream = None


def _structural_arrays(parameters: dict) -> dict:
    """The arrays the module constructors need (shapes and fixed buffers) from a state dict."""
    arrays = {}
    for key, name in (("inducing.A", "A"), ("inducing.Z", "Z"), ("Phi", "Phi"), ("bias", "bias")):
        if key in parameters:
            arrays[name] = np.asarray(parameters[key], dtype=np.float32)
    if "inducing.basis_t" in parameters:
        arrays["basis"] = np.asarray(parameters["inducing.basis_t"], dtype=np.float32).T
    if not any(k in arrays for k in ("basis", "Z")):
        raise ModelFormatError("MLGPF parameters hold neither inducing.basis_t nor inducing.Z")
    return arrays


def _json_plain(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))
