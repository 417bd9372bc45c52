"""Feature preprocessing shared by every model: standardise columns, weight them by inverse document
frequency, scale rows to unit length.

:class:`FeaturePreprocessor` fits and transforms the way scikit-learn's ``StandardScaler`` and
``TfidfTransformer(norm="l2", smooth_idf=True, sublinear_tf=False)`` do, on sparse input, in the order
standardise, idf, normalise. Its fitted attributes have one meaning each:

``mean_``  column means (subtracted), ``scale_``  column standard deviations (divided by),
``idf_``  smoothed inverse document frequencies (multiplied by).

The statistics come from sums over the rows (column sums of x and x^2; document counts), so they
never densify a sparse matrix and data-parallel processes can add theirs (``reduce``). Centring
makes every entry non-zero: a standardised sparse matrix comes back dense (as a CSR matrix); text
features are better idf-weighted than standardised.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, TransformerMixin

from .exceptions import ModelFormatError, NotFittedError, ValidationError
from .fitted_state import check_fields
from .parameters import Boolean, Options, check_parameters
from .state_checks import PREPROCESSOR_FIELDS

__all__ = ["FeaturePreprocessor", "IDF_MIN_ROWS", "MAX_CENTRED_ENTRIES", "STANDARDIZE_CONSTRAINT", "column_mean_and_scale",
           "inverse_document_frequency", "legacy_preprocessor_state", "normalize_rows", "resolve_idf", "resolve_standardize"]

#: The ``standardize`` setting every model takes: "auto" (dense features only), True or False.
STANDARDIZE_CONSTRAINT = ["auto", Boolean()]

#: ``idf="auto"`` weights the columns by idf from this many training rows on. Measured with MLGPF
#: (docs/experiments.md, "MLGPF: idf on small sets"): idf cost P@1 and AURC on every seed at 333 and
#: 1,123 rows (medical, enron) and gained them at 4,880 (bibtex); 2,500 lies between.
IDF_MIN_ROWS = 2500

_DTYPES = {"float32": np.float32, "float64": np.float64}

#: Centring densifies the rows it transforms: at most this many entries (1 GB of float32) per call
#: when the input is sparse (dense input costs at most twice its own size).
MAX_CENTRED_ENTRIES = 1 << 28


def inverse_document_frequency(document_counts: np.ndarray, n_rows: int) -> np.ndarray:
    """Smoothed idf per feature, log((1 + N) / (1 + df)) + 1 (scikit-learn's ``TfidfTransformer``
    form): ``document_counts`` (D,) rows in which each feature is non-zero, of ``n_rows`` rows. float64 (D,)."""
    counts = np.asarray(document_counts, dtype=np.float64)
    return np.log((1.0 + n_rows) / (1.0 + counts)) + 1.0


def row_square_sums(data: np.ndarray, indptr: np.ndarray, block: int = 1 << 22) -> np.ndarray:
    """Sum of squares of every CSR row's stored entries, float64 (n,) (0 for an empty row), squared in
    float64 over blocks of about ``block`` entries: a float64 ``reduceat`` of a float32 array casts
    element by element (2.7 s against 0.16 s for 84M entries), and a whole float64 copy would double
    the data's memory."""
    n_rows = len(indptr) - 1
    sums = np.zeros(n_rows)
    first = 0
    while first < n_rows:
        last = max(int(np.searchsorted(indptr, indptr[first] + block, side="right")) - 1, first + 1)
        last = min(last, n_rows)  # rows first..last-1: entries indptr[first]..indptr[last]
        starts = indptr[first:last]
        filled = starts < indptr[first + 1 : last + 1]
        if filled.any():
            squares = np.square(data[indptr[first] : indptr[last]], dtype=np.float64)
            sums[first:last][filled] = np.add.reduceat(squares, (starts - indptr[first])[filled])
        first = last
    return sums


def normalize_rows(X: sp.csr_matrix, dtype=np.float32, copy: bool = True) -> sp.csr_matrix:
    """``X`` with every non-zero row scaled to unit L2 norm (all-zero rows kept), as CSR of ``dtype``:
    a new matrix, or ``X`` itself scaled in place when ``copy`` is False and it is CSR of ``dtype``.
    The squared norms are summed in float64 over each row's stored entries (duplicates summed
    first), and the entries scaled in place: no sparse product."""
    X = sp.csr_matrix(X, dtype=dtype, copy=copy)
    X.sum_duplicates()
    lengths = np.diff(X.indptr)
    norms = np.sqrt(row_square_sums(X.data, X.indptr))
    norms[norms == 0] = 1.0
    X.data *= np.repeat((1.0 / norms).astype(dtype), lengths)
    return X


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


def resolve_idf(idf, n_rows: int, counts: bool = True) -> bool:
    """Whether to idf-weight the columns, from an ``idf`` setting of "auto", True or False: "auto"
    weights them from ``IDF_MIN_ROWS`` training rows on, and only when the features are ``counts``
    (every stored value a whole number: term counts or binary indicators). The idf of a few hundred
    rows mostly amplifies features seen once or twice, whose weight then dominates the rows they
    occur in; real-valued features (tf-idf as the extreme-classification sets ship them) are weighted
    already, and a second idf cost MLGPF 1.8-3 P@1 on the EURLex-4K shape (docs/experiments.md,
    "MLGPF ablations by label-frequency band")."""
    if isinstance(idf, str) and idf == "auto":
        return n_rows >= IDF_MIN_ROWS and counts
    return bool(idf)


def resolve_standardize(standardize, n_nonzero: int, n_entries: int) -> bool:
    """Whether to standardise feature columns, from a ``standardize`` setting of "auto", True or
    False. "auto" standardises dense features (more than half of the ``n_entries`` entries are
    among the ``n_nonzero`` stored ones: audio or image descriptors, whose raw columns differ in
    offset and scale) and leaves sparse ones (text) as they are (``STANDARDIZE_CONSTRAINT`` checks
    the setting)."""
    if isinstance(standardize, str) and standardize == "auto":
        return n_entries > 0 and n_nonzero > 0.5 * n_entries
    return bool(standardize)


class FeaturePreprocessor(TransformerMixin, BaseEstimator):
    """Standardise, idf-weight and row-normalise sparse features.

    Parameters
    ----------
    standardize : {"auto", True, False}, default False
        Scale every column to unit standard deviation in the training rows (and centre it, with
        ``with_mean``); constant columns keep scale 1. "auto" standardises when more than half of
        the training entries are non-zero (dense real-valued features such as audio or image
        descriptors, :func:`resolve_standardize`) and leaves sparse ones alone.
    with_mean : bool, default True
        Centre the columns when standardising (densifies the rows). False divides by the standard
        deviation only, which keeps the sparsity (scikit-learn's ``with_mean=False``).
    idf : {"auto", True, False}, default False
        Multiply every column by its smoothed inverse document frequency in the training rows
        (:func:`inverse_document_frequency`, counted on the raw features). "auto" does so from
        ``IDF_MIN_ROWS`` (2,500) training rows on, for count or binary features only (every stored
        value a whole number; :func:`resolve_idf`).
    normalize : bool, default False
        Scale every row to unit L2 norm, last (all-zero rows stay zero).
    dtype : {"float32", "float64"}, default "float32"
        The precision of the arithmetic and of the output: the statistics (kept in float64) are
        rounded to it, the rows centred, then multiplied by the rounded reciprocal of ``scale_``.

    Attributes
    ----------
    n_features_in_ : int, D
    standardized_ : bool, whether the columns are standardised ("auto" resolved)
    mean_ : ndarray float64 (D,) or None, column means subtracted (None: no centring)
    scale_ : ndarray float64 (D,) or None, column standard deviations divided by (1 for constant
        columns; None: no scaling)
    idf_ : ndarray float64 (D,) or None, column weights multiplied by (None: no idf weighting)

    Examples
    --------
    >>> import numpy as np
    >>> from bayesmlc.preprocessing import FeaturePreprocessor
    >>> X = np.array([[1.0, 10.0], [3.0, 30.0]])
    >>> FeaturePreprocessor(standardize=True).fit_transform(X).toarray().tolist()
    [[-1.0, -1.0], [1.0, 1.0]]
    """

    _parameter_constraints = {
        "standardize": STANDARDIZE_CONSTRAINT,
        "with_mean": [Boolean()],
        "idf": ["auto", Boolean()],
        "normalize": [Boolean()],
        "dtype": [Options(*_DTYPES)],
    }

    def __init__(self, standardize=False, with_mean=True, idf=False, normalize=False, dtype="float32"):
        self.standardize = standardize
        self.with_mean = with_mean
        self.idf = idf
        self.normalize = normalize
        self.dtype = dtype

    def fit(self, X, y=None, n_rows: int | None = None, reduce=None):
        """Fit the column statistics of ``X`` (sparse or dense (n, D)); ``y`` is ignored.

        With the rows split over processes, ``X`` holds this process's rows, ``n_rows`` counts the
        rows of all processes and ``reduce`` sums an array over processes (an all-reduce); by
        default ``X`` holds every row.
        """
        check_parameters(self)
        X = _as_csr(X)
        n_rows = X.shape[0] if n_rows is None else int(n_rows)
        total = (lambda array: array) if reduce is None else reduce
        self.n_features_in_ = X.shape[1]
        n_nonzero = int(total(np.array([X.nnz], dtype=np.int64))[0])
        self.standardized_ = resolve_standardize(self.standardize, n_nonzero, n_rows * X.shape[1])
        self.mean_ = self.scale_ = self.idf_ = None
        if self.standardized_:
            mean, self.scale_ = column_mean_and_scale(X, n_rows, reduce)
            self.mean_ = mean if self.with_mean else None
        non_integer = np.count_nonzero(X.data != np.round(X.data))
        counts = int(total(np.array([non_integer], dtype=np.int64))[0]) == 0
        if resolve_idf(self.idf, n_rows, counts):
            counts = np.bincount(X.indices[X.data != 0], minlength=X.shape[1])
            self.idf_ = inverse_document_frequency(total(counts), n_rows)
        return self

    def _check_fitted(self, X) -> sp.csr_matrix:
        if not hasattr(self, "n_features_in_"):
            raise NotFittedError("This FeaturePreprocessor instance is not fitted yet: call fit(X) first")
        X = _as_csr(X)
        if X.shape[1] != self.n_features_in_:
            raise ValidationError(f"X has {X.shape[1]} features but the preprocessor was fitted with {self.n_features_in_}")
        return X

    def transform(self, X) -> sp.csr_matrix:
        """The preprocessed rows, CSR (n, D) of ``dtype`` (``X`` itself, converted, when nothing applies)."""
        X = self._check_fitted(X)
        dtype = _DTYPES[self.dtype]
        if self.mean_ is not None:  # centring: every entry becomes non-zero
            X = sp.csr_matrix(self._standardised_dense(X))
        elif self.scale_ is not None:
            X = sp.csr_matrix(X.multiply(self._inverse_scale()[None, :]), dtype=dtype)
        if self.idf_ is not None or self.normalize:  # the steps below scale this copy in place
            X = sp.csr_matrix(X, dtype=dtype, copy=True)
        if self.idf_ is not None:  # column j times idf_j
            X.data *= self.idf_.astype(dtype)[X.indices]
        if self.normalize:
            X = normalize_rows(X, dtype, copy=False)
        return X.astype(dtype, copy=False)

    def transform_dense(self, X) -> np.ndarray:
        """Standardised rows as a dense ndarray (n, D) of ``dtype``, without the CSR round trip of
        :meth:`transform`; only for a preprocessor without idf weighting or row normalisation."""
        if self.idf_ is not None or self.normalize:
            raise ValidationError("transform_dense covers standardisation only; use transform")
        X = self._check_fitted(X)
        if self.mean_ is not None:
            return self._standardised_dense(X)
        return self.transform(X).toarray()

    def inverse_transform(self, Z) -> sp.csr_matrix:
        """Standardised rows back to the original scale, CSR (n, D) of ``dtype``: Z * scale_ + mean_.
        Only for a preprocessor without idf weighting or row normalisation (those lose information)."""
        if self.idf_ is not None or self.normalize:
            raise ValidationError("inverse_transform undoes standardisation only, not idf weighting or normalisation")
        Z = self._check_fitted(Z)
        dtype = _DTYPES[self.dtype]
        if self.scale_ is None:
            return Z.astype(dtype)
        if self.mean_ is None:
            return sp.csr_matrix(Z.multiply(self.scale_.astype(dtype)[None, :]), dtype=dtype)
        dense = Z.toarray().astype(dtype, copy=False) * self.scale_.astype(dtype) + self.mean_.astype(dtype)
        return sp.csr_matrix(dense)

    def _inverse_scale(self) -> np.ndarray:
        return (1.0 / self.scale_).astype(_DTYPES[self.dtype])

    def _standardised_dense(self, X: sp.csr_matrix) -> np.ndarray:
        """(X - mean_) * (1 / scale_) as a dense ndarray of ``dtype``."""
        entries = X.shape[0] * X.shape[1]
        if entries > MAX_CENTRED_ENTRIES and entries > 2 * X.nnz:
            raise ValidationError(
                f"standardisation (standardize={self.standardize!r}) centres the features, which densifies them: "
                f"{X.shape[0]} x {X.shape[1]} = {entries} entries is above MAX_CENTRED_ENTRIES = {MAX_CENTRED_ENTRIES}. "
                "Pass fewer rows per call, or for sparse features use standardize=False (with idf weighting)"
            )
        dtype = _DTYPES[self.dtype]
        return (X.toarray().astype(dtype, copy=False) - self.mean_.astype(dtype)) * self._inverse_scale()

    # ---- persistence (bayesmlc.persistence) ------------------------------------------------------
    def _get_state(self) -> dict:
        return {name: getattr(self, name) for name in _STATE}

    def _set_state(self, state: dict) -> None:
        """Set the fitted state, checking what a model file could get wrong."""
        if set(state) != set(_STATE):
            raise ModelFormatError(f"a FeaturePreprocessor state needs exactly {', '.join(_STATE)}")
        check_fields(state, PREPROCESSOR_FIELDS)  # before any conversion: a non-float array is refused
        for name in _STATE:
            value = state[name]
            setattr(self, name, value.astype(np.float64) if isinstance(value, np.ndarray) else value)


_STATE = ("n_features_in_", "standardized_", "mean_", "scale_", "idf_")


def _as_csr(X) -> sp.csr_matrix:
    if sp.issparse(X):
        return sp.csr_matrix(X)
    array = np.asarray(X)
    return sp.csr_matrix(array if array.dtype.kind == "f" else array.astype(np.float64))


#: Fitted attributes of models saved before :class:`FeaturePreprocessor`: ``feature_scale_`` meant
#: 1 / standard deviation in MLGPF and LogisticRegression files, the standard deviation in BNMC and
#: baseline files.
LEGACY_FEATURE_KEYS = ("feature_mean_", "feature_scale_", "feature_idf_", "standardized_")


def legacy_preprocessor_state(state: dict, params: dict, reciprocal_scale: bool) -> dict:
    """A model state of the old form (``feature_mean_``, ``feature_scale_``, ``feature_idf_``,
    ``standardized_``, any of them absent from older files) with those entries replaced by the
    equivalent ``preprocessor_``, a fitted ``FeaturePreprocessor(**params)``; a state that has a
    ``preprocessor_`` comes back as it is.

    ``reciprocal_scale``: the old ``feature_scale_`` held 1 / standard deviation (MLGPF,
    LogisticRegression) rather than the standard deviation (BNMC, the baselines). An old model gives
    the same predictions to float rounding (the reciprocal is taken again).
    """
    if "preprocessor_" in state:
        return state
    state = dict(state)
    mean, scale, idf = (state.pop(key, None) for key in LEGACY_FEATURE_KEYS[:3])
    if state.pop("standardized_", True) is False:  # BNMC stored zeros and ones when not standardising
        mean = scale = None
    if scale is not None and reciprocal_scale:
        scale = 1.0 / np.asarray(scale, dtype=np.float64)
    n_features = state.get("n_features_in_")
    preprocessor = FeaturePreprocessor(**params)
    try:
        preprocessor._set_state({
            "n_features_in_": int(n_features) if isinstance(n_features, (int, np.integer)) else n_features,
            "standardized_": scale is not None,
            "mean_": None if mean is None or not params.get("with_mean", True) else np.asarray(mean),
            "scale_": None if scale is None else np.asarray(scale),
            "idf_": None if idf is None else np.asarray(idf),
        })
    except (ModelFormatError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise ModelFormatError(f"the old-form feature_mean_ / feature_scale_ / feature_idf_ do not make a "
                               f"feature preprocessor ({exc})") from None
    state["preprocessor_"] = preprocessor
    return state
