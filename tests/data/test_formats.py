"""Readers and writers: every shared dataset round-trips, every error names its file and line, and
each format agrees with an independent reader (scikit-learn's svmlight parser, scipy's ARFF and
MAT readers, hand-written expected files)."""

from __future__ import annotations

import hashlib
import io
import os
import warnings

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
from scipy.io import arff as scipy_arff
from sklearn.datasets import load_svmlight_file

from bayesmlc.data.dataset import Dataset
from bayesmlc.data.formats.arff import read_arff, write_arff
from bayesmlc.data.formats.cache import load_npz, save_npz
from bayesmlc.data.formats.sparse_text import Grammar, LineError, parse_line
from bayesmlc.data.formats.svmlight import read_svmlight, write_svmlight
from bayesmlc.data.formats.xc import format_values, read_xc, write_xc
from bayesmlc.data.io import read_dataset, read_train_test, write_dataset
from bayesmlc.exceptions import DataFormatError, ValidationError

from conftest import shared_dataset_dir

# name: (N train, N test, D, L) from ../shared/datasets/README.md
SHARED_SHAPES = {
    "bibtex": (4880, 2515, 1836, 159),
    "bibtex_xc": (4880, 2515, 1836, 159),
    "emotions": (391, 202, 72, 6),
    "scene": (1211, 1196, 294, 6),
    "yeast": (1500, 917, 103, 14),
    "medical": (333, 645, 1449, 45),
    "enron": (1123, 579, 1001, 53),
}
# files whose numbers are written the way write_xc writes them (value_format), so writing what was
# read reproduces the file byte for byte; the others carry more digits than float32 holds
BYTE_IDENTICAL = {
    ("bibtex", "train"): None, ("bibtex", "test"): None, ("enron", "train"): None, ("enron", "test"): None,
    ("medical", "train"): None, ("medical", "test"): None, ("yeast", "test"): None,
    ("bibtex_xc", "train"): "%.6f", ("bibtex_xc", "test"): "%.6f",
}
ENGINES = ("compiled", "python")


def _sklearn_reference(path):
    """X, Y of an XC file read by scikit-learn's svmlight parser after dropping the header."""
    with open(path, "rb") as stream:
        header = stream.readline().split()
        body = stream.read()
    n, d, n_labels = (int(v) for v in header)
    X, labels = load_svmlight_file(io.BytesIO(body), n_features=d, multilabel=True, zero_based=True,
                                   dtype=np.float32)
    rows = [i for i, row in enumerate(labels) for _ in row]
    cols = [int(label) for row in labels for label in row]
    Y = sp.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=(n, n_labels))
    return X, Y


def _same_csr(A, B):
    A, B = sp.csr_matrix(A), sp.csr_matrix(B)
    A.sort_indices()
    B.sort_indices()
    return (A.shape == B.shape and np.array_equal(A.indptr, B.indptr) and np.array_equal(A.indices, B.indices)
            and np.array_equal(A.data, B.data))


def _write(path, text: str | bytes):
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


# ------------------------------------------------------------------------------------------------
# shared datasets
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SHARED_SHAPES))
def test_shared_dataset_shapes_reference_and_round_trip(name, tmp_path):
    folder = shared_dataset_dir(name)
    n_train, n_test, d, n_labels = SHARED_SHAPES[name]
    for split, n in (("train", n_train), ("test", n_test)):
        source = folder / f"{split}.txt"
        data = read_dataset(source)
        assert (data.n_samples, data.n_features, data.n_labels) == (n, d, n_labels)
        assert data.label_names == (folder / "labels.txt").read_text().splitlines()
        assert data.feature_names == (folder / "features.txt").read_text().splitlines()
        assert data.source["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
        # independent parser: scikit-learn's svmlight reader on the body
        X_ref, Y_ref = _sklearn_reference(source)
        assert _same_csr(data.X, X_ref) and _same_csr(data.Y, Y_ref)
        # write -> read gives identical matrices
        copy = tmp_path / f"{name}-{split}.txt"
        write_dataset(data, copy)
        again = read_dataset(copy)
        assert _same_csr(again.X, data.X) and _same_csr(again.Y, data.Y)
        if (name, split) in BYTE_IDENTICAL:
            write_dataset(data, copy, value_format=BYTE_IDENTICAL[(name, split)])
            assert copy.read_bytes() == source.read_bytes()


@pytest.mark.parametrize("name", sorted(SHARED_SHAPES))
def test_shared_dataset_round_trips_through_every_format(name, tmp_path):
    folder = shared_dataset_dir(name)
    data = read_dataset(folder / "test.txt")
    for suffix, options in ((".arff", {}), (".svm", {"n_features": data.n_features, "n_labels": data.n_labels}),
                            (".mat", {}), (".npz", {})):
        path = write_dataset(data, tmp_path / f"{name}{suffix}")
        again = read_dataset(path, **options)
        assert (again.n_samples, again.n_features, again.n_labels) == (data.n_samples, data.n_features, data.n_labels)
        assert _same_csr(again.X, data.X) and _same_csr(again.Y, data.Y), suffix
        if suffix in (".arff", ".npz"):
            assert again.label_names == data.label_names and again.feature_names == data.feature_names


def test_shared_dense_values_equal_float32_of_the_text():
    folder = shared_dataset_dir("emotions")
    data = read_dataset(folder / "train.txt")
    first = (folder / "train.txt").read_text().splitlines()[1].split()
    expected = [np.float32(float(token.split(":")[1])) for token in first[1:]]
    assert data.X[0].data.tolist() == expected
    assert data.Y[0].indices.tolist() == [int(v) for v in first[0].split(",")]


def test_shared_train_test_pair_and_cache(tmp_path):
    folder = shared_dataset_dir("medical")
    train, test = read_train_test(folder / "train.txt", folder / "test.txt")
    assert train.n_features == test.n_features == 1449 and train.n_labels == test.n_labels == 45
    first = read_dataset(folder / "train.txt", cache=tmp_path)
    second = read_dataset(folder / "train.txt", cache=tmp_path)
    assert first.source["from_cache"] is False and second.source["from_cache"] is True
    assert _same_csr(first.X, second.X) and _same_csr(first.Y, second.Y)
    assert second.label_names == first.label_names and second.feature_names == first.feature_names


# ------------------------------------------------------------------------------------------------
# XC text: grammar
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
def test_xc_hand_worked_example(tmp_path, engine):
    text = (
        "5 6 3\n"
        "0,2 0:1 3:0.5 5:-2.25e1\n"  # labels and features
        " 1:7\n"  # no labels
        "1\n"  # labels, no features
        " \n"  # nothing
        "2\t4:1e-3\t\t2:0 \r\n"  # tabs, unsorted, an explicit zero, CRLF
    )
    X, Y = read_xc(_write(tmp_path / "a.txt", text), engine=engine)
    expected_X = np.array([[1, 0, 0, 0.5, 0, -22.5], [0, 7, 0, 0, 0, 0], [0] * 6, [0] * 6,
                           [0, 0, 0, 0, 0.001, 0]], dtype=np.float32)
    assert np.array_equal(X.toarray(), expected_X)
    assert X.nnz == 6  # the explicit 2:0 is kept, not dropped
    assert np.array_equal(Y.toarray(), [[1, 0, 1], [0, 0, 0], [0, 1, 0], [0, 0, 0], [0, 0, 1]])
    assert X.dtype == np.float32 and X.has_sorted_indices


@pytest.mark.parametrize("engine", ENGINES)
def test_xc_no_final_newline_trailing_blank_lines_and_bom(tmp_path, engine):
    X, Y = read_xc(_write(tmp_path / "a.txt", b"\xef\xbb\xbf2 3 2\n1 2:4\n0 0:1"), engine=engine)
    assert X.toarray().tolist() == [[0, 0, 4], [1, 0, 0]] and Y.toarray().tolist() == [[0, 1], [1, 0]]
    X, _ = read_xc(_write(tmp_path / "b.txt", "1 3 2\n1 2:4\n\n  \n"), engine=engine)
    assert X.shape == (1, 3)


@pytest.mark.parametrize("engine", ENGINES)
def test_xc_values_are_correctly_rounded(tmp_path, engine):
    tokens = ["0.1", "1e-30", "3.4028234e38", "-0", "123456789012345678901234567890", ".5", "5.", "+2.5E+3",
              "0.1000000000000000055511151231257827021181583404541015625", "1e-46", "7.0e-45", "0e999999"]
    line = "0 " + " ".join(f"{i}:{t}" for i, t in enumerate(tokens))
    X, _ = read_xc(_write(tmp_path / "a.txt", f"1 {len(tokens)} 1\n{line}\n"), engine=engine)
    assert X.data.tolist() == [float(np.float32(float(t))) for t in tokens]
    assert np.signbit(X.data[3])


@pytest.mark.parametrize("chunk_bytes", [1, 5, 64, 1 << 20])
def test_xc_chunking_does_not_change_the_result(tmp_path, chunk_bytes):
    rng = np.random.default_rng(3)
    X = sp.random(300, 50, density=0.2, format="csr", random_state=4, dtype=np.float32)
    X.data = np.round(rng.normal(size=X.nnz), 3).astype(np.float32)
    Y = sp.random(300, 7, density=0.3, format="csr", random_state=5)
    Y.data[:] = 1
    path = tmp_path / "a.txt"
    write_xc(path, X, Y)
    X2, Y2 = read_xc(path, chunk_bytes=chunk_bytes)
    assert _same_csr(X2, X) and _same_csr(Y2, Y)


# (file text, 1-based line, words the message must contain)
XC_ERRORS = [
    ("", 1, "empty file"),
    ("3 4\n", 1, "bad header"),
    ("3 4 x\n", 1, "bad header"),
    ("3 4 2 1\n", 1, "bad header"),
    ("3 4 2\n0 1:1\n", 2, "declares N=3 rows but the file has only 1"),
    ("1 4 2\n0 1:1\n1 2:1\n", 3, "more rows than the 1 declared"),
    ("2 4 2\n0 1:1\n0 4:1\n", 3, "feature index 4 out of range: the header (line 1) declares D=4"),
    ("2 4 2\n0 1:1\n2 1:1\n", 3, "label 2 out of range: the header (line 1) declares L=2"),
    ("1 4 2\n0 -1:1\n", 2, "negative feature index -1"),
    ("1 4 2\n-1 1:1\n", 2, "negative label -1"),
    ("1 4 2\n0 1:abc\n", 2, "non-numeric value 'abc' for feature 1"),
    ("1 4 2\n0 1:\n", 2, "non-numeric value '' for feature 1"),
    ("1 4 2\n0 1:nan\n", 2, "NaN or infinite value 'nan'"),
    ("1 4 2\n0 1:-Inf\n", 2, "NaN or infinite value '-Inf'"),
    ("1 4 2\n0 1:1e39\n", 2, "beyond the float32 range"),
    ("1 4 2\n0 1:1e999\n", 2, "beyond the float32 range"),
    ("1 4 2\n0 1:1 1:2\n", 2, "duplicate feature index 1"),
    ("1 4 2\n0 3:1 1:1 3:2\n", 2, "duplicate feature index 3"),
    ("1 4 2\n1,1 1:1\n", 2, "duplicate label 1"),
    ("1 4 2\n0 1\n", 2, "malformed feature '1': expected index:value"),
    ("1 4 2\n0 1:2:3\n", 2, "malformed feature '1:2:3'"),
    ("1 4 2\n0,,1 1:1\n", 2, "malformed label list '0,,1'"),
    ("1 4 2\n0, 1:1\n", 2, "malformed label list '0,'"),
    ("1 4 2\n1:1 2:1\n", 2, "must start with a space"),
    ("1 4 2\nx 1:1\n", 2, "label 'x' is not a non-negative integer"),
    ("1 4 2\n0 a:1\n", 2, "feature index 'a' is not a non-negative integer"),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("text,line,words", XC_ERRORS)
def test_xc_errors_name_file_line_and_problem(tmp_path, engine, text, line, words):
    path = _write(tmp_path / "bad.txt", text)
    with pytest.raises(DataFormatError) as info:
        read_xc(path, engine=engine)
    assert info.value.line == line and info.value.path == str(path)
    assert words in str(info.value) and str(info.value).startswith(f"{path}:{line}: ")


@pytest.mark.parametrize("engine", ENGINES)
def test_xc_error_deep_in_a_chunked_file_has_the_right_line(tmp_path, engine):
    lines = ["500 10 3"] + [f"{i % 3} {i % 10}:1" for i in range(500)]
    lines[377] = "1 3:1 10:1"  # line 378 of the file
    path = _write(tmp_path / "bad.txt", "\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match="feature index 10 out of range") as info:
        read_xc(path, engine=engine, chunk_bytes=100)
    assert info.value.line == 378
    lines[377] = "1 3:1 3:1"
    _write(path, "\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match="duplicate feature index 3") as info:
        read_xc(path, engine=engine, chunk_bytes=100)
    assert info.value.line == 378


def test_parse_line_reference_examples():
    grammar = Grammar(n_features=10, n_labels=5)
    assert parse_line(b"3,1 4:2 0:0.5", grammar) == ([3, 1], [4, 0], [2.0, 0.5])
    assert parse_line(b" 4:2", grammar) == ([], [4], [2.0])
    assert parse_line(b"", grammar) == ([], [], [])
    svm = Grammar(comments=True, skip_blank=True, colon_first_means_no_labels=True, index_base=1)
    assert parse_line(b"# only a comment", svm) is None
    assert parse_line(b"4:2 1:1 # c", svm) == ([], [3, 0], [2.0, 1.0])
    with pytest.raises(LineError, match="below the first index 1"):
        parse_line(b"1 0:1", svm)


# ------------------------------------------------------------------------------------------------
# XC writer
# ------------------------------------------------------------------------------------------------
def test_xc_writer_exact_text(tmp_path):
    # row 1 holds an explicitly stored zero: it is written, not dropped
    X = sp.csr_matrix((np.array([1, 0.1, 0, -2.5, 1e-6], dtype=np.float32), [0, 2, 1, 0, 1], [0, 2, 3, 5]),
                      shape=(3, 3))
    Y = sp.csr_matrix(np.array([[1, 0, 1], [0, 0, 0], [0, 0, 0]], dtype=np.float32))
    path = tmp_path / "a.txt"
    write_xc(path, X, Y)
    assert path.read_text() == "3 3 3\n0,2 0:1 2:0.1\n 1:0\n 0:-2.5 1:1e-06\n"
    write_xc(path, sp.csr_matrix((2, 3)), sp.csr_matrix(np.array([[0, 1], [0, 0]])))
    assert path.read_text() == "2 3 2\n1\n \n"
    X2, Y2 = read_xc(path)
    assert X2.nnz == 0 and Y2.toarray().tolist() == [[0, 1], [0, 0]]


def test_xc_writer_canonicalises_a_copy_and_leaves_its_input_alone(tmp_path):
    # unsorted indices, a repeated index (summed) and a stored zero label (not a label)
    X = sp.csr_matrix((np.array([1, 2, 5], dtype=np.float32), [2, 2, 0], [0, 2, 3]), shape=(2, 3))
    Y = sp.csr_matrix((np.array([1, 0], dtype=np.float32), [1, 0], [0, 1, 2]), shape=(2, 2))
    before = [a.copy() for a in (X.data, X.indices, X.indptr, Y.data, Y.indices)]
    write_xc(tmp_path / "a.txt", X, Y)
    assert (tmp_path / "a.txt").read_text() == "2 3 2\n1 2:3\n 0:5\n"
    for old, new in zip(before, (X.data, X.indices, X.indptr, Y.data, Y.indices)):
        assert np.array_equal(old, new)


def test_format_values_is_shortest_round_trip():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(size=2000) * 10.0 ** rng.integers(-40, 39, size=2000),
                             [0, -0.0, 1, 16777216, 3e38, 1.4e-45]]).astype(np.float32)
    values = values[np.isfinite(values)]
    text = format_values(values)
    assert [np.float32(float(t)) for t in text] == values.tolist()
    assert format_values(np.array([1, 2.5, 0.1], dtype=np.float32)).tolist() == ["1", "2.5", "0.1"]
    assert format_values(np.array([0.5], dtype=np.float32), "%.3f").tolist() == ["0.500"]


def test_write_dataset_refuses_to_drop_a_label_mask(tmp_path):
    data = Dataset.from_arrays(np.eye(2), np.eye(2), label_mask=np.ones((2, 2)))
    with pytest.raises(DataFormatError, match="cannot store a label mask"):
        write_dataset(data, tmp_path / "a.txt")


def test_write_names_round_trip(tmp_path):
    data = Dataset.from_arrays(np.eye(2), np.eye(2), feature_names=["a b", "c"], label_names=["x", "y"])
    write_dataset(data, tmp_path / "train.txt", write_names=True)
    again = read_dataset(tmp_path / "train.txt")
    assert again.feature_names == ["a b", "c"] and again.label_names == ["x", "y"]


def test_companion_names_of_the_wrong_length_are_ignored_with_a_warning(tmp_path):
    write_dataset(Dataset.from_arrays(np.eye(2), np.eye(2)), tmp_path / "train.txt")
    (tmp_path / "labels.txt").write_text("only one\n")
    with pytest.warns(UserWarning, match="labels.txt"):
        data = read_dataset(tmp_path / "train.txt")
    assert data.label_names is None
    with pytest.raises(DataFormatError, match="has 1 label names"):
        read_dataset(tmp_path / "train.txt", label_names_file=tmp_path / "labels.txt")


# ------------------------------------------------------------------------------------------------
# read_dataset / read_train_test
# ------------------------------------------------------------------------------------------------
def test_read_dataset_dispatch_errors(tmp_path):
    with pytest.raises(DataFormatError, match="cannot tell the format"):
        read_dataset(_write(tmp_path / "a.csv", "x"))
    with pytest.raises(DataFormatError, match="no such file"):
        read_dataset(tmp_path / "missing.txt")
    with pytest.raises(ValidationError, match="do not apply to format 'xc'"):
        read_dataset(_write(tmp_path / "a.txt", "0 1 1\n"), n_labels=3)
    with pytest.raises(ValidationError, match="format="):
        read_dataset(tmp_path / "a.txt", format="csv")
    data = read_dataset(_write(tmp_path / "a.dat", "1 2 1\n0 1:1\n"), format="xc")
    assert data.source["format"] == "xc" and data.source["size_bytes"] == 12
    assert "sha256" not in read_dataset(tmp_path / "a.dat", format="xc", sha256=False).source


def test_read_train_test_width_checks(tmp_path):
    train = _write(tmp_path / "train.txt", "1 4 2\n0 1:1\n")
    with pytest.raises(DataFormatError, match=r"train.txt has D=4 features but .*test.txt has D=5") as info:
        read_train_test(train, _write(tmp_path / "test.txt", "1 5 2\n0 1:1\n"))
    assert str(tmp_path / "test.txt") in str(info.value)
    with pytest.raises(DataFormatError, match="L=2 labels but .* L=3"):
        read_train_test(train, _write(tmp_path / "test.txt", "1 4 3\n0 1:1\n"))
    # headerless svmlight: a narrower test file is padded, a wider one refused
    svm_train = _write(tmp_path / "train.svm", "0,3 1:1 8:2\n1 2:1\n")
    tr, te = read_train_test(svm_train, _write(tmp_path / "test.svm", "0 1:1\n"))
    assert (te.n_features, te.n_labels) == (tr.n_features, tr.n_labels) == (8, 4)
    assert te.X.toarray().tolist() == [[1, 0, 0, 0, 0, 0, 0, 0]] and te.Y.toarray().tolist() == [[1, 0, 0, 0]]
    with pytest.raises(DataFormatError, match="beyond the training width"):
        read_train_test(svm_train, _write(tmp_path / "test.svm", "0 9:1\n"))


# ------------------------------------------------------------------------------------------------
# svmlight
# ------------------------------------------------------------------------------------------------
def test_svmlight_matches_scikit_learn(tmp_path):
    rng = np.random.default_rng(1)
    lines = []
    for _ in range(200):
        columns = np.sort(rng.choice(30, size=rng.integers(1, 8), replace=False)) + 1
        labels = np.sort(rng.choice(6, size=rng.integers(0, 3), replace=False))
        feats = " ".join(f"{c}:{v:.5g}" for c, v in zip(columns, rng.normal(size=columns.size)))
        lines.append(f"{','.join(map(str, labels))} {feats}  # row comment")
    lines.insert(5, "# a comment line")
    lines.insert(9, "")
    path = _write(tmp_path / "a.svm", "\n".join(lines) + "\n")
    X, Y = read_svmlight(path, n_features=30)
    X_ref, labels = load_svmlight_file(str(path), n_features=30, multilabel=True, zero_based=False, dtype=np.float32)
    assert _same_csr(X, X_ref)
    assert [tuple(float(v) for v in row.indices) for row in Y] == [tuple(row) for row in labels]
    copy = tmp_path / "b.svm"
    write_svmlight(copy, X, Y)
    X2, Y2 = read_svmlight(copy, n_features=30, n_labels=Y.shape[1])
    assert _same_csr(X2, X) and _same_csr(Y2, Y)
    X_sk, _ = load_svmlight_file(str(copy), n_features=30, multilabel=True, zero_based=False, dtype=np.float32)
    assert _same_csr(X_sk, X)


def test_svmlight_options_and_errors(tmp_path):
    path = _write(tmp_path / "a.svm", "0 0:1\n")
    with pytest.raises(DataFormatError, match="below the first index 1.*zero_based=True") as info:
        read_dataset(path)
    assert info.value.line == 1
    data = read_dataset(path, zero_based=True, n_features=3, n_labels=2)
    assert data.X.toarray().tolist() == [[1, 0, 0]] and data.n_labels == 2
    with pytest.raises(DataFormatError, match="feature index 5 out of range: the argument n_features=3"):
        read_dataset(_write(tmp_path / "b.svm", "0 5:1\n"), zero_based=True, n_features=3)
    with pytest.raises(DataFormatError, match="label '1.5' is not a non-negative integer"):
        read_dataset(_write(tmp_path / "c.svm", "1.5 1:1\n"))
    with pytest.raises(DataFormatError, match="no labels and no features"):
        write_dataset(Dataset.from_arrays(np.zeros((1, 2)), np.zeros((1, 2))), tmp_path / "d.svm")


# ------------------------------------------------------------------------------------------------
# ARFF
# ------------------------------------------------------------------------------------------------
DENSE_ARFF = """% a Mulan-style file
@relation 'tiny'
@attribute f0 numeric
@attribute 'word two' numeric
@attribute "bin" {0,1}
@attribute happy {0,1}
@attribute sad {0,1}
@data
0.5,1.25,1,1,0
-3,0,0,0,1
% comment between rows

2e-1,7,1,1,1
"""
XML = """<?xml version="1.0" encoding="utf-8"?>
<labels xmlns="http://mulan.sourceforge.net/labels"><label name="happy"></label><label name="sad"></label></labels>
"""


def test_arff_dense_with_xml_matches_scipy(tmp_path):
    path = _write(tmp_path / "tiny-train.arff", DENSE_ARFF)
    _write(tmp_path / "tiny.xml", XML)
    data = read_dataset(path)
    assert data.feature_names == ["f0", "word two", "bin"] and data.label_names == ["happy", "sad"]
    records, _ = scipy_arff.loadarff(str(path))
    expected_X = np.array([[r[0], r[1], float(r[2].decode())] for r in records], dtype=np.float32)
    expected_Y = np.array([[int(r[3].decode()), int(r[4].decode())] for r in records])
    assert np.array_equal(data.X.toarray(), expected_X) and np.array_equal(data.Y.toarray(), expected_Y)
    assert data.X.nnz == np.count_nonzero(expected_X)


def test_arff_sparse_label_count_meka_and_missing_labels(tmp_path):
    text = ("@relation 'sparse: -C -2'\n@attribute a numeric\n@attribute b numeric\n@attribute c numeric\n"
            "@attribute l0 {0,1}\n@attribute l1 {0,1}\n@data\n{0 1.5,3 1}\n{}\n{1 -2,2 4,4 1}\n{3 ?,0 2}\n")
    path = _write(tmp_path / "s.arff", text)
    expected_X = [[1.5, 0, 0], [0, 0, 0], [0, -2, 4], [2, 0, 0]]
    expected_Y = [[1, 0], [0, 0], [0, 1], [0, 0]]
    for data in (read_dataset(path), read_dataset(path, n_labels=2)):  # MEKA -C -2, then the count
        assert data.X.toarray().tolist() == expected_X and data.Y.toarray().tolist() == expected_Y
        assert data.label_mask.toarray().tolist() == [[1, 1], [1, 1], [1, 1], [0, 1]]
    meka_first = _write(tmp_path / "m.arff", "@relation 'm: -C 1'\n@attribute y {0,1}\n@attribute x numeric\n"
                                             "@data\n1,3\n0,4\n")
    data = read_dataset(meka_first)
    assert data.Y.toarray().tolist() == [[1], [0]] and data.X.toarray().tolist() == [[3], [4]]
    copy = tmp_path / "copy.arff"
    write_dataset(read_dataset(path), copy)
    again = read_dataset(copy)  # labels from the copy's .xml
    assert again.X.toarray().tolist() == expected_X and again.Y.toarray().tolist() == expected_Y
    assert again.label_mask.toarray().tolist() == [[1, 1], [1, 1], [1, 1], [0, 1]]
    assert again.label_names == ["l0", "l1"] and again.feature_names == ["a", "b", "c"]


@pytest.mark.parametrize("body,line,words", [
    ("@attribute a numeric\n@attribute l {0,1}\n@data\n1,0,1\n", 6, "row has 3 values"),
    ("@attribute a numeric\n@attribute l {0,1}\n@data\nx,1\n", 6, "non-numeric value 'x'"),
    ("@attribute a numeric\n@attribute l {0,1}\n@data\n?,1\n", 6, "missing value '?' for feature 'a'"),
    ("@attribute a numeric\n@attribute l {0,1}\n@data\n1,2\n", 6, "not one of its categories"),
    ("@attribute a numeric\n@attribute l {0,1}\n@data\n{0 1,5 1}\n", 6, "attribute index 5 out of range"),
    ("@attribute a numeric\n@attribute l {0,1}\n@data\n{0 1,0 2}\n", 6, "duplicate attribute index 0"),
    ("@attribute a numeric\n@attribute l {0,1}\n@data\nnan,1\n", 6, "NaN, infinite"),
    ("@attribute a string\n@attribute l {0,1}\n@data\n", 3, "only numeric and nominal"),
    ("@attribute a numeric\n@attribute l {yes,no}\n@data\n", 4, "must be nominal {0,1}"),
    ("@attribute a numeric\n@attribute l {0,1}\n", 4, "no @data"),
])
def test_arff_errors(tmp_path, body, line, words):
    path = _write(tmp_path / "e.arff", "@relation e\n\n" + body)
    with pytest.raises(DataFormatError) as info:
        read_dataset(path, n_labels=1)
    assert words in str(info.value) and info.value.line == line and str(path) in str(info.value)
    with pytest.raises(DataFormatError, match="cannot tell which attributes are labels"):
        read_arff(_write(tmp_path / "f.arff", "@relation f\n@attribute a numeric\n@data\n1\n"))


def test_arff_writer_quotes_names(tmp_path):
    data = Dataset.from_arrays(np.array([[0.5, 0], [0, 2]]), np.array([[1, 0], [1, 1]]),
                               feature_names=["it's", "a b"], label_names=["x,y", "{z}"])
    arff_path, xml_path = write_arff(tmp_path / "q.arff", data)
    again = read_dataset(arff_path)
    assert again.feature_names == ["it's", "a b"] and again.label_names == ["x,y", "{z}"]
    assert _same_csr(again.X, data.X) and _same_csr(again.Y, data.Y)


# ------------------------------------------------------------------------------------------------
# MATLAB
# ------------------------------------------------------------------------------------------------
def test_mat_variables_round_trip_and_errors(tmp_path):
    rng = np.random.default_rng(2)
    X = sp.random(20, 9, density=0.3, format="csc", random_state=2)
    Y = (rng.random((20, 4)) < 0.3).astype(np.float64)
    path = tmp_path / "d.mat"
    scipy.io.savemat(path, {"X_tr": X, "Y_tr": sp.csc_matrix(Y), "Y_bad": 2 * Y - 1, "Y_t": Y.T})
    data = read_dataset(path, variables={"X": "X_tr", "Y": "Y_tr"})
    assert np.array_equal(data.X.toarray(), X.toarray().astype(np.float32)) and np.array_equal(data.Y.toarray(), Y)
    with pytest.raises(DataFormatError, match=r"no variable 'X_te' \(for X\) in the file; it holds \['X_tr', 'Y_bad'"):
        read_dataset(path, variables={"X": "X_te", "Y": "Y_tr"})
    with pytest.raises(DataFormatError, match="must hold 0/1.*-1/\\+1"):
        read_dataset(path, variables={"X": "X_tr", "Y": "Y_bad"})
    with pytest.raises(DataFormatError, match="stored transposed"):
        read_dataset(path, variables={"X": "X_tr", "Y": "Y_t"})
    with pytest.raises(DataFormatError, match="not a readable MATLAB"):
        read_dataset(_write(tmp_path / "junk.mat", b"not a mat file at all" * 10))
    write_dataset(data, tmp_path / "copy.mat", variables={"X": "A", "Y": "B"})
    again = read_dataset(tmp_path / "copy.mat", variables={"X": "A", "Y": "B"})
    assert _same_csr(again.X, data.X) and _same_csr(again.Y, data.Y)


# ------------------------------------------------------------------------------------------------
# npz files and the cache
# ------------------------------------------------------------------------------------------------
def test_npz_round_trip_everything(tmp_path):
    data = Dataset.from_arrays(np.array([[0.25, 0], [0, -1]]), np.array([[1, 0], [0, 1]]),
                               label_mask=np.array([[1, 0], [1, 1]]), feature_names=["a", "ü"],
                               label_names=["x", "y"], source={"generator": "test", "seed": 3})
    path = write_dataset(data, tmp_path / "d.npz")
    again = read_dataset(path)
    for a, b in ((again.X, data.X), (again.Y, data.Y), (again.label_mask, data.label_mask)):
        assert _same_csr(a, b)
    assert again.feature_names == ["a", "ü"] and again.label_names == ["x", "y"]
    assert again.source["generator"] == "test" and again.source["loaded_from"] == str(path.resolve())
    with np.load(path, allow_pickle=False) as archive:  # nothing needs pickle
        assert all(archive[key].dtype != object for key in archive.files)


def test_npz_refuses_newer_and_foreign_files(tmp_path):
    path = save_npz(Dataset.from_arrays(np.eye(2), np.eye(2)), tmp_path / "d.npz")
    with np.load(path) as archive:
        contents = dict(archive)
    contents["format_version"] = np.asarray(99)
    np.savez(tmp_path / "new.npz", **contents)
    with pytest.raises(DataFormatError, match="newer bayesmlc"):
        load_npz(tmp_path / "new.npz")
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    with pytest.raises(DataFormatError, match="not a bayesmlc dataset"):
        read_dataset(tmp_path / "other.npz")
    with pytest.raises(DataFormatError, match="not a readable dataset"):
        read_dataset(_write(tmp_path / "junk.npz", b"PK\x03\x04garbage"))


def test_cache_reuse_and_invalidation(tmp_path):
    source = _write(tmp_path / "d.txt", "2 3 2\n0 1:1\n1 2:5\n")
    cache_dir = tmp_path / "cache"
    first = read_dataset(source, cache=cache_dir)
    assert first.source["from_cache"] is False
    cached = read_dataset(source, cache=cache_dir)
    assert cached.source["from_cache"] is True and _same_csr(cached.X, first.X)
    # the cache really is what is read: change it behind the reader's back
    cache_file = next(cache_dir.iterdir())
    tampered, _ = load_npz(cache_file)
    tampered.X.data[:] = 42
    save_npz(tampered, cache_file, record=load_npz(cache_file)[1])
    assert read_dataset(source, cache=cache_dir).X.data.tolist() == [42, 42]
    # a new size or mtime invalidates it
    _write(source, "2 3 2\n0 1:1\n1 2:6\n")
    os.utime(source, ns=(1_000_000_000, 1_000_000_000))
    fresh = read_dataset(source, cache=cache_dir)
    assert fresh.source["from_cache"] is False and fresh.X.data.tolist() == [1, 6]
    # other reader options invalidate it too
    (tmp_path / "names.txt").write_text("p\nq\n")
    named = read_dataset(source, cache=cache_dir, label_names_file=tmp_path / "names.txt")
    assert named.source["from_cache"] is False and named.label_names == ["p", "q"]
    # a corrupt cache is reported and rebuilt
    cache_file.write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="ignoring unreadable cache"):
        rebuilt = read_dataset(source, cache=cache_dir, label_names_file=tmp_path / "names.txt")
    assert rebuilt.X.data.tolist() == [1, 6]
    # cache=True: next to the file
    read_dataset(source, cache=True)
    assert (tmp_path / "d.txt.bayesmlc.npz").exists()


def test_cache_true_falls_back_when_the_source_folder_cannot_be_written(tmp_path, monkeypatch):
    import bayesmlc.data.formats.cache as cache_module

    source = _write(tmp_path / "d.txt", "1 2 1\n0 1:1\n")
    real_save = cache_module.save_npz

    def refuse_next_to_source(dataset, path, **kwargs):
        if path.parent == tmp_path:
            raise PermissionError(13, "Permission denied", str(path))
        return real_save(dataset, path, **kwargs)

    monkeypatch.setattr(cache_module, "save_npz", refuse_next_to_source)
    monkeypatch.setenv("BAYESMLC_CACHE_DIR", str(tmp_path / "fallback"))
    first = read_dataset(source, cache=True)
    assert first.source["cache"].startswith(str(tmp_path / "fallback")) and not first.source["from_cache"]
    assert read_dataset(source, cache=True).source["from_cache"] is True


def test_cache_is_only_for_text_formats(tmp_path):
    path = write_dataset(Dataset.from_arrays(np.eye(2), np.eye(2)), tmp_path / "d.npz")
    with pytest.raises(ValidationError, match="cache= applies to the text formats"):
        read_dataset(path, cache=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_dataset(path)


# ------------------------------------------------------------------------------------------------
# memory (slow: run with -m slow)
# ------------------------------------------------------------------------------------------------
MEMORY_PROBE = """
import sys, json
from bayesmlc.data.io import read_dataset
read_dataset(sys.argv[2])  # warm up: load the compiled scanner
def status(key):
    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(key + ':')) / 1024
before = status('VmRSS')
open('/proc/self/clear_refs', 'w').write('5')
data = read_dataset(sys.argv[1], sha256=False)
print(json.dumps({'extra_mb': status('VmHWM') - before,
                  'output_mb': (data.X.data.nbytes + data.X.indices.nbytes + data.X.indptr.nbytes
                                + data.Y.indices.nbytes + data.Y.data.nbytes + data.Y.indptr.nbytes) / 2**20}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc to measure peak memory")
def test_xc_reader_peak_memory_is_about_one_copy_of_the_output(tmp_path):
    import json
    import subprocess
    import sys

    rng = np.random.default_rng(0)
    n, d, per_row = 200_000, 100_000, 100
    columns = np.sort(rng.integers(0, d, size=(n, per_row)), axis=1)
    keep = np.ones(columns.shape, dtype=bool)
    keep[:, 1:] = columns[:, 1:] != columns[:, :-1]
    X = sp.csr_matrix((np.round(rng.random(int(keep.sum())), 3).astype(np.float32) + 0.001, columns[keep],
                       np.concatenate([[0], np.cumsum(keep.sum(axis=1))])), shape=(n, d))
    Y = sp.csr_matrix((np.ones(n, dtype=np.float32), rng.integers(0, 50, size=n), np.arange(n + 1)), shape=(n, 50))
    path = tmp_path / "big.txt"
    write_xc(path, X, Y)
    _write(tmp_path / "warm.txt", "1 2 1\n0 1:1\n")
    out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(path), str(tmp_path / "warm.txt")],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # the output (~155 MB here) plus at most a quarter more and the chunk work arrays
    assert result["extra_mb"] < 1.25 * result["output_mb"] + 150, result
