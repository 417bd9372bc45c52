"""Data-driven starting values of MLGPF's parameters, and the module that holds them.

Every statistic here is a sum over training rows, computed from this process's rows and summed over
processes by a :class:`~bayesmlc.distributed.ParallelContext` (None: one process holding every row),
so a data-parallel run starts where the one-process run does.

``settings`` below is any object with the estimator's parameters as attributes (an
:class:`~bayesmlc.gp.MLGPF`, or ``types.SimpleNamespace(**model.get_params())``).
"""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import numpy as np
import torch

from ..distributed import ParallelContext
from ..exceptions import ModelFormatError
from ..label_statistics import LabelStatistics
from ..linalg import top_singular_vectors
from ..safe_io import physical_memory_bytes
from ..utils import logit
from .inducing import (
    FeatureBatch, InputSpaceInducing, SubspaceInducing, kmeans_centres, sample_rows, subspace_kmeans_centres, truncated_svd,
)
from .kernels import make_kernel, resolve_kernel
from .likelihoods import BernoulliLogit
from .linear_support import SupportLinearTerm, gradient_support
from .linear_term import OPTIMISER_STATE, LinearTerm, uses_row_negatives
from .objective import MLGPFModule, data_term_full, latent_marginals
from .variational import make_variational, robust_cholesky

__all__ = [
    "AUTO_SUBSPACE_RANK", "PROJECTION_CACHE_MEMORY_SHARE", "ProjectionCache", "initial_arrays", "initial_factors", "warm_start_mean",
    "build_module", "module_from_parameters", "resolve_epochs", "resolved_structure", "training_projection", "feature_batch", "initial_module",
]

#: ``subspace_rank="auto"``: this rank, or min(training rows, features) when smaller.
AUTO_SUBSPACE_RANK = 1000
#: The training rows' subspace projections X X~^T are kept once formed (:class:`ProjectionCache`)
#: when they take at most this share of the machine's physical memory (4.7 GB at the AmazonCat-13K
#: shape); otherwise every batch forms its rows' projections again.
PROJECTION_CACHE_MEMORY_SHARE = 0.25


def initial_arrays(settings, X, Y, rng: np.random.Generator, context: ParallelContext | None = None) -> dict:
    """Inducing inputs (``basis`` and ``A``, or ``Z``), loadings ``Phi`` (L, P), bias ``bias`` (L,) and,
    with ``settings.linear_term``, the shape (L, D) of the linear term's W (``linear_shape``; W starts at 0).

    ``X``, ``Y`` are this process's (prepared) training rows and ``context`` their place among all
    training rows. Subspace inducing inputs: the top-R right singular vectors of X and k-means on
    the projections U S of a row sample (subspace paper sec. 2.2); free ones: k-means in input space; fixed
    ones: a random subset of rows. The bias is the logit of the smoothed label frequency.
    """
    context = ParallelContext.whole(X.shape[0]) if context is None else context
    M = settings.n_inducing
    n, D = context.n_total, X.shape[1]
    seed = int(rng.integers(2**31 - 1))
    arrays = {}
    if settings.inducing.startswith("subspace"):
        requested = AUTO_SUBSPACE_RANK if settings.subspace_rank == "auto" else settings.subspace_rank
        rank = min(requested, n, D)
        if rank < requested and settings.subspace_rank != "auto":
            warnings.warn(
                f"subspace_rank={settings.subspace_rank} exceeds min(rows, features) = {rank}; using {rank}",
                UserWarning,
                stacklevel=6,
            )
        work_dtype = np.float32 if settings.dtype == "float32" else np.float64  # of the (D, R) work arrays
        arrays["basis"] = truncated_svd(X, rank, seed, settings.svd_max_rows, context, work_dtype)
        arrays["A"] = subspace_kmeans_centres(X, arrays["basis"], M, seed, context=context)
    elif settings.inducing == "free":
        arrays["Z"] = kmeans_centres(X, M, seed, context=context)
    else:  # fixed: a random subset of training rows
        arrays["Z"] = context.gather(X, np.sort(rng.choice(n, M, replace=False)))
    prior = np.clip(LabelStatistics.of_labels(Y).summed(context.reduce_sum).prior, 1e-6, 1 - 1e-6)  # mask ignored
    arrays["bias"] = logit(prior, floor=0.0).astype(np.float32)
    arrays["Phi"] = initial_factors(Y, settings.n_latent, settings.init_factors, rng, context, settings.svd_max_rows)
    if getattr(settings, "linear_term", False):
        if getattr(settings, "linear_features", None) is None:
            arrays["linear_shape"] = (Y.shape[1], D)
        else:
            arrays["linear_support"] = gradient_support(X, Y, min(settings.linear_features, D))
    return arrays


def initial_factors(Y, n_latent: int, init_factors: str, rng: np.random.Generator,
                    context: ParallelContext | None = None, max_rows: int | None = None) -> np.ndarray:
    """(L, P) loadings: N(0, 1/P) draws (``init_factors="random"``, the authors' code), or a warm
    start from the top-P right singular vectors of the label matrix scaled by
    sqrt(singular value / mean) and normalised to an average squared row norm of 1, plus 0.1 x the
    random draw (so the GPs only have to learn the leading left singular directions of Y; the
    reference notes found this speeds convergence). ``Y`` holds this process's share of the
    training rows (``context``; None: every row is here); the singular vectors are those of at
    most ``max_rows`` random rows (None: all), as for the subspace basis (11.0 s against 0.7 s at
    the AmazonCat-13K shape)."""
    context = ParallelContext.whole(Y.shape[0]) if context is None else context
    L, P = Y.shape[1], n_latent
    noise = rng.standard_normal((L, P)) / math.sqrt(P)
    if init_factors == "random" or P > min(context.n_total, L):  # P = L: the full SVD basis
        return noise.astype(np.float32)
    seed = int(rng.integers(2**31 - 1))
    Y, used = sample_rows(Y, context, max_rows, seed)
    Vt, s = top_singular_vectors(Y, P, seed, context if used is None else used)
    Phi = Vt.T * np.sqrt(s / s.mean())
    Phi *= math.sqrt(L) / np.linalg.norm(Phi)
    return (Phi + 0.1 * noise).astype(np.float32)


def warm_start_mean(settings, module: MLGPFModule, X, Y, rng: np.random.Generator,
                    context: ParallelContext | None = None, max_rows: int = 5000, max_entries: int = 4_000_000) -> None:
    """Start E_q[u] at a ridge fit of latent targets (a reduced-rank-regression warm start), in place.

    With a(x) = L_K^{-1} k_Z(x), the whitened mean v gives E[h(x)] = a(x)^T v with prior
    v ~ N(0, I). Targets for h are the posterior means of latent values h ~ N(0, I) that map to the
    centred labels through Phi with noise of the labels' mean variance s2 = mean_l ybar_l (1 - ybar_l),
    H0 = (Y - ybar) Phi (Phi^T Phi + s2 I)^{-1} (computed sparsely), scaled by c; then
    v = (A A^T + I)^{-1} A c H0 on at most ``max_rows`` random rows, and c in {0, 0.5, 1, ..., 16}
    is chosen by the expected log-likelihood (under the current variances) on rows x labels up
    to ``max_entries`` entries. ``context`` as in :func:`initial_arrays`: ybar, the normal
    equations (A A^T, A H0) and the log-likelihoods are sums over rows, added over processes.
    """
    context = ParallelContext.whole(X.shape[0]) if context is None else context
    n = context.n_total
    chosen = np.sort(rng.choice(n, min(n, max_rows), replace=False))
    rows, chosen_here = context.shard.select(chosen)  # this process's chosen rows, and their positions in chosen
    with torch.no_grad():
        batch = feature_batch(module, X, rows)  # not the training cache: these random rows would touch all its pages
        mean_h, var_h, prep = latent_marginals(module, batch, settings.jitter)
        blocks = module.kernel(module.inducing.inner_products(batch, module.kernel.input_weights()))
        L_K, _ = robust_cholesky(blocks.zz, settings.jitter)
        A = torch.linalg.solve_triangular(L_K, blocks.xz.T, upper=False)  # (M, n)
        Phi = module.Phi
        Y_rows = Y[rows]
        Phi_np = Phi.double().cpu().numpy()
        label_rate = context.reduce_sum(np.asarray(Y.sum(axis=0), dtype=np.float64).ravel()) / n  # ybar (L,)
        centred = Y_rows @ Phi_np - label_rate @ Phi_np  # (n, P)
        noise = max(float(np.mean(label_rate * (1.0 - label_rate))), 1e-6)
        H0 = np.linalg.solve(Phi_np.T @ Phi_np + noise * np.eye(Phi_np.shape[1]), centred.T).T
        H0 = torch.as_tensor(H0, dtype=A.dtype, device=A.device)
        normal = context.reduce_sum(torch.cat([A @ A.T, A @ H0], dim=1).cpu().numpy())  # [A A^T, A H0], summed
        normal = torch.as_tensor(normal, dtype=A.dtype, device=A.device)
        eye = torch.eye(A.shape[0], dtype=A.dtype, device=A.device)
        V = torch.linalg.solve(normal[:, : A.shape[0]] + eye, normal[:, A.shape[0] :])  # (M, P), whitened ridge
        h_fit = A.T @ V  # (n, P)
        n_eval = max(1, min(len(chosen), max_entries // (Y.shape[1] * settings.quadrature_points)))
        n_eval = min(max(n_eval - chosen_here.start, 0), len(rows))  # this process's share of them
        likelihood = BernoulliLogit(settings.quadrature_points)
        Y_eval = torch.as_tensor(Y_rows[:n_eval].toarray(), dtype=A.dtype, device=A.device)
        scales = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
        values = context.reduce_sum([
            float(data_term_full(likelihood, c * h_fit[:n_eval], var_h[:n_eval], Phi, module.bias, Y_eval, None))
            for c in scales
        ])
        best = max(zip(values, scales))
        module.variational.set_mean((best[1] * (L_K @ V)).T, L_K)


#: ``MLGPF(n_latent="auto")``: min(MAX_AUTO_LATENT, L) latent GPs.
MAX_AUTO_LATENT = 100


def resolved_structure(params: dict, X, n_labels: int, n_rows: int | None = None, reduce=None) -> tuple[str, int]:
    """The kernel and the number of latent GPs of ``MLGPF(**params)`` on training features ``X`` with
    ``n_labels`` labels, "auto" resolved: the kernel by :func:`~bayesmlc.gp.kernels.resolve_kernel`
    (``n_rows``, ``reduce``: all processes' rows, as there), ``n_latent`` as min(100, L)."""
    return resolve_kernel(params["kernel"], X, n_rows, reduce), resolved_latent(params["n_latent"], n_labels)


def resolved_latent(n_latent, n_labels: int) -> int:
    """P for ``MLGPF(n_latent=n_latent)`` with ``n_labels`` labels: min(100, L) for "auto"."""
    return int(min(MAX_AUTO_LATENT, n_labels) if n_latent == "auto" else n_latent)


def resolve_linear_term(params: dict, n_labels: int, n_latent: int, kernel: str, world_size: int = 1) -> bool:
    """``linear_term`` of ``MLGPF(**params)`` with "auto" resolved: on when the labels outnumber the
    latent GPs (L > P: the rank-P loadings Phi cannot give every label a direction of its own) and the
    latent GPs have the linear ``kernel`` (resolved), in one process and with batch-shared negatives
    (where the term can run: :func:`check_linear_term`). Beside SE latent GPs the term ranked lower on
    delicious's validation rows (P@1 68.4 / 68.6 against 69.2 / 69.7, seeds 0 / 1) and no better on
    hmc_cellcycle_go's (docs/experiments.md, "MLGPF: the kernel of many rows and few features")."""
    value = params["linear_term"]
    if value != "auto":
        return bool(value)
    return (n_labels > n_latent and kernel == "linear" and world_size == 1
            and not uses_row_negatives(SimpleNamespace(**params)))


#: ``epochs="auto"``: the epochs of a fit with labels beyond the latent GPs or many rows, and of the
#: others. With the per-label linear term (L > P), 40 epochs ranked as well as 100 on validation rows of
#: the EURLex-4K shape x0.25, bibtex_xc and delicious (mean P@1 62.27 against 61.85, PSP@1 34.53 against
#: 34.53) in 40-48% of the CPU time; 20 lost 1.9 P@1 on the mean, 5.8 on EURLex (docs/experiments.md,
#: "MLGPF: epochs with the linear term"). Without the term 40 did as well or better where L > P (SE
#: latent GPs: delicious and subsets of its rows, 1.0-2.6 P@1 above 100 epochs on validation rows;
#: hmc_cellcycle_go's test P@5 level with 100's) and from ``AUTO_EPOCHS_MANY_ROWS`` rows on (goemotions,
#: 28 labels: 55.60 against 55.64 P@1) in 35-45% of the time ("MLGPF: the kernel of many rows and few
#: features"). Small sets with few labels keep 100.
AUTO_EPOCHS_LINEAR, AUTO_EPOCHS = 40, 100
AUTO_EPOCHS_MANY_ROWS = 10_000


def resolve_epochs(epochs, linear_term, n_rows: int | None = None, labels_beyond_latent: bool = False) -> int | str:
    """``epochs`` with "auto" resolved: ``AUTO_EPOCHS_LINEAR`` with the linear term (``linear_term``, the
    fit's resolved one), with labels beyond the latent GPs (``labels_beyond_latent``: L > P) or with at
    least ``AUTO_EPOCHS_MANY_ROWS`` training rows (``n_rows``; None: unknown, counted as few),
    ``AUTO_EPOCHS`` otherwise; "auto" stays while ``linear_term`` is still "auto" (an unfitted model)."""
    if epochs != "auto":
        return epochs
    if linear_term == "auto":
        return epochs
    many_rows = n_rows is not None and n_rows >= AUTO_EPOCHS_MANY_ROWS
    return AUTO_EPOCHS_LINEAR if linear_term or labels_beyond_latent or many_rows else AUTO_EPOCHS


#: ``linear_prior_variance="evidence"``: the s2 the linear term starts from, before its first update.
EVIDENCE_START_VARIANCE = 16.0


def starting_prior_variance(settings) -> float:
    """The linear term's s2 at the start: ``linear_prior_variance``, or ``EVIDENCE_START_VARIANCE`` for
    "evidence" (:meth:`~bayesmlc.gp.training.Trainer.update_prior_variance` then updates it)."""
    value = getattr(settings, "linear_prior_variance", 1.0)
    return EVIDENCE_START_VARIANCE if value == "evidence" else float(value)


def build_module(settings, arrays: dict) -> MLGPFModule:
    """The module (float32, on the CPU) of ``settings``'s kernel, inducing inputs and variational family,
    holding ``arrays`` (from :func:`initial_arrays`, or :func:`structural_arrays` of a state dict)."""
    if "basis" in arrays:
        inducing = SubspaceInducing(arrays["basis"], arrays["A"], trainable=settings.inducing == "subspace",
                                    gram=arrays.get("basis_gram"))
    else:
        inducing = InputSpaceInducing(arrays["Z"], trainable=settings.inducing == "free")
    kernel = make_kernel(settings.kernel, inducing.n_weights if settings.ard else None)
    variational = make_variational(settings.variational, settings.n_latent, settings.n_inducing)
    linear = None
    if "linear_shape" in arrays:
        linear = LinearTerm(*arrays["linear_shape"], starting_prior_variance(settings))
    elif "linear_support" in arrays:
        linear = SupportLinearTerm(arrays["linear_support"], starting_prior_variance(settings))
    return MLGPFModule(kernel, inducing, variational, arrays["Phi"], arrays["bias"], linear)


def module_from_parameters(settings, parameters: dict, device, dtype) -> MLGPFModule:
    """The module holding ``parameters`` (a state dict: a checkpoint's or ``parameters_``) on ``device``
    in ``dtype``. Cast before loading: the constructors build in float32, which would round a float64
    model's values. The linear term's Adam state may be absent (model files do not keep it): it then
    starts at zero."""
    module = build_module(settings, structural_arrays(parameters)).to(device=device, dtype=dtype)
    missing, unexpected = module.load_state_dict(parameters, strict=False)
    optimiser_state = {f"linear.{name}" for name in OPTIMISER_STATE}
    if unexpected or set(missing) - optimiser_state:
        raise ModelFormatError(f"MLGPF parameters do not form the module: missing {sorted(set(missing) - optimiser_state)}, "
                               f"unexpected {sorted(unexpected)}")
    return module


def structural_arrays(parameters: dict) -> dict:
    """The arrays the module constructors need (shapes and fixed buffers) from a state dict."""
    arrays = {}
    for key, name in (("inducing.A", "A"), ("inducing.Z", "Z"), ("Phi", "Phi"), ("bias", "bias")):
        if key in parameters:
            arrays[name] = np.asarray(parameters[key], dtype=np.float32)
    if "linear.support" in parameters:
        arrays["linear_support"] = np.asarray(parameters["linear.support"], dtype=np.int64)
    elif "linear.weight" in parameters:
        arrays["linear_shape"] = tuple(parameters["linear.weight"].shape)
    if "inducing.basis_t" in parameters:
        arrays["basis"] = np.asarray(parameters["inducing.basis_t"], dtype=np.float32).T
        rank = arrays["basis"].shape[0]
        gram = parameters.get("inducing.basis_gram")
        if gram is not None and tuple(gram.shape) == (rank, rank):  # else recomputed; loading then names the misfit
            arrays["basis_gram"] = np.asarray(gram, dtype=np.float32)
    if not any(k in arrays for k in ("basis", "Z")):
        raise ModelFormatError("MLGPF parameters hold neither inducing.basis_t nor inducing.Z")
    return arrays


class ProjectionCache:
    """The training rows' subspace projections X X~^T (= U S), each row's formed by the sparse product
    the first time a batch holds it and kept for later epochs.

    A row's product does not depend on the rows beside it (the same bits batch by batch, tested), so
    a cached run, an uncached one and a resumed one see the same numbers; the cache only saves the
    nnz(x) R product per row after the first epoch (a third of an epoch at the AmazonCat-13K shape).

    Parameters
    ----------
    inducing : SubspaceInducing, whose fixed basis the projections are on
    X : CSR (n, D), the prepared training rows
    """

    def __init__(self, inducing: SubspaceInducing, X):
        self.inducing, self.X = inducing, X
        dtype = torch.empty(0, dtype=inducing.basis_t.dtype).numpy().dtype
        self.values = np.empty((X.shape[0], inducing.rank), dtype=dtype)  # pages are touched as rows fill
        self.known = np.zeros(X.shape[0], dtype=bool)

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        """(len(rows), R) projections of the rows ``rows``, forming those not yet known."""
        rows = np.asarray(rows, dtype=np.int64)
        missing = np.unique(rows[~self.known[rows]])
        if missing.size:
            with torch.no_grad():
                self.values[missing] = self.inducing.project(self.X[missing]).cpu().numpy()
            self.known[missing] = True
        return self.values[rows]


def training_projection(module: MLGPFModule, X) -> ProjectionCache | None:
    """A :class:`ProjectionCache` of the training rows ``X`` when subspace inputs are used and their
    projections take at most ``PROJECTION_CACHE_MEMORY_SHARE`` of the physical memory (1 GiB where
    the platform does not say; else None: every batch forms them)."""
    inducing = module.inducing
    if not isinstance(inducing, SubspaceInducing):
        return None
    memory = physical_memory_bytes()
    size = X.shape[0] * inducing.rank * inducing.basis_t.element_size()
    if size > (2**30 if memory is None else PROJECTION_CACHE_MEMORY_SHARE * memory):
        return None
    return ProjectionCache(inducing, X)


def feature_batch(module: MLGPFModule, X, rows=None, projection: ProjectionCache | None = None) -> FeatureBatch:
    """The rows ``rows`` of ``X`` (all when None) as the inducing inputs take them, with their cached
    projections when ``projection`` (from :func:`training_projection`) is given."""
    X_rows = X if rows is None else X[rows]
    projected = None if (projection is None or rows is None) else projection[rows]
    return module.inducing.make_batch(X_rows, projected)


def initial_module(settings, X, Y, rng: np.random.Generator, context: ParallelContext | None = None,
                   device="cpu", dtype=torch.float32):
    """The starting module for the prepared training rows ``X``, ``Y`` on ``device`` in ``dtype``, as
    ``fit`` builds it: :func:`initial_arrays`, then :func:`warm_start_mean` when
    ``settings.init_mean == "ridge"``. Returns (module, projection of the rows or None)."""
    module = build_module(settings, initial_arrays(settings, X, Y, rng, context))
    module = module.to(device=device, dtype=dtype)
    projection = training_projection(module, X)
    if settings.init_mean == "ridge":
        warm_start_mean(settings, module, X, Y, rng, context)
    return module, projection
