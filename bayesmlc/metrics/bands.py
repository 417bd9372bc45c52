"""Ranking metrics by label-frequency band: where in the head-to-tail range of training label
frequencies a model's top-k hits (and misses) lie.

Labels are ordered by their training frequency, most frequent first, and cut into bands of (nearly)
equal numbers of labels (:func:`frequency_bands`): band 0 is the head, the last band the tail.
:func:`metrics_by_band` splits P@k, PSP@k and recall@k into one *contribution* per band, the part of
the metric earned by hits on that band's labels, so that the bands of a metric add up to the metric
itself (the value :func:`~bayesmlc.metrics.precision_at_k`, :func:`~bayesmlc.metrics.psprecision_at_k`
and pyxclib's recall@k give for the same ranking).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..exceptions import ValidationError
from ..validation import check_labels
from ._checks import _check_k, _check_y_true
from .ranking import _best_weighted, _check_weights, _hits, _ranked_indices

__all__ = ["FrequencyBands", "frequency_bands", "BandMetrics", "metrics_by_band", "DEFAULT_N_BANDS"]

#: Deciles of the labels by training frequency, unless there are fewer labels than that.
DEFAULT_N_BANDS = 10


@dataclass(frozen=True)
class FrequencyBands:
    """Labels grouped by training frequency, head (band 0) to tail.

    Attributes
    ----------
    band_of_label : ndarray of int64, shape (L,), the band of each label.
    n_labels : ndarray of int64, shape (n_bands,), labels per band.
    min_count, max_count : ndarrays of int64, shape (n_bands,), the smallest and largest training
        frequency (rows carrying the label) among each band's labels.
    """

    band_of_label: np.ndarray
    n_labels: np.ndarray
    min_count: np.ndarray
    max_count: np.ndarray

    @property
    def n_bands(self) -> int:
        return int(self.n_labels.size)


def frequency_bands(label_counts, n_bands: int | None = None) -> FrequencyBands:
    """Cut the labels into ``n_bands`` bands of training frequency, most frequent first.

    The labels are sorted by decreasing count, ties towards the lower label index, and the sorted list
    is cut into ``n_bands`` consecutive pieces whose sizes differ by at most one (the first
    ``L mod n_bands`` pieces have the extra label). Labels with equal counts can therefore fall on
    both sides of a cut; labels never seen in training end up in the last bands.

    Parameters
    ----------
    label_counts : array-like of non-negative int, shape (L,), training rows carrying each label
        (``np.bincount(Y_train.indices, minlength=L)`` for CSR labels).
    n_bands : int or None, the number of bands; None: ``min(DEFAULT_N_BANDS, L)`` (deciles, or one
        band per label for fewer than ten labels). At most L.
    """
    counts = np.asarray(label_counts)
    if counts.ndim != 1 or counts.size == 0:
        raise ValidationError(f"label_counts must be a non-empty 1-D array, got shape {counts.shape}")
    if counts.dtype.kind not in "iuf" or not np.all(np.isfinite(counts)) or counts.min() < 0 \
            or not np.array_equal(counts, np.round(counts)):
        raise ValidationError("label_counts must hold non-negative whole numbers (training rows per label)")
    counts = counts.astype(np.int64)
    n_labels = counts.size
    n_bands = min(DEFAULT_N_BANDS, n_labels) if n_bands is None else _check_k(n_bands, "n_bands")
    if n_bands > n_labels:
        raise ValidationError(f"n_bands={n_bands} is more than the {n_labels} labels to put in them")
    order = np.lexsort((np.arange(n_labels), -counts))  # decreasing count, then increasing index
    band_of_label = np.empty(n_labels, dtype=np.int64)
    pieces = np.array_split(order, n_bands)
    for band, labels in enumerate(pieces):
        band_of_label[labels] = band
    return FrequencyBands(
        band_of_label=band_of_label,
        n_labels=np.array([piece.size for piece in pieces], dtype=np.int64),
        min_count=np.array([counts[piece].min() for piece in pieces], dtype=np.int64),
        max_count=np.array([counts[piece].max() for piece in pieces], dtype=np.int64),
    )


@dataclass(frozen=True)
class BandMetrics:
    """:func:`metrics_by_band`'s result.

    Attributes
    ----------
    bands : FrequencyBands, the bands the metrics are split by.
    values : dict, metric name (``"P@k"``, ``"PSP@k"``, ``"R@k"`` for each k) to an ndarray
        (n_bands,) of band contributions (fractions); ``values[name].sum()`` is the metric.
    positive_share : ndarray (n_bands,), each band's share of the test set's true (row, label) pairs.
    """

    bands: FrequencyBands
    values: dict
    positive_share: np.ndarray

    def overall(self, name: str) -> float:
        """The whole metric: the sum of its band contributions."""
        return float(self.values[name].sum())

    def to_json(self) -> dict:
        """Plain lists, for a JSON record."""
        return {
            "n_labels": self.bands.n_labels.tolist(), "min_count": self.bands.min_count.tolist(),
            "max_count": self.bands.max_count.tolist(), "positive_share": self.positive_share.tolist(),
            "values": {name: values.tolist() for name, values in self.values.items()},
        }


def metrics_by_band(Y_true, scores, Y_train=None, *, ks=(1, 3, 5), n_bands: int | None = None, bands=None,
                    propensities=None, A: float = 0.55, B: float = 1.5) -> BandMetrics:
    """P@k, PSP@k and recall@k split into label-frequency bands whose contributions add up to each metric.

    With ``pi_i`` the top-k ranking of test row i, ``y_i`` its true labels, ``n`` the test rows and
    ``B_b`` the labels of band b, each band's contribution is::

        P@k_b   = (1 / (k n)) sum_i |{r <= k : pi_i(r) in y_i and pi_i(r) in B_b}|
        PSP@k_b = sum_i (1/k) sum_{r <= k, pi_i(r) in y_i and in B_b} w_{pi_i(r)}  /  sum_i best_i
        R@k_b   = (1 / n) sum_i |{r <= k : pi_i(r) in y_i and in B_b}| / |y_i|     (0 when y_i is empty)

    so ``sum_b P@k_b`` is P@k (:func:`~bayesmlc.metrics.precision_at_k`), ``sum_b PSP@k_b`` the
    normalised PSP@k (:func:`~bayesmlc.metrics.psprecision_at_k`: ``best_i`` is the row's best
    achievable propensity-weighted top-k sum over *all* bands, the same denominator for every band), and
    ``sum_b R@k_b`` recall@k as pyxclib computes it (a mean over all rows, an empty row counting 0).
    A band's contribution is thus bounded by how many of the test set's true labels lie in it
    (:attr:`BandMetrics.positive_share`): a tail band of rare labels can add little to P@k even for a
    perfect model, and PSP@k weights its hits up by the inverse propensities ``w``.

    Parameters
    ----------
    Y_true : sparse or dense 0/1, shape (n, L), the test labels.
    scores : dense (n, L), higher = more likely, or a top-k tuple ``(indices, values)`` with at least
        ``max(ks)`` labels per row (as for :func:`~bayesmlc.metrics.precision_at_k`).
    Y_train : sparse or dense 0/1, shape (N, L), the training labels: the bands come from their
        column counts and, unless ``propensities`` is given, the inverse propensities from them (Jain
        et al. 2016, constants ``A`` and ``B``). May be omitted when ``bands`` and ``propensities``
        are both given.
    ks : the cut-offs (positive integers).
    n_bands : the number of bands (:func:`frequency_bands`; default deciles, fewer for fewer labels).
    bands : FrequencyBands, bands already computed (then ``n_bands`` must be None).
    propensities : array (L,), inverse propensities ``w_l >= 1`` to use instead of ``Y_train``'s.
    A, B : Jain et al.'s constants for the propensities from ``Y_train``.
    """
    Y = _check_y_true(Y_true)
    n_rows, n_labels = Y.shape
    ks = tuple(_check_k(k, "every entry of ks") for k in ks)
    if not ks:
        raise ValidationError("ks must name at least one k")
    train = None if Y_train is None else check_labels(Y_train, "Y_train")
    if train is not None and train.shape[1] != n_labels:
        raise ValidationError(f"Y_train has {train.shape[1]} label columns but Y_true has {n_labels}")
    if bands is None:
        if train is None:
            raise ValidationError("give Y_train (training labels) or bands (from frequency_bands) to band the labels by")
        bands = frequency_bands(np.bincount(train.indices, minlength=n_labels), n_bands)
    elif n_bands is not None:
        raise ValidationError("give n_bands or bands, not both")
    if bands.band_of_label.shape != (n_labels,):
        raise ValidationError(f"bands cover {bands.band_of_label.size} labels but Y_true has {n_labels}")
    if propensities is None and train is None:
        raise ValidationError("give Y_train or propensities for PSP@k")
    weights = _check_weights(propensities, train if propensities is None else None, A, B, n_labels)
    indices = _ranked_indices(scores, max(ks), Y.shape)
    hits = _hits(Y, indices)
    hit_bands = bands.band_of_label[indices]
    true_per_row = np.diff(Y.indptr).astype(np.float64)
    row_recall_weight = np.divide(1.0, true_per_row, out=np.zeros(n_rows), where=true_per_row > 0)
    values = {}
    for k in ks:
        top = min(k, indices.shape[1])
        band_k, hit_k = hit_bands[:, :top][hits[:, :top]], hits[:, :top]
        total_best = _best_weighted(Y, weights, k, discount=False).sum() / k
        values[f"P@{k}"] = _band_sums(band_k, None, bands.n_bands) / (k * n_rows)
        psp = _band_sums(band_k, weights[indices[:, :top]][hit_k], bands.n_bands) / k
        values[f"PSP@{k}"] = psp / total_best if total_best > 0 else np.zeros(bands.n_bands)
        recall_weights = np.broadcast_to(row_recall_weight[:, None], hit_k.shape)[hit_k]
        values[f"R@{k}"] = _band_sums(band_k, recall_weights, bands.n_bands) / n_rows
    positives = np.bincount(bands.band_of_label[Y.indices], minlength=bands.n_bands).astype(np.float64)
    return BandMetrics(bands, values, positives / max(Y.nnz, 1))


def _band_sums(band_of_hit: np.ndarray, weight_of_hit, n_bands: int) -> np.ndarray:
    """Per band, the number (or the summed weights) of the hits that fall in it."""
    return np.bincount(band_of_hit, weights=weight_of_hit, minlength=n_bands).astype(np.float64)
