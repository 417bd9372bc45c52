"""Regression tests of the hardening of readers, model files and the command line (issue 14, points
2 to 6): each test builds the hostile or clumsy input and checks the one clear outcome."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import struct
import subprocess
import sys
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import write_small_xc as _write_xc
import scipy.sparse as sp

from bayesmlc.cli import main
from bayesmlc.data.dataset import Dataset
from bayesmlc.data.formats.arff import read_arff
from bayesmlc.data.formats.cache import load_npz, save_npz
from bayesmlc.data.io import read_dataset
from bayesmlc.exceptions import DataFormatError, ModelFormatError
from bayesmlc.persistence import load_model
from bayesmlc.safe_io import MEMORY_LIMIT_ENV, remove_stale_temporaries

ROOT = Path(__file__).resolve().parents[1]


def _dataset(n=12, d=6, n_labels=4, seed=0) -> Dataset:
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=0.5, format="csr", random_state=seed, dtype=np.float32)
    Y = sp.csr_matrix((rng.random((n, n_labels)) < 0.4).astype(np.float32))
    return Dataset(X=X, Y=Y)


def _members(path) -> dict:
    with np.load(path, allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}


def _peak_bytes(call):
    """(result or exception, peak bytes traced while ``call()`` ran)."""
    tracemalloc.start()
    try:
        try:
            result = call()
        except Exception as exc:  # returned for the caller to check
            result = exc
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _deflated_zeros_member(path: Path, name: str, n_bytes: int) -> None:
    """Append to the archive ``path`` a deflated ``.npy`` member of ``n_bytes`` zero bytes (a few
    hundred kilobytes on disk)."""
    header = b"\x93NUMPY\x01\x00"
    text = f"{{'descr': '|u1', 'fortran_order': False, 'shape': ({n_bytes},), }}".encode()
    text += b" " * ((64 - (len(header) + 2 + len(text) + 1) % 64) % 64) + b"\n"
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open(name + ".npy", "w", force_zip64=True) as member:
            member.write(header + struct.pack("<H", len(text)) + text)
            block = bytes(1 << 20)
            for start in range(0, n_bytes, len(block)):
                member.write(block[: min(len(block), n_bytes - start)])


# ---- 2. stored CSR matrices are checked whole; members read lazily, bounded first ----------------
@pytest.mark.parametrize("member, value, message", [
    ("X_indices", 6, "column index 6 is out of range for 6 columns"),      # == D
    ("X_indices", -1, "column index -1 is out of range"),
    ("Y_indices", 4, "column index 4 is out of range for 4 columns"),      # label index >= L
    ("X_indptr", 10**6, "indptr"),
])
def test_npz_dataset_with_bad_sparse_parts_is_refused(tmp_path, member, value, message):
    path = tmp_path / "d.npz"
    save_npz(_dataset(), path)
    arrays = _members(path)
    arrays[member] = arrays[member].copy()
    arrays[member][1] = value
    np.savez(path, **arrays)
    with pytest.raises(DataFormatError, match=message):
        read_dataset(path)


def test_npz_dataset_with_decreasing_indptr_is_refused(tmp_path):
    path = tmp_path / "d.npz"
    save_npz(_dataset(), path)
    arrays = _members(path)
    indptr = arrays["X_indptr"].copy()
    indptr[2] = indptr[3] + 1  # still within the stored entries, but above the next row's start
    arrays["X_indptr"] = indptr
    np.savez(path, **arrays)
    with pytest.raises(DataFormatError, match="indptr decreases at row 2"):
        load_npz(path)


def test_model_file_with_bad_sparse_state_is_refused(tmp_path):
    from bayesmlc.baselines import KNNBaseline

    data = _dataset(n=20)
    path = tmp_path / "knn.npz"
    KNNBaseline(n_neighbors=3).fit(data.X, data.Y).save(path)
    arrays = _members(path)
    key = next(k for k in arrays if k.endswith(".indices") and "train_features" in k)
    arrays[key] = arrays[key].copy()
    arrays[key][0] = 10**6  # far beyond the 6 columns: scipy's routines would write out of bounds
    np.savez(path, **arrays)
    with pytest.raises(ModelFormatError, match="out of range"):
        load_model(path)


def test_unreferenced_member_is_never_decompressed(tmp_path, monkeypatch):
    """A 64 MiB deflated member nothing refers to: the dataset and the model still load, with far
    less memory traced than the member would take."""
    monkeypatch.setenv(MEMORY_LIMIT_ENV, str(16 * 2**20))
    path = tmp_path / "d.npz"
    save_npz(_dataset(), path)
    _deflated_zeros_member(path, "unused", 64 * 2**20)
    result, peak = _peak_bytes(lambda: load_npz(path))
    assert not isinstance(result, Exception), result
    assert peak < 8 * 2**20

    from bayesmlc.linear import LogisticRegression

    data = _dataset(n=20)
    model_path = tmp_path / "m.npz"
    LogisticRegression().fit(data.X, data.Y).save(model_path)
    _deflated_zeros_member(model_path, "unused", 64 * 2**20)
    result, peak = _peak_bytes(lambda: load_model(model_path))
    assert isinstance(result, LogisticRegression) and peak < 8 * 2**20


def test_member_larger_than_the_memory_limit_is_refused_before_decompression(tmp_path, monkeypatch):
    monkeypatch.setenv(MEMORY_LIMIT_ENV, str(16 * 2**20))
    path = tmp_path / "d.npz"
    arrays = _members(save_npz(_dataset(), path))
    del arrays["X_data"]
    np.savez(path, **arrays)
    _deflated_zeros_member(path, "X_data", 64 * 2**20)
    result, peak = _peak_bytes(lambda: load_npz(path))
    assert isinstance(result, DataFormatError) and "declares 64.0 MiB" in str(result)
    assert peak < 8 * 2**20


def test_zip_header_and_npy_header_must_agree(tmp_path):
    path = tmp_path / "d.npz"
    arrays = _members(save_npz(_dataset(), path))
    np.savez(path, **arrays)
    raw = bytearray(path.read_bytes())
    at = raw.find(b"'shape': (") + len(b"'shape': (")
    raw[at: at + 1] = b"9"  # the X_data .npy header now declares another length than the zip holds
    path.write_bytes(bytes(raw))
    with pytest.raises(DataFormatError):
        load_npz(path)


# ---- 3. declared sizes are bounded before any O(L) or O(D) allocation -----------------------------
def test_svmlight_huge_label_is_refused_naming_the_size(tmp_path, monkeypatch):
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "8G")
    path = tmp_path / "huge.svm"
    path.write_bytes(b"2000000000 1:1 2:0.5\n0 3:1\n1 1:1\n")
    result, peak = _peak_bytes(lambda: read_dataset(path))
    assert isinstance(result, DataFormatError), result
    assert "L=2000000001: too large" in str(result) and peak < 256 * 2**20


@pytest.mark.parametrize("header, name", [(b"3 4 2000000000\n", "L=2000000000"), (b"3 2000000000 4\n", "D=2000000000")])
def test_xc_header_with_huge_width_is_refused(tmp_path, monkeypatch, header, name):
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "8G")
    path = tmp_path / "huge.txt"
    path.write_bytes(header + b"0 1:1\n1 2:1\n2 3:1\n")
    with pytest.raises(DataFormatError, match=name):
        read_dataset(path)


def test_xc_header_with_more_rows_than_the_file_can_hold(tmp_path):
    path = tmp_path / "rows.txt"
    path.write_bytes(b"99999999999 4 2\n0 1:1\n")
    with pytest.raises(DataFormatError, match="N=99999999999 rows cannot fit in the 6 bytes"):
        read_dataset(path)


def test_npz_with_huge_declared_width_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "8G")
    path = tmp_path / "d.npz"
    arrays = _members(save_npz(_dataset(), path))
    arrays["Y_shape"] = np.asarray([12, 2**31], dtype=np.int64)
    np.savez(path, **arrays)
    with pytest.raises(DataFormatError, match="L=2147483648"):
        load_npz(path)


# ---- 4. the CLI: one line, exit 2 (130 for Ctrl-C), output folder checked before training ---------


@pytest.fixture
def run_dir(tmp_path):
    train = _write_xc(tmp_path / "train.txt")
    assert main(["train", "--model", "logistic", "--train", str(train), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    return tmp_path / "run"


def _one_line_error(capsys, code_expected=2, argv=None):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == code_expected, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bayesmlc: error: ") and "Traceback" not in err, err
    return lines[0]


def test_cli_failures_are_one_line_with_exit_two(tmp_path, run_dir, capsys):
    train = str(tmp_path / "train.txt")
    out = str(tmp_path / "new")

    def fails(*argv):
        return _one_line_error(capsys, argv=list(argv))

    assert "exists and is not a folder" in fails("train", "--model", "logistic", "--train", train, "--out", train)
    assert "TrainingDivergedError" in fails("train", "--model", "mlgpf", "--train", train, "--set", "n_inducing=10",
                                            "--set", "learning_rate=1e4", "--set", "epochs=2", "--quiet")
    # without the [compare] extra, the missing package is what the one line names
    assert ("n_threads" if importlib.util.find_spec("omikuji") else "optional package 'omikuji'") in fails(
        "train", "--model", "omikuji_parabel", "--train", train, "--set", "n_threads=1000000000", "--quiet")
    assert "topics exist only for bmls" in fails("topics", "--model-dir", str(run_dir))
    meta = json.loads((run_dir / "meta.json").read_text())
    (run_dir / "meta.json").write_text(json.dumps({**meta, "label_names": ["a", "b"]}))
    assert "label_names has 2 entries" in fails("predict", "--model-dir", str(run_dir), "--input", train, "--names")
    (run_dir / "meta.json").write_text("{not json")
    assert "corrupt meta.json" in fails("predict", "--model-dir", str(run_dir), "--input", train)
    (run_dir / "history.json").write_text("[[[")
    assert "corrupt history.json" in fails("plot-history", "--model-dir", str(run_dir))
    (run_dir / "model.npz").write_bytes(b"")
    assert "not a bayesmlc model file" in fails("evaluate", "--model-dir", str(run_dir), "--test", train)
    deep = (b'{"format": "bayesmlc-model", "format_version": 1, "class": "bayesmlc.linear:LogisticRegression", '
            b'"params": {}, "state": ' + b"[" * 100000 + b"]" * 100000 + b"}")
    np.savez(run_dir / "model.npz", __meta__=np.frombuffer(deep, dtype=np.uint8))
    assert "model.npz" in fails("evaluate", "--model-dir", str(run_dir), "--test", train)
    _write_xc(tmp_path / "run2.txt")
    assert main(["train", "--model", "logistic", "--train", str(tmp_path / "run2.txt"), "--out", out, "--quiet"]) == 0
    assert "No such file or directory" in fails("predict", "--model-dir", out, "--input", train,
                                                "--output", str(tmp_path / "no" / "such" / "dir" / "p.txt"))
    if os.path.exists("/dev/full"):
        assert "No space left" in fails("predict", "--model-dir", out, "--input", train, "--output", "/dev/full")


def test_argument_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--model", "logistic", "--train", "x.txt", "--seed", "-1"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("bayesmlc train: error: argument --seed: -1 is negative")


def test_unwritable_out_fails_before_training(tmp_path, capsys, monkeypatch):
    from bayesmlc.linear import LogisticRegression

    def no_fit(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(LogisticRegression, "fit", no_fit)
    train = str(_write_xc(tmp_path / "train.txt"))
    # /proc/version is a file, so no folder can be made under it, whoever runs the test
    line = _one_line_error(capsys, argv=["train", "--model", "logistic", "--train", train, "--out",
                                         "/proc/version/run", "--quiet"])
    assert "/proc/version" in line


def test_ctrl_c_exits_130_without_traceback(tmp_path):
    train = _write_xc(tmp_path / "train.txt", n=200)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "bayesmlc", "train", "--model", "mlgpf", "--train", str(train),
                                "--set", "epochs=100000", "--set", "n_inducing=10"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               # a test runner started in the background (a non-interactive shell's
                               # `cmd &`, nohup) hands its children SIGINT ignored, and Python then
                               # installs no handler: give the CLI the default disposition a terminal gives
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    for line in process.stderr:  # wait until training has started
        if line.startswith("training mlgpf") or time.time() > deadline:
            break
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "bayesmlc: interrupted"


# ---- 5. --out is written as a unit; an existing run is kept unless --overwrite ---------------------
def test_out_is_refused_when_it_holds_a_run_and_replaced_whole_with_overwrite(tmp_path, capsys):
    train, test = str(_write_xc(tmp_path / "train.txt")), str(_write_xc(tmp_path / "test.txt", seed=1))
    out = tmp_path / "run"
    assert main(["train", "--model", "logistic", "--train", train, "--test", test, "--out", str(out), "--quiet"]) == 0
    assert (out / "metrics.json").exists()
    before = (out / "model.npz").read_bytes()
    line = _one_line_error(capsys, argv=["train", "--model", "logistic", "--train", train, "--out", str(out),
                                         "--set", "C=0.01", "--quiet"])
    assert "--overwrite" in line and (out / "model.npz").read_bytes() == before
    assert main(["train", "--model", "logistic", "--train", train, "--out", str(out), "--set", "C=0.01",
                 "--overwrite", "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["history.json", "meta.json", "model.npz"]  # no stale metrics
    assert json.loads((out / "meta.json").read_text())["params"]["C"] == 0.01
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_out_keeps_files_that_are_not_part_of_a_run(tmp_path):
    """A harness's log in --out (open while the run writes) stays, with what was written to it."""
    train = str(_write_xc(tmp_path / "train.txt"))
    out = tmp_path / "run"
    out.mkdir()
    with open(out / "stdout.txt", "w") as log:
        log.write("before\n")
        log.flush()
        assert main(["train", "--model", "logistic", "--train", train, "--out", str(out), "--quiet"]) == 0
        log.write("after\n")
    assert (out / "stdout.txt").read_text() == "before\nafter\n" and (out / "model.npz").exists()


def test_a_run_that_fails_midway_leaves_nothing(tmp_path, capsys, monkeypatch):
    from bayesmlc.cli.commands import train as train_command

    def broken(path, payload):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(train_command, "write_json", broken)  # fails after model.npz is written
    train = str(_write_xc(tmp_path / "train.txt"))
    _one_line_error(capsys, argv=["train", "--model", "logistic", "--train", train, "--out",
                                  str(tmp_path / "run"), "--quiet"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.txt"]


def test_stale_temporaries_of_dead_processes_are_removed_and_look_alikes_kept(tmp_path, capsys):
    dead = 999_999_999  # above any pid_max: no such process
    stale = [tmp_path / f".run.bayesmlc-tmp-{dead}-abcd1234", tmp_path / f".model.npz.bayesmlc-tmp-{dead}-x_y12345.npz",
             tmp_path / f".bibtex.zip.bayesmlc-tmp-{dead}-yyyyyyyy.part"]
    stale[0].mkdir()
    (stale[0] / "model.npz").write_bytes(b"x" * 1000)
    for path in stale[1:]:
        path.write_bytes(b"x")
    # the user's files that only look temporary, and a live writer's temporary, stay
    kept = [tmp_path / f".other.bayesmlc-tmp-{os.getpid()}-zzzzzzzz.npz", tmp_path / f".notes.tmp-{dead}-abc",
            tmp_path / ".old-download.part", tmp_path / f"visible.bayesmlc-tmp-{dead}-abcd1234",
            tmp_path / f".x.bayesmlc-tmp-{dead}-abcd1234.tar.gz"]
    for path in kept:
        path.write_bytes(b"keep")
    os.utime(kept[2], (0, 0))  # an old hidden .part is not ours to judge
    os.symlink(tmp_path / "train.txt", tmp_path / f".link.bayesmlc-tmp-{dead}-abcd1234")
    train = str(_write_xc(tmp_path / "train.txt"))
    assert main(["train", "--model", "logistic", "--train", train, "--out", str(tmp_path / "run"), "--quiet"]) == 0
    assert not any(path.exists() for path in stale)
    assert all(path.read_bytes() == b"keep" for path in kept)
    assert (tmp_path / f".link.bayesmlc-tmp-{dead}-abcd1234").is_symlink()
    assert remove_stale_temporaries(tmp_path) == []


# ---- 6. smaller points ----------------------------------------------------------------------------
def test_predict_and_evaluate_refuse_a_narrower_declared_width_and_pad_an_inferred_one(tmp_path, run_dir, capsys):
    narrow = _write_xc(tmp_path / "narrow.txt", d=8)
    for command in (["predict", "--input"], ["evaluate", "--test"]):
        line = _one_line_error(capsys, argv=[command[0], "--model-dir", str(run_dir), command[1], str(narrow)])
        assert "D=8" in line and "D=12" in line
    svm = tmp_path / "narrow.svm"
    svm.write_text("0 1:1 3:1\n1 2:1\n2,3 5:1\n")  # inferred D=5 < 12: padded, as train --test does
    assert main(["predict", "--model-dir", str(run_dir), "--input", str(svm), "--top-k", "1", "--quiet"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_too_few_rows_are_refused_before_fitting(tmp_path, capsys, monkeypatch):
    from bayesmlc.linear import LogisticRegression

    monkeypatch.setattr(LogisticRegression, "fit", lambda *a, **k: pytest.fail("fit was called"))
    path = tmp_path / "two.txt"
    path.write_text("2 3 2\n0 0:1\n1 1:1\n")
    line = _one_line_error(capsys, argv=["train", "--model", "logistic", "--train", str(path), "--quiet"])
    assert "at least 3" in line


def test_outputs_share_the_umask_mode(tmp_path, run_dir):
    mask = os.umask(0o022)
    os.umask(mask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in run_dir.iterdir()}
    assert set(modes.values()) == {0o666 & ~mask}, modes
    assert (run_dir.stat().st_mode & 0o777) == 0o777 & ~mask


def test_label_names_are_escaped_on_the_terminal(tmp_path, run_dir, capsys):
    meta = json.loads((run_dir / "meta.json").read_text())
    meta["label_names"] = ["\x1b[31mred", "bell\x07", "ok", "new\nline"]
    (run_dir / "meta.json").write_text(json.dumps(meta))
    assert main(["predict", "--model-dir", str(run_dir), "--input", str(tmp_path / "train.txt"), "--top-k", "4",
                 "--names", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and len(out.splitlines()) == 40
    assert "\\x1b[31mred:" in out and "bell\\x07:" in out and "new\\x0aline:" in out


def test_utf8_bom_is_accepted_by_every_text_format(tmp_path):
    bom = b"\xef\xbb\xbf"
    xc, svm, arff = tmp_path / "d.txt", tmp_path / "d.svm", tmp_path / "d.arff"
    xc.write_bytes(bom + b"2 3 2\n0 0:1\n1 2:1\n")
    svm.write_bytes(bom + b"0 1:1\n1 3:1\n")
    arff.write_bytes(bom + b"@relation 'r: -C 2'\n@attribute l0 {0,1}\n@attribute l1 {0,1}\n@attribute a numeric\n"
                     b"@attribute b numeric\n@attribute c numeric\n@data\n1,0,1,0,0\n0,1,0,0,1\n")
    reference = read_dataset(xc)
    for path in (svm, arff):
        data = read_dataset(path)
        assert np.array_equal(data.X.toarray(), reference.X.toarray()), path
        assert np.array_equal(data.Y.toarray(), reference.Y.toarray()), path


def test_arff_duplicate_attribute_names_are_refused(tmp_path):
    path = tmp_path / "dup.arff"
    path.write_text("@relation 'r: -C 1'\n@attribute l0 {0,1}\n@attribute a numeric\n@attribute a numeric\n"
                    "@data\n1,0,0\n")
    with pytest.raises(DataFormatError, match=r"dup.arff:4: duplicate attribute name 'a' \(first declared at line 3\)"):
        read_arff(path)


def test_shard_reader_bounds_members_before_decompression(tmp_path, monkeypatch):
    from bayesmlc.data.shard import read_shard

    class Rank:
        rank, world_size = 0, 2

    monkeypatch.setenv(MEMORY_LIMIT_ENV, str(16 * 2**20))
    path = tmp_path / "d.npz"
    arrays = _members(save_npz(_dataset(), path))
    del arrays["meta"]
    np.savez(path, **arrays)
    _deflated_zeros_member(path, "meta", 64 * 2**20)  # a small file whose metadata member inflates to 64 MiB
    result, peak = _peak_bytes(lambda: read_shard(path, Rank()))
    assert isinstance(result, DataFormatError) and "declares 64.0 MiB" in str(result)
    assert peak < 8 * 2**20
