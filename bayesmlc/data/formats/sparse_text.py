"""Streaming parser shared by the line-oriented sparse text formats (Extreme Classification text and
svmlight/libsvm multi-label).

One row per line::

    l1,l2,... i:v i:v ...      labels, then features
     i:v i:v ...               a row with no labels starts with white space

The grammar of a line (white space is a run of spaces, tabs or carriage returns)::

    line    := blank | labels [ws features] [ws] | ws features [ws]
    labels  := int ("," int)*
    features:= feature (ws feature)*
    feature := int ":" float
    int     := [0-9]+
    float   := [+-]? ([0-9]+ ("." [0-9]*)? | "." [0-9]+) ([eE] [+-]? [0-9]+)?

Two engines implement it and must agree on every input:

* :func:`parse_line` - the reference, one line at a time in pure Python. It is the specification and
  it writes the error messages.
* a compiled scanner (numba) that walks a chunk of bytes and fills preallocated arrays, with no
  Python object per non-zero. When it meets anything it does not accept it stops and reports the byte
  offset of the offending line; the driver hands that line to :func:`parse_line`, which raises the
  :class:`~bayesmlc.exceptions.DataFormatError` with the file, the 1-based line number and the reason.

Decimal values are converted exactly: the scanner uses the exact fast path (an integer mantissa of
at most 2**53 times a power of ten of at most 22, one correctly rounded IEEE operation, as
``float()`` would give) and leaves every other literal to Python's ``float()``. Values are stored as
float32 (rounded from the correctly rounded float64).

The file is read in chunks of whole lines (``chunk_bytes``, 8 MiB by default) and the scanner writes
into output arrays grown in place, so the peak memory is about one copy of the output plus one
chunk's work arrays.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from typing import BinaryIO, List, Optional, Tuple

import numpy as np

from ...exceptions import DataFormatError

__all__ = ["Grammar", "ParsedRows", "parse_line", "parse_stream", "INDEX_LIMIT", "LineError"]

#: exclusive bound on 0-based feature and label indices when no width is given (indices are stored as int32)
INDEX_LIMIT = 2**31 - 1
DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024
_FLOAT32_MAX = float(np.finfo(np.float32).max)

_WS_BYTES = b" \t\r"
_WS_RUN = re.compile(rb"[ \t\r]+")
_FLOAT_LITERAL = re.compile(rb"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NAN_INF = {b"nan", b"inf", b"infinity"}


@dataclass(frozen=True)
class Grammar:
    """Dialect switches of the line grammar.

    Attributes
    ----------
    comments:
        ``#`` starts a comment running to the end of the line (svmlight).
    skip_blank:
        Blank lines (after removing comments) are not rows (svmlight). Otherwise a blank line is a
        row with no labels and no features (XC text).
    colon_first_means_no_labels:
        A line whose first field contains ``:`` has no labels (svmlight, as scikit-learn reads it).
        Otherwise such a line is an error: a row without labels must start with white space (XC).
    index_base:
        0 or 1: the feature index written for column 0.
    n_features, n_labels:
        Width bounds (indices must be below them), or ``None`` to accept any index below
        :data:`INDEX_LIMIT` and infer the width.
    base_hint:
        Added to the message when a feature index is below ``index_base``.
    width_origin:
        Where the bounds come from, for messages (for example "the header (line 1)").
    """

    comments: bool = False
    skip_blank: bool = False
    colon_first_means_no_labels: bool = False
    index_base: int = 0
    n_features: Optional[int] = None
    n_labels: Optional[int] = None
    base_hint: str = ""
    width_origin: str = "the header (line 1)"


class LineError(Exception):
    """What is wrong with one line (the driver adds the file and the line number)."""


def _show(token: bytes, limit: int = 40) -> str:
    text = token.decode("utf-8", errors="backslashreplace")
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _parse_int(token: bytes, what: str) -> int:
    if token.isdigit():
        return int(token)
    if token[:1] == b"-" and token[1:].isdigit():
        raise LineError(f"negative {what} {token.decode()}")
    if token == b"":
        raise LineError(f"empty {what}")
    raise LineError(f"{what} {_show(token)} is not a non-negative integer")


def parse_line(line: bytes, grammar: Grammar) -> Optional[Tuple[List[int], List[int], List[float]]]:
    """Parse one line (without its newline) into ``(labels, feature_columns, values)``.

    The reference implementation of the grammar (see the module docstring). Feature columns are
    0-based (the file's index minus ``grammar.index_base``); values are float32-representable
    Python floats. Returns ``None`` for a line that is not a row (a blank or comment line when
    ``grammar.skip_blank``). Raises :class:`LineError` saying what is wrong.
    """
    if grammar.comments:
        hash_at = line.find(b"#")
        if hash_at >= 0:
            line = line[:hash_at]
    if line.strip(_WS_BYTES) == b"":
        return None if grammar.skip_blank else ([], [], [])

    label_field, rest = b"", line
    if line[:1] not in (b" ", b"\t", b"\r"):
        gap = _WS_RUN.search(line)
        label_field = line if gap is None else line[: gap.start()]
        rest = b"" if gap is None else line[gap.start():]
        if b":" in label_field:
            if grammar.colon_first_means_no_labels:
                label_field, rest = b"", line
            else:
                raise LineError(
                    f"the first field {_show(label_field)} is not a label list: a row without labels "
                    "must start with a space"
                )

    labels: List[int] = []
    if label_field:
        seen = set()
        for part in label_field.split(b","):
            if part == b"":
                raise LineError(f"malformed label list {_show(label_field)}: empty label between commas")
            label = _parse_int(part, "label")
            if label >= (INDEX_LIMIT if grammar.n_labels is None else grammar.n_labels):
                if grammar.n_labels is None:
                    raise LineError(f"label {label} exceeds the largest supported index {INDEX_LIMIT - 1}")
                raise LineError(
                    f"label {label} out of range: {grammar.width_origin} declares L={grammar.n_labels} "
                    f"labels (valid 0..{grammar.n_labels - 1})"
                )
            if label in seen:
                raise LineError(f"duplicate label {label} in the row")
            seen.add(label)
            labels.append(label)

    columns: List[int] = []
    values: List[float] = []
    seen_columns = set()
    rest = rest.strip(_WS_BYTES)
    for token in _WS_RUN.split(rest) if rest else ():
        if token.count(b":") != 1:
            raise LineError(f"malformed feature {_show(token)}: expected index:value")
        index_text, value_text = token.split(b":")
        written = _parse_int(index_text, "feature index")
        column = written - grammar.index_base
        if column < 0:
            raise LineError(f"feature index {written} is below the first index {grammar.index_base}{grammar.base_hint}")
        if grammar.n_features is None:
            if column >= INDEX_LIMIT:
                raise LineError(f"feature index {written} exceeds the largest supported index {INDEX_LIMIT - 1}")
        elif column >= grammar.n_features:
            last = grammar.n_features - 1 + grammar.index_base
            raise LineError(
                f"feature index {written} out of range: {grammar.width_origin} declares D={grammar.n_features} "
                f"features (valid {grammar.index_base}..{last})"
            )
        if _FLOAT_LITERAL.fullmatch(value_text) is None:
            if value_text.lower().lstrip(b"+-") in _NAN_INF:
                raise LineError(f"NaN or infinite value {_show(value_text)} for feature {written}")
            raise LineError(f"non-numeric value {_show(value_text)} for feature {written}")
        value = float(value_text)
        with np.errstate(over="ignore"):
            stored = np.float32(value)
        if not np.isfinite(stored):
            raise LineError(
                f"value {_show(value_text)} for feature {written} is infinite or beyond the float32 range "
                f"(+-{_FLOAT32_MAX:.4g})"
            )
        if column in seen_columns:
            raise LineError(f"duplicate feature index {written} in the row")
        seen_columns.add(column)
        columns.append(column)
        values.append(float(stored))
    return labels, columns, values


# ----------------------------------------------------------------------------------------------
# compiled scanner
# ----------------------------------------------------------------------------------------------
_STATUS_OK = 0  # scan_chunk status: every line parsed (else the offset of a bad line is returned)


def _build_scanner():
    """The compiled chunk scanner (numba, cached on disk), or ``None`` if numba is unavailable."""
    try:
        from ._kernels import scan_chunk
    except ImportError:  # pragma: no cover - numba is a declared dependency
        return None
    return scan_chunk


_SCANNER = None
_SCANNER_BUILT = False


def _scanner():
    global _SCANNER, _SCANNER_BUILT
    if not _SCANNER_BUILT:
        _SCANNER = _build_scanner()
        _SCANNER_BUILT = True
    return _SCANNER


# ----------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------
@dataclass
class ParsedRows:
    """CSR parts of the rows read from a stream.

    ``X_indptr``/``X_indices``/``X_data`` and ``Y_indptr``/``Y_indices`` describe CSR matrices with
    ``n_rows`` rows; ``max_column``/``max_label`` are the largest indices seen (-1 when none);
    ``last_line`` is the number of the last line read.
    """

    X_indptr: np.ndarray
    X_indices: np.ndarray
    X_data: np.ndarray
    Y_indptr: np.ndarray
    Y_indices: np.ndarray
    n_rows: int
    max_column: int
    max_label: int
    last_line: int


class _Growable:
    """A 1-D array grown in place of a list of chunks.

    Capacity is allocated with ``np.empty`` and never touched before it is written, so unused
    capacity costs address space, not resident memory; growing copies only the filled part, and
    :meth:`finish` trims the array in place (no second copy of the output).
    """

    def __init__(self, dtype):
        self.array = np.empty(0, dtype=dtype)
        self.size = 0

    def reserve(self, extra: int, predicted: int = 0) -> None:
        """Make room for ``extra`` more items (at least ``predicted`` in all when growing)."""
        need = self.size + extra
        if need > self.array.size:
            grown = np.empty(max(need, predicted, self.array.size + self.array.size // 4), dtype=self.array.dtype)
            grown[: self.size] = self.array[: self.size]
            self.array = grown

    def free(self) -> np.ndarray:
        """The unfilled capacity (a view; the scanner writes into it)."""
        return self.array[self.size:]

    def extend(self, values) -> None:
        values = np.asarray(values, dtype=self.array.dtype)
        self.reserve(values.size)
        self.array[self.size: self.size + values.size] = values
        self.size += values.size

    def finish(self) -> np.ndarray:
        out, self.array = self.array, np.empty(0, dtype=self.array.dtype)
        try:
            out.resize(self.size, refcheck=False)  # in place: the allocator releases the unused tail
        except ValueError:  # pragma: no cover - the buffer is not owned; fall back to a copy
            out = out[: self.size].copy()
        return out


def _line_error(path, line_no: int, line: bytes, grammar: Grammar) -> DataFormatError:
    try:
        parse_line(line, grammar)
    except LineError as exc:
        return DataFormatError(str(exc), path=path, line=line_no)
    raise AssertionError(  # pragma: no cover - the two engines disagree: a bug, not a data error
        f"{path}:{line_no}: the compiled scanner rejected a line the reference parser accepts: {line[:200]!r}"
    )


class _Accumulator:
    """The growing CSR parts of the rows parsed so far.

    ``total_bytes`` (the file size, 0 if unknown) lets it predict the final number of entries
    from the bytes consumed so far, so the output arrays are allocated about once.
    """

    def __init__(self, total_bytes: int = 0):
        self.x_counts = _Growable(np.int64)
        self.y_counts = _Growable(np.int64)
        self.x_indices = _Growable(np.int32)
        self.x_data = _Growable(np.float32)
        self.y_indices = _Growable(np.int32)
        self.max_column = -1
        self.max_label = -1
        self.total_bytes = total_bytes
        self.bytes_done = 0

    @property
    def n_rows(self) -> int:
        return self.x_counts.size

    def predicted(self, filled: int) -> int:
        """Entries expected in all, extrapolated from ``filled`` after ``bytes_done`` bytes (+3%)."""
        if not self.bytes_done or not self.total_bytes:
            return 0
        return int(filled / self.bytes_done * self.total_bytes * 1.03) + 1024

    def add(self, x_counts, x_indices, x_data, y_counts, y_indices) -> None:
        self.x_counts.extend(x_counts)
        self.y_counts.extend(y_counts)
        self.x_indices.extend(x_indices)
        self.x_data.extend(x_data)
        self.y_indices.extend(y_indices)

    def finish(self, last_line: int) -> ParsedRows:
        def indptr(counts: _Growable) -> np.ndarray:
            per_row = counts.finish()
            out = np.zeros(per_row.size + 1, dtype=np.int64)
            np.cumsum(per_row, out=out[1:])
            return out.astype(np.int32) if out[-1] < 2**31 else out

        return ParsedRows(
            X_indptr=indptr(self.x_counts), X_indices=self.x_indices.finish(), X_data=self.x_data.finish(),
            Y_indptr=indptr(self.y_counts), Y_indices=self.y_indices.finish(), n_rows=self.n_rows,
            max_column=self.max_column, max_label=self.max_label, last_line=last_line,
        )


def _sort_rows(indptr: np.ndarray, indices: np.ndarray):
    """Sort ``indices`` within each CSR row: ``(sorted indices, order, first row with a repeat or -1)``."""
    counts = np.diff(indptr)
    rows = np.repeat(np.arange(counts.size), counts)
    order = np.lexsort((indices, rows))
    indices_sorted = indices[order]
    same = (indices_sorted[1:] == indices_sorted[:-1]) & (rows[1:] == rows[:-1])
    first_repeat = int(rows[1:][same][0]) if same.any() else -1
    return indices_sorted, order, first_repeat


def _parse_chunk_compiled(scan, buf: bytes, end: int, max_rows: int, grammar: Grammar, path,
                          first_line_no: int, acc: _Accumulator) -> int:
    """Parse the whole lines of ``buf[:end]`` (line ``first_line_no`` first) into ``acc``.

    The scanner writes labels, columns and values straight into the accumulator's spare capacity.
    Returns the position after the last row taken. The scanner stops at the first line it rejects;
    values it left to ``float()`` and repeated indices in rows with unsorted indices are checked
    afterwards, and the earliest offending line (in file order) is reported by :func:`parse_line`.
    """
    array = np.frombuffer(buf, dtype=np.uint8)
    n_lines = buf.count(b"\n", 0, end)
    row_lab = np.empty(n_lines + 1, dtype=np.int64)
    row_feat = np.empty(n_lines + 1, dtype=np.int64)
    row_start = np.empty(n_lines + 1, dtype=np.int64)
    feature_bound, label_bound = end // 4 + 1, end // 2 + 1  # "0:1 " and "0," are the shortest tokens
    acc.x_indices.reserve(feature_bound, acc.predicted(acc.x_indices.size))
    acc.x_data.reserve(feature_bound, acc.predicted(acc.x_data.size))
    acc.y_indices.reserve(label_bound, acc.predicted(acc.y_indices.size))
    hard_pos = np.empty(feature_bound, dtype=np.int64)
    hard_span = np.empty((feature_bound, 2), dtype=np.int64)
    columns_out, values_out, labels_out = acc.x_indices.free(), acc.x_data.free(), acc.y_indices.free()
    status, pos, n_rows, n_lab, n_feat, n_hard, unsorted, bad_at, max_label, max_column = scan(
        array, 0, end, max_rows, grammar.comments, grammar.skip_blank, grammar.colon_first_means_no_labels,
        grammar.index_base, -1 if grammar.n_features is None else grammar.n_features,
        -1 if grammar.n_labels is None else grammar.n_labels,
        labels_out, columns_out, values_out, row_lab, row_feat, row_start, hard_pos, hard_span,
    )
    # rows 0..n_rows-1 are complete; on failure the rejected line is "row" n_rows
    bad_rows = [n_rows] if status != _STATUS_OK else []
    n_feat, n_lab = int(row_feat[n_rows]), int(row_lab[n_rows])
    for k in range(n_hard):
        with np.errstate(over="ignore"):
            stored = np.float32(float(buf[hard_span[k, 0]: hard_span[k, 1]]))
        if not np.isfinite(stored):
            bad_rows.append(int(np.searchsorted(row_feat[: n_rows + 1], hard_pos[k], side="right")) - 1)
            break
        if hard_pos[k] < n_feat:
            values_out[hard_pos[k]] = stored
    if unsorted & 2 and n_feat:
        columns, order, repeat = _sort_rows(row_feat[: n_rows + 1], columns_out[:n_feat])
        columns_out[:n_feat] = columns
        values_out[:n_feat] = values_out[:n_feat][order]
        bad_rows += [repeat] if repeat >= 0 else []
    if unsorted & 1 and n_lab:
        labels, _, repeat = _sort_rows(row_lab[: n_rows + 1], labels_out[:n_lab])
        labels_out[:n_lab] = labels
        bad_rows += [repeat] if repeat >= 0 else []
    del columns_out, values_out, labels_out  # views of the accumulator's arrays
    if bad_rows:
        row = min(bad_rows)
        at = bad_at if row >= n_rows else int(row_start[row])
        line_no = first_line_no + buf.count(b"\n", 0, at)
        raise _line_error(path, line_no, buf[at: buf.find(b"\n", at)], grammar)
    acc.x_indices.size += n_feat
    acc.x_data.size += n_feat
    acc.y_indices.size += n_lab
    acc.x_counts.extend(np.diff(row_feat[: n_rows + 1]))
    acc.y_counts.extend(np.diff(row_lab[: n_rows + 1]))
    acc.max_column = max(acc.max_column, int(max_column))
    acc.max_label = max(acc.max_label, int(max_label))
    return pos


def _parse_chunk_python(buf: bytes, end: int, max_rows: int, grammar: Grammar, path, first_line_no: int,
                        acc: _Accumulator) -> int:
    """The reference counterpart of :func:`_parse_chunk_compiled`, one :func:`parse_line` per line."""
    x_counts, y_counts, columns, values, labels = [], [], [], [], []
    pos = 0
    line_no = first_line_no
    taken = 0
    while pos < end and (max_rows < 0 or taken < max_rows):
        stop = buf.index(b"\n", pos)
        try:
            parsed = parse_line(buf[pos:stop], grammar)
        except LineError as exc:
            raise DataFormatError(str(exc), path=path, line=line_no) from None
        pos = stop + 1
        line_no += 1
        if parsed is None:
            continue
        row_labels, row_columns, row_values = parsed
        order = np.argsort(row_columns, kind="stable")
        columns.extend(np.asarray(row_columns, dtype=np.int64)[order].tolist())
        values.extend(np.asarray(row_values, dtype=np.float64)[order].tolist())
        labels.extend(sorted(row_labels))
        x_counts.append(len(row_columns))
        y_counts.append(len(row_labels))
        taken += 1
        if row_columns:
            acc.max_column = max(acc.max_column, max(row_columns))
        if row_labels:
            acc.max_label = max(acc.max_label, max(row_labels))
    acc.add(x_counts, columns, values, y_counts, labels)
    return pos


def parse_stream(stream: BinaryIO, grammar: Grammar, *, path, first_line_no: int = 1, max_rows: int = -1,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, engine: str = "auto") -> ParsedRows:
    """Parse the rest of a binary ``stream`` as rows.

    Parameters
    ----------
    stream:
        Binary file object positioned at the first row.
    grammar:
        The dialect (:class:`Grammar`).
    path:
        File name for error messages.
    first_line_no:
        1-based number of the line the stream is positioned at.
    max_rows:
        Stop after this many rows (-1: read to the end). After them only blank lines may follow;
        anything else is a :class:`DataFormatError` ("more rows than declared").
    chunk_bytes:
        Bytes read per chunk (whole lines are parsed; a longer line is read whole).
    engine:
        ``"auto"`` (compiled scanner when numba is available), ``"compiled"`` or ``"python"``
        (the reference parser; slow, for tests).
    """
    if engine not in ("auto", "compiled", "python"):
        raise ValueError(f"engine must be 'auto', 'compiled' or 'python', got {engine!r}")
    scan = None if engine == "python" else _scanner()
    if engine == "compiled" and scan is None:  # pragma: no cover
        raise RuntimeError("the compiled scanner needs numba, which is not installed")
    try:
        total_bytes = os.fstat(stream.fileno()).st_size
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        total_bytes = 0
    acc = _Accumulator(total_bytes)
    carry = b""
    line_no = first_line_no
    at_eof = False
    while not at_eof:
        data = stream.read(chunk_bytes)
        at_eof = not data
        buf = carry + data if carry else data
        if at_eof:
            if not buf:
                break
            if not buf.endswith(b"\n"):
                buf += b"\n"
            end = len(buf)
        else:
            end = buf.rfind(b"\n") + 1
            if end == 0:
                carry = buf
                continue
        remaining = -1 if max_rows < 0 else max_rows - acc.n_rows
        if remaining == 0:
            pos = 0
        elif scan is not None:
            pos = _parse_chunk_compiled(scan, buf, end, remaining, grammar, path, line_no, acc)
        else:
            pos = _parse_chunk_python(buf, end, remaining, grammar, path, line_no, acc)
        if pos < end:  # the declared number of rows is reached: the rest must be blank
            extra = buf[pos:end]
            if extra.strip(b" \t\r\n"):
                offset = len(extra) - len(extra.lstrip(b" \t\r\n"))
                bad_line = line_no + buf.count(b"\n", 0, pos + offset)
                raise DataFormatError(
                    f"more rows than the {max_rows} declared in the header (line 1)", path=path, line=bad_line
                )
        line_no += buf.count(b"\n", 0, end)
        acc.bytes_done += end
        carry = buf[end:]
    return acc.finish(last_line=line_no - 1)
