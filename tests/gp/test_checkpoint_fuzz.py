"""Checkpoints are untrusted input (issue 32, point 3), fuzzed: a real checkpoint of a tiny MLGPF run,
mutated by hypothesis (fields dropped or renamed, tensors of another dtype or shape or with NaN, an
infinity or 1e30 in them, the epoch, Adam's state, the version, the document's container types, the
file's bytes), is resumed. The property: resuming either trains on and ends with finite parameters
whose own checkpoint reads back, or raises a documented error (``ModelFormatError`` or
``ValidationError`` in one line naming the file and the field at fault; ``TrainingDivergedError``
when values the checks accept make the bound diverge), never another exception and never a crash.

The examples vary between runs (``derandomize=False``; hypothesis prints a failing example and the
seed to reproduce it with ``--hypothesis-seed``), beside fixed ``@example`` cases. The command line
is checked on a few examples in child processes: exit 0, or exit 2 with one line on stderr.
"""

from __future__ import annotations

import copy
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import write_small_xc as _write_xc
import torch
from hypothesis import HealthCheck, event, example, given, note, settings
from hypothesis import strategies as st

from bayesmlc.cli import main
from bayesmlc.data.io import read_dataset
from bayesmlc.exceptions import ModelFormatError, ValidationError
from bayesmlc.gp.checkpoints import REQUIRED_FIELDS, load_checkpoint, save_checkpoint
from bayesmlc.gp.model import MLGPF
from bayesmlc.gp.training import TrainingDivergedError

ROOT = Path(__file__).resolve().parents[2]
#: the fixture's run: 2 of these epochs are written, a resume asks for 3
SETTINGS = ("n_inducing=6", "n_latent=3", "random_state=0", "lr_decay=0", "checkpoint_every=1",
            "validation_fraction=0.25")
EPOCHS_WRITTEN, EPOCHS_RESUMED = 2, 3
#: what a resume may raise: the documented refusals, and divergence of values the checks accept
REFUSALS = (ModelFormatError, ValidationError)


def _fuzz(max_examples: int) -> settings:
    """Examples that vary between runs; a failing one is printed with the seed that reproduces it."""
    return settings(max_examples=max_examples, deadline=None, derandomize=False, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])




def _cli_arguments(folder: Path, checkpoint: Path, out: str, *extra: str, epochs: int) -> list:
    argv = ["train", "--model", "mlgpf", "--train", str(folder / "train.txt"), "--out", str(folder / out), "--quiet",
            "--set", f"checkpoint_path={checkpoint}", *extra]
    for setting in SETTINGS + (f"epochs={epochs}",):
        argv += ["--set", setting]
    return argv


class Written:
    """The fixture: the folder, the data, the checkpoint's bytes, its payload and the model settings."""

    def __init__(self, folder: Path):
        self.folder = folder
        _write_xc(folder / "train.txt")
        checkpoint = folder / "written.npz"
        assert main(_cli_arguments(folder, checkpoint, "first", epochs=EPOCHS_WRITTEN)) == 0
        self.bytes = checkpoint.read_bytes()
        self.payload = load_checkpoint(checkpoint)
        assert self.payload["best_state"] is not None and len(self.payload["val_rows"]) == 10  # every field in use
        data = read_dataset(folder / "train.txt")
        self.X, self.Y = data.X, data.Y
        known = MLGPF().get_params()
        self.params = {k: v for k, v in self.payload["params"].items() if k in known}

    def resume(self, path: Path) -> MLGPF:
        """Resume the fixture's run from ``path`` to ``EPOCHS_RESUMED`` epochs, in this process."""
        model = MLGPF(**dict(self.params, epochs=EPOCHS_RESUMED, checkpoint_path=str(path)))
        return model.fit(self.X, self.Y, resume=True)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return Written(tmp_path_factory.mktemp("checkpoint-fuzz"))


# ---- mutations of the payload (written back with save_checkpoint) -----------------------------------
_ODD = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                 st.none(), st.text(max_size=4), st.lists(st.integers(-3, 3), max_size=3),
                 st.dictionaries(st.text(max_size=3), st.integers(0, 3), max_size=2))
_EPOCHS = st.one_of(st.sampled_from([-5, -1, 0, 1, 2, 3, 4, 10**30, 2.0, 2.5, True, "2", None]),
                    st.integers(-(10**20), 10**20))
_DTYPES = st.sampled_from(["int64", "int32", "uint8", "bool", "complex64", "complex128", "float64", "float16"])
_SHAPES = st.sampled_from(["transpose", "unsqueeze", "drop_dim", "grow", "shrink", "empty", "scalar", "vector"])
_VALUES = st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e30, -1e30, 3e38, -1.0, 0.0])
_PAYLOAD_MUTATION = st.one_of(
    st.tuples(st.just("drop_field"), st.sampled_from(REQUIRED_FIELDS + ("best_state",))),
    st.tuples(st.just("rename_field"), st.sampled_from(REQUIRED_FIELDS + ("best_state",)), st.text(max_size=6)),
    st.tuples(st.just("replace_field"), st.sampled_from(REQUIRED_FIELDS + ("best_state",)), _ODD),
    st.tuples(st.just("epoch"), _EPOCHS),
    st.tuples(st.just("rewind"), st.integers(0, EPOCHS_WRITTEN)),
    st.tuples(st.just("dtype"), st.integers(0, 10**6), _DTYPES),
    st.tuples(st.just("shape"), st.integers(0, 10**6), _SHAPES),
    st.tuples(st.just("value"), st.integers(0, 10**6), st.integers(0, 10**6), _VALUES),
    st.tuples(st.just("adam_step"), st.integers(0, 10**6),
              st.one_of(_VALUES, st.sampled_from([-1.0, 2.0**53 + 4, 1e300, 2.5]), st.integers(-5, 2**60))),
    st.tuples(st.just("adam_entry"), st.integers(0, 10**6),
              st.sampled_from(["drop", "extra_key", "drop_key", "not_a_dict", "unknown_index", "swap"])),
    st.tuples(st.just("param_groups"), st.sampled_from(["shuffle", "merge", "empty", "not_a_list", "extra_index"])),
    st.tuples(st.just("history"), st.integers(0, 100), st.sampled_from(["truncate", "append", "nan", "text", "none"])),
    st.tuples(st.just("steps"), st.integers(0, 100), st.sampled_from(["truncate", "append", "nan", "text", "none"])),
    st.tuples(st.just("val_rows"), st.sampled_from(["reverse", "duplicate", "beyond", "negative", "float", "2-D",
                                                    "empty", "fewer"])),
    st.tuples(st.just("rng_state"), st.sampled_from(["drop_state", "text", "negative", "huge", "other_generator"])),
    st.tuples(st.just("params"), st.integers(0, 100), _ODD),
    st.tuples(st.just("best_state"), st.sampled_from(["drop_one", "extra", "not_a_dict", "empty"])),
)


def _tensor_slots(payload: dict) -> list:
    """Every tensor of the payload as (its container, its key), in a fixed order."""
    slots = []
    for field in ("parameters", "best_state"):
        if isinstance(payload.get(field), dict):
            slots += [(payload[field], name) for name in sorted(payload[field])]
    state = payload["optimizer"]["state"] if isinstance(payload.get("optimizer"), dict) else {}
    for index in sorted(state, key=str):
        if isinstance(state[index], dict):
            slots += [(state[index], name) for name in sorted(state[index])
                      if isinstance(state[index][name], torch.Tensor)]
    return slots


def _reshaped(tensor: torch.Tensor, how: str) -> torch.Tensor:
    return {"transpose": lambda t: t.T.contiguous() if t.dim() > 1 else t.reshape(-1, 1),
            "unsqueeze": lambda t: t.unsqueeze(0), "drop_dim": lambda t: t[0] if t.dim() else t.reshape(1),
            "grow": lambda t: torch.cat([t.reshape(-1), t.reshape(-1)[:1]]) if t.numel() else torch.ones(1),
            "shrink": lambda t: t.reshape(-1)[1:], "empty": lambda t: t.reshape(-1)[:0],
            "scalar": lambda t: t.reshape(-1)[0].clone() if t.numel() else torch.tensor(0.0),
            "vector": lambda t: t.reshape(-1).clone()}[how](tensor)


def _retyped(tensor: torch.Tensor, dtype: str) -> torch.Tensor:
    if dtype.startswith("complex"):
        return (tensor.to(getattr(torch, dtype)) + 1j).contiguous()
    return tensor.to(getattr(torch, dtype))


def _mutate_list(values, how: str):
    if not isinstance(values, list):
        return values
    return {"truncate": values[:-1], "append": values + values[-1:] + [1.0], "nan": values[:-1] + [float("nan")],
            "text": values[:-1] + ["x"], "none": None}[how]


def _mutate_val_rows(rows: np.ndarray, how: str):
    return {"reverse": rows[::-1].copy(), "duplicate": np.concatenate([rows[:-1], rows[-2:-1]]),
            "beyond": np.concatenate([rows[:-1], [10**6]]), "negative": np.concatenate([[-1], rows[1:]]),
            "float": rows.astype(np.float64), "2-D": rows.reshape(2, -1), "empty": rows[:0],
            "fewer": rows[:-1]}[how]


def _mutate_rng_state(state: dict, how: str):
    state = copy.deepcopy(state)
    if how == "drop_state":
        del state["state"]
    elif how == "text":
        state["state"]["state"] = "x"
    elif how == "negative":
        state["state"]["inc"] = -1
    elif how == "huge":
        state["state"]["state"] = 2**200
    else:
        state["bit_generator"] = "MT19937"
    return state


def _mutate_adam_entry(state: dict, index: int, how: str) -> None:
    keys = sorted(state, key=int)
    key = keys[index % len(keys)]
    if how == "drop":
        del state[key]
    elif how == "extra_key":
        state[key]["max_exp_avg_sq"] = state[key]["exp_avg_sq"].clone()
    elif how == "drop_key":
        del state[key][sorted(state[key])[index % 3]]
    elif how == "not_a_dict":
        state[key] = [1, 2]
    elif how == "unknown_index":
        state[str(len(keys) + index % 5)] = state[key]
    else:  # another parameter's state (most of another shape)
        other = keys[(index + 1) % len(keys)]
        state[key], state[other] = state[other], state[key]


def _mutate_param_groups(optimizer: dict, how: str) -> None:
    groups = optimizer["param_groups"]
    if how == "shuffle":
        groups[0]["params"] = groups[0]["params"][::-1]
    elif how == "merge":
        optimizer["param_groups"] = [dict(groups[0], params=[i for g in groups for i in g["params"]])]
    elif how == "empty":
        optimizer["param_groups"] = []
    elif how == "not_a_list":
        optimizer["param_groups"] = {"0": groups[0]}
    else:
        groups[-1]["params"] = groups[-1]["params"] + [99]


def _apply(payload: dict, mutation: tuple) -> str:
    """Apply ``mutation`` to ``payload`` in place; returns the top-level field it changed."""
    kind, *args = mutation
    if kind in ("drop_field", "rename_field", "replace_field"):
        value = payload.pop(args[0], None)
        if kind == "rename_field":
            payload[args[1] or "_"] = value
        elif kind == "replace_field":
            payload[args[0]] = args[1]
        return args[0]
    if kind == "epoch":
        payload["epoch"] = args[0]
        return "epoch"
    if kind == "rewind":  # an earlier epoch with its history: a consistent checkpoint
        payload["epoch"] = args[0]
        payload["history"] = {k: v[: args[0]] for k, v in payload["history"].items()}
        return "epoch"
    if kind in ("dtype", "shape", "value"):
        slots = _tensor_slots(payload)
        container, key = slots[args[0] % len(slots)]
        tensor = container[key]
        if kind == "dtype":
            container[key] = _retyped(tensor, args[1])
        elif kind == "shape":
            container[key] = _reshaped(tensor, args[1])
        elif tensor.numel():
            changed = tensor.clone().reshape(-1)
            value = args[2]
            if not tensor.is_floating_point():  # an integer field (the linear term's support): any integer
                value = -2 if not math.isfinite(value) else int(max(min(value, 2**62), -(2**62)))
            changed[args[1] % changed.numel()] = value
            container[key] = changed.reshape(tensor.shape)
        return "tensor"
    if kind == "adam_step":
        state = payload["optimizer"]["state"]
        key = sorted(state, key=int)[args[0] % len(state)]
        state[key]["step"] = torch.tensor(args[1]) if isinstance(args[1], float) or abs(args[1]) < 2**62 else args[1]
        return "optimizer"
    if kind == "adam_entry":
        _mutate_adam_entry(payload["optimizer"]["state"], args[0], args[1])
        return "optimizer"
    if kind == "param_groups":
        _mutate_param_groups(payload["optimizer"], args[0])
        return "optimizer"
    if kind in ("history", "steps"):
        lists = payload[kind]
        name = sorted(lists)[args[0] % len(lists)]
        lists[name] = _mutate_list(lists[name], args[1])
        return kind
    if kind == "val_rows":
        payload["val_rows"] = _mutate_val_rows(payload["val_rows"], args[0])
        return "val_rows"
    if kind == "rng_state":
        payload["rng_state"] = _mutate_rng_state(payload["rng_state"], args[0])
        return "rng_state"
    if kind == "params":
        name = sorted(payload["params"])[args[0] % len(payload["params"])]
        payload["params"][name] = args[1]
        return "params"
    best = payload["best_state"]  # kind == "best_state"
    if args[0] == "drop_one":
        best.pop(sorted(best)[0])
    elif args[0] == "extra":
        best["extra"] = torch.zeros(2)
    else:
        payload["best_state"] = {"not_a_dict": [1], "empty": {}}[args[0]]
    return "best_state"


def _check_resume(written: Written, path: Path) -> tuple[str, str]:
    """Resume from ``path``: finite parameters and a checkpoint that reads back (``("trained", "")``),
    or a documented error in one line naming the file (``("refused" or "diverged", message)``)."""
    try:
        model = written.resume(path)
    except REFUSALS as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(f"{path}: "), message
        return "refused", message
    except TrainingDivergedError as exc:
        assert "\n" not in str(exc), str(exc)
        return "diverged", str(exc)
    for name, value in model.parameters_.items():
        assert bool(torch.isfinite(torch.as_tensor(value)).all()), f"resumed parameter {name} is not finite"
    assert load_checkpoint(path)["epoch"] == EPOCHS_RESUMED  # what the resumed run wrote reads back
    return "trained", ""


def _mutated_payload(payload: dict, mutations: list) -> tuple[dict, list]:
    """A copy of ``payload`` with ``mutations`` applied in turn, and the fields they changed. A
    mutation that an earlier one left nothing to act on (a dropped or replaced field) is skipped."""
    payload = copy.deepcopy(payload)
    fields = []
    for mutation in mutations:
        try:
            fields.append(_apply(payload, mutation))
        except (KeyError, TypeError, AttributeError, IndexError, ValueError, RuntimeError, ZeroDivisionError):
            assert len(mutations) > 1, mutation  # each mutation applies to the written checkpoint
            fields.append(None)
    return payload, fields


#: the words a refusal of a change to a top-level field names (the field, or a field it must agree with)
_NAMED = {
    "tensor": ("parameters", "best_state", "optimizer", "tensor entry"),
    "optimizer": ("optimizer",),
    "epoch": ("epoch", "history"),
    "params": ("params", "different parameters"),
    "n_rows": ("n_rows", "val_rows", "data of shape"),
    "n_features": ("n_features", "features=", "parameters"),
    "n_labels": ("n_labels", "labels=", "parameters"),
    "best_state": ("best_state",),
}


def _names_the_field(message: str, field: str) -> bool:
    """(A renamed field is refused by its new, unknown name.)"""
    return any(word in message for word in _NAMED.get(field, (field,))) or "fields: missing" in message \
        or "fields: unknown" in message


@_fuzz(80)
@given(mutations=st.lists(_PAYLOAD_MUTATION, min_size=1, max_size=3))
@example(mutations=[("shape", 20, "grow")])  # Adam state longer than its parameter: wrote out of bounds
@example(mutations=[("value", 3, 0, float("nan")), ("rewind", 2)])
@example(mutations=[("epoch", 10**30)])
@example(mutations=[("replace_field", "optimizer", [1, 2])])
@example(mutations=[("rewind", 1)])
@example(mutations=[("rename_field", "params", "\n")])  # an unknown name is quoted, the message one line
@example(mutations=[("rename_field", "best_state", "")])
@example(mutations=[("dtype", 0, "complex64")])
@example(mutations=[("adam_step", 0, 2.0**53 + 4)])
def test_any_mutated_checkpoint_resumes_finite_or_is_refused_by_field(written, mutations):
    _resume_mutated(written, mutations)


def _resume_mutated(written: Written, mutations: list) -> None:
    """Write the fixture's payload with ``mutations`` and resume from it (:func:`_check_resume`); a
    refusal of one mutation names the field it changed (or a field that must agree with it)."""
    payload, fields = _mutated_payload(written.payload, mutations)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "mutated.npz"
        save_checkpoint(path, payload)
        outcome, message = _check_resume(written, path)
    event(f"resume {outcome}")
    note(f"resume {outcome}: {message}")
    if outcome == "refused" and len(mutations) == 1:
        assert _names_the_field(message, fields[0]), (fields[0], message)


# ---- mutations of the document (format, version, container types) and of the file's bytes -----------
def _document(data: bytes) -> tuple[dict, dict]:
    with np.load(io.BytesIO(data)) as archive:
        arrays = {k: archive[k] for k in archive.files}
    return json.loads(arrays.pop("__meta__").tobytes()), arrays


_DOCUMENT_MUTATION = st.one_of(
    st.tuples(st.just("version"), st.one_of(_ODD, st.sampled_from([0, 1, 2, -1, "1", 1.0, True, 10**40]))),
    st.tuples(st.just("format"), _ODD),
    st.tuples(st.just("payload"), _ODD),
    st.tuples(st.just("meta"), st.one_of(st.lists(st.integers(), max_size=2), st.text(max_size=4), st.integers())),
    st.tuples(st.just("meta_bytes"), st.binary(max_size=40)),
    st.tuples(st.just("drop_array"), st.integers(0, 10**6)),
    st.tuples(st.just("array_dtype"), st.integers(0, 10**6),
              st.sampled_from(["<U3", "S2", ">f8", ">i4", "<c16", "<f16", "<c32", "?"])),
    st.tuples(st.just("reference"), st.integers(0, 10**6), st.one_of(st.text(max_size=5), st.integers(), st.none())),
)


def _apply_document(meta: dict, arrays: dict, mutation: tuple):
    """Apply ``mutation``; returns the new ``__meta__`` bytes."""
    kind, *args = mutation
    names = sorted(arrays)
    if kind in ("version", "format", "payload"):
        meta[kind] = args[0]
    elif kind == "meta":
        meta = args[0]
    elif kind == "meta_bytes":
        return np.frombuffer(args[0], np.uint8)
    elif kind == "drop_array":
        del arrays[names[args[0] % len(names)]]
    elif kind == "array_dtype":
        name = names[args[0] % len(names)]
        arrays[name] = np.ones(arrays[name].shape, args[1]) if args[1] != "<U3" else np.full(arrays[name].shape, "abc")
    else:  # a tensor or array reference to another entry, or to no entry
        text = json.dumps(meta)
        name = names[args[0] % len(names)]
        meta = json.loads(text.replace(json.dumps(name), json.dumps(args[1]), 1))
    return np.frombuffer(json.dumps(meta).encode(), np.uint8)


_BYTES_MUTATION = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=8)),
    st.tuples(st.just("garbage"), st.binary(max_size=300)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=100)),
    st.tuples(st.just("zip_of_other"), st.binary(max_size=50)),
)


def _mutated_bytes(data: bytes, mutation: tuple) -> bytes:
    kind, arg = mutation
    if kind == "truncate":
        return data[: int(arg * len(data))]
    if kind == "flip":
        changed = bytearray(data)
        for where, value in arg:
            changed[min(int(where * len(data)), len(data) - 1)] = value
        return bytes(changed)
    if kind == "garbage":
        return arg
    if kind == "append":
        return data + arg
    buffer = io.BytesIO()  # a zip archive, but not of arrays
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("__meta__.npy", arg)
    return buffer.getvalue()


@_fuzz(60)
@given(mutation=st.one_of(_DOCUMENT_MUTATION, _BYTES_MUTATION))
@example(mutation=("version", "x"))
@example(mutation=("payload", [1, 2]))
@example(mutation=("version", 10**40))
@example(mutation=("truncate", 0.5))
@example(mutation=("garbage", b""))
@example(mutation=("meta_bytes", b"[" * 40))
def test_any_mangled_checkpoint_file_resumes_finite_or_is_refused(written, mutation):
    _resume_mangled(written, mutation)


def _resume_mangled(written: Written, mutation: tuple) -> None:
    """Write the fixture's file with its document or bytes mangled and resume from it."""
    if mutation[0] in ("truncate", "flip", "garbage", "append", "zip_of_other"):
        data = _mutated_bytes(written.bytes, mutation)
    else:
        meta, arrays = _document(written.bytes)
        arrays["__meta__"] = _apply_document(meta, arrays, mutation)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        data = buffer.getvalue()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "mangled.npz"
        path.write_bytes(data)
        outcome, message = _check_resume(written, path)
    event(f"resume {outcome}")
    note(f"resume {outcome}: {message}")


def test_the_unmutated_checkpoint_resumes(written, tmp_path):
    """The base of every mutation resumes (else every case would be a refusal of something else)."""
    path = tmp_path / "copy.npz"
    path.write_bytes(written.bytes)
    assert _check_resume(written, path) == ("trained", "")


# ---- what the fuzz found, as fixed cases -------------------------------------------------------------
def _first_moment(payload: dict, index: str) -> torch.Tensor:
    return payload["optimizer"]["state"][index]["exp_avg"]


@pytest.mark.parametrize("edit, expected", [
    # Adam's first moment far beyond its second: one step of any size (3e38 overflowed the parameter
    # to inf: a run that ended "successfully" with non-finite parameters, or an AssertionError, exit 1)
    (lambda p: _first_moment(p, "1").fill_(3e38), "checkpoint field optimizer.state[1].exp_avg exceeds what Adam"),
    (lambda p: _first_moment(p, "3").view(-1)[0].fill_(1e30), "checkpoint field optimizer.state[3].exp_avg exceeds"),
    # finite inducing inputs of 1e30 leave K_ZZ without a Cholesky factor: a raw CholeskyError
    (lambda p: p["parameters"]["inducing.A"].view(-1)[0].fill_(1e30),
     "checkpoint field parameters does not score rows (CholeskyError"),
    (lambda p: p["best_state"]["inducing.A"].view(-1)[0].fill_(-1e30),
     "checkpoint field best_state does not score rows (CholeskyError"),
    (lambda p: p["best_state"]["Phi"].fill_(3e38),
     "checkpoint field best_state scores rows like training rows with NaN"),
], ids=["exp_avg-3e38", "exp_avg-1e30", "inducing-1e30", "best-inducing-1e30", "best-Phi-3e38"])
def test_values_the_field_checks_passed_are_refused_by_field(written, tmp_path, edit, expected):
    payload = copy.deepcopy(written.payload)
    edit(payload)
    path = tmp_path / "found.npz"
    save_checkpoint(path, payload)
    outcome, message = _check_resume(written, path)
    assert outcome == "refused" and message.startswith(f"{path}: {expected}"), message


def test_adam_first_moment_bound_is_the_supremum_of_adams_own_states():
    """C of :func:`adam_first_moment_bound` against torch's Adam itself: random gradient sequences stay
    below it, and the Cauchy-Schwarz equality case (g_i proportional to (b1/b2)^(t-i), growing
    geometrically) comes within 1% of it after 300 steps."""
    from bayesmlc.gp.checkpoints import adam_first_moment_bound

    betas = (0.9, 0.999)
    bound = adam_first_moment_bound(betas)
    assert bound == pytest.approx(0.01 / (0.001 * (1 - 0.81 / 0.999)), rel=1e-12)  # 52.86...
    rng = np.random.default_rng(0)
    t = 300
    sequences = [rng.normal(size=(t, 50)) * rng.lognormal(0, 3, size=(t, 1)) for _ in range(3)]
    # g_i = (b1/b2)^(t-i) for i = 1..t: each gradient 1/0.9009 times the one before
    sequences.append(((betas[0] / betas[1]) ** (t - 1 - np.arange(t)))[:, None] * np.ones((1, 50)))
    ratios = []
    for gradients in sequences:
        parameter = torch.zeros(50, dtype=torch.float64, requires_grad=True)
        adam = torch.optim.Adam([parameter], lr=1e-3, betas=betas)
        for g in gradients:
            parameter.grad = torch.as_tensor(g, dtype=torch.float64)
            adam.step()
        state = adam.state[parameter]
        ratios.append(float((state["exp_avg"] ** 2 / state["exp_avg_sq"]).max()))
    assert max(ratios[:3]) <= bound and ratios[3] <= bound * (1 + 1e-9), ratios
    assert ratios[3] == pytest.approx(bound, rel=0.01), ratios


def test_tensor_entries_of_the_other_byte_order_are_read_and_wider_floats_refused():
    """``decode`` gave torch a big-endian array (a raw ValueError) and a long double one (TypeError)."""
    from bayesmlc.persistence import decode

    decoded = decode({"__tensor__": "t"}, {"t": np.arange(3, dtype=">f8")})
    assert decoded.dtype == torch.float64 and decoded.tolist() == [0.0, 1.0, 2.0]
    assert decode({"__tensor__": "t"}, {"t": np.array([-2, 7], dtype=">i4")}).tolist() == [-2, 7]
    for dtype in ("<f16", "<c32"):
        with pytest.raises(ModelFormatError, match="tensor entry 't' has dtype"):
            decode({"__tensor__": "t"}, {"t": np.ones(2, dtype=dtype)})


# ---- the command line, in child processes --------------------------------------------------------
def _resume_command(written: Written, checkpoint: Path, out: str) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = _cli_arguments(written.folder, checkpoint, out, "--resume", epochs=EPOCHS_RESUMED)
    return subprocess.run([sys.executable, "-m", "bayesmlc", *argv], capture_output=True, text=True, timeout=120,
                          cwd=written.folder, env=environment)


_CLI_CASES = iter(range(10**9))


@_fuzz(1)
@given(mutation=st.one_of(_PAYLOAD_MUTATION, _BYTES_MUTATION))
@example(mutation=("value", 23, 0, 3e38))  # Adam's exp_avg of Phi's bias: exit 1 (AssertionError) or 0 with inf
def test_the_cli_resumes_a_mutated_checkpoint_or_exits_2_with_one_line(written, mutation):
    case = next(_CLI_CASES)
    path = written.folder / f"cli-{case}.npz"
    if mutation[0] in ("truncate", "flip", "garbage", "append", "zip_of_other"):
        path.write_bytes(_mutated_bytes(written.bytes, mutation))
    else:
        payload, _ = _mutated_payload(written.payload, [mutation])
        save_checkpoint(path, payload)
    done = _resume_command(written, path, f"cli-run-{case}")
    lines = done.stderr.strip().splitlines()
    note(f"exit {done.returncode}: {done.stderr[-500:]}")
    assert done.returncode in (0, 2), (done.returncode, done.stderr[-2000:])
    if done.returncode == 2:
        assert len(lines) == 1 and lines[0].startswith("bayesmlc: error: "), done.stderr
        assert not (written.folder / f"cli-run-{case}").exists()
    else:
        assert (written.folder / f"cli-run-{case}" / "model.npz").is_file()


@pytest.mark.slow
@_fuzz(1500)
@given(mutations=st.one_of(st.lists(_PAYLOAD_MUTATION, min_size=1, max_size=4), _DOCUMENT_MUTATION, _BYTES_MUTATION))
def test_many_mutated_or_mangled_checkpoints(written, mutations):
    """Both properties on many more examples (``-m slow``)."""
    if isinstance(mutations, list):
        _resume_mutated(written, mutations)
    else:
        _resume_mangled(written, mutations)
