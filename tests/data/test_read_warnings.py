"""The readers' warnings held back on a helper thread (bayesmlc.data.read_warnings), and the CLI's
model load beside the data read (cli/commands/data_files.load_model_and_data), which relies on them."""

import threading
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from bayesmlc.cli.commands import data_files
from bayesmlc.data import read_warnings
from bayesmlc.data.io import read_dataset, write_dataset
from bayesmlc.data.dataset import Dataset
from bayesmlc.exceptions import DataFormatError, ModelFormatError
from bayesmlc.linear import LogisticRegression


def test_outside_deferred_a_reader_warning_is_raised_at_once_and_inside_it_is_held_in_order():
    with pytest.warns(UserWarning, match="first"):
        read_warnings.warn("first")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # anything raised inside the block would fail here
        with read_warnings.deferred() as held:
            read_warnings.warn("a")
            read_warnings.warn("b")
    assert held == ["a", "b"]
    with pytest.warns(UserWarning) as raised:
        read_warnings.raise_deferred(held)
    assert [str(w.message) for w in raised] == ["a", "b"]


def test_a_reader_on_another_thread_holds_its_warning_while_this_one_silences_warnings(tmp_path):
    """The race the holding prevents: a companion names file of the wrong length makes the reader warn
    while the main thread sits in a catch_warnings block that ignores everything (as the model
    probe does at load); the reader's warning is still there afterwards."""
    folder = tmp_path
    write_dataset(Dataset(X=sp.csr_matrix(np.eye(3)), Y=sp.csr_matrix(np.eye(3))), folder / "test.txt", format="xc")
    (folder / "labels.txt").write_text("only one\n")
    done = threading.Event()
    result = {}

    def read():
        with read_warnings.deferred() as held:
            result["data"] = read_dataset(folder / "test.txt")
        result["held"] = held
        done.set()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        thread = threading.Thread(target=read)
        thread.start()
        assert done.wait(60)
        thread.join()
    assert result["data"].label_names is None
    assert len(result["held"]) == 1 and "labels.txt" in result["held"][0]


@pytest.fixture
def saved_model(tmp_path):
    rng = np.random.default_rng(0)
    X = sp.csr_matrix((rng.random((60, 6)) < 0.5).astype(np.float32))
    Y = sp.csr_matrix(np.column_stack([X[:, 0].toarray().ravel(), 1 - X[:, 1].toarray().ravel()]))
    run = tmp_path / "run"
    run.mkdir()
    LogisticRegression().fit(X, Y).save(run / "model.npz")
    write_dataset(Dataset(X=X[:10], Y=Y[:10]), tmp_path / "test.txt", format="xc")
    return run, tmp_path / "test.txt", X[:10], Y[:10]


def test_the_model_and_the_data_come_back_as_read_one_after_the_other(saved_model):
    run, path, X, Y = saved_model
    model, meta, data = data_files.load_model_and_data(run, False, path, None, labels=True)
    assert meta == {} and isinstance(model, LogisticRegression)
    np.testing.assert_array_equal(data.X.toarray(), X.toarray())
    np.testing.assert_array_equal(data.Y.toarray(), Y.toarray())


def test_the_reader_s_warning_survives_a_load_that_silences_warnings(saved_model, monkeypatch):
    run, path, _, _ = saved_model
    (path.parent / "labels.txt").write_text("one\ntwo\nthree\n")  # 3 names for 2 labels: ignored, with a warning
    loaded, read, finished = data_files.load_model_dir, data_files._read_holding_warnings, threading.Event()

    def read_then_signal(*args):
        try:
            return read(*args)
        finally:
            finished.set()

    def silent_slow_load(model_dir, allow_native):  # silences warnings until the reader is done
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert finished.wait(60)
            return loaded(model_dir, allow_native)

    monkeypatch.setattr(data_files, "_read_holding_warnings", read_then_signal)
    monkeypatch.setattr(data_files, "load_model_dir", silent_slow_load)
    with pytest.warns(UserWarning, match="labels.txt"):
        data_files.load_model_and_data(run, False, path, None, labels=True)


def test_a_model_that_does_not_load_is_reported_before_a_file_that_does_not_parse(saved_model):
    run, path, _, _ = saved_model
    path.write_text("2 6 2\n0 9:1\n")
    (run / "model.npz").write_bytes(b"not an archive")
    with pytest.raises(ModelFormatError):
        data_files.load_model_and_data(run, False, path, None, labels=True)
    (run / "model.npz").unlink()
    LogisticRegression().fit(np.eye(6), np.eye(6)[:, :2]).save(run / "model.npz")
    with pytest.raises(DataFormatError, match="test.txt"):
        data_files.load_model_and_data(run, False, path, None, labels=True)
