"""Extreme Classification Repository text format.

::

    N D L                      <- header: rows, features, labels
    l1,l2,... f:v f:v ...      <- one row per line; 0-based label and feature indices
     f:v f:v ...               <- a row with no labels starts with a space

The reader streams the file in chunks through the compiled scanner of
:mod:`bayesmlc.data.formats.sparse_text`; the writer formats values in bulk with NumPy.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
import scipy.sparse as sp

from ...exceptions import DataFormatError
from ...safe_io import check_file_width, check_width
from .sparse_text import DEFAULT_CHUNK_BYTES, INDEX_LIMIT, Grammar, ParsedRows, parse_stream

__all__ = ["read_xc", "write_xc", "read_xc_header", "format_values", "write_sparse_rows", "canonical_csr"]

_HEADER_MAX_BYTES = 4096


def read_xc_header(stream, path) -> Tuple[int, int, int]:
    """Read and check the ``N D L`` header line from a binary stream positioned at the start."""
    raw = stream.readline(_HEADER_MAX_BYTES)
    if raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark written by some editors
        raw = raw[3:]
    if not raw:
        raise DataFormatError("empty file: expected the header 'N D L' (rows, features, labels)", path=path, line=1)
    if not raw.endswith(b"\n") and len(raw) >= _HEADER_MAX_BYTES:
        raise DataFormatError(
            f"bad header: the first line is longer than {_HEADER_MAX_BYTES} bytes; expected 'N D L'", path=path, line=1
        )
    fields = raw.split()
    shown = raw.strip().decode("utf-8", errors="backslashreplace")[:80]
    if len(fields) != 3 or not all(field.isdigit() for field in fields):
        hint = " (a headerless svmlight file? read it with format='svmlight')" if b":" in raw else ""
        raise DataFormatError(
            f"bad header {shown!r}: expected 'N D L' (three non-negative integers: rows, features, labels){hint}",
            path=path, line=1,
        )
    n_rows, n_features, n_labels = (int(field) for field in fields)
    for name, value in (("D", n_features), ("L", n_labels)):
        if value > INDEX_LIMIT:
            raise DataFormatError(f"bad header {shown!r}: {name}={value} exceeds the supported {INDEX_LIMIT}",
                                  path=path, line=1)

    def fail(message: str) -> DataFormatError:
        return DataFormatError(f"bad header {shown!r}: {message}", path=path, line=1)

    try:
        file_bytes = os.fstat(stream.fileno()).st_size
    except (OSError, AttributeError, io.UnsupportedOperation):
        file_bytes = None
    for name, value in (("D", n_features), ("L", n_labels)):
        if file_bytes is None:
            check_width(value, name, fail)
        else:  # at most one column per byte of the file (and at least MIN_WIDTH_BOUND)
            check_file_width(value, name, file_bytes, fail)
    remaining = None if file_bytes is None else file_bytes - stream.tell()
    if remaining is not None and n_rows > remaining + 1:  # every row but the last ends with a newline
        raise fail(f"N={n_rows} rows cannot fit in the {remaining} bytes that follow the header")
    return n_rows, n_features, n_labels


def read_xc(path, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES, engine: str = "auto"
            ) -> Tuple[sp.csr_matrix, sp.csr_matrix]:
    """Read an XC text file into ``(X, Y)`` CSR matrices (float32; Y holds ones).

    Raises :class:`DataFormatError` naming the file, the 1-based line and the problem for a bad
    header, a row count different from the header's ``N``, an index out of range, a non-numeric,
    NaN or infinite value, a duplicate index or label in a row, or a malformed token.
    """
    path = Path(path)
    with open(path, "rb") as stream:
        n_rows, n_features, n_labels = read_xc_header(stream, path)
        grammar = Grammar(n_features=n_features, n_labels=n_labels, width_origin="the header (line 1)")
        rows = parse_stream(stream, grammar, path=path, first_line_no=2, max_rows=n_rows, chunk_bytes=chunk_bytes,
                            engine=engine)
    if rows.n_rows != n_rows:
        raise DataFormatError(
            f"the header (line 1) declares N={n_rows} rows but the file has only {rows.n_rows} "
            f"(it ends at line {rows.last_line})",
            path=path, line=rows.last_line,
        )
    return rows_to_csr(rows, n_features, n_labels)


def rows_to_csr(rows: ParsedRows, n_features: int, n_labels: int) -> Tuple[sp.csr_matrix, sp.csr_matrix]:
    """CSR matrices (X float32, Y of ones) from parsed rows, without copying the index arrays."""
    X = sp.csr_matrix((rows.X_data, rows.X_indices, rows.X_indptr), shape=(rows.n_rows, n_features), copy=False)
    Y = sp.csr_matrix((np.ones(rows.Y_indices.size, dtype=np.float32), rows.Y_indices, rows.Y_indptr),
                      shape=(rows.n_rows, n_labels), copy=False)
    X.has_sorted_indices = True
    Y.has_sorted_indices = True
    return X, Y


# ----------------------------------------------------------------------------------------------
# writing
# ----------------------------------------------------------------------------------------------
def format_values(values: np.ndarray, value_format: Optional[str] = None) -> np.ndarray:
    """Decimal strings for float32 ``values``.

    ``value_format=None`` writes the shortest decimal that reads back to exactly the same float32
    (integral values without a decimal point: ``1``, ``0.0937``, ``1e-06``). A printf-style format
    such as ``"%.6f"`` is applied as given (it may lose precision).
    """
    values = np.asarray(values, dtype=np.float32)
    if value_format is not None:
        return np.char.mod(value_format, values.astype(np.float64))
    text = values.astype(str)
    integral = (values == np.round(values)) & (np.abs(values) < 2**24) & ~np.signbit(values)
    if integral.all():
        return values.astype(np.int64).astype(str)
    if integral.any():
        text = text.astype(object)
        text[integral] = values[integral].astype(np.int64).astype(str)
    return text


def _value_text_table(values: np.ndarray, value_format: Optional[str]):
    """Decimal text of each distinct value: ``(ids, text bytes (n_distinct, width), lengths)``."""
    # distinct bit patterns, so that -0.0 and 0.0 keep their own text
    bits, ids = np.unique(np.ascontiguousarray(values, dtype=np.float32).view(np.uint32), return_inverse=True)
    distinct = bits.view(np.float32)
    encoded = np.asarray(format_values(distinct, value_format)).astype(str).astype("S")
    width = max(encoded.dtype.itemsize, 1)
    text = np.frombuffer(encoded.tobytes(), dtype=np.uint8).reshape(-1, width) if distinct.size else np.zeros(
        (0, width), dtype=np.uint8)
    lengths = (text != 0).sum(axis=1).astype(np.int64)
    return ids.astype(np.int64).ravel(), text, lengths


def write_sparse_rows(stream, X: sp.csr_matrix, Y: sp.csr_matrix, *, index_base: int = 0,
                      value_format: Optional[str] = None, rows_per_chunk: int = 50000) -> None:
    """Write rows ``l1,l2 i:v i:v`` (a row with no labels starts with a space) to a binary stream.

    ``X`` and ``Y`` are canonical CSR matrices (see :func:`canonical_csr`); values are formatted by
    :func:`format_values` (each distinct value of a chunk once) and the bytes assembled by a
    compiled kernel.
    """
    from ._kernels import assemble_rows

    n_rows = X.shape[0]
    for first in range(0, n_rows, rows_per_chunk):
        last = min(n_rows, first + rows_per_chunk)
        x_lo, x_hi = int(X.indptr[first]), int(X.indptr[last])
        y_lo, y_hi = int(Y.indptr[first]), int(Y.indptr[last])
        x_ptr = (X.indptr[first: last + 1] - x_lo).astype(np.int64)
        y_ptr = (Y.indptr[first: last + 1] - y_lo).astype(np.int64)
        ids, text, lengths = _value_text_table(X.data[x_lo:x_hi], value_format)
        capacity = (y_hi - y_lo) * 12 + (x_hi - x_lo) * (24 + text.shape[1]) + (last - first) * 2 + 16
        out = np.empty(capacity, dtype=np.uint8)
        size = assemble_rows(out, y_ptr, Y.indices[y_lo:y_hi].astype(np.int64), x_ptr,
                             X.indices[x_lo:x_hi].astype(np.int64), ids, text, lengths, index_base)
        stream.write(memoryview(out[:size]))


def canonical_csr(matrix, *, drop_zeros: bool = False) -> sp.csr_matrix:
    """``matrix`` as float32 CSR with sorted, unique indices per row (and no stored zeros if
    ``drop_zeros``). The input is never changed; it is copied only when it needs fixing."""
    out = sp.csr_matrix(matrix, dtype=np.float32)  # may share its arrays with the input
    needs_zeros_dropped = bool(drop_zeros and out.nnz and not np.all(out.data))
    if not out.has_canonical_format or needs_zeros_dropped:
        out = out.copy()
        out.sum_duplicates()
        out.sort_indices()
        if needs_zeros_dropped:
            out.eliminate_zeros()
    return out


def write_xc(path, X, Y, *, value_format: Optional[str] = None) -> None:
    """Write ``X`` (n, D) and ``Y`` (n, L) as an XC text file (header ``N D L``, 0-based indices).

    Indices are written in ascending order, explicitly stored zeros are kept, and with the default
    ``value_format=None`` every float32 value is written as the shortest decimal that reads back
    to the same float32, so :func:`read_xc` returns identical matrices.
    """
    X, Y = canonical_csr(X), canonical_csr(Y, drop_zeros=True)
    with open(path, "wb") as stream:
        stream.write(f"{X.shape[0]} {X.shape[1]} {Y.shape[1]}\n".encode())
        write_sparse_rows(stream, X, Y, index_base=0, value_format=value_format)
