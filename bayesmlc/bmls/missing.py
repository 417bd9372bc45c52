"""The BMLS paper's reduced-training-data protocols (Sec. 6.2), reproducible from a seed.

* :func:`remove_labels`: "randomly remove 80% entries from the label matrix". By default the removed
  entries are *missing* (a mask marks the observed 20%, positives and negatives alike), which is what
  bayesmlc's models integrate out. ``mode="positives"`` reproduces the authors' released data instead:
  80% of the positive entries are turned into zeros and no mask is returned, so they look like
  observed negatives.
* :func:`subsample_instances`: keep a random 20% of the training rows (Table 4).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..exceptions import ValidationError
from ..utils import numpy_rng

__all__ = ["remove_labels", "subsample_instances"]


def _check_fraction(value, name):
    if not isinstance(value, (int, float, np.floating)) or not 0.0 <= float(value) <= 1.0:
        raise ValidationError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


def remove_labels(Y, fraction: float = 0.8, mode: str = "entries", random_state=None):
    """Hide a random ``fraction`` of the training label matrix.

    Parameters
    ----------
    Y : sparse or dense 0/1, shape (n_samples, n_labels)
    fraction : share of entries (``mode="entries"``) or of positives (``mode="positives"``) removed;
        exactly ``round(fraction * count)`` of them, chosen uniformly without replacement.
    mode : ``"entries"`` (default) or ``"positives"`` (the authors' released data).
    random_state : seed or Generator.

    Returns
    -------
    Y_observed : CSR float32 (n_samples, n_labels), the positives that remain visible.
    label_mask : CSR float32 of observed entries (``mode="entries"``), or ``None`` (``"positives"``).
    """
    fraction = _check_fraction(fraction, "fraction")
    Y = sp.csr_matrix(Y, dtype=np.float32)
    Y.eliminate_zeros()
    rng = numpy_rng(random_state)
    n, n_labels = Y.shape
    if mode == "positives":
        coo = Y.tocoo()
        keep = np.ones(coo.nnz, dtype=bool)
        keep[rng.choice(coo.nnz, size=int(round(fraction * coo.nnz)), replace=False)] = False
        kept = sp.csr_matrix(
            (np.ones(int(keep.sum()), dtype=np.float32), (coo.row[keep], coo.col[keep])), shape=Y.shape
        )
        return kept, None
    if mode != "entries":
        raise ValidationError(f"mode must be 'entries' or 'positives', got {mode!r}")
    total = n * n_labels
    n_observed = total - int(round(fraction * total))
    observed = np.sort(rng.choice(total, size=n_observed, replace=False))
    rows, cols = np.divmod(observed, n_labels)
    mask = sp.csr_matrix((np.ones(n_observed, dtype=np.float32), (rows, cols)), shape=Y.shape)
    Y_observed = sp.csr_matrix(Y.multiply(mask), dtype=np.float32)
    Y_observed.eliminate_zeros()
    return Y_observed, mask


def subsample_instances(n_samples: int, fraction: float = 0.2, random_state=None) -> np.ndarray:
    """Indices (sorted) of ``round(fraction * n_samples)`` training rows drawn without replacement."""
    fraction = _check_fraction(fraction, "fraction")
    if not isinstance(n_samples, (int, np.integer)) or n_samples < 1:
        raise ValidationError(f"n_samples must be a positive integer, got {n_samples!r}")
    rng = numpy_rng(random_state)
    return np.sort(rng.choice(int(n_samples), size=int(round(fraction * n_samples)), replace=False))
