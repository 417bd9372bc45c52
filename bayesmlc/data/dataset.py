"""The :class:`Dataset` container: sparse features, sparse labels, an optional mask of observed labels."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import numpy as np
import scipy.sparse as sp

from ..exceptions import ValidationError

__all__ = ["Dataset"]


def _as_csr(matrix, dtype, name: str) -> sp.csr_matrix:
    if sp.issparse(matrix):
        out = sp.csr_matrix(matrix, dtype=dtype)
    else:
        array = np.asarray(matrix)
        if array.ndim != 2:
            raise ValidationError(f"{name} must be 2-D, got shape {array.shape}")
        out = sp.csr_matrix(array.astype(dtype, copy=False))
    out.sum_duplicates()
    out.sort_indices()
    return out


@dataclass
class Dataset:
    """A multi-label data set.

    Attributes
    ----------
    X:
        Features, ``scipy.sparse.csr_matrix`` of shape (n_samples, n_features), float32.
    Y:
        Labels, ``csr_matrix`` of shape (n_samples, n_labels), float32 with stored values 1.
    label_mask:
        ``None`` when every label entry is observed; otherwise a ``csr_matrix`` of shape
        (n_samples, n_labels) whose stored ones mark the *observed* entries. An unobserved entry is
        missing, not negative: estimators leave it out of the likelihood.
    feature_names, label_names:
        Optional names, one per column.
    source:
        Provenance: where the data came from (path, format, generator and seed, ...).

    Examples
    --------
    >>> import numpy as np
    >>> ds = Dataset.from_arrays(np.eye(3), np.array([[1, 0], [0, 1], [1, 1]]))
    >>> ds.n_samples, ds.n_features, ds.n_labels
    (3, 3, 2)
    """

    X: sp.csr_matrix
    Y: sp.csr_matrix
    label_mask: Optional[sp.csr_matrix] = None
    feature_names: Optional[Sequence[str]] = None
    label_names: Optional[Sequence[str]] = None
    source: dict = field(default_factory=dict)

    def __post_init__(self):
        self.X = _as_csr(self.X, np.float32, "X")
        self.Y = _as_csr(self.Y, np.float32, "Y")
        if self.X.shape[0] != self.Y.shape[0]:
            raise ValidationError(
                f"X has {self.X.shape[0]} rows but Y has {self.Y.shape[0]}: they must describe the same instances"
            )
        if self.Y.nnz and not np.all(self.Y.data == 1):
            bad = np.unique(self.Y.data[self.Y.data != 1])[:5]
            raise ValidationError(f"Y must be 0/1; found values {bad.tolist()}")
        if self.label_mask is not None:
            self.label_mask = _as_csr(self.label_mask, np.float32, "label_mask")
            if self.label_mask.shape != self.Y.shape:
                raise ValidationError(
                    f"label_mask has shape {self.label_mask.shape}, Y has {self.Y.shape}: they must match"
                )
            self.label_mask.data[:] = 1.0
        for names, size, what in (
            (self.feature_names, self.X.shape[1], "feature_names"),
            (self.label_names, self.Y.shape[1], "label_names"),
        ):
            if names is not None and len(names) != size:
                raise ValidationError(f"{what} has {len(names)} entries for {size} columns")

    @classmethod
    def from_arrays(cls, X, Y, label_mask=None, **kwargs) -> "Dataset":
        """Build a dataset from dense or sparse arrays."""
        return cls(X=X, Y=Y, label_mask=label_mask, **kwargs)

    # --- shape -------------------------------------------------------------------------------
    @property
    def n_samples(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]

    @property
    def n_labels(self) -> int:
        return self.Y.shape[1]

    def __len__(self) -> int:
        return self.n_samples

    # --- statistics --------------------------------------------------------------------------
    def labels_per_row(self) -> np.ndarray:
        """Number of positive labels of each row, shape (n_samples,)."""
        return np.diff(self.Y.indptr)

    def label_frequencies(self) -> np.ndarray:
        """Number of rows carrying each label, shape (n_labels,)."""
        return np.bincount(self.Y.indices, minlength=self.n_labels)

    def stats(self) -> dict:
        """Basic statistics as a dict of plain Python numbers."""
        per_row = self.labels_per_row()
        freq = self.label_frequencies()
        n, d, l = self.n_samples, self.n_features, self.n_labels
        out = {
            "n_samples": n,
            "n_features": d,
            "n_labels": l,
            "feature_nnz": int(self.X.nnz),
            "features_per_row": float(self.X.nnz / n) if n else 0.0,
            "feature_density": float(self.X.nnz / (n * d)) if n * d else 0.0,
            "labels_per_row": float(per_row.mean()) if n else 0.0,
            "labels_per_row_std": float(per_row.std(ddof=1)) if n > 1 else 0.0,
            "label_density": float(self.Y.nnz / (n * l)) if n * l else 0.0,
            "rows_without_labels": int((per_row == 0).sum()),
            "labels_without_rows": int((freq == 0).sum()),
            "label_frequency_min": int(freq.min()) if l else 0,
            "label_frequency_median": float(np.median(freq)) if l else 0.0,
            "label_frequency_max": int(freq.max()) if l else 0,
            "binary_features": bool(self.X.nnz == 0 or np.all(self.X.data == 1)),
            "nonnegative_features": bool(self.X.nnz == 0 or self.X.data.min() >= 0),
        }
        if self.label_mask is not None:
            out["observed_label_fraction"] = float(self.label_mask.nnz / (n * l)) if n * l else 0.0
        return out

    def summary(self) -> str:
        """Human-readable statistics, one per line (what ``bayesmlc info`` prints)."""
        lines = []
        if self.source:
            lines.append("source: " + ", ".join(f"{k}={v}" for k, v in self.source.items()))
        for key, value in self.stats().items():
            lines.append(f"{key:>24}: {value:.4g}" if isinstance(value, float) else f"{key:>24}: {value}")
        return "\n".join(lines)

    # --- derived datasets --------------------------------------------------------------------
    def subset(self, rows) -> "Dataset":
        """The rows ``rows`` (indices or boolean mask) as a new dataset."""
        rows = np.asarray(rows)
        mask = None if self.label_mask is None else self.label_mask[rows]
        return replace(self, X=self.X[rows], Y=self.Y[rows], label_mask=mask)

    def with_features_width(self, n_features: int) -> "Dataset":
        """Pad X with empty columns up to ``n_features`` (used to align a test file with training)."""
        if n_features < self.n_features:
            raise ValidationError(f"cannot shrink {self.n_features} feature columns to {n_features}")
        X = sp.csr_matrix((self.X.data, self.X.indices, self.X.indptr), shape=(self.n_samples, n_features))
        names = None
        if self.feature_names is not None:
            names = list(self.feature_names) + [f"f{i}" for i in range(self.n_features, n_features)]
        return replace(self, X=X, feature_names=names)
