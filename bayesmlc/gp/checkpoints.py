"""MLGPF's training checkpoints: written atomically, and read like model files (untrusted input).

A checkpoint is a file of :func:`bayesmlc.persistence.write_npz_atomically` whose JSON document is
``{"format": "bayesmlc-mlgpf-checkpoint", "version": 1, "payload": {...}}``; the payload holds the
run's settings, the data's shape, the epoch reached, the module's state dict, Adam's state, the random
stream, the history, the validation rows and the best validated parameters.

:func:`load_checkpoint` checks every field before anything uses it: the keys, the type of each
value, finite numbers, ``epoch`` in [0, ...], history lists of ``epoch`` entries, validation rows
within the data, the module's parameters as float tensors whose label and feature extents match the
recorded data shape, ``best_state`` with the same names and shapes as the parameters, a random-stream
state the generator accepts. :func:`module_from_checkpoint` builds the module (the parameters must
form one, and it and ``best_state`` must score rows like training rows finitely, as a loaded model
must) and :func:`optimizer_state_from_checkpoint` checks Adam's state, entry by entry, against the
very parameters the optimizer updates (shape, dtype kind, finite, second moments >= 0, first moments
within what Adam can accumulate from them) before ``torch.optim.Adam.load_state_dict`` sees it:
Adam's fused step trusts those shapes and writes out of bounds otherwise, and an unbounded first
moment makes a step of any size. Every refusal is a :class:`~bayesmlc.exceptions.ModelFormatError`
that names the file and the field.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from ..exceptions import ModelFormatError
from ..fitted_state import check_integer, check_number, probe_rows, tensor_all_finite
from ..persistence import decode, encode, read_npz, write_npz_atomically
from .history import EPOCH_FIELDS, STEP_FIELDS
from .initialisation import module_from_parameters
from .linear_support import support_problem
from .prediction import mean_utilities

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "save_checkpoint", "load_checkpoint", "module_from_checkpoint",
           "optimizer_state_from_checkpoint", "adam_first_moment_bound"]

CHECKPOINT_FORMAT = "bayesmlc-mlgpf-checkpoint"
CHECKPOINT_VERSION = 1

#: the payload's fields; ``best_state`` may be absent (None)
REQUIRED_FIELDS = ("params", "n_features", "n_labels", "n_rows", "epoch", "parameters", "optimizer", "rng_state",
                   "history", "steps", "jitter", "val_rows", "elapsed")
#: the state of one parameter under Adam without amsgrad (the only Adam :func:`make_optimizer` builds)
ADAM_STATE_FIELDS = frozenset({"step", "exp_avg", "exp_avg_sq"})
#: Adam counts steps in a float32 tensor, exact up to 2**24; a count beyond 2**53 is no count at all
MAX_ADAM_STEP = 2.0**53


def save_checkpoint(path, payload: dict) -> None:
    """Write ``payload`` (tensors, arrays, dicts, numbers) atomically: temporary file, then rename."""
    arrays: dict = {}
    meta = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "payload": encode(payload, arrays, "c")}
    write_npz_atomically(path, meta, arrays)


def load_checkpoint(path) -> dict:
    """The payload of a checkpoint written by :func:`save_checkpoint`, every field checked (see the
    module's docstring); ``ModelFormatError`` naming the file and the field otherwise."""
    path = os.fspath(path)
    meta, arrays = read_npz(path)  # ModelFormatError naming the file for anything not such an archive
    with arrays:
        if meta.get("format") != CHECKPOINT_FORMAT:
            raise ModelFormatError(f"{path}: not an MLGPF checkpoint (format {str(meta.get('format'))[:80]!r})")
        version = meta.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ModelFormatError(f"{path}: checkpoint field version must be an integer >= 1, got "
                                   f"{str(version)[:40]!r}")
        if version > CHECKPOINT_VERSION:
            raise ModelFormatError(f"{path}: checkpoint version {version} was written by a newer bayesmlc; this one "
                                   f"reads versions up to {CHECKPOINT_VERSION}")
        try:
            payload = decode(meta.get("payload"), arrays)
            check_payload(payload)
        except ModelFormatError as exc:
            raise ModelFormatError(f"{path}: {exc}") from None
        except RecursionError:
            raise ModelFormatError(f"{path}: corrupt checkpoint (nested too deeply)") from None
    return payload


def _fail(field: str, message: str) -> ModelFormatError:
    return ModelFormatError(f"checkpoint field {field} {message}")


def _checked(field: str, check, *args, **kwargs) -> None:
    """``check(field, ...)`` of :mod:`bayesmlc.fitted_state`, its message prefixed with the field's place."""
    try:
        check(field, *args, **kwargs)
    except ModelFormatError as exc:
        raise ModelFormatError(f"checkpoint field {exc}") from None


def check_payload(payload) -> None:
    """Check a decoded checkpoint payload field by field (``ModelFormatError`` naming the field)."""
    if not isinstance(payload, dict):
        raise ModelFormatError(f"checkpoint payload must be a mapping of fields, got {type(payload).__name__}")
    missing = [name for name in REQUIRED_FIELDS if name not in payload]
    unknown = sorted(set(payload) - set(REQUIRED_FIELDS) - {"best_state"})
    if missing or unknown:
        raise ModelFormatError(f"checkpoint fields: {'missing ' + ', '.join(missing) if missing else ''}"
                               f"{'; ' if missing and unknown else ''}"
                               f"{'unknown ' + ', '.join(ascii(str(k)[:40]) for k in unknown[:5]) if unknown else ''}")
    params = payload["params"]
    if not isinstance(params, dict) or not all(v is None or isinstance(v, (bool, int, float, str))
                                               for v in params.values()):
        raise _fail("params", "must map setting names to plain values")
    for name in ("n_rows", "n_features", "n_labels"):
        _checked(name, check_integer, payload[name], low=1)
    _checked("epoch", check_integer, payload["epoch"], low=0)
    _checked("jitter", check_number, payload["jitter"], low=0.0)
    _checked("elapsed", check_number, payload["elapsed"], low=0.0)
    _check_parameters("parameters", payload["parameters"], payload["n_features"], payload["n_labels"])
    best = payload.get("best_state")
    if best is not None:
        _check_parameters("best_state", best, payload["n_features"], payload["n_labels"])
        shapes = {k: tuple(v.shape) for k, v in payload["parameters"].items()}
        if {k: tuple(v.shape) for k, v in best.items()} != shapes:
            raise _fail("best_state", "must hold the same tensors, of the same shapes, as parameters")
    _check_history(payload["history"], payload["steps"], payload["epoch"])
    _check_validation_rows(payload["val_rows"], payload["n_rows"])
    _check_rng_state(payload["rng_state"])
    optimizer = payload["optimizer"]
    if not (isinstance(optimizer, dict) and isinstance(optimizer.get("state"), dict)
            and isinstance(optimizer.get("param_groups"), list)):
        raise _fail("optimizer", "must be an optimizer state dict (state, param_groups)")


def _check_tensor(field: str, value, shape=None, low=None) -> None:
    """``value`` is a real floating tensor (of ``shape``, if given) of finite entries >= ``low``."""
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        shown = f"a {value.dtype} tensor" if isinstance(value, torch.Tensor) else type(value).__name__
        raise _fail(field, f"must be a floating-point tensor, got {shown}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise _fail(field, f"must have shape {tuple(shape)} (its parameter's), got {tuple(value.shape)}")
    if not tensor_all_finite(value):
        raise _fail(field, "must hold finite numbers (it holds NaN or infinity)")
    if low is not None and value.numel() and float(value.min()) < low:
        raise _fail(field, f"must be >= {low}, got {float(value.min()):.6g}")


def _check_parameters(field: str, parameters, n_features: int, n_labels: int) -> None:
    """A state dict of finite float tensors whose label rows (``Phi``, ``bias``) and feature extent
    (``inducing.basis_t`` rows or ``inducing.Z`` columns) match the recorded data shape."""
    if not isinstance(parameters, dict) or not parameters:
        raise _fail(field, "must map parameter names to tensors")
    for name, value in parameters.items():
        if name == "linear.support":
            _check_support(f"{field}[{name!r}]", value, n_features, parameters.get("linear.weight"))
        else:
            _check_tensor(f"{field}[{name[:60]!r}]", value)
    extents = {"Phi": (0, n_labels), "bias": (0, n_labels), "inducing.basis_t": (0, n_features),
               "inducing.Z": (1, n_features)}
    for name, (axis, expected) in extents.items():
        value = parameters.get(name)
        if value is not None and (value.dim() <= axis or value.shape[axis] != expected):
            raise _fail(f"{field}[{name!r}]", f"must have {expected} entries on axis {axis} (the checkpoint's "
                        f"data shape), got shape {tuple(value.shape)}")


def _check_support(field: str, value, n_features: int, weight) -> None:
    """The linear term's support: an integer tensor of W's shape holding columns in [0, D) or -1."""
    problem = support_problem(value, n_features)
    if problem:
        raise _fail(field, problem)
    if not isinstance(weight, torch.Tensor) or tuple(value.shape) != tuple(weight.shape):
        raise _fail(field, "must have the shape of linear.weight")


def _real_numbers(values) -> bool:
    return isinstance(values, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _check_history(history, steps, epoch: int) -> None:
    """Per-epoch history lists (those of a fresh trainer) of ``epoch`` numbers each; per-step lists of
    equal length."""
    keys = set(EPOCH_FIELDS)
    if not isinstance(history, dict) or set(history) != keys:
        raise _fail("history", f"must hold exactly the lists {', '.join(sorted(keys))}")
    for name, values in history.items():
        if not _real_numbers(values) or len(values) != epoch:
            raise _fail(f"history[{name!r}]", f"must be a list of {epoch} numbers (one per epoch reached)")
    if not isinstance(steps, dict) or set(steps) != set(STEP_FIELDS):
        raise _fail("steps", f"must hold exactly the lists {', '.join(STEP_FIELDS)}")
    lengths = {len(values) if _real_numbers(values) else -1 for values in steps.values()}
    if len(lengths) != 1 or -1 in lengths:
        raise _fail("steps", "must hold lists of numbers, all of one length")


def _check_validation_rows(rows, n_rows: int) -> None:
    """Sorted distinct row indices in [0, ``n_rows``)."""
    if not isinstance(rows, np.ndarray) or rows.ndim != 1 or rows.dtype.kind not in "iu":
        raise _fail("val_rows", "must be a 1-D integer array")
    if rows.size and (rows[0] < 0 or rows[-1] >= n_rows or np.any(rows[1:] <= rows[:-1])):
        raise _fail("val_rows", f"must be increasing row indices in [0, {n_rows})")


def _check_rng_state(state) -> None:
    """A state that numpy's default bit generator (PCG64) accepts."""
    try:
        np.random.PCG64().state = state
    except (TypeError, ValueError, KeyError, OverflowError) as exc:
        raise _fail("rng_state", f"is not a {np.random.PCG64.__name__} state ({str(exc)[:120]})") from None


def module_from_checkpoint(settings, checkpoint: dict, path, device, dtype):
    """The MLGPF module holding ``checkpoint["parameters"]``; ``ModelFormatError`` naming ``path``
    when they do not form the module ``settings`` describe (names, shapes), or when it or
    ``best_state`` (the module a run ends with when no later epoch validates better) does not score
    rows like training rows (:func:`_probe_scores`)."""
    module = None
    for field in ("parameters", "best_state"):
        if checkpoint.get(field) is None:
            continue
        try:
            built = module_from_parameters(settings, checkpoint[field], device, dtype)
        except (RuntimeError, ValueError, TypeError, IndexError, KeyError) as exc:
            message = " ".join(str(exc).split())[:300]
            raise ModelFormatError(f"{os.fspath(path)}: checkpoint field {field} does not form this MLGPF module "
                                   f"({message})") from None
        _probe_scores(built, checkpoint["n_features"], checkpoint["jitter"], f"{os.fspath(path)}: checkpoint field "
                      f"{field}")
        module = built if module is None else module
    return module


def _probe_scores(module, n_features: int, jitter: float, where: str) -> None:
    """The mean utilities of :func:`~bayesmlc.fitted_state.probe_rows` (all but its row of ones, as
    the model loader's probe) are finite: finite parameters of any size pass the field checks, but
    1e30 in the inducing inputs leaves no Cholesky factor of K_ZZ, at the first step or at the end."""
    rows = probe_rows(n_features)
    try:
        with np.errstate(all="ignore"):
            scores, _ = mean_utilities(module, rows[[i for i in range(rows.shape[0]) if i != 1]], jitter)
    except (RuntimeError, ValueError, ArithmeticError) as exc:  # CholeskyError is a RuntimeError
        raise ModelFormatError(f"{where} does not score rows ({type(exc).__name__}: "
                               f"{' '.join(str(exc).split())[:200]})") from None
    if not np.all(np.isfinite(scores)):
        raise ModelFormatError(f"{where} scores rows like training rows with NaN or infinity")


def optimizer_state_from_checkpoint(optimizer: torch.optim.Optimizer, saved: dict, path) -> dict:
    """The state dict to hand ``optimizer.load_state_dict``: ``optimizer``'s own parameter groups
    (the learning rates are set before every step anyway) with the checkpoint's per-parameter Adam
    state, each entry checked against the parameter it belongs to (:func:`_checked_adam_entry`).

    The checkpoint's groups must list the same parameter indices as ``optimizer``'s; a parameter
    without saved state starts Adam afresh, as it would after its first gradient."""
    fresh = optimizer.state_dict()
    groups, state = saved["param_groups"], saved["state"]
    expected = [group["params"] for group in fresh["param_groups"]]
    if [group.get("params") if isinstance(group, dict) else None for group in groups] != expected:
        raise ModelFormatError(f"{os.fspath(path)}: checkpoint field optimizer.param_groups does not list this "
                               f"module's parameters (expected the indices {expected})")
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    indices = [i for group in expected for i in group]
    unknown = sorted(str(k)[:20] for k in set(state) - {str(i) for i in indices})
    if unknown:
        raise ModelFormatError(f"{os.fspath(path)}: checkpoint field optimizer.state has entries for parameters "
                               f"the module does not have ({', '.join(unknown[:5])})")
    restored = {}
    group_of_each = [group for group in fresh["param_groups"] for _ in group["params"]]
    for index, parameter, group in zip(indices, parameters, group_of_each):
        if str(index) in state:
            try:
                restored[index] = _checked_adam_entry(f"optimizer.state[{index}]", state[str(index)], parameter,
                                                      group["betas"], group["eps"])
            except ModelFormatError as exc:
                raise ModelFormatError(f"{os.fspath(path)}: {exc}") from None
    return {"state": restored, "param_groups": fresh["param_groups"]}


def adam_first_moment_bound(betas) -> float:
    """C with ``exp_avg**2 <= C * exp_avg_sq`` in every state Adam (no amsgrad) can reach, whatever the
    gradients g_i: m_t = (1 - b1) sum_i b1^(t-i) g_i and v_t = (1 - b2) sum_i b2^(t-i) g_i^2
    (Kingma & Ba 2015, Algorithm 1), and by Cauchy-Schwarz (sum_i b1^(t-i) g_i)^2 <= sum_k (b1^2/b2)^k
    * sum_i b2^(t-i) g_i^2, so C = (1 - b1)^2 / ((1 - b2)(1 - b1^2/b2)): 52.9 at torch's (0.9, 0.999);
    infinite when b1^2 >= b2 (no bound)."""
    beta1, beta2 = (float(b) for b in betas)
    if beta1**2 >= beta2:
        return float("inf")
    return (1.0 - beta1) ** 2 / ((1.0 - beta2) * (1.0 - beta1**2 / beta2))


def _checked_adam_entry(field: str, entry, parameter: torch.Tensor, betas=(0.9, 0.999), eps: float = 1e-8) -> dict:
    """One parameter's Adam state: exactly ``step`` (a finite scalar count in [0, 2**53]),
    ``exp_avg`` (finite, the parameter's shape, within :func:`adam_first_moment_bound` of
    ``exp_avg_sq`` up to rounding and ``eps``: else one step moves the parameter arbitrarily far)
    and ``exp_avg_sq`` (finite, >= 0, the parameter's shape); returned with ``step`` as float32
    (Adam's own type for it)."""
    if not isinstance(entry, dict) or set(entry) != ADAM_STATE_FIELDS:
        shown = ", ".join(sorted(str(k)[:20] for k in entry)) if isinstance(entry, dict) else type(entry).__name__
        raise _fail(field, f"must hold exactly {', '.join(sorted(ADAM_STATE_FIELDS))}, got {shown}")
    _check_tensor(f"{field}.step", entry["step"], shape=(), low=0.0)
    if float(entry["step"]) > MAX_ADAM_STEP:
        raise _fail(f"{field}.step", f"must be at most 2**53, got {float(entry['step']):.6g}")
    _check_tensor(f"{field}.exp_avg", entry["exp_avg"], shape=parameter.shape)
    _check_tensor(f"{field}.exp_avg_sq", entry["exp_avg_sq"], shape=parameter.shape, low=0.0)
    root = math.sqrt(adam_first_moment_bound(betas))
    allowed = root * entry["exp_avg_sq"].double().sqrt() * (1.0 + 1e-3) + eps
    if bool((entry["exp_avg"].double().abs() > allowed).any()):
        raise _fail(f"{field}.exp_avg", f"exceeds what Adam accumulates: |exp_avg| <= {root:.4g} sqrt(exp_avg_sq) "
                    f"for betas {tuple(float(b) for b in betas)}")
    return {"step": entry["step"].to(torch.float32), "exp_avg": entry["exp_avg"], "exp_avg_sq": entry["exp_avg_sq"]}
