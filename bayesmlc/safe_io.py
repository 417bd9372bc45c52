"""Reading untrusted files safely, and writing outputs so that they appear whole or not at all.

Every reader of a file bayesmlc did not just write itself (dataset ``.npz`` files and their cache,
model files, checkpoints) goes through these checks:

* :class:`LazyNpz` opens an ``.npz`` archive without decompressing anything; a member is read only
  when asked for, after the size its zip header and its ``.npy`` header declare has been checked
  against :func:`memory_limit_bytes` (and against each other), never with pickles.
* :func:`checked_csr` verifies every part of a stored CSR matrix (shape, ``indptr`` starting at 0,
  non-decreasing and ending at ``nnz``, every column index in range) before scipy sees it: scipy's
  compiled routines trust these arrays and write out of bounds otherwise.
* :func:`check_width` refuses a declared number of features or labels whose per-column arrays
  (frequencies, propensities, weights) could not fit in memory, and :func:`check_file_width` one
  that the file declaring it cannot back: more columns than the file has bytes (and more than
  :data:`MIN_WIDTH_BOUND`), so that no small file makes a command build wide arrays.
* :func:`open_regular_file` opens only regular files (never blocking on a FIFO, never reading a
  device such as ``/dev/zero``), and :class:`LazyNpz` reads through it; a member is inflated only
  when the bytes the archive stores for it can hold what it declares.

For writing, temporary names carry a bayesmlc marker and the writer's process id
(``.NAME.bayesmlc-tmp-PID-XXXXXXXX``), so the next writer in the same folder can remove what a killed
process left behind without touching the temporaries of one still running, nor any file bayesmlc did
not write (:func:`remove_stale_temporaries`). Outputs replace only regular files
(:func:`check_output_target`): a device, FIFO, socket or folder in the way is refused before anything
is written.
"""

from __future__ import annotations

import os
import re
import tempfile
import zipfile
from typing import Callable, Iterator, Mapping

import numpy as np
import scipy.sparse as sp

__all__ = ["memory_limit_bytes", "physical_memory_bytes", "format_bytes", "check_width", "checked_csr", "LazyNpz", "BYTES_PER_COLUMN",
           "check_file_width", "MIN_WIDTH_BOUND", "open_regular_file", "read_regular_file", "DEFLATE_MAX_RATIO",
           "temporary_prefix", "remove_stale_temporaries", "check_output_target", "TEMPORARY_MARKER", "apply_umask_mode", "make_temporary_file", "error_factory",
           "MEMORY_LIMIT_ENV"]

#: environment variable that caps (in bytes, or with a K/M/G/T suffix) what a reader may allocate
MEMORY_LIMIT_ENV = "BAYESMLC_MEMORY_LIMIT"
#: bytes per feature or label column that training and statistics allocate at the least (a few
#: float64/int64 arrays of length D or L: counts, propensities, weights, optimiser state)
BYTES_PER_COLUMN = 64
_FALLBACK_LIMIT = 16 * 2**30
_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_READ_BLOCK = 1 << 20
#: a file may always declare this many feature or label columns, however small it is
#: (:func:`check_file_width`); beyond it, at most one column per byte of the file. 2^20 columns cost
#: BYTES_PER_COLUMN x 2^20 = 64 MiB of per-column arrays, and let a short file of a wide vocabulary
#: (one document to score, a sample of a text set) name the feature indices it really uses
MIN_WIDTH_BOUND = 1 << 20
#: deflate's largest expansion: a 258-byte match coded in 2 bits, about 1032 to 1
DEFLATE_MAX_RATIO = 1032
#: the marker in the name of every temporary file or folder bayesmlc writes; nothing else is ever cleaned
TEMPORARY_MARKER = "bayesmlc-tmp"
#: a whole temporary name: hidden, the marker, the writer's pid, then tempfile's 8 random characters and
#: an optional suffix (what :func:`temporary_prefix` and :func:`make_temporary_file` produce)
_TEMP_PATTERN = re.compile(r"^\..+\." + TEMPORARY_MARKER + r"-(\d+)-[a-z0-9_]{8}(\.[A-Za-z0-9]+)?$")


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units: ``'1.5 GiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    raise AssertionError  # pragma: no cover


def physical_memory_bytes() -> int | None:
    """The machine's physical memory in bytes, or None where the platform does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def memory_limit_bytes() -> int:
    """What one read may allocate: ``$BAYESMLC_MEMORY_LIMIT`` if set, else the memory available now
    (``MemAvailable`` of ``/proc/meminfo``; physical memory where that does not exist)."""
    raw = os.environ.get(MEMORY_LIMIT_ENV, "").strip().upper().removesuffix("B").removesuffix("I")
    if raw:
        number, suffix = (raw[:-1], raw[-1]) if raw[-1] in _SUFFIXES else (raw, "")
        try:
            return max(0, int(float(number) * _SUFFIXES[suffix]))
        except ValueError:
            pass  # a malformed setting is ignored, the measured limit applies
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    physical = physical_memory_bytes()
    return _FALLBACK_LIMIT if physical is None else physical


def check_width(value: int, what: str, fail: Callable[[str], Exception]) -> None:
    """Raise ``fail(message)`` when ``value`` columns (features or labels, named ``what``) would need
    more memory than :func:`memory_limit_bytes` at :data:`BYTES_PER_COLUMN` bytes each."""
    limit = memory_limit_bytes()
    needed = int(value) * BYTES_PER_COLUMN
    if needed > limit:
        raise fail(f"{what}={value}: too large for this machine ({BYTES_PER_COLUMN} bytes per column make "
                   f"{format_bytes(needed)}, {format_bytes(limit)} is available; ${MEMORY_LIMIT_ENV} sets the bound)")


def check_file_width(value: int, what: str, file_bytes: int, fail: Callable[[str], Exception]) -> None:
    """Raise ``fail(message)`` when a file of ``file_bytes`` bytes declares or implies ``value``
    columns (features or labels, named ``what``) that it cannot back: more than
    ``max(MIN_WIDTH_BOUND, file_bytes)``. Then :func:`check_width` (the machine's memory).

    A column costs a model and the statistics arrays of their own, whatever the file holds in it;
    a width of more columns than the file has bytes is a header or an index that its contents do
    not support (``1 1 100000000`` and one row, or one label ``100000000`` in a 20-byte file), and
    would otherwise make a 20-byte file allocate gigabytes. Widths a caller gives (svmlight's
    ``n_features``/``n_labels``) are the caller's, and are not checked here.
    """
    bound = max(MIN_WIDTH_BOUND, int(file_bytes))
    if int(value) > bound:
        raise fail(f"{what}={value}: too large for a file of {file_bytes} bytes (a file may declare at most "
                   f"max({MIN_WIDTH_BOUND}, its size in bytes) = {bound} columns)")
    check_width(value, what, fail)


def open_regular_file(path, fail: Callable[[str], Exception]):
    """``path`` opened for binary reading, if it is a regular file (a link is followed); else
    ``fail(message)`` naming what it is. A FIFO is opened without blocking and refused, so that a
    reader never waits for a writer; a device (``/dev/zero``) is refused unread."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise fail(f"cannot read the file: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "not a regular file")
        raise fail(f"is {kind}; only regular files are read")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular_file(path, max_bytes: int, fail: Callable[[str], Exception]) -> bytes:
    """The bytes of the regular file ``path`` (:func:`open_regular_file`), refused by
    ``fail(message)`` when it holds more than ``max_bytes``: read at most ``max_bytes + 1``."""
    with open_regular_file(path, fail) as stream:
        data = stream.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise fail(f"holds more than {format_bytes(max_bytes)}, more than such a file can need")
    return data


def _integer_array(array, name: str, fail) -> np.ndarray:
    if not isinstance(array, np.ndarray) or array.ndim != 1 or array.dtype.kind not in "iu":
        shown = f"{array.dtype} array of shape {array.shape}" if isinstance(array, np.ndarray) else type(array).__name__
        raise fail(f"{name} must be a 1-D integer array, got {shown}")
    return array


def checked_csr(data, indices, indptr, shape, fail: Callable[[str], Exception], what: str = "matrix",
                dtype=None) -> sp.csr_matrix:
    """A CSR matrix from stored parts, after checking all of them; ``fail(message)`` is raised otherwise.

    Checks: ``shape`` is two non-negative integers (columns below 2**31); ``indptr`` has ``rows + 1``
    integer entries, starts at 0, never decreases and ends at ``len(indices)``; every index is in
    ``[0, columns)``; ``data`` (if not ``None``: then all ones) is 1-D numeric of the same length.
    Nothing here is O(columns) in memory. ``dtype`` converts ``data``.
    """
    try:
        shape = tuple(shape)
        if len(shape) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                                      for v in shape):
            raise TypeError
        n_rows, n_columns = (int(v) for v in shape)
    except TypeError:
        raise fail(f"{what}: shape must be two integers, got {str(shape)[:80]}") from None
    if n_rows < 0 or n_columns < 0 or n_columns > np.iinfo(np.int32).max + 1 or n_rows > 2**62:
        raise fail(f"{what}: shape {shape} is out of range")
    indptr = _integer_array(indptr, f"{what}: indptr", fail)
    indices = _integer_array(indices, f"{what}: indices", fail)
    if indptr.size != n_rows + 1:
        raise fail(f"{what}: indptr has {indptr.size} entries, the shape {shape} needs {n_rows + 1}")
    if indptr[0] != 0 or indptr[-1] != indices.size:
        raise fail(f"{what}: indptr must run from 0 to the number of stored entries ({indices.size}), "
                   f"runs from {int(indptr[0])} to {int(indptr[-1])}")
    if n_rows and np.any(indptr[1:] < indptr[:-1]):
        row = int(np.flatnonzero(indptr[1:] < indptr[:-1])[0])
        raise fail(f"{what}: indptr decreases at row {row}")
    if indices.size:
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= n_columns:
            bad = low if low < 0 else high
            raise fail(f"{what}: column index {bad} is out of range for {n_columns} columns")
    if data is None:
        data = np.ones(indices.size, dtype=np.float32 if dtype is None else dtype)
    elif not isinstance(data, np.ndarray) or data.ndim != 1 or data.dtype.kind not in "biuf":
        shown = f"{data.dtype} of shape {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise fail(f"{what}: data must be a 1-D numeric array, got {shown}")
    if data.size != indices.size:
        raise fail(f"{what}: {data.size} values for {indices.size} indices")
    if dtype is not None:
        data = data.astype(dtype, copy=False)
    matrix = sp.csr_matrix((data, indices, indptr), shape=(n_rows, n_columns), copy=False)
    return matrix


class LazyNpz(Mapping):
    """The arrays of an ``.npz`` archive, each read (and decompressed) only when it is looked up.

    ``fail(message)`` builds the exception raised for anything wrong with the file, which must be a
    regular file (:func:`open_regular_file`). Every member read is bounded before decompression:
    it must be stored or deflated (what NumPy writes); a stored member must store exactly the bytes
    it declares, within the file; a deflated one may declare at most :data:`DEFLATE_MAX_RATIO` times
    what it stores; the size its zip header declares must match what its ``.npy`` header declares;
    all members read through one ``LazyNpz`` together must stay within ``limit`` bytes (default
    :func:`memory_limit_bytes`), and may add at most ``inflation_budget`` bytes (default: no bound)
    beyond what the file stores for them. Object arrays are refused. Use as a context manager, or
    call :meth:`close`.
    """

    def __init__(self, path, fail: Callable[[str], Exception], limit: int | None = None, kind: str = ".npz",
                 inflation_budget: int | None = None):
        self.path = os.fspath(path)
        self._fail = fail
        self._limit = memory_limit_bytes() if limit is None else int(limit)
        self._inflation_budget = inflation_budget
        self._used = self._inflated = 0
        self._stream = open_regular_file(self.path, fail)
        self.size = os.fstat(self._stream.fileno()).st_size
        try:
            self._zip = zipfile.ZipFile(self._stream)
            infos = self._zip.infolist()
        except OSError as exc:
            self._stream.close()
            raise fail(f"cannot read the file: {exc.strerror or exc}") from None
        except Exception as exc:  # BadZipFile, and the ValueError/EOFError/struct.error of damaged archives
            self._stream.close()
            raise fail(f"not a readable {kind} file ({type(exc).__name__}: {exc})") from None
        self._members = {}
        for info in infos:
            if info.filename.endswith(".npy"):
                self._members[info.filename[:-4]] = info

    # ---- Mapping ---------------------------------------------------------------------------------
    @property
    def files(self) -> list:
        return list(self._members)

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, key) -> bool:
        return key in self._members

    def declared_size(self, key: str) -> int:
        """Bytes the member ``key`` declares uncompressed (its zip header), read without decompressing."""
        return self._members[key].file_size

    def __getitem__(self, key) -> np.ndarray:
        if not isinstance(key, str) or key not in self._members:
            raise self._fail(f"no member {str(key)[:100]!r} in the archive")
        info = self._members[key]
        self._check_stored_bytes(key, info)
        if info.file_size > self._limit - self._used:
            raise self._fail(f"member {key!r} declares {format_bytes(info.file_size)} uncompressed, more than the "
                             f"{format_bytes(max(self._limit - self._used, 0))} of memory left for this file "
                             f"(${MEMORY_LIMIT_ENV} sets the bound)")
        try:
            with self._zip.open(info) as stream:
                array = self._read_member(key, info, stream)
        except OSError as exc:
            raise self._fail(f"cannot read member {key!r}: {exc}") from None
        except Exception as exc:
            if isinstance(exc, getattr(self._fail, "error_type", ())):
                raise
            raise self._fail(f"member {key!r} is damaged ({type(exc).__name__}: {exc})") from None
        self._used += info.file_size
        self._inflated += max(0, info.file_size - info.compress_size)
        return array

    def _check_stored_bytes(self, key: str, info: zipfile.ZipInfo) -> None:
        """Refuse a member whose declared size the bytes the archive stores for it cannot hold,
        before anything is inflated (see the class docstring)."""
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise self._fail(f"member {key!r} is compressed with zip method {info.compress_type}; only stored "
                             "and deflated members (what NumPy writes) are read")
        if info.header_offset + info.compress_size > self.size:
            raise self._fail(f"member {key!r} runs past the end of the file ({info.compress_size} bytes at offset "
                             f"{info.header_offset} of a {self.size}-byte file)")
        if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            raise self._fail(f"member {key!r} declares {info.file_size} bytes but stores {info.compress_size}")
        if info.file_size > DEFLATE_MAX_RATIO * info.compress_size + 1024:
            raise self._fail(f"member {key!r} declares {format_bytes(info.file_size)}, more than the "
                             f"{info.compress_size} bytes it stores can inflate to")
        growth = max(0, info.file_size - info.compress_size)
        if self._inflation_budget is not None and self._inflated + growth > self._inflation_budget:
            raise self._fail(f"member {key!r} inflates from {format_bytes(info.compress_size)} to "
                             f"{format_bytes(info.file_size)}, beyond the {format_bytes(self._inflation_budget)} "
                             "that compressed members of such a file may add (bayesmlc writes them uncompressed)")

    def _read_member(self, key: str, info: zipfile.ZipInfo, stream) -> np.ndarray:
        fmt = np.lib.format
        version = fmt.read_magic(stream)
        if version == (1, 0):
            shape, fortran_order, dtype = fmt.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran_order, dtype = fmt.read_array_header_2_0(stream)
        else:
            raise self._fail(f"member {key!r}: unsupported .npy version {version}")
        if dtype.hasobject:
            raise self._fail(f"member {key!r} holds Python objects, which are never loaded")
        count = 1
        for extent in shape:
            count *= int(extent)
        nbytes = count * dtype.itemsize
        header_bytes = stream.tell()
        if nbytes != info.file_size - header_bytes:
            raise self._fail(f"member {key!r}: its .npy header declares {nbytes} bytes of data, the archive "
                             f"{info.file_size - header_bytes}")
        out = np.empty(count, dtype=dtype)
        view = memoryview(out.view(np.uint8)) if nbytes else None
        filled = 0
        while filled < nbytes:
            got = stream.readinto(view[filled: filled + _READ_BLOCK])
            if not got:
                raise self._fail(f"member {key!r} is truncated")
            filled += got
        if fortran_order:
            return out.reshape(shape[::-1]).transpose()
        return out.reshape(shape)

    # ---- lifetime --------------------------------------------------------------------------------
    def close(self) -> None:
        self._zip.close()
        self._stream.close()

    def __enter__(self) -> "LazyNpz":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def error_factory(error_type, describe: Callable[[str], str] | None = None, **kwargs) -> Callable[[str], Exception]:
    """``fail(message) -> error_type(describe(message), **kwargs)`` (``describe`` defaults to the
    message itself), recognised by :class:`LazyNpz` as its own."""
    def fail(message: str) -> Exception:
        return error_type(message if describe is None else describe(message), **kwargs)

    fail.error_type = error_type
    return fail


# ---- writing ----------------------------------------------------------------------------------------
def temporary_prefix(name: str) -> str:
    """Prefix of a temporary file or folder standing in for ``name``: ``.NAME.bayesmlc-tmp-PID-``."""
    return f".{name}.{TEMPORARY_MARKER}-{os.getpid()}-"


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # exists but belongs to someone else, or cannot tell: leave it
    return True


def remove_stale_temporaries(folder) -> list:
    """Remove the temporaries in ``folder`` whose writing process is gone; returns what was removed.

    Only entries whose whole name is one bayesmlc writes (``.NAME.bayesmlc-tmp-PID-XXXXXXXX[.ext]``,
    see :func:`temporary_prefix`) whose process ``PID`` no longer runs are removed, and only regular
    files and real folders among them (never a link, a device or a FIFO): a file of the user's that
    merely looks temporary is left alone.
    """
    import shutil

    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_PATTERN.match(entry.name)
        if not match or _pid_alive(int(match.group(1))):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            elif entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
            else:
                continue
            removed.append(entry.path)
        except OSError:
            pass
    return removed


def check_output_target(path, what: str | None = None) -> None:
    """Refuse to write ``path`` when something other than a regular file is there.

    A save writes a temporary and renames it over ``path``; over a device (``/dev/null``), a FIFO, a
    socket or a folder that rename would replace a thing that is not the user's data file. A link is
    followed: the question is what it points to. Raises :class:`~bayesmlc.exceptions.OutputPathError`
    naming ``what`` (the argument, if given) and the path.
    """
    import stat

    from .exceptions import OutputPathError

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputPathError(f"{what + ' ' if what else ''}{os.fspath(path)}: cannot inspect: "
                              f"{exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "not a regular file")
        raise OutputPathError(f"{what + ' ' if what else ''}{os.fspath(path)}: is {kind}; bayesmlc only replaces "
                              "regular files")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask_mode(path, directory: bool = False) -> None:
    """Give ``path`` the permissions a plain ``open``/``mkdir`` would (``mkstemp``/``mkdtemp`` make
    private ones): 0666 (0777 for a folder) less the umask."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def make_temporary_file(folder, name: str, suffix: str = "") -> tuple[int, str]:
    """``(fd, path)`` of a new temporary for ``folder/name``, with the umask's permissions; refuses
    (:func:`check_output_target`) when ``folder/name`` is there and is not a regular file."""
    check_output_target(os.path.join(folder, name))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=temporary_prefix(name), suffix=suffix)
    try:
        apply_umask_mode(tmp)
    except OSError:
        pass
    return fd, tmp
