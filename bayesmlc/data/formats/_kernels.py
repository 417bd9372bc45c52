"""Compiled (numba) kernels of the sparse text formats.

* :func:`scan_chunk` - the chunk scanner behind :mod:`bayesmlc.data.formats.sparse_text`. It
  implements the line grammar documented there, byte by byte, and must agree with the reference
  parser :func:`~bayesmlc.data.formats.sparse_text.parse_line` on every input (the fuzz tests
  compare them).
* :func:`assemble_rows` - writes rows ``l1,l2 i:v ...`` into a byte buffer for the writers.

Module-level functions so that numba's on-disk cache can key them.
"""

import numba
import numpy as np

STATUS_OK = 0
STATUS_BAD_LINE = 1
_INDEX_LIMIT = 2**31 - 1
_POW10 = np.array([10.0**k for k in range(23)], dtype=np.float64)  # exact in float64
_TWO53 = 2**53
_MANTISSA_CAP = 10**18


@numba.njit(cache=True, nogil=True)
def _is_ws(c):
    return c == 32 or c == 9 or c == 13


@numba.njit(cache=True, nogil=True)
def _is_digit(c):
    return c >= 48 and c <= 57


@numba.njit(cache=True, nogil=True)
def scan_chunk(buf, pos, end, max_rows, comments, skip_blank, colon_first, base, n_features, n_labels,
               lab_out, idx_out, val_out, row_lab, row_feat, row_start, hard_pos, hard_span):
    """Parse the lines of ``buf[pos:end]`` (uint8; ``buf[end - 1]`` is a newline).

    Parameters: ``max_rows`` stop after this many rows (-1: no limit); ``comments``, ``skip_blank``,
    ``colon_first``, ``base``: the dialect (see ``sparse_text.Grammar``); ``n_features``,
    ``n_labels``: exclusive index bounds (-1: up to ``_INDEX_LIMIT``). Outputs: ``lab_out``,
    ``idx_out`` (int32) and ``val_out`` (float32) receive labels, 0-based columns and values in file
    order; ``row_lab[r]``/``row_feat[r]`` the number of labels/features before row ``r``;
    ``row_start[r]`` the byte offset of row ``r``; ``hard_pos``/``hard_span`` the output position and
    byte span of each value left to Python's ``float()``.

    Returns (status, position after the last parsed line, rows, labels, features, hard values,
    unsorted flag (1 labels, 2 features), offset of the rejected line or -1, max label, max column).
    """
    n_rows = 0
    n_lab = 0
    n_feat = 0
    n_hard = 0
    unsorted = 0
    max_label = -1
    max_column = -1
    label_bound = n_labels if n_labels >= 0 else _INDEX_LIMIT
    column_bound = n_features if n_features >= 0 else _INDEX_LIMIT
    row_lab[0] = 0
    row_feat[0] = 0
    while pos < end:
        if max_rows >= 0 and n_rows >= max_rows:
            break
        line_start = pos
        nl = pos
        while buf[nl] != 10:
            nl += 1
        line_end = nl
        if comments:
            q = pos
            while q < line_end:
                if buf[q] == 35:
                    line_end = q
                    break
                q += 1
        next_pos = nl + 1
        q = pos
        while q < line_end and _is_ws(buf[q]):
            q += 1
        if q == line_end:
            pos = next_pos
            if skip_blank:
                continue
            row_start[n_rows] = line_start
            n_rows += 1
            row_lab[n_rows] = n_lab
            row_feat[n_rows] = n_feat
            continue
        feature_from = pos
        if not _is_ws(buf[pos]):
            field_end = pos
            has_colon = False
            while field_end < line_end and not _is_ws(buf[field_end]):
                if buf[field_end] == 58:
                    has_colon = True
                field_end += 1
            if has_colon:
                if not colon_first:
                    return (STATUS_BAD_LINE, pos, n_rows, n_lab, n_feat, n_hard, unsorted, line_start,
                            max_label, max_column)
            else:
                q = pos
                previous = -1
                while True:
                    if q >= field_end or not _is_digit(buf[q]):
                        return (STATUS_BAD_LINE, pos, n_rows, n_lab, n_feat, n_hard, unsorted, line_start,
                                max_label, max_column)
                    value = 0
                    while q < field_end and _is_digit(buf[q]):
                        if value < label_bound:
                            value = value * 10 + (buf[q] - 48)
                        q += 1
                    if value >= label_bound:
                        return (STATUS_BAD_LINE, pos, n_rows, n_lab, n_feat, n_hard, unsorted, line_start,
                                max_label, max_column)
                    lab_out[n_lab] = value
                    n_lab += 1
                    if value <= previous:
                        unsorted |= 1
                    previous = value
                    if value > max_label:
                        max_label = value
                    if q == field_end:
                        break
                    if buf[q] != 44:
                        return (STATUS_BAD_LINE, pos, n_rows, n_lab, n_feat, n_hard, unsorted, line_start,
                                max_label, max_column)
                    q += 1
                feature_from = field_end
        q = feature_from
        previous = -1
        while True:
            while q < line_end and _is_ws(buf[q]):
                q += 1
            if q >= line_end:
                break
            # index
            if not _is_digit(buf[q]):
                return (STATUS_BAD_LINE, pos, n_rows, n_lab, n_feat, n_hard, unsorted, line_start,
                        max_label, max_column)
            written = 0
            while q < line_end and _is_digit(buf[q]):
                if written <= column_bound + base:
                    written = written * 10 + (buf[q] - 48)
                q += 1
            if q >= line_end or buf[q] != 58:
                return (STATUS_BAD_LINE, pos, n_rows, n_lab, n_feat, n_hard, unsorted, line_start,
                        max_label, max_column)
            column = written - base
            if column < 0 or column >= column_bound:
                return (STATUS_BAD_LINE, pos, n_rows, n_lab, n_feat, n_hard, unsorted, line_start,
                        max_label, max_column)
            q += 1
            # value: [+-]? (digits [. digits*] | . digits) ([eE] [+-]? digits)?
            value_start = q
            negative = False
            if q < line_end and (buf[q] == 43 or buf[q] == 45):
                negative = buf[q] == 45
                q += 1
            mantissa = 0
            exponent = 0
            n_digits = 0
            hard = False
            while q < line_end and _is_digit(buf[q]):
                if mantissa < _MANTISSA_CAP:
                    mantissa = mantissa * 10 + (buf[q] - 48)
                else:
                    hard = True
                n_digits += 1
                q += 1
            if q < line_end and buf[q] == 46:
                q += 1
                while q < line_end and _is_digit(buf[q]):
                    if mantissa < _MANTISSA_CAP:
                        mantissa = mantissa * 10 + (buf[q] - 48)
                        exponent -= 1
                    else:
                        hard = True
                    n_digits += 1
                    q += 1
            if n_digits == 0:
                return (STATUS_BAD_LINE, pos, n_rows, n_lab, n_feat, n_hard, unsorted, line_start,
                        max_label, max_column)
            if q < line_end and (buf[q] == 101 or buf[q] == 69):
                q += 1
                exp_negative = False
                if q < line_end and (buf[q] == 43 or buf[q] == 45):
                    exp_negative = buf[q] == 45
                    q += 1
                if q >= line_end or not _is_digit(buf[q]):
                    return (STATUS_BAD_LINE, pos, n_rows, n_lab, n_feat, n_hard, unsorted, line_start,
                            max_label, max_column)
                written_exp = 0
                while q < line_end and _is_digit(buf[q]):
                    if written_exp < 100000:
                        written_exp = written_exp * 10 + (buf[q] - 48)
                    q += 1
                exponent += -written_exp if exp_negative else written_exp
            if q < line_end and not _is_ws(buf[q]):
                return (STATUS_BAD_LINE, pos, n_rows, n_lab, n_feat, n_hard, unsorted, line_start,
                        max_label, max_column)
            # exact fast path (Clinger, "How to read floating point numbers accurately", PLDI 1990):
            # an integer up to 2**53 and 10**|e| with |e| <= 22 are exact doubles, so one IEEE
            # multiplication or division gives the correctly rounded value, as float() does
            if mantissa == 0 and not hard:
                result = 0.0
            elif not hard and mantissa <= _TWO53 and exponent >= -22 and exponent <= 22:
                if exponent >= 0:
                    result = mantissa * _POW10[exponent]
                else:
                    result = mantissa / _POW10[-exponent]
            else:
                result = 0.0
                hard_pos[n_hard] = n_feat
                hard_span[n_hard, 0] = value_start
                hard_span[n_hard, 1] = q
                n_hard += 1
            if negative:
                result = -result
            stored = np.float32(result)
            if not np.isfinite(stored):
                return (STATUS_BAD_LINE, pos, n_rows, n_lab, n_feat, n_hard, unsorted, line_start,
                        max_label, max_column)
            idx_out[n_feat] = column
            val_out[n_feat] = stored
            n_feat += 1
            if column <= previous:
                unsorted |= 2
            previous = column
            if column > max_column:
                max_column = column
        row_start[n_rows] = line_start
        n_rows += 1
        row_lab[n_rows] = n_lab
        row_feat[n_rows] = n_feat
        pos = next_pos
    return (STATUS_OK, pos, n_rows, n_lab, n_feat, n_hard, unsorted, -1, max_label, max_column)


@numba.njit(cache=True, nogil=True)
def _write_int(out, at, value):
    """Decimal digits of the non-negative ``value`` into ``out[at:]``; returns the new position."""
    if value == 0:
        out[at] = 48
        return at + 1
    n_digits = 0
    rest = value
    while rest > 0:
        rest //= 10
        n_digits += 1
    end = at + n_digits
    rest = value
    for k in range(n_digits):
        out[end - 1 - k] = 48 + rest % 10
        rest //= 10
    return end


@numba.njit(cache=True, nogil=True)
def assemble_rows(out, y_ptr, labels, x_ptr, columns, value_ids, text, text_len, index_base):
    """Write one line per row into ``out``: ``l1,l2 c:v c:v`` (no labels: a leading space).

    ``value_ids[k]`` selects the decimal text of value ``k``: the bytes ``text[value_ids[k],
    :text_len[value_ids[k]]]``. Returns the number of bytes written; ``out`` must be large enough.
    """
    at = 0
    for row in range(y_ptr.size - 1):
        for k in range(y_ptr[row], y_ptr[row + 1]):
            if k > y_ptr[row]:
                out[at] = 44
                at += 1
            at = _write_int(out, at, labels[k])
        if x_ptr[row + 1] > x_ptr[row] or y_ptr[row + 1] == y_ptr[row]:
            out[at] = 32
            at += 1
        for k in range(x_ptr[row], x_ptr[row + 1]):
            if k > x_ptr[row]:
                out[at] = 32
                at += 1
            at = _write_int(out, at, columns[k] + index_base)
            out[at] = 58
            at += 1
            vid = value_ids[k]
            for b in range(text_len[vid]):
                out[at] = text[vid, b]
                at += 1
        out[at] = 10
        at += 1
    return at
