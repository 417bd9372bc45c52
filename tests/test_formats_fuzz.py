"""Fuzzing the text parsers: any input gives a valid Dataset or a DataFormatError, nothing else; the
compiled scanner and the pure-Python reference parser agree on every input (same matrices, or the
same error at the same line); written files read back exactly."""

from __future__ import annotations

import tempfile
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
from bayesmlc.exceptions import DataFormatError

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


@pytest.fixture(scope="module", autouse=True)
def _cleanup():
    yield
    for path in WORKDIR.iterdir():
        path.unlink()
    WORKDIR.rmdir()
