"""Allocation bounded by the input, and the smaller hardening points (issue 32, points 7 and 8).

Point 7: no input file of under 1 kB makes a command allocate more than 200 MB above a bare ``info``
(peak resident memory of the command's process, measured with ``wait4``); declared widths are
bounded by the bytes of the file declaring them; compressed members of a model file are bounded
before they are inflated; only regular files are read as model parts (a FIFO never hangs a command).
Point 8: ``.mat`` files read under a hard ``ulimit -v``; ``bench`` refuses absurd numbers; a device
that holds no data and torch's out-of-memory error are one-line errors with exit 2.
"""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from bayesmlc.cli import describe_error, main
from bayesmlc.data.dataset import Dataset
from bayesmlc.data.formats.cache import save_npz
from bayesmlc.data.io import read_dataset, write_dataset
from bayesmlc.exceptions import DataFormatError, ModelFormatError
from bayesmlc.persistence import load_model

ROOT = Path(__file__).resolve().parents[1]
#: what a crafted small file may add to the peak memory of a bare ``info``
ALLOWED_GROWTH_MB = 200


def _environment() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _run(argv, cwd: Path, timeout: float = 240.0, limit_address_space: int | None = None):
    """``python -m bayesmlc *argv`` in a child process: ``(exit code, peak RSS in MB, stderr)``; the
    child is killed (and the code is ``"timeout"``) after ``timeout`` seconds."""
    def limit():  # pragma: no cover - runs in the child
        if limit_address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_address_space, limit_address_space))

    err_path = cwd / f"stderr-{time.monotonic_ns()}.txt"
    with open(err_path, "wb") as err:
        child = subprocess.Popen([sys.executable, "-m", "bayesmlc", *map(str, argv)], stdout=subprocess.DEVNULL,
                                 stderr=err, cwd=cwd, env=_environment(), preexec_fn=limit)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                child.kill()
                _, status, usage = os.wait4(child.pid, 0)
                return "timeout", usage.ru_maxrss / 1024, err_path.read_text(errors="replace")
            time.sleep(0.05)
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here; keep Popen from waiting again
    return child.returncode, usage.ru_maxrss / 1024, err_path.read_text(errors="replace")


def _xc_rows(n=40, d=12, n_labels=4, seed=0) -> str:
    rng = np.random.default_rng(seed)
    lines = [f"{n} {d} {n_labels}"]
    for _ in range(n):
        labels = sorted(set(rng.integers(0, n_labels, 2).tolist()))
        features = sorted(set(rng.integers(0, d, 4).tolist()))
        lines.append(",".join(map(str, labels)) + " " + " ".join(f"{j}:1" for j in features))
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A folder with a small training file ``train.txt``."""
    path = tmp_path_factory.mktemp("limits")
    (path / "train.txt").write_text(_xc_rows())
    return path


@pytest.fixture(scope="module")
def bare_info_mb(folder):
    """Peak RSS of ``info`` on a well-formed 40-row file."""
    code, peak, err = _run(["info", "--quiet", "train.txt"], folder)
    assert code == 0, err
    return peak


def _npz_declaring_labels(path: Path, n_labels: int) -> Path:
    """A dataset .npz of 3 rows whose Y_shape declares ``n_labels`` labels."""
    X = sp.csr_matrix(np.eye(3, 4, dtype=np.float32))
    Y = sp.csr_matrix(np.eye(3, 2, dtype=np.float32))
    save_npz(Dataset(X=X, Y=Y), path)
    with np.load(path, allow_pickle=False) as archive:
        members = {key: archive[key] for key in archive.files}
    members["Y_shape"] = np.asarray([3, n_labels], dtype=np.int64)
    np.savez_compressed(path, **members)
    return path


#: crafted files of under 1 kB (the npz: a few kB of zip headers), and the command each is given to
CRAFTED = {
    "xc-header-L": ("huge-L.txt", b"1 1 100000000\n0 0:1\n", ["info"]),
    "xc-header-L-3e8": ("huge-L3.txt", b"1 1 300000000\n0 0:1\n", ["info"]),
    "xc-header-D-train": ("huge-D.txt", b"3 3000000 2\n0 0:1\n1 1:1\n0,1 2:1\n",
                          ["train", "--model", "logistic", "--train"]),
    "svmlight-label-index": ("huge-label.svm", b"100000000 1:1\n0 2:1\n1 1:1\n", ["info"]),
    "svmlight-feature-index-train": ("huge-index.svm", b"0 1:1\n1 2:1\n0,1 3:1 3000000:1\n",
                                     ["train", "--model", "logistic", "--train"]),
}


@pytest.mark.parametrize("case", sorted(CRAFTED) + ["npz-Y_shape"])
def test_small_crafted_file_allocates_little_and_fails_in_one_line(folder, bare_info_mb, case):
    if case == "npz-Y_shape":
        path, command = _npz_declaring_labels(folder / "huge-L.npz", 200_000_000), ["info"]
    else:
        name, content, command = CRAFTED[case]
        path = folder / name
        path.write_bytes(content)
        assert path.stat().st_size < 1024
    code, peak, err = _run([*command, path.name, "--quiet"], folder)
    assert code == 2, (code, err[-1000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "too large for a file of" in lines[0] and path.name in lines[0], err
    assert peak - bare_info_mb < ALLOWED_GROWTH_MB, (peak, bare_info_mb)


@pytest.mark.parametrize("declared, bound, accepted", [
    (1 << 20, 20, True),         # every file may declare MIN_WIDTH_BOUND columns
    ((1 << 20) + 1, 20, False),
    ((1 << 20) + 5000, (1 << 20) + 5000, True),  # one column per byte of the file
    ((1 << 20) + 5001, (1 << 20) + 5000, False),
])
def test_declared_width_is_bounded_by_the_bytes_of_the_file(tmp_path, declared, bound, accepted):
    header = f"1 {declared} 2\n".encode()
    row = b"0 0:1"
    path = tmp_path / "w.txt"
    path.write_bytes(header + row + b" " * (bound - len(header) - len(row) - 1) + b"\n")
    assert path.stat().st_size == max(bound, len(header) + len(row) + 1)
    if accepted:
        assert read_dataset(path).n_features == declared
    else:
        with pytest.raises(DataFormatError, match=f"D={declared}: too large for a file of"):
            read_dataset(path)


def test_svmlight_widths_the_caller_gives_are_not_bounded_by_the_file(tmp_path):
    path = tmp_path / "one.svm"
    path.write_bytes(b"0 5000:1\n")
    assert read_dataset(path).n_features == 5000  # a short file may use up to MIN_WIDTH_BOUND columns
    path.write_bytes(b"0 5000000:1\n")
    with pytest.raises(DataFormatError, match="D=5000000: too large for a file of 12 bytes"):
        read_dataset(path)
    dataset = read_dataset(path, n_features=6_000_000, n_labels=3000)
    assert (dataset.n_features, dataset.n_labels) == (6_000_000, 3000) and dataset.X[0, 4_999_999] == 1


def _replace_member(path: Path, key: str, n_bytes: int) -> None:
    """Rewrite the archive ``path`` with member ``key`` replaced by a deflated ``.npy`` of ``n_bytes``
    zero bytes (a few hundred kilobytes on disk)."""
    with zipfile.ZipFile(path) as archive:
        kept = {info.filename: archive.read(info) for info in archive.infolist() if info.filename != key + ".npy"}
    header = b"\x93NUMPY\x01\x00"
    text = f"{{'descr': '|u1', 'fortran_order': False, 'shape': ({n_bytes},), }}".encode()
    text += b" " * ((64 - (len(header) + 2 + len(text) + 1) % 64) % 64) + b"\n"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in kept.items():
            archive.writestr(name, data)
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open(key + ".npy", "w", force_zip64=True) as member:
            member.write(header + struct.pack("<H", len(text)) + text)
            block = bytes(1 << 20)
            for start in range(0, n_bytes, len(block)):
                member.write(block[: min(len(block), n_bytes - start)])


@pytest.fixture(scope="module")
def run_dir(folder):
    out = folder / "run"
    assert main(["train", "--model", "logistic", "--train", str(folder / "train.txt"), "--out", str(out),
                 "--quiet"]) == 0
    return out


def test_compressed_model_member_is_refused_before_it_is_inflated(folder, run_dir, bare_info_mb, tmp_path):
    """A model file of a few hundred kB whose coefficient member inflates to 320 MiB: refused before
    inflating (the model's shape check would come only after), in memory and in the command."""
    crafted = tmp_path / "run"
    crafted.mkdir()
    for name in os.listdir(run_dir):
        (crafted / name).write_bytes((run_dir / name).read_bytes())
    model = crafted / "model.npz"
    with zipfile.ZipFile(model) as archive:
        key = next(info.filename[:-4] for info in archive.infolist() if "coef" in info.filename)
    _replace_member(model, key, 320 * 2**20)
    assert model.stat().st_size < 2**20
    with pytest.raises(ModelFormatError, match=f"member {key!r} inflates"):
        load_model(model)
    code, peak, err = _run(["predict", "--model-dir", crafted, "--input", folder / "train.txt"], folder)
    assert code == 2 and "inflates" in err and len(err.strip().splitlines()) == 1, err
    assert peak - bare_info_mb < ALLOWED_GROWTH_MB, (peak, bare_info_mb)


@pytest.mark.parametrize("part", ["model.npz", "meta.json"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_model_part_that_is_not_a_regular_file_is_refused_without_reading(folder, run_dir, tmp_path, kind, part):
    crafted = tmp_path / "run"
    crafted.mkdir()
    for name in os.listdir(run_dir):
        if name != part:
            (crafted / name).write_bytes((run_dir / name).read_bytes())
    if kind == "fifo":
        os.mkfifo(crafted / part)
    else:
        os.symlink("/dev/zero", crafted / part)
    code, _, err = _run(["predict", "--model-dir", crafted, "--input", folder / "train.txt"], folder, timeout=60)
    assert code == 2, (code, err[-500:])
    line, = err.strip().splitlines()
    assert part in line and ("a FIFO" if kind == "fifo" else "a device") in line, line


# ---- point 8 ------------------------------------------------------------------------------------
def test_mat_file_reads_under_a_hard_address_space_limit(tmp_path):
    rng = np.random.default_rng(0)
    X = sp.random(10, 6, density=0.5, format="csr", random_state=0, dtype=np.float32)
    Y = sp.csr_matrix((rng.random((10, 3)) < 0.5).astype(np.float32))
    path = write_dataset(Dataset(X=X, Y=Y), tmp_path / "d.mat")
    script = ("import sys, numpy as np; from bayesmlc.data.io import read_dataset; "
              "d = read_dataset(sys.argv[1]); print(d.X.shape, d.Y.shape, float(d.X.sum()))")
    limit = 3 * 2**30

    def cap():  # pragma: no cover - runs in the child
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # soft and hard: the child cannot raise it

    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120,
                          env=_environment(), preexec_fn=cap)
    assert done.returncode == 0, done.stderr[-1000:]
    assert done.stdout.split("(")[1:] == ["10, 6) ", f"10, 3) {float(X.sum())}\n"]


@pytest.mark.parametrize("argv, message", [
    (["--timeout", "-5"], "positive, finite number of seconds"),
    (["--timeout", "inf"], "positive, finite number of seconds"),
    (["--seed", "-1"], "not a seed"),
    (["--threads", "0"], "at least 1 thread"),
    (["--threads", "1000000000"], "threads"),
    (["--repeats", "0"], "at least 1 run"),
])
def test_bench_refuses_absurd_numbers_in_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        main(["bench", "--suite", "quick", "--out", str(tmp_path / "bench"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "bench").exists()


@pytest.mark.parametrize("model", [["logistic"], ["mlgpf", "--set", "n_inducing=5"]], ids=["logistic", "mlgpf"])
def test_a_device_that_holds_no_data_is_refused_in_one_line(folder, capsys, model):
    code = main(["train", "--model", *model, "--train", str(folder / "train.txt"), "--set", "device=meta", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "device='meta'" in err[0], err


def test_torch_out_of_memory_is_a_one_line_usage_error():
    import torch

    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 40000000000000 bytes. Error code 12 (Cannot allocate memory)")
    gpu = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB.\nGPU 0 has a total capacity")
    for error in (cpu, gpu):
        code, message = describe_error(error)
        assert code == 2 and message.startswith("out of memory: ") and "\n" not in message, message
    with pytest.raises(RuntimeError) as real:  # the CPU allocator's own error reads as the first
        torch.empty(2**62, dtype=torch.uint8)
    assert describe_error(real.value)[0] == 2
