"""Declared parameter constraints, checked once for every estimator.

An estimator lists what each constructor parameter may be in a class attribute::

    _parameter_constraints = {
        "n_latent": [Integer(1)],
        "subspace_rank": [Integer(1), "auto"],
        "kernel": [Options("linear", "se", "linear+se")],
        "validation_fraction": [Real(0, 1, high_open=True)],
        "standardize": ["auto", Boolean()],
        "max_batch_size": [Integer(1), None],
    }

A value is accepted when it satisfies at least one entry of its list; a plain string or ``None`` in a
list stands for that literal value. :func:`check_parameters` (called by ``MultiLabelEstimator.fit``)
raises :class:`~bayesmlc.exceptions.ValidationError` naming the parameter, the value and what is
allowed, e.g. ``n_latent must be an integer >= 1, got 0``. Checks that relate two parameters, or a
parameter and the data, stay in the estimator's ``fit``.
"""

from __future__ import annotations

import ast
import math
import numbers

import numpy as np

from .exceptions import ValidationError

__all__ = ["Boolean", "InstanceOf", "Integer", "Options", "Real", "check_parameters", "describe", "parse_set_values"]


def _is_integer(value) -> bool:
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value) -> bool:
    return isinstance(value, (numbers.Real, np.number)) and not isinstance(value, (bool, np.bool_))


class Integer:
    """An integer (not a bool) in [``low``, ``high``]; ``None`` leaves that side open."""

    def __init__(self, low: int | None = None, high: int | None = None):
        self.low, self.high = low, high

    def accepts(self, value) -> bool:
        return (_is_integer(value) and (self.low is None or value >= self.low)
                and (self.high is None or value <= self.high))

    def phrases(self) -> list[str]:
        if self.low is not None and self.high is not None:
            return [f"an integer in [{self.low}, {self.high}]"]
        if self.low is not None:
            return [f"an integer >= {self.low}"]
        return ["an integer" if self.high is None else f"an integer <= {self.high}"]


class Real:
    """A finite real number (int or float, not a bool) between ``low`` and ``high`` (``None``: no
    bound); ``low_open`` / ``high_open`` exclude the bound itself."""

    def __init__(self, low: float | None = None, high: float | None = None, low_open: bool = False,
                 high_open: bool = False):
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open

    def accepts(self, value) -> bool:
        if not _is_real(value) or not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or (value < self.high or (not self.high_open and value == self.high))

    def phrases(self) -> list[str]:
        if self.high is None and self.low == 0:
            return ["a positive number" if self.low_open else "a non-negative number"]
        if self.high is None and self.low is not None:
            return [f"a number {'>' if self.low_open else '>='} {self.low}"]
        if self.low is None and self.high is not None:
            return [f"a number {'<' if self.high_open else '<='} {self.high}"]
        if self.low is None:
            return ["a number"]
        return [f"a number in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"]


class Options:
    """One of the given literal values (strings, ``None``, ...), compared with ``==`` and of the same type."""

    def __init__(self, *values):
        self.values = values

    def accepts(self, value) -> bool:
        return any(type(value) is type(option) and value == option for option in self.values)

    def phrases(self) -> list[str]:
        return [repr(option) for option in self.values]


class InstanceOf:
    """An instance of ``cls``, described as ``description`` ("a bayesmlc estimator")."""

    def __init__(self, cls: type, description: str):
        self.cls, self.description = cls, description

    def accepts(self, value) -> bool:
        return isinstance(value, self.cls)

    def phrases(self) -> list[str]:
        return [self.description]


class Boolean:
    """True or False (a Python or NumPy bool)."""

    def accepts(self, value) -> bool:
        return isinstance(value, (bool, np.bool_))

    def phrases(self) -> list[str]:
        return ["True", "False"]


def _constraint(entry):
    """A constraint object from a list entry: literal strings and ``None`` stand for themselves."""
    if entry is None or isinstance(entry, str):
        return Options(entry)
    return entry


def describe(constraints) -> str:
    """What a list of constraints allows, in words: ``"an integer >= 1 or 'auto'"``; a single list of
    three or more literals reads ``"one of 'a', 'b', 'c'"``."""
    constraints = [_constraint(entry) for entry in constraints]
    if len(constraints) == 1 and isinstance(constraints[0], Options) and len(constraints[0].values) > 2:
        return "one of " + ", ".join(constraints[0].phrases())
    phrases = [phrase for constraint in constraints for phrase in constraint.phrases()]
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " or " + phrases[-1]


def check_parameters(estimator) -> None:
    """Check every parameter that ``type(estimator)._parameter_constraints`` declares (parameters it
    does not list are not checked); raises :class:`ValidationError` on the first that fails."""
    for name, constraints in getattr(type(estimator), "_parameter_constraints", {}).items():
        value = getattr(estimator, name)
        if not any(_constraint(entry).accepts(value) for entry in constraints):
            raise ValidationError(f"{name} must be {describe(constraints)}, got {value!r}")


def parse_set_values(pairs, valid_keys) -> dict:
    """Parameter values from ``"key=value"`` strings (``bayesmlc train --set``, the benchmark scripts):
    a dict ``{key: value}``. A value is a Python literal (int, float, list, ...), ``true``/``false``,
    ``none``/``null`` (any case), else the string itself. Raises :class:`ValidationError` for a string
    without ``=`` or a key not in ``valid_keys``."""
    params = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValidationError(f"expects key=value, got {pair!r}")
        if key not in valid_keys:
            raise ValidationError(f"{key}: unknown parameter; valid keys: {', '.join(sorted(valid_keys))}")
        lowered = raw.strip().lower()
        if lowered in ("true", "false"):
            value = lowered == "true"
        elif lowered in ("none", "null"):
            value = None
        else:
            try:
                value = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                value = raw
        params[key] = value
    return params
