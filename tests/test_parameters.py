"""Declared parameter constraints: every bad value is refused by ``fit`` with a message naming the
parameter, the value and what is allowed."""

import importlib
import inspect
import re

import numpy as np
import pytest

from bayesmlc.baselines import KNNBaseline, NapkinXCPLT, OmikujiParabel
from bayesmlc.bmls import BMLS
from bayesmlc.bnmc import BNMC
from bayesmlc.calibration import CalibratedClassifier
from bayesmlc.risk_control import RiskController
from bayesmlc.ensemble import AveragingEnsemble
from bayesmlc.exceptions import ValidationError
from bayesmlc.gp import MLGPF
from bayesmlc.linear import LogisticRegression
from bayesmlc.models import LOADABLE_CLASSES
from bayesmlc.parameters import Boolean, InstanceOf, Integer, Options, Real, check_parameters, describe
from bayesmlc.preprocessing import FeaturePreprocessor

X = np.random.default_rng(0).random((12, 4))
Y = (np.random.default_rng(1).random((12, 3)) < 0.5).astype(float)

# (estimator, the message fit gives, exactly)
BAD_SETTINGS = [
    (LogisticRegression(C=0), "C must be a positive number, got 0"),
    (LogisticRegression(C="1"), "C must be a positive number, got '1'"),
    (LogisticRegression(max_iter=0), "max_iter must be an integer >= 1, got 0"),
    (LogisticRegression(tol=-1.0), "tol must be a non-negative number, got -1.0"),
    (LogisticRegression(standardize="auto"), "standardize must be True or False, got 'auto'"),
    (BNMC(truncation=1), "truncation must be an integer >= 2, got 1"),
    (BNMC(n_passes=2.0), "n_passes must be an integer >= 1, got 2.0"),
    (BNMC(batch_size=True), "batch_size must be an integer >= 1, got True"),
    (BNMC(tau=0), "tau must be a positive number, got 0"),
    (BNMC(weight_precision=-1), "weight_precision must be 'auto' or a positive number, got -1"),
    (BNMC(kappa=0.5), "kappa must be a number in (0.5, 1], got 0.5"),
    (BNMC(solver="qr"), "solver must be one of 'auto', 'dense', 'woodbury', 'cg', 'lowrank', got 'qr'"),
    (BNMC(classifier="probit"), "classifier must be one of 'auto', 'logistic', 'svm', got 'probit'"),
    (BNMC(standardize="yes"), "standardize must be 'auto', True or False, got 'yes'"),
    (BNMC(online=1), "online must be True or False, got 1"),
    (BNMC(merge_trials=-1), "merge_trials must be an integer >= 0, got -1"),
    (BNMC(validation_fraction=1.0), "validation_fraction must be a number in [0, 1), got 1.0"),
    (BNMC(sgd_alpha=0.0), "sgd_alpha must be None or a positive number, got 0.0"),
    (BNMC(n_keep=5, n_sweeps=4), "n_keep (5) cannot exceed n_sweeps (4)"),
    (BMLS(n_topics=0), "n_topics must be 'auto' or an integer >= 1, got 0"),
    (BMLS(n_burnin=-1), "n_burnin must be an integer >= 0, got -1"),
    (BMLS(max_sweeps=10), "max_sweeps must be 'auto' or an integer >= 40, got 10"),
    (BMLS(mu0=float("inf")), "mu0 must be a positive number, got inf"),
    (BMLS(schedule="adaptive"), "schedule must be 'auto' or 'fixed', got 'adaptive'"),
    (BMLS(validation_fraction=0.6), "validation_fraction must be None or a number in (0, 0.5], got 0.6"),
    (BMLS(max_kept_draws=-2), "max_kept_draws must be 'auto' or an integer >= 0, got -2"),
    (BMLS(sample_dtype="float64"), "sample_dtype must be 'float32' or 'float16', got 'float64'"),
    (BMLS(sample_beta0="yes"), "sample_beta0 must be True or False, got 'yes'"),
    (BMLS(binarize_threshold="half"), "binarize_threshold must be 'auto', None or a number, got 'half'"),
    (MLGPF(n_latent=0), "n_latent must be 'auto' or an integer >= 1, got 0"),
    (MLGPF(subspace_rank="full"), "subspace_rank must be an integer >= 1 or 'auto', got 'full'"),
    (MLGPF(negative_samples=0), "negative_samples must be an integer >= 1, None or 'auto', got 0"),
    (MLGPF(kernel="rbf"), "kernel must be one of 'auto', 'linear', 'se', 'linear+se', got 'rbf'"),
    (MLGPF(lr_decay=1.5), "lr_decay must be a number in [0, 1], got 1.5"),
    (MLGPF(learning_rate=float("nan")), "learning_rate must be a positive number, got nan"),
    (MLGPF(variational_learning_rate=0), "variational_learning_rate must be None or a positive number, got 0"),
    (MLGPF(idf_weighting="yes"), "idf_weighting must be 'auto', True or False, got 'yes'"),
    (MLGPF(dtype="float16"), "dtype must be 'float32' or 'float64', got 'float16'"),
    (MLGPF(max_batch_size=0), "max_batch_size must be None or an integer >= 1, got 0"),
    (MLGPF(epochs=1, early_stopping_patience=2),
     "early_stopping_patience needs validation_fraction > 0 (a held-out set to watch)"),
    (MLGPF(n_inducing=13), "n_inducing=13 exceeds the n_samples=12 training rows available to initialise the inducing inputs; "
                           "lower n_inducing"),
    (KNNBaseline(n_neighbors=0), "n_neighbors must be an integer >= 1, got 0"),
    (KNNBaseline(weighting="distance"), "weighting must be 'similarity' or 'uniform', got 'distance'"),
    (NapkinXCPLT(arity=1), "arity must be an integer >= 2, got 1"),
    (NapkinXCPLT(loss="hinge"), "loss must be 'log' or 'l2', got 'hinge'"),
    (NapkinXCPLT(n_threads=0), "n_threads must be None or an integer >= 1, got 0"),
    (OmikujiParabel(linear_c=0), "linear_c must be a positive number, got 0"),
    (OmikujiParabel(predict_top_k=0), "predict_top_k must be None or an integer >= 1, got 0"),
    (CalibratedClassifier(LogisticRegression(), method="beta"),
     "method must be one of 'isotonic', 'temperature', 'platt', got 'beta'"),
    (CalibratedClassifier("logistic"), "estimator must be a bayesmlc estimator, got 'logistic'"),
    (CalibratedClassifier(LogisticRegression(), calibration_fraction=1),
     "calibration_fraction must be a number in (0, 1), got 1"),
    (CalibratedClassifier(LogisticRegression(), min_label_positives=0),
     "min_label_positives must be None or an integer >= 1, got 0"),
    (CalibratedClassifier(LogisticRegression(), random_state=1.5), "random_state must be None or an integer, got 1.5"),
    (AveragingEnsemble([("a", LogisticRegression())], random_state="0"), "random_state must be None or an integer, got '0'"),
]


@pytest.mark.parametrize("model, message", BAD_SETTINGS, ids=lambda case: case if isinstance(case, str) else "")
def test_fit_refuses_a_bad_setting_with_a_clear_message(model, message):
    with pytest.raises(ValidationError, match="^" + re.escape(message) + "$"):
        model.fit(X, Y)


def test_preprocessor_refuses_a_bad_setting():
    with pytest.raises(ValidationError, match=re.escape("dtype must be 'float32' or 'float64', got 'float16'")):
        FeaturePreprocessor(dtype="float16").fit(X)


def test_bnmc_partial_fit_checks_the_settings_too():
    with pytest.raises(ValidationError, match=re.escape("tau must be a positive number, got -1")):
        BNMC(tau=-1).partial_fit(X, Y)


def _loadable_classes():
    for path in sorted(set(LOADABLE_CLASSES.values())):  # where each loadable class lives now
        module_name, _, class_name = path.partition(":")
        yield getattr(importlib.import_module(module_name), class_name)


@pytest.mark.parametrize("cls", list(_loadable_classes()), ids=lambda cls: cls.__name__)
def test_declared_names_are_constructor_parameters_and_defaults_pass(cls):
    declared = set(getattr(cls, "_parameter_constraints", {}))
    assert declared <= set(inspect.signature(cls.__init__).parameters) - {"self"}
    if cls in (CalibratedClassifier, RiskController):
        check_parameters(cls(LogisticRegression()))
    elif cls is AveragingEnsemble:
        check_parameters(cls([("logistic", LogisticRegression())]))
    else:
        check_parameters(cls())


def test_constraints_accept_and_describe():
    assert Integer(1).accepts(np.int64(3)) and not Integer(1).accepts(True) and not Integer(1).accepts(1.0)
    assert Real(0, 1, low_open=True).accepts(1) and not Real(0, 1, low_open=True).accepts(0)
    assert not Real().accepts(float("nan")) and not Real().accepts(np.bool_(True))
    assert Boolean().accepts(np.bool_(False)) and not Boolean().accepts(0)
    assert Options("a", None).accepts(None) and not Options(1).accepts(True)
    assert InstanceOf(int, "an int").accepts(3)
    assert describe([Integer(1), "auto"]) == "an integer >= 1 or 'auto'"
    assert describe([None, Integer(0, 5)]) == "None or an integer in [0, 5]"
    assert describe([Options("x", "y", "z")]) == "one of 'x', 'y', 'z'"
    assert describe([Real(None, 2, high_open=True)]) == "a number < 2"
