"""Small shared helpers: devices, random generators, batching."""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp
import torch

from .exceptions import ValidationError

__all__ = ["resolve_device", "numpy_rng", "torch_generator", "torch_threads", "csr_to_torch", "iter_batches"]


#: the torch device types bayesmlc computes on
COMPUTE_DEVICE_TYPES = ("cpu", "cuda", "mps")


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
    if resolved.type not in COMPUTE_DEVICE_TYPES:  # "meta" and the like hold no data to compute with
        raise ValidationError(f"device={device!r}: bayesmlc computes on {', '.join(COMPUTE_DEVICE_TYPES)} devices, "
                              f"not {resolved.type!r}")
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


def torch_threads(n_threads: int | None):
    """:func:`bayesmlc.threads.compute_threads`: the ``with`` block computes with ``n_threads``
    threads (torch and the BLAS pools), or with the count of an enclosing ``use_threads`` block, or
    with one thread per idle core (``None``)."""
    from .threads import compute_threads

    return compute_threads(n_threads)


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


def thread_bounds(n: int, min_per_thread: int) -> list[int]:
    """Bounds [0, ..., n] of equal blocks of ``range(n)``, one per thread of ``torch.get_num_threads()``,
    fewer so that each block holds at least ``min_per_thread`` items (one block at least)."""
    threads = max(1, min(torch.get_num_threads(), n // max(1, min_per_thread)))
    return np.linspace(0, n, threads + 1).astype(np.int64).tolist()


def run_blocks(bounds, work) -> None:
    """``work(begin, end)`` for each non-empty block between consecutive ``bounds``, each block on its
    own thread when there are several (``work`` is expected to release the GIL: a numba ``nogil``
    kernel, a BLAS call) and inline when there is one."""
    tasks = [(int(begin), int(end)) for begin, end in zip(bounds[:-1], bounds[1:]) if end > begin]
    if len(tasks) == 1:
        work(*tasks[0])
    elif tasks:
        with ThreadPoolExecutor(len(tasks)) as pool:
            list(pool.map(lambda task: work(*task), tasks))
