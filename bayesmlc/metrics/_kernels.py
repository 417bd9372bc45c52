"""Compiled (numba) kernels of the metrics over dense (rows, labels) arrays: one pass over the array
each, with no temporaries of its size (but the copy of the scores that :func:`row_rank_sums` writes
for the micro AUC's sort).

* :func:`top_k_rows` - each row's ``k`` highest values, best first, ties to the lower label index
  (:func:`bayesmlc.metrics.topk`), by a bounded heap per row: O(L log k) a row at worst.
* :func:`probability_bins` - the all-pairs calibration bins (count and sum of probabilities per
  equal-width bin) of :func:`bayesmlc.metrics.calibration.reliability_curve`.
* :func:`row_rank_sums`, :func:`label_rank_sums` - the Mann-Whitney rank sums of the instance (per
  row) and macro (per label) AUCs (:mod:`bayesmlc.metrics.auc`): each positive score is compared with
  every score of its row or label column (a loop the compiler vectorises), or located in a sorted
  copy when the group has many positives.

The first two check their input as they read it and return the flat position of the first entry
that fails (a non-finite score; a probability outside [0, 1]), or -1; the caller raises the error.
Module-level functions so that numba's on-disk cache can key them.
"""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def _worse(value_a, index_a, value_b, index_b):
    """Whether entry a ranks below entry b: a lower value, or an equal value at a higher label."""
    return value_a < value_b or (value_a == value_b and index_a > index_b)


@numba.njit(cache=True, nogil=True)
def _sift_down(values, indices, size, position):
    """Restore the heap order (the worst entry at the root) below ``position``."""
    while True:
        child = 2 * position + 1
        if child >= size:
            return
        if child + 1 < size and _worse(values[child + 1], indices[child + 1], values[child], indices[child]):
            child += 1
        if not _worse(values[child], indices[child], values[position], indices[position]):
            return
        values[child], values[position] = values[position], values[child]
        indices[child], indices[position] = indices[position], indices[child]
        position = child


#: scores :func:`top_k_rows` checks at once (finite? any above the heap's root?) before looking at each
_SCAN_WIDTH = 64


@numba.njit(cache=True, nogil=True)
def top_k_rows(scores, k, indices, values):
    """Fill ``indices[i]`` (int64) and ``values[i]`` (k,) with row i's ``k`` best entries of
    ``scores`` (n, L), ``k <= L``, best first; ties go to the lower label index, so the result is
    ``argsort(-scores, kind="stable")[:, :k]``. Runs of ``_SCAN_WIDTH`` scores are tested at once and
    read one by one only when one of them is non-finite or above the heap's root. Returns the flat
    position of the first non-finite score, or -1 (the rows after it are left unfilled)."""
    n, n_labels = scores.shape
    heap_values = np.empty(k, dtype=scores.dtype)
    heap_indices = np.empty(k, dtype=np.int64)
    for row in range(n):
        for column in range(k):  # the first k entries, heapified (worst at the root)
            value = scores[row, column]
            if not np.isfinite(value):
                return row * n_labels + column
            heap_values[column] = value
            heap_indices[column] = column
        for position in range(k // 2 - 1, -1, -1):
            _sift_down(heap_values, heap_indices, k, position)
        floor = heap_values[0]
        for first in range(k, n_labels, _SCAN_WIDTH):
            end = min(first + _SCAN_WIDTH, n_labels)
            finite, above = True, False  # of this run of scores, in a loop the compiler vectorises
            for column in range(first, end):
                finite &= np.abs(scores[row, column]) < np.inf
                above |= scores[row, column] > floor
            if finite and not above:
                continue
            for column in range(first, end):
                value = scores[row, column]
                if not np.isfinite(value):
                    return row * n_labels + column
                if value > floor:  # an equal value at a later label ranks below the root
                    heap_values[0] = value
                    heap_indices[0] = column
                    _sift_down(heap_values, heap_indices, k, 0)
                    floor = heap_values[0]
        for size in range(k, 0, -1):  # pop the worst to the back: best first
            indices[row, size - 1] = heap_indices[0]
            values[row, size - 1] = heap_values[0]
            heap_values[0] = heap_values[size - 1]
            heap_indices[0] = heap_indices[size - 1]
            _sift_down(heap_values, heap_indices, size - 1, 0)
    return -1


@numba.njit(cache=True, nogil=True)
def probability_bins(proba, n_bins, block_rows, counts, sums):
    """Add to ``counts`` (int64) and ``sums`` (float64), both (n_bins,), the number and the sum of the
    probabilities of ``proba`` (n, L) in each equal-width bin [b/n_bins, (b+1)/n_bins) (the last bin
    closed at 1), with the bin of p ``min(int(float64(p) * n_bins), n_bins - 1)``. The sums are taken
    over blocks of ``block_rows`` rows, each block's from zero in row-major order, then added (the
    order of ``numpy.bincount`` over the same blocks: the same float64 sums). Returns the flat
    position of the first value outside [0, 1] (NaN included), or -1."""
    n, n_labels = proba.shape
    block_sums = np.zeros(n_bins)
    for start in range(0, n, block_rows):
        block_sums[:] = 0.0
        current, run_sum, run_count = 0, 0.0, 0  # the bin of the last value, kept in registers
        for row in range(start, min(start + block_rows, n)):
            for column in range(n_labels):
                value = np.float64(proba[row, column])
                if not (value >= 0.0 and value <= 1.0):
                    return row * n_labels + column
                which = min(int(value * n_bins), n_bins - 1)
                if which != current:  # store the run; each bin's sum still adds its values in order
                    block_sums[current] = run_sum
                    counts[current] += run_count
                    current, run_sum, run_count = which, block_sums[which], 0
                run_sum += value
                run_count += 1
        block_sums[current] = run_sum
        counts[current] += run_count
        for which in range(n_bins):
            sums[which] += block_sums[which]
    return -1


#: a group with at most this many positives compares each positive with every score of the group (a
#: loop the compiler vectorises, about 0.1 ns a comparison); one with more sorts its scores and
#: searches for each positive
LINEAR_MAX = 256
#: the most scores a group may have to be counted by comparisons: the count is a float32 sum, exact
#: below 2^24 (each score adds 0, 1 or 2); a larger group is sorted
LINEAR_MAX_SCORES = 1 << 23


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _count_twice(scores, size, value):
    """(#entries of ``scores[:size]`` below ``value``) + (#at or below it), ``size`` at most
    ``LINEAR_MAX_SCORES``: a float32 sum the compiler may reassociate (and so vectorise), exact here."""
    total = np.float32(0.0)
    for entry in range(size):
        total += np.float32(scores[entry] < value) + np.float32(scores[entry] <= value)
    return np.int64(total)


@numba.njit(cache=True, nogil=True)
def _group_rank_sum(scores, size, positives, begin, end):
    """The sum over the positive scores ``positives[begin:end]`` of (#entries of ``scores[:size]``
    below it + #at or below it): the rank sum of :func:`bayesmlc.metrics.auc._auc_per_group`.
    Entries set to +inf (unobserved) count for no positive."""
    total = 0
    if end - begin <= LINEAR_MAX and size <= LINEAR_MAX_SCORES:
        for position in range(begin, end):
            total += _count_twice(scores, size, positives[position])
    else:
        ordered = np.sort(scores[:size])
        for position in range(begin, end):
            total += np.searchsorted(ordered, positives[position], side="left")
            total += np.searchsorted(ordered, positives[position], side="right")
    return total


@numba.njit(cache=True, nogil=True)
def row_rank_sums(scores, observed_ptr, observed_columns, masked, row_ptr, row_values, row_sums, observed, keep):
    """Set ``row_sums[i]`` (int64) to row i's rank sum (:func:`_group_rank_sum`) over its observed
    entries of ``scores`` (n, L): every entry, or with ``masked`` the columns
    ``observed_columns[observed_ptr[i]:observed_ptr[i + 1]]``; the row's positive scores are
    ``row_values[row_ptr[i]:row_ptr[i + 1]]`` (a row without one is left alone). Each row's observed
    scores are copied into ``observed`` (1-D): with ``keep``, row after row (as many entries as all
    rows observe: the micro AUC sorts them), else each over the last (as many as the widest row)."""
    n, n_labels = scores.shape
    end = 0
    for index in range(n):
        if not keep:
            end = 0
        begin = end
        if masked:
            for entry in range(observed_ptr[index], observed_ptr[index + 1]):
                observed[end] = scores[index, observed_columns[entry]]
                end += 1
        else:
            for column in range(n_labels):
                observed[end] = scores[index, column]
                end += 1
        if row_ptr[index] < row_ptr[index + 1]:
            row_sums[index] = _group_rank_sum(observed[begin:end], end - begin, row_values, row_ptr[index],
                                              row_ptr[index + 1])


@numba.njit(cache=True, nogil=True)
def _fill_masked_tile(tile, scores, first_row, height, first_column, end_column, observed_ptr, observed_columns,
                      cursor):
    """``tile[c - first_column, i]`` = the score of row ``first_row + i``, column c, for the observed
    entries with c < ``end_column`` at or after each row's ``cursor`` (columns ascending), +inf
    elsewhere; advances the cursors past ``end_column`` (they start at ``first_column``)."""
    tile[:, :height] = np.inf
    for offset in range(height):
        entry = cursor[offset]
        end = observed_ptr[first_row + offset + 1]
        while entry < end and observed_columns[entry] < end_column:
            column = observed_columns[entry]
            tile[column - first_column, offset] = scores[first_row + offset, column]
            entry += 1
        cursor[offset] = entry


@numba.njit(cache=True, nogil=True)
def _skip_columns(first_row, height, end_column, observed_ptr, observed_columns, cursor):
    """Advance each row's ``cursor`` past the observed columns below ``end_column``."""
    for offset in range(height):
        entry = cursor[offset]
        end = observed_ptr[first_row + offset + 1]
        while entry < end and observed_columns[entry] < end_column:
            entry += 1
        cursor[offset] = entry


@numba.njit(cache=True, nogil=True)
def label_rank_sums(scores, observed_ptr, observed_columns, masked, label_ptr, label_values, tile_rows, tile_columns,
                    label_sums):
    """Add to ``label_sums[l]`` (int64) label l's rank sum over its column's observed entries (as
    :func:`row_rank_sums`; with ``masked``, each row's ``observed_columns`` must be ascending); the
    label's positive scores are ``label_values[label_ptr[l]:label_ptr[l + 1]]``. The scores are
    copied ``tile_rows`` x ``tile_columns`` at a time into a column-major tile (reading rows
    contiguously), each label's part of a tile counted on its own (the counts add up)."""
    n, n_labels = scores.shape
    tile = np.empty((tile_columns, tile_rows), dtype=scores.dtype)
    cursor = np.empty(tile_rows, dtype=np.int64)
    for first_row in range(0, n, tile_rows):
        height = min(tile_rows, n - first_row)
        if masked:
            cursor[:height] = observed_ptr[first_row:first_row + height]
        for first_column in range(0, n_labels, tile_columns):
            end_column = min(n_labels, first_column + tile_columns)
            if label_ptr[first_column] == label_ptr[end_column]:  # no positive in these labels
                if masked:
                    _skip_columns(first_row, height, end_column, observed_ptr, observed_columns, cursor)
                continue
            if masked:
                _fill_masked_tile(tile, scores, first_row, height, first_column, end_column, observed_ptr,
                                  observed_columns, cursor)
            else:
                for offset in range(height):
                    for column in range(first_column, end_column):
                        tile[column - first_column, offset] = scores[first_row + offset, column]
            for column in range(first_column, end_column):
                label_sums[column] += _group_rank_sum(tile[column - first_column], height, label_values,
                                                      label_ptr[column], label_ptr[column + 1])


@numba.njit(cache=True, nogil=True)
def _first_argmax(row):
    """``np.argmax(row)``: the first maximum, or the first NaN when there is one."""
    best, position = row[0], 0
    if best != best:
        return 0
    for j in range(1, row.shape[0]):
        value = row[j]
        if value != value:
            return j
        if value > best:
            best, position = value, j
    return position


@numba.njit(cache=True, nogil=True)
def entries_at_or_above(values, bounds, fill_empty):
    """The CSR ``(indptr, indices)`` (int64) of the entries with ``values[i, j] >= bounds[j]`` (a NaN
    is never selected), each row's columns ascending; with ``fill_empty``, a row with none gets its
    :func:`_first_argmax` instead. Two passes over the values: the counts, then the columns."""
    n, n_labels = values.shape
    indptr = np.zeros(n + 1, dtype=np.int64)
    fallback = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        count = 0
        for j in range(n_labels):
            count += values[i, j] >= bounds[j]
        if count == 0 and fill_empty and n_labels > 0:
            fallback[i] = _first_argmax(values[i])
            count = 1
        indptr[i + 1] = indptr[i] + count
    indices = np.empty(indptr[n], dtype=np.int64)
    for i in range(n):
        position = indptr[i]
        if fallback[i] >= 0:
            indices[position] = fallback[i]
            continue
        for j in range(n_labels):
            if values[i, j] >= bounds[j]:
                indices[position] = j
                position += 1
    return indptr, indices
