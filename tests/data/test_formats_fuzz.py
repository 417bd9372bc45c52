"""Fuzzing the readers: any input gives a valid Dataset or a DataFormatError (a model or a
ModelFormatError for model files), nothing else: no crash, hang, traceback or allocation over 1 GB.

Text parsers: the compiled scanner and the pure-Python reference parser agree on every input (same
matrices, or the same error at the same line); written files read back exactly. Binary files (.npz
datasets, .mat, model files): random bytes, byte mutations of valid files, structured mutations of
their arrays and records, and extreme declared sizes (XC headers, svmlight indices, zip and .npy
headers), with ``$BAYESMLC_MEMORY_LIMIT`` at 1 GiB and the memory every read allocates traced."""

from __future__ import annotations

import json
import os
import signal
import struct
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bayesmlc.data.formats.arff import read_arff
from bayesmlc.data.formats.svmlight import read_svmlight
from bayesmlc.data.formats.xc import read_xc, write_xc
from bayesmlc.data.io import read_dataset
from bayesmlc.exceptions import DataFormatError, ModelFormatError, ValidationError
from bayesmlc.safe_io import MEMORY_LIMIT_ENV

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
WORKDIR = Path(tempfile.mkdtemp(prefix="bayesmlc-fuzz-"))

# bytes that matter to the grammar, plus a few that do not belong in it
ALPHABET = b"0123456789:, \t\r\n.-+eE#x{}?"
grammar_bytes = st.lists(st.sampled_from(list(ALPHABET)), max_size=120).map(bytes)
any_bytes = st.binary(max_size=200)


def _outcome(read, data: bytes, name: str, **kwargs):
    """('ok', X, Y) or ('error', message, line); any other exception propagates and fails the test."""
    path = WORKDIR / name
    path.write_bytes(data)
    try:
        X, Y = read(path, **kwargs)
    except DataFormatError as exc:
        assert exc.path == str(path)
        return ("error", exc.reason, exc.line)
    assert X.dtype == np.float32 and Y.dtype == np.float32 and X.shape[0] == Y.shape[0]
    assert np.all(np.isfinite(X.data)) and np.all(Y.data == 1)
    X.check_format(full_check=True)
    Y.check_format(full_check=True)
    return ("ok", X, Y)


def _assert_engines_agree(read, data: bytes, **kwargs):
    outcomes = [_outcome(read, data, "f", engine=engine, **kwargs) for engine in ("compiled", "python")]
    compiled, python = outcomes
    assert compiled[0] == python[0], (data, compiled, python)
    if compiled[0] == "error":
        assert compiled[1:] == python[1:], data
    else:
        for a, b in zip(compiled[1:], python[1:]):
            assert a.shape == b.shape and np.array_equal(a.indptr, b.indptr)
            assert np.array_equal(a.indices, b.indices) and np.array_equal(a.data, b.data)
    return compiled


@FUZZ
@given(body=grammar_bytes, header=st.sampled_from([b"", b"3 5 4\n", b"2 9 3\n", b"1 1 1\n", b"0 0 0\n"]),
       chunk=st.sampled_from([1, 7, 1 << 16]))
def test_xc_grammar_bytes(body, header, chunk):
    _assert_engines_agree(read_xc, header + body, chunk_bytes=chunk)


@FUZZ
@given(data=any_bytes)
def test_xc_arbitrary_bytes(data):
    _assert_engines_agree(read_xc, data)


def _valid_xc(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    n, d, n_labels = rng.integers(1, 6), rng.integers(1, 8), rng.integers(1, 5)
    X = sp.random(n, d, density=0.5, format="csr", random_state=seed, dtype=np.float32)
    X.data = (rng.normal(size=X.nnz) * 10.0 ** rng.integers(-3, 4, size=X.nnz)).astype(np.float32)
    Y = sp.random(n, n_labels, density=0.4, format="csr", random_state=seed + 1)
    Y.data[:] = 1
    path = WORKDIR / "valid.txt"
    write_xc(path, X, Y)
    return path.read_bytes()


mutation = st.tuples(st.sampled_from(["insert", "delete", "replace"]), st.integers(0, 10**6),
                     st.sampled_from(list(ALPHABET) + [0, 0xFF]))


def _mutate(data: bytes, mutations) -> bytes:
    buf = bytearray(data)
    for kind, where, byte in mutations:
        at = where % (len(buf) + 1)
        if kind == "insert":
            buf.insert(at, byte)
        elif buf and kind == "delete":
            del buf[at % len(buf)]
        elif buf:
            buf[at % len(buf)] = byte
    return bytes(buf)


@FUZZ
@given(seed=st.integers(0, 10**6), mutations=st.lists(mutation, min_size=1, max_size=4))
def test_xc_mutated_valid_files(seed, mutations):
    _assert_engines_agree(read_xc, _mutate(_valid_xc(seed), mutations))


@FUZZ
@given(body=grammar_bytes, zero_based=st.booleans())
def test_svmlight_grammar_bytes(body, zero_based):
    _assert_engines_agree(read_svmlight, body, zero_based=zero_based)


@FUZZ
@given(data=any_bytes)
def test_svmlight_arbitrary_bytes(data):
    _assert_engines_agree(read_svmlight, data)


ARFF_SEED = (b"@relation 'r: -C -2'\n@attribute a numeric\n@attribute 'b c' {0,1}\n@attribute l0 {0,1}\n"
             b"@attribute l1 {0,1}\n@data\n1.5,1,0,1\n{0 2,3 1}\n-1,0,?,0\n")


@FUZZ
@given(mutations=st.lists(mutation, min_size=1, max_size=4))
def test_arff_mutated(mutations):
    path = WORKDIR / "m.arff"
    path.write_bytes(_mutate(ARFF_SEED, mutations))
    try:
        data = read_arff(path)
    except DataFormatError:
        return
    assert data.X.dtype == np.float32 and np.all(np.isfinite(data.X.data))


@FUZZ
@given(data=any_bytes, n_labels=st.sampled_from([None, 1]))
def test_arff_arbitrary_bytes(data, n_labels):
    path = WORKDIR / "a.arff"
    path.write_bytes(data)
    try:
        read_arff(path, n_labels=n_labels)
    except DataFormatError:
        pass


finite_float32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(values=st.lists(finite_float32, min_size=1, max_size=40), seed=st.integers(0, 1000))
def test_xc_write_read_is_exact(values, seed):
    rng = np.random.default_rng(seed)
    n, d = 4, 12
    positions = rng.choice(n * d, size=min(len(values), n * d), replace=False)
    X = sp.csr_matrix((np.asarray(values[: positions.size], dtype=np.float32), (positions // d, positions % d)),
                      shape=(n, d))
    Y = sp.csr_matrix((rng.random((n, 3)) < 0.5).astype(np.float32))
    path = WORKDIR / "rt.txt"
    write_xc(path, X, Y)
    data = read_dataset(path)
    X.sort_indices()
    assert np.array_equal(data.X.indptr, X.indptr) and np.array_equal(data.X.indices, X.indices)
    assert np.array_equal(data.X.data.view(np.uint32), X.data.view(np.uint32))  # bit for bit, -0.0 too
    assert np.array_equal(data.Y.toarray(), Y.toarray())


# ---- binary files and extreme declared sizes -------------------------------------------------------
FUZZ_FILES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
ONE_GIB = 2**30
EXTREME = st.sampled_from([-1, -(2**31), 2**31 - 1, 2**31, 2**32 + 1, 2**40, 2**62, 2**63 - 1])


class _Hang(Exception):
    pass


def _bounded(call, allowed):
    """``call()`` with at most 1 GiB traced and 30 s of wall time; returns its result, or ``None``
    when it raised one of ``allowed`` (anything else propagates and fails the test)."""
    def alarm(signum, frame):
        raise _Hang("a read took more than 30 s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, 30)
    tracemalloc.start()
    try:
        try:
            return call()
        except allowed as exc:
            assert str(exc) and "\n" not in str(exc).strip(), exc
            return None
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            assert peak < ONE_GIB, f"a read allocated {peak} bytes"
    finally:
        tracemalloc.stop()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module", autouse=True)
def _memory_limit():
    old = os.environ.get(MEMORY_LIMIT_ENV)
    os.environ[MEMORY_LIMIT_ENV] = str(ONE_GIB)
    yield
    if old is None:
        del os.environ[MEMORY_LIMIT_ENV]
    else:
        os.environ[MEMORY_LIMIT_ENV] = old


def _check_dataset(data):
    for matrix in (data.X, data.Y) + (() if data.label_mask is None else (data.label_mask,)):
        matrix.check_format(full_check=True)
        assert matrix.shape[0] == data.n_samples
    assert np.all(np.isfinite(data.X.data)) and np.all(data.Y.data == 1)


def _read_file(data: bytes, name: str, **options):
    path = WORKDIR / name
    path.write_bytes(data)
    dataset = _bounded(lambda: read_dataset(path, **options), DataFormatError)
    if dataset is not None:
        _check_dataset(dataset)
    return dataset


@FUZZ_FILES
@given(n_rows=st.integers(0, 2**64), n_features=st.integers(0, 2**64), n_labels=st.integers(0, 2**64),
       body=st.sampled_from([b"", b"0 1:1\n", b"1,2 0:1 3:2\n 4:1\n"]))
def test_xc_extreme_header_sizes(n_rows, n_features, n_labels, body):
    _read_file(f"{n_rows} {n_features} {n_labels}\n".encode() + body, "h.txt")


@FUZZ_FILES
@given(label=st.integers(0, 2**40), feature=st.integers(0, 2**40), zero_based=st.booleans())
def test_svmlight_extreme_indices(label, feature, zero_based):
    _read_file(f"{label} {feature}:1\n0 1:1\n".encode(), "h.svm", zero_based=zero_based)


@FUZZ_FILES
@given(n_labels=st.integers(0, 2**40), mutations=st.lists(mutation, max_size=3))
def test_arff_extreme_label_count(n_labels, mutations):
    text = ARFF_SEED.replace(b"-C -2", f"-C {n_labels}".encode())
    _read_file(_mutate(text, mutations), "h.arff")


def _valid_dataset(seed: int):
    from bayesmlc.data.dataset import Dataset

    rng = np.random.default_rng(seed)
    n, d, n_labels = 6, 5, 4
    X = sp.random(n, d, density=0.5, format="csr", random_state=seed, dtype=np.float32)
    Y = sp.csr_matrix((rng.random((n, n_labels)) < 0.5).astype(np.float32))
    mask = sp.csr_matrix((rng.random((n, n_labels)) < 0.8).astype(np.float32))
    return Dataset(X=X, Y=Y, label_mask=mask, feature_names=[f"f{i}" for i in range(d)],
                   label_names=[f"l{j}" for j in range(n_labels)])


def _npz_members(seed: int) -> dict:
    from bayesmlc.data.formats.cache import save_npz

    path = save_npz(_valid_dataset(seed), WORKDIR / "valid.npz")
    with np.load(path, allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}


DTYPES = [np.float64, np.float16, np.int8, np.uint64, np.bool_, "<U3", np.complex64, object]
array_edit = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 100), st.integers(0, 100), EXTREME | st.integers(-3, 8)),
    st.tuples(st.just("dtype"), st.integers(0, 100), st.sampled_from(DTYPES)),
    st.tuples(st.just("drop"), st.integers(0, 100)),
    st.tuples(st.just("reshape"), st.integers(0, 100)),
    st.tuples(st.just("truncate"), st.integers(0, 100), st.integers(0, 5)),
)


def _edit_arrays(arrays: dict, edits) -> dict:
    arrays = dict(arrays)
    for edit in edits:
        keys = sorted(arrays)
        if not keys:
            break
        key = keys[edit[1] % len(keys)]
        value = np.array(arrays[key])
        if edit[0] == "set" and value.size and value.dtype.kind in "iuf":
            flat = value.reshape(-1).astype(np.float64 if value.dtype.kind == "f" else np.int64)
            flat[edit[2] % flat.size] = edit[3]
            arrays[key] = flat.reshape(value.shape)
        elif edit[0] == "dtype":
            try:
                arrays[key] = value.astype(edit[2])
            except (ValueError, TypeError, OverflowError):
                pass
        elif edit[0] == "drop":
            del arrays[key]
        elif edit[0] == "reshape":
            arrays[key] = value.reshape(1, -1)
        elif edit[0] == "truncate" and value.ndim == 1:
            arrays[key] = value[: edit[2]]
    return arrays


def _savez(path: Path, arrays: dict, compressed: bool) -> bytes:
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return path.read_bytes()


def _patch_sizes(data: bytes, which: int, size: int) -> bytes:
    """Set the uncompressed size that the zip headers of member ``which`` declare to ``size``."""
    buf = bytearray(data)
    size = min(size, 2**32 - 1)
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        spots = [i for i in range(len(buf)) if buf.startswith(signature, i)]
        if spots:
            at = spots[which % len(spots)] + offset
            buf[at: at + 4] = struct.pack("<I", size)
    return bytes(buf)


@FUZZ_FILES
@given(data=any_bytes)
def test_npz_arbitrary_bytes(data):
    _read_file(data, "r.npz")


@FUZZ_FILES
@given(seed=st.integers(0, 1000), edits=st.lists(array_edit, min_size=1, max_size=3), compressed=st.booleans())
def test_npz_mutated_arrays(seed, edits, compressed):
    data = _savez(WORKDIR / "e.npz", _edit_arrays(_npz_members(seed), edits), compressed)
    _read_file(data, "e.npz")


@FUZZ_FILES
@given(seed=st.integers(0, 1000), mutations=st.lists(mutation, min_size=1, max_size=4), compressed=st.booleans(),
       patch=st.none() | st.tuples(st.integers(0, 20), EXTREME.filter(lambda v: v > 0)))
def test_npz_mutated_bytes_and_declared_sizes(seed, mutations, compressed, patch):
    data = _savez(WORKDIR / "b.npz", _npz_members(seed), compressed)
    if patch is not None:
        data = _patch_sizes(data, *patch)
    _read_file(_mutate(data, mutations) if patch is None else data, "b.npz")


@FUZZ_FILES
@given(seed=st.integers(0, 1000), member=st.integers(0, 20), shape=st.lists(EXTREME.filter(lambda v: v > 0) |
                                                                             st.integers(0, 9), max_size=3))
def test_npz_extreme_npy_shapes(seed, member, shape):
    """A member's .npy header declares a huge shape (the data is not there)."""
    data = _savez(WORKDIR / "s.npz", _npz_members(seed), False)
    buf = bytearray(data)
    spots = [i for i in range(len(buf)) if buf.startswith(b"'shape': (", i)]
    at = spots[member % len(spots)] + len(b"'shape': (")
    end = buf.index(b")", at)
    text = ", ".join(str(v) for v in shape) + ("," if len(shape) == 1 else "")
    buf[at:end] = text.encode()
    _read_file(bytes(buf), "s.npz")


def _valid_mat(seed: int, compressed: bool) -> bytes:
    import scipy.io

    data = _valid_dataset(seed)
    path = WORKDIR / "valid.mat"
    scipy.io.savemat(path, {"X": data.X.astype(np.float64), "Y": data.Y.toarray()}, do_compression=compressed)
    return path.read_bytes()


@FUZZ_FILES
@given(data=any_bytes)
def test_mat_arbitrary_bytes(data):
    _read_file(data, "r.mat")


@FUZZ_FILES
@given(seed=st.integers(0, 1000), compressed=st.booleans(), mutations=st.lists(mutation, min_size=1, max_size=4),
       size_at=st.none() | st.tuples(st.integers(0, 10**6), EXTREME))
def test_mat_mutated(seed, compressed, mutations, size_at):
    data = _valid_mat(seed, compressed)
    if size_at is not None:  # overwrite a 4-byte field (a tag's size, a dimension) with an extreme value
        buf = bytearray(data)
        at = 128 + 4 * (size_at[0] % ((len(buf) - 132) // 4))
        buf[at: at + 4] = struct.pack("<I", size_at[1] % 2**32)
        data = bytes(buf)
    _read_file(_mutate(data, mutations), "m.mat")


# ---- model files --------------------------------------------------------------------------------------
def _model_file(kind: int) -> Path:
    path = WORKDIR / f"model{kind}.npz"
    if not path.exists():
        from bayesmlc.baselines import KNNBaseline
        from bayesmlc.linear import LogisticRegression

        data = _valid_dataset(0)
        model = (LogisticRegression(max_iter=5), KNNBaseline(n_neighbors=2))[kind]
        model.fit(data.X, data.Y).save(path)
    return path


def _load_model_bytes(data: bytes):
    from bayesmlc.persistence import load_model

    path = WORKDIR / "fuzzed-model.npz"
    path.write_bytes(data)
    model = _bounded(lambda: load_model(path), ModelFormatError)
    if model is not None:
        X = sp.random(3, 5, density=0.5, format="csr", random_state=0, dtype=np.float32)
        try:  # a loaded model predicts, or refuses rows of another width (a ValidationError)
            model.predict_topk(X, 2)
            model.predict_proba(X)
        except ValidationError:
            pass
    return model


def _edit_json(value, path_choice: int, replacement):
    """``value`` with the ``path_choice``-th node (in a depth-first walk) replaced by ``replacement``."""
    counter = [0]

    def walk(node):
        counter[0] += 1
        if counter[0] - 1 == path_choice:
            return replacement
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(value)


json_leaf = st.one_of(st.none(), st.booleans(), EXTREME, st.floats(allow_nan=True), st.text(max_size=8),
                      st.sampled_from([[], {}, {"__array__": "nope"}, {"__sparse__": 3, "shape": [1]},
                                       {"__estimator__": "bayesmlc.linear:LogisticRegression", "params": {},
                                        "state": {}}, "os:system", [[[[]]]]]))


@FUZZ_FILES
@given(data=any_bytes)
def test_model_file_arbitrary_bytes(data):
    _load_model_bytes(data)


@FUZZ_FILES
@given(kind=st.integers(0, 1), node=st.integers(0, 200), leaf=json_leaf,
       edits=st.lists(array_edit, max_size=2), compressed=st.booleans())
def test_model_file_mutated_record_and_arrays(kind, node, leaf, edits, compressed):
    with np.load(_model_file(kind), allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    meta = _edit_json(json.loads(arrays.pop("__meta__").tobytes()), node, leaf)
    arrays = _edit_arrays(arrays, edits)
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    _load_model_bytes(_savez(WORKDIR / "edited-model.npz", arrays, compressed))


@FUZZ_FILES
@given(kind=st.integers(0, 1), mutations=st.lists(mutation, min_size=1, max_size=4),
       patch=st.none() | st.tuples(st.integers(0, 20), EXTREME.filter(lambda v: v > 0)))
def test_model_file_mutated_bytes_and_declared_sizes(kind, mutations, patch):
    data = _model_file(kind).read_bytes()
    _load_model_bytes(_mutate(data, mutations) if patch is None else _patch_sizes(data, *patch))


@pytest.fixture(scope="module", autouse=True)
def _cleanup():
    yield
    for path in WORKDIR.iterdir():
        path.unlink()
    WORKDIR.rmdir()
