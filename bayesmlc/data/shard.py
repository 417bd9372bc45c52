"""Rows split over processes: which rows a process holds (:func:`shard_bounds`, :class:`RowShard`),
and a reader that loads only those rows of a data file (:func:`read_shard`).

A data-parallel run (:mod:`bayesmlc.distributed`) gives each of ``W`` processes a contiguous range of
the global row order; these pieces know nothing of how the processes talk to each other.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..exceptions import DataFormatError, ValidationError
from ..safe_io import LazyNpz, error_factory
from .dataset import Dataset
from .formats.cache import check_dataset_npz, csr_from_members
from .formats.sparse_text import Grammar, parse_stream
from .formats.xc import read_xc_header, rows_to_csr
from .io import infer_format

__all__ = ["RowShard", "shard_bounds", "read_shard"]


def shard_bounds(n_rows: int, rank: int, world_size: int) -> tuple:
    """Rows ``[start, stop)`` of a batch of ``n_rows`` that ``rank`` computes.

    Contiguous shares whose sizes differ by at most one, the larger ones first (so rank 0 is empty
    only when the batch is); the shares of ranks 0..world_size-1 tile ``range(n_rows)`` in order.
    """
    base, extra = divmod(n_rows, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


@dataclass(frozen=True)
class RowShard:
    """The rows ``[start, stop)`` of an ordered set of ``n_total`` rows that this process holds.

    The shards of the ranks 0..W-1 tile ``range(n_total)`` in order, so global row ``g`` is local
    row ``g - start`` of the rank whose shard contains it. One process holds ``RowShard.whole(n)``.
    """

    start: int
    stop: int
    n_total: int

    @classmethod
    def whole(cls, n_total: int) -> "RowShard":
        return cls(0, int(n_total), int(n_total))

    @property
    def n_local(self) -> int:
        return self.stop - self.start

    def positions_in(self, sorted_ids: np.ndarray) -> slice:
        """The positions in ``sorted_ids`` (increasing global row ids) of the rows this shard holds:
        a contiguous range, since the shard is a contiguous range of ids."""
        low, high = np.searchsorted(sorted_ids, [self.start, self.stop])
        return slice(int(low), int(high))

    def select(self, sorted_ids: np.ndarray):
        """(local row indices, RowShard) for the subset ``sorted_ids`` of the global rows: this
        shard's members of the subset as local indices, and its shard of the subset (positions in
        ``sorted_ids``), which again tile the subset in rank order."""
        held = self.positions_in(sorted_ids)
        local = np.asarray(sorted_ids[held], dtype=np.int64) - self.start
        return local, RowShard(held.start, held.stop, len(sorted_ids))

    def gather(self, rows, global_ids: np.ndarray, reduce) -> np.ndarray:
        """Dense float64 ``(len(global_ids), C)`` copy of the global rows ``global_ids`` (any order)
        of a row-sharded matrix whose local part is ``rows`` (dense or sparse, ``n_local`` rows):
        each process fills the rows it holds, zeros elsewhere, and ``reduce`` sums over processes."""
        global_ids = np.asarray(global_ids, dtype=np.int64)
        out = np.zeros((global_ids.size, rows.shape[1]), dtype=np.float64)
        held = (global_ids >= self.start) & (global_ids < self.stop)
        if held.any():
            part = rows[global_ids[held] - self.start]
            out[held] = part.toarray() if sp.issparse(part) else part
        return reduce(out)


_SCAN_BYTES = 1 << 24


def read_shard(path, parallel, format: str | None = None):
    """Read only this rank's rows of a data file: a :class:`~bayesmlc.data.dataset.Dataset` of the
    rows ``shard_bounds(N, parallel.rank, parallel.world_size)``.

    ``parallel`` is any object with ``rank`` and ``world_size`` (a
    :class:`~bayesmlc.distributed.DataParallel`; :class:`~bayesmlc.distributed.SingleProcess` reads
    every row). Formats:

    * ``npz`` (a bayesmlc dataset file or the ``read_dataset(..., cache=True)`` cache): the row
      pointers of the rank's rows are read, then only the slices of the column-index and value
      arrays they point to (the archive's members are read at an offset, never whole);
    * ``xc`` text: the file is scanned for the byte offsets of the rank's first and last lines (a
      chunked newline count, constant memory) and only those lines are parsed.

    Memory: the rank's rows plus O(N) row pointers (8 bytes per row) for ``npz``; names (``L`` label
    and ``D`` feature names, when the file has them) are read whole. ``source["shard"]`` records
    ``start``, ``stop`` and ``n_rows`` (N). Whole-file checks that need every row (more rows than
    the header declares after the last one) are left to :func:`bayesmlc.data.io.read_dataset`.
    """
    path = Path(path)
    fmt = infer_format(path) if format is None else format
    if not path.is_file():
        raise DataFormatError("no such file" if not path.exists() else "not a regular file", path=path)
    if fmt == "npz":
        dataset = _read_npz_shard(path, parallel.rank, parallel.world_size)
    elif fmt == "xc":
        dataset = _read_xc_shard(path, parallel.rank, parallel.world_size)
    else:
        raise ValidationError(
            f"read_shard reads the npz and xc formats, not {fmt!r}: convert the file once with "
            "bayesmlc.data.io.write_dataset(read_dataset(path), 'train.npz')"
        )
    return dataset


def _npz_slice(archive: zipfile.ZipFile, name: str, start: int, stop: int, path) -> np.ndarray:
    """Elements ``[start, stop)`` of the 1-D array member ``name`` of an ``.npz``, read at an offset.

    A stored (uncompressed, as ``numpy.savez`` writes) member is read straight from the file at
    its offset; a compressed one through the zip stream, whose forward seek decompresses and
    discards (in bounded chunks)."""
    try:
        info = archive.getinfo(f"{name}.npy")
    except KeyError:
        raise DataFormatError(f"not a bayesmlc dataset .npz: missing {name}", path=path) from None
    if info.compress_type == zipfile.ZIP_STORED:
        stream = open(path, "rb")
        stream.seek(info.header_offset)
        local_header = stream.read(30)  # the member's local header: fixed 30 bytes, then name and extra field
        if len(local_header) != 30 or local_header[:4] != b"PK\x03\x04":
            stream.close()
            raise DataFormatError(f"member {name}: corrupt zip header", path=path)
        name_length = int.from_bytes(local_header[26:28], "little")
        extra_length = int.from_bytes(local_header[28:30], "little")
        stream.seek(info.header_offset + 30 + name_length + extra_length)
    else:
        stream = archive.open(info)
    with stream:
        version = np.lib.format.read_magic(stream)
        readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in readers:
            raise DataFormatError(f"member {name}: unsupported .npy version {version}", path=path)
        shape, fortran_order, dtype = readers[version](stream)
        if len(shape) != 1 or not 0 <= start <= stop <= shape[0]:
            raise DataFormatError(f"member {name}: shape {shape} does not hold elements [{start}, {stop})", path=path)
        stream.seek(stream.tell() + start * dtype.itemsize)
        out = np.empty(stop - start, dtype=dtype)
        n_read = stream.readinto(memoryview(out).cast("B")) if out.nbytes else 0
    if n_read != out.nbytes:
        raise DataFormatError(f"member {name} is truncated", path=path)
    return out


def _read_npz_shard(path: Path, rank: int, world_size: int):
    # members are read lazily and bounded before decompression; the large ones only as row slices below
    archive_npz = LazyNpz(path, error_factory(DataFormatError, path=path), kind="dataset .npz")
    with archive_npz, zipfile.ZipFile(path) as archive:
        members = set(archive_npz.files)
        check_dataset_npz(members, archive_npz.__getitem__, path)
        n_rows = int(archive_npz["X_shape"][0])
        start, stop = shard_bounds(n_rows, rank, world_size)

        def rows_of(prefix: str, with_data: bool) -> sp.csr_matrix:
            """Rows [start, stop) of the stored CSR matrix ``prefix``, from slices of its members."""
            n_columns = int(archive_npz[f"{prefix}_shape"][1])
            indptr = _npz_slice(archive, f"{prefix}_indptr", start, stop + 1, path).astype(np.int64)
            first, last = int(indptr[0]), int(indptr[-1])
            part = {f"{prefix}_indptr": indptr - first, f"{prefix}_shape": (stop - start, n_columns),
                    f"{prefix}_indices": _npz_slice(archive, f"{prefix}_indices", first, last, path)}
            if with_data:
                part[f"{prefix}_data"] = _npz_slice(archive, f"{prefix}_data", first, last, path)
            return csr_from_members(part, prefix, path)

        X, Y = rows_of("X", True), rows_of("Y", False)
        mask = rows_of("mask", False) if "mask_indptr" in members else None
        names = {key: archive_npz[key].tolist() if key in members else None for key in ("feature_names", "label_names")}
        source = dict(json.loads(str(archive_npz["meta"])).get("source", {}))
    source["shard"] = {"start": start, "stop": stop, "n_rows": n_rows, "loaded_from": str(path.resolve())}
    return Dataset(X=X, Y=Y, label_mask=mask, source=source, **names)


def _line_offsets(stream, lines: tuple) -> list:
    """Byte offsets (from the file's start) where the 0-based ``lines`` (increasing, counted from the
    stream's position) begin; the end of the file for lines past it. Constant memory."""
    offsets, position, line = [], stream.tell(), 0
    wanted = list(lines)
    while wanted and wanted[0] == 0:
        offsets.append(position)
        wanted.pop(0)
    while wanted:
        chunk = stream.read(_SCAN_BYTES)
        if not chunk:
            break
        newlines = chunk.count(b"\n")
        at = 0
        while wanted and line + newlines >= wanted[0]:
            for _ in range(wanted[0] - line):  # step to the newline ending line wanted[0] - 1
                at = chunk.index(b"\n", at) + 1
            newlines -= wanted[0] - line
            line = wanted.pop(0)
            offsets.append(position + at)
        line += newlines
        position += len(chunk)
    return offsets + [position] * len(wanted)


def _read_xc_shard(path: Path, rank: int, world_size: int):
    with open(path, "rb") as stream:
        n_rows, n_features, n_labels = read_xc_header(stream, path)
        start, stop = shard_bounds(n_rows, rank, world_size)
        begin, end = _line_offsets(stream, (start, stop))
        stream.seek(begin)
        text = stream.read(end - begin)
    grammar = Grammar(n_features=n_features, n_labels=n_labels, width_origin="the header (line 1)")
    rows = parse_stream(io.BytesIO(text), grammar, path=path, first_line_no=start + 2, max_rows=stop - start)
    if rows.n_rows != stop - start:
        raise DataFormatError(
            f"the header (line 1) declares N={n_rows} rows but the file ends at line {rows.last_line}",
            path=path, line=rows.last_line,
        )
    X, Y = rows_to_csr(rows, n_features, n_labels)
    source = {"path": str(path.resolve()), "format": "xc", "size_bytes": path.stat().st_size,
              "shard": {"start": start, "stop": stop, "n_rows": n_rows}}
    return Dataset(X=X, Y=Y, source=source)
