"""svmlight / libsvm multi-label text format.

::

    l1,l2 i:v i:v ...   # comment
     i:v i:v            <- no labels (a first field containing ':' also means no labels)

No header: the widths are inferred (largest index + 1) unless given. Feature indices are 1-based by
default, as the svmlight and libsvm documentation specify (pass ``zero_based=True`` for 0-based
files); labels are the non-negative integers written (label ``l`` is column ``l``). Blank and
comment-only lines are skipped, as scikit-learn's ``load_svmlight_file`` does. ``qid:`` fields
(ranking data) are not supported.

Parsed by the same streaming engine as the XC format (:mod:`~bayesmlc.data.formats.sparse_text`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
import scipy.sparse as sp

from ...exceptions import DataFormatError, ValidationError
from ...safe_io import check_file_width, check_width
from .sparse_text import DEFAULT_CHUNK_BYTES, Grammar, parse_stream
from .xc import canonical_csr, rows_to_csr, write_sparse_rows

__all__ = ["read_svmlight", "write_svmlight"]

UTF8_BOM = b"\xef\xbb\xbf"


def read_svmlight(path, *, zero_based: bool = False, n_features: Optional[int] = None,
                  n_labels: Optional[int] = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                  engine: str = "auto") -> Tuple[sp.csr_matrix, sp.csr_matrix]:
    """Read a multi-label svmlight/libsvm file into ``(X, Y)`` CSR matrices (float32).

    Parameters
    ----------
    zero_based:
        ``False`` (default): the first feature is written ``1``; ``True``: it is written ``0``.
    n_features, n_labels:
        Widths; indices must be below them. ``None`` infers them as largest index + 1.
    """
    path = Path(path)
    base = 0 if zero_based else 1
    origin = []
    if n_features is not None:
        origin.append(f"n_features={n_features}")
    if n_labels is not None:
        origin.append(f"n_labels={n_labels}")
    grammar = Grammar(
        comments=True, skip_blank=True, colon_first_means_no_labels=True, index_base=base,
        n_features=n_features, n_labels=n_labels,
        base_hint="" if zero_based else " (svmlight indices are 1-based; pass zero_based=True for a 0-based file)",
        width_origin="the argument " + " and ".join(origin) if origin else "",
    )
    for name, value in (("n_features", n_features), ("n_labels", n_labels)):
        if value is not None and (not isinstance(value, (int, np.integer)) or value < 0):
            raise ValidationError(f"{name} must be a non-negative integer or None, got {value!r}")
    with open(path, "rb") as stream:
        file_bytes = os.fstat(stream.fileno()).st_size
        if stream.read(3) != UTF8_BOM:  # a byte-order mark some editors write is skipped, as in XC and ARFF
            stream.seek(0)
        rows = parse_stream(stream, grammar, path=path, first_line_no=1, chunk_bytes=chunk_bytes, engine=engine)
    width = rows.max_column + 1 if n_features is None else n_features
    labels = rows.max_label + 1 if n_labels is None else n_labels
    def fail(message: str) -> DataFormatError:
        return DataFormatError(message, path=path)

    for name, value, given in (("D", width, n_features), ("L", labels, n_labels)):
        if given is not None:  # the caller's width: bounded by memory only
            check_width(value, f"given {name}", fail)
        else:  # an index the file holds: at most one column per byte of it (and at least MIN_WIDTH_BOUND)
            origin = "the largest feature index makes" if name == "D" else "the largest label makes"
            check_file_width(value, f"{origin} {name}", file_bytes, fail)
    return rows_to_csr(rows, width, labels)


def write_svmlight(path, X, Y, *, zero_based: bool = False, value_format: Optional[str] = None) -> None:
    """Write ``X`` and ``Y`` as multi-label svmlight (1-based feature indices unless ``zero_based``).

    A row with neither labels nor features cannot be written (svmlight readers skip blank lines, so
    the row would vanish): that raises :class:`DataFormatError`; use the XC format for such data.
    """
    X, Y = canonical_csr(X), canonical_csr(Y, drop_zeros=True)
    empty = np.flatnonzero((np.diff(X.indptr) == 0) & (np.diff(Y.indptr) == 0))
    if empty.size:
        raise DataFormatError(
            f"row {int(empty[0])} ({empty.size} rows in all) has no labels and no features: svmlight readers "
            "skip blank lines, so it would be lost; write the XC text format instead", path=path,
        )
    with open(path, "wb") as stream:
        write_sparse_rows(stream, X, Y, index_base=0 if zero_based else 1, value_format=value_format)
