"""MLGPF's declared fitted fields (:func:`bayesmlc.fitted_state.check_fitted_state`).

``parameters_`` holds the module's tensors by name; each name has a declared shape over the symbols
``L`` (labels), ``D`` (features), ``Q`` (latent GPs), ``M`` (inducing variables) and ``R`` (the
subspace rank), and ``K`` (the linear term's columns per label); every tensor but ``linear.support``
(integer feature columns) must be floating point (never complex, integer or bool: the module would
copy it silently) and finite (an infinite lengthscale, a NaN mean)."""

from __future__ import annotations

import fnmatch

from ..exceptions import ModelFormatError
from ..fitted_state import Field, _check_value, _shown, choice, integer, number, rule, tensor
from ..state_checks import COMMON_FIELDS
from .kernels import KERNEL_NAMES
from .linear_support import support_problem

__all__ = ["MLGPF_FIELDS", "PARAMETER_SHAPES"]

#: name pattern -> shape (or list of alternative shapes) of every tensor an MLGPF module keeps
PARAMETER_SHAPES = {
    "Phi": ("L", "Q"),
    "bias": ("L",),
    "kernel.*raw_weights": (None,),  # ARD weights, one per input coordinate of the inducing object
    "kernel.*": (),  # variances and lengthscales
    "inducing.Z": ("M", None),
    "inducing.A": ("M", "R"),
    "inducing.basis_t": ("D", "R"),  # X~^T, stored transposed
    "inducing.basis_gram": ("R", "R"),
    "variational.mean": ("Q", "M"),
    "variational.mu": ("Q", "M"),
    "variational.raw_sigma": ("Q", "M"),
    "variational.scale_offdiag": [("M", "M"), ("Q", "M", "M")],
    "variational.raw_scale_diag": [("M",), ("Q", "M")],
    "variational.raw_gp_scale": ("Q",),
    "linear.weight": ("L", "K"),  # K = D without a support
    "linear.support": ("L", "K"),  # integer: each label's feature columns, -1 for none
}
_REQUIRED = ("Phi", "bias", "variational.mean")


def _parameters(model, dims) -> None:
    parameters = model.parameters_
    if not isinstance(parameters, dict):
        raise ModelFormatError(f"parameters_ must be a mapping of tensor names, got {type(parameters).__name__}")
    for name in _REQUIRED:
        if name not in parameters:
            raise ModelFormatError(f"parameters_ lacks {name!r}")
    for name in [*_REQUIRED, *sorted(set(parameters) - set(_REQUIRED))]:
        pattern = next((p for p in PARAMETER_SHAPES if fnmatch.fnmatchcase(str(name), p)), None)
        if pattern is None:
            raise ModelFormatError(f"parameters_ has an entry {str(name)[:80]!r} that no MLGPF module holds")
        if name == "linear.support":
            _check_support(parameters[name], dims)
        else:
            _check_value(tensor(("parameters_", name), PARAMETER_SHAPES[pattern]), parameters[name], dims)
    if "linear.weight" in parameters and "linear.support" not in parameters and dims.get("K") != dims.get("D"):
        raise ModelFormatError(f"parameters_['linear.weight'] must have shape (L, D) without a linear.support "
                               f"(one column per feature, {dims.get('D')}), got {dims.get('K')} columns")


def _flag(model, name: str) -> None:
    """An optional fitted bool (files written before it existed lack it)."""
    value = getattr(model, name, False)
    if not isinstance(value, bool):
        raise ModelFormatError(f"{name} must be True or False, got {_shown(value)}")


def _check_support(value, dims) -> None:
    """linear.support: an integer (L, K) tensor of feature columns in [0, D) or -1."""
    name = "parameters_['linear.support']"
    problem = support_problem(value, dims["D"])
    if problem:
        raise ModelFormatError(f"{name} {problem}")
    for symbol, length in zip(("L", "K"), value.shape):
        dims.setdefault(symbol, length)
        if dims[symbol] != length:
            raise ModelFormatError(f"{name} must have shape (L, K) = ({dims['L']}, {dims['K']}), got {tuple(value.shape)}")


#: :class:`bayesmlc.gp.MLGPF` (files written before ``kernel_`` and ``n_latent_`` existed lack them)
MLGPF_FIELDS = COMMON_FIELDS + (
    choice("kernel_", KERNEL_NAMES, optional=True),
    integer("n_latent_", 1, binds="Q", optional=True),
    rule("linear_term_", lambda model, dims: _flag(model, "linear_term_")),
    number("jitter_", 0.0),
    integer("n_rows_seen_", 0, optional=True),
    Field(path=("step_history_",), kind="mapping", optional=True),
    Field(path=("parameters_",), kind="any"),
    rule("parameters_", _parameters),
)
