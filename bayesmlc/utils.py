"""Small shared helpers: devices, random generators, batching."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import scipy.sparse as sp
import torch

from .exceptions import ValidationError

__all__ = ["resolve_device", "numpy_rng", "torch_generator", "torch_threads", "csr_to_torch", "iter_batches"]


def resolve_device(device) -> torch.device:
    """Turn ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device`` into a device.

    ``"auto"`` picks CUDA when it is available and the CPU otherwise.
    """
    if isinstance(device, torch.device):
        return device
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, str):
        raise ValidationError(f"device must be 'auto', 'cpu', 'cuda' or a torch.device, got {device!r}")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise ValidationError(f"device={device!r} is not a valid torch device: {exc}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValidationError(f"device={device!r} was requested but CUDA is not available on this machine")
    return resolved


def numpy_rng(random_state) -> np.random.Generator:
    """A NumPy Generator from ``None``, an int, a Generator or a legacy RandomState."""
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(0, 2**31 - 1))
    if random_state is None or isinstance(random_state, (int, np.integer)):
        return np.random.default_rng(random_state)
    raise ValidationError(f"random_state must be None, an int or a numpy Generator, got {random_state!r}")


def torch_generator(rng: np.random.Generator, device="cpu") -> torch.Generator:
    """A torch Generator seeded from ``rng`` (so one ``random_state`` drives NumPy and torch)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(rng.integers(0, 2**62)))
    return gen


@contextlib.contextmanager
def torch_threads(n_threads: int | None):
    """Run the ``with`` block with ``torch.set_num_threads(n_threads)``, restoring the previous setting
    after it; ``None`` leaves torch's setting alone."""
    if n_threads is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(int(n_threads))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def csr_to_torch(matrix: sp.csr_matrix, device="cpu", dtype=torch.float32) -> torch.Tensor:
    """A scipy CSR matrix as a torch sparse CSR tensor (no densification)."""
    matrix = sp.csr_matrix(matrix)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(
            torch.from_numpy(matrix.indptr.astype(np.int64)),
            torch.from_numpy(matrix.indices.astype(np.int64)),
            torch.from_numpy(matrix.data).to(dtype),
            size=matrix.shape,
            device=device,
            check_invariants=False,
        )


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function 1 / (1 + e^-x), written with tanh so that no exp overflows."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def logit(p: np.ndarray, floor: float = 1e-7) -> np.ndarray:
    """log(p / (1 - p)), with ``p`` first kept ``floor`` away from 0 and 1 so that it stays finite."""
    p = np.clip(p, floor, 1.0 - floor)
    return np.log(p) - np.log1p(-p)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x) = -log sigmoid(-x), elementwise in float64 (torch's kernel; the linear branch above 40,
    where the two differ by less than 1e-17 relative)."""
    return torch.nn.functional.softplus(torch.from_numpy(np.asarray(x, dtype=np.float64)), threshold=40.0).numpy()


def iter_batches(n: int, batch_size: int):
    """Yield ``slice`` objects covering ``range(n)`` in consecutive batches."""
    for start in range(0, n, batch_size):
        yield slice(start, min(start + batch_size, n))


def normalize_rows(X: sp.csr_matrix, dtype=np.float32) -> sp.csr_matrix:
    """``X`` with every non-zero row scaled to unit L2 norm (all-zero rows kept), as CSR of ``dtype``."""
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    norms[norms == 0] = 1.0
    return sp.csr_matrix(sp.diags((1.0 / norms).astype(dtype)) @ X, dtype=dtype)


def column_mean_and_scale(X, n_rows: int | None = None, reduce=None) -> tuple[np.ndarray, np.ndarray]:
    """Mean and scale (float64, (D,)) of every column of ``X`` (sparse or dense) over its rows, from
    float64 sums of x and x^2, which never densify a sparse ``X``. The scale is the standard deviation,
    except that a constant column gets scale 1 (standardising leaves it centred, not blown up).

    With the rows split over processes, ``reduce`` sums the per-process sums (an all-reduce; None:
    this process holds every row) and ``n_rows`` counts the rows of all processes. A column whose
    spread is below the rounding of those sums (standard deviation at most 1e-6 of its root mean
    square) counts as constant: E[x^2] - E[x]^2 leaves about 1e-8 of a constant column's value there.
    """
    X = sp.csr_matrix(X, dtype=np.float64)
    n_rows = X.shape[0] if n_rows is None else n_rows
    sums = np.concatenate([np.asarray(X.sum(axis=0)).ravel(), np.asarray(X.multiply(X).sum(axis=0)).ravel()])
    if reduce is not None:
        sums = np.asarray(reduce(sums), dtype=np.float64)
    mean, mean_square = sums[: X.shape[1]] / max(n_rows, 1), sums[X.shape[1] :] / max(n_rows, 1)
    std = np.sqrt(np.maximum(mean_square - mean**2, 0.0))
    std[std <= 1e-6 * np.sqrt(mean_square)] = 1.0
    return mean, std


def resolve_standardize(standardize, n_nonzero: int, n_entries: int) -> bool:
    """Whether to standardise feature columns, from a ``standardize`` setting of "auto", True or
    False. "auto" standardises dense features (more than half of the ``n_entries`` entries are
    among the ``n_nonzero`` stored ones: audio or image descriptors, whose raw columns differ in
    offset and scale) and leaves sparse ones (text) as they are."""
    if isinstance(standardize, str) and standardize == "auto":
        return n_entries > 0 and n_nonzero > 0.5 * n_entries
    if isinstance(standardize, (bool, np.bool_)):
        return bool(standardize)
    raise ValidationError(f"standardize must be 'auto', True or False, got {standardize!r}")
