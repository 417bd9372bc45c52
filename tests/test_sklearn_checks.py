"""scikit-learn's own estimator checks on every model, with tiny settings (the models with their own
fit in the default suite; the ensemble, the calibration wrapper and the napkinXC/omikuji baselines
with ``-m slow``).

The checks that cannot apply to a multi-label estimator with a sparse ``predict`` are listed in
``NOT_APPLICABLE`` with the reason (docs/estimators.md repeats them); scikit-learn runs them as
expected failures, so a check that starts passing shows up as XPASS. The tests below the
parametrized checks cover what those checks would have covered, with 0/1 indicator labels.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone, is_classifier
from sklearn.utils.estimator_checks import parametrize_with_checks

from conftest import linear_multilabel_problem

from bayesmlc.base import MultiLabelEstimator
from bayesmlc.baselines import KNNBaseline, missing_dependency
from bayesmlc.bmls import BMLS
from bayesmlc.bnmc import BNMC
from bayesmlc.calibration import CalibratedClassifier
from bayesmlc.ensemble import AveragingEnsemble
from bayesmlc.gp import MLGPF
from bayesmlc.linear import LogisticRegression
from bayesmlc.models import MODEL_CLASSES, get_model_class

#: tiny settings: each model's whole set of checks runs in seconds
FAST = {
    "logistic": lambda: LogisticRegression(max_iter=5, device="cpu"),
    "mlgpf": lambda: MLGPF(n_latent=2, n_inducing=4, subspace_rank=3, batch_size=32, epochs=2, n_threads=1,
                           device="cpu"),
    "bmls": lambda: BMLS(n_topics=2, schedule="fixed", n_burnin=4, n_draws=4, thin=1, device="cpu"),
    "bnmc": lambda: BNMC(truncation=3, n_passes=1, n_mode_steps=2, n_sweeps=1, n_keep=1, merge_trials=0,
                         validation_fraction=0.0, device="cpu"),
    "knn": lambda: KNNBaseline(n_neighbors=3, device="cpu"),
    "ensemble": lambda: AveragingEnsemble([("logistic", LogisticRegression(max_iter=5, device="cpu")),
                                           ("knn", KNNBaseline(n_neighbors=3, device="cpu"))]),
    "calibration": lambda: CalibratedClassifier(LogisticRegression(max_iter=5, device="cpu"), method="platt",
                                                min_label_positives=None),
}


def _optional_baselines():
    """The napkinXC and omikuji baselines, where the [compare] extra is installed."""
    import importlib.util

    libraries = {"napkinxc_plt": "napkinxc", "omikuji_parabel": "omikuji", "omikuji_bonsai": "omikuji"}
    return {name: get_model_class(name) for name, library in libraries.items()
            if importlib.util.find_spec(library) is not None}


OPTIONAL = _optional_baselines()


#: the default suite runs every check on the models with their own fit; the wrappers (which add clones
#: and fit their members several times) and the optional library baselines run under -m slow
DEFAULT_SUITE = ("logistic", "mlgpf", "bmls", "bnmc", "knn")


def slow_suite_estimators():
    models = [make() for name, make in FAST.items() if name not in DEFAULT_SUITE]
    models += [cls(n_threads=1, device="cpu") for cls in OPTIONAL.values()]
    return models


#: scikit-learn checks that cannot apply, and why (docs/estimators.md, "scikit-learn checks")
NOT_APPLICABLE = {
    "check_estimators_dtypes":
        "feeds the class labels 1 and 2; Y is a 0/1 indicator matrix (covered here with 0/1 labels)",
    "check_fit2d_1feature":
        "feeds the class labels 1 and 2; Y is a 0/1 indicator matrix (covered here with 0/1 labels)",
    "check_classifier_data_not_an_array":
        "feeds the class labels 1 and 2; Y is a 0/1 indicator matrix (covered here with 0/1 labels)",
    "check_classifiers_classes":
        "feeds 1-D string class labels; Y is a 0/1 indicator matrix",
    "check_classifiers_train":
        "expects 1-D predictions of class labels and predict_proba with one column per class summing to one; "
        "a multi-label model predicts one independent probability per label",
    "check_decision_proba_consistency":
        "feeds a 1-D binary target; Y is 2-D (the same property is tested here on 2-D Y)",
    "check_estimator_sparse_array":
        "expects predict_proba of shape (n, 2) for a binary target; a multi-label model gives (n, L) "
        "(sparse input in every scipy format is tested here)",
    "check_estimator_sparse_matrix":
        "expects predict_proba of shape (n, 2) for a binary target; a multi-label model gives (n, L) "
        "(sparse input in every scipy format is tested here)",
    "check_classifier_multioutput":
        "expects predict to return a dense integer ndarray; predict returns a sparse CSR 0/1 matrix",
    "check_classifiers_multilabel_representation_invariance":
        "compares predict outputs with assert_array_equal, which needs dense arrays; predict returns sparse CSR",
    "check_classifiers_multilabel_output_format_predict":
        "expects predict to return a dense ndarray; predict returns a sparse CSR 0/1 matrix",
}


#: checks that cannot apply to one model, and why
NOT_APPLICABLE_TO = {
    "KNNBaseline": {
        "check_classifiers_multilabel_output_format_predict_proba":
            "demands probabilities strictly inside (0, 1); a k-NN vote fraction is exactly 0 or 1 where all "
            "neighbours agree",
    },
    "NapkinXCPLT": {
        "check_fit_idempotent": "napkinXC's training is not reproducible from its seed (two fits with the same "
                                "seed on one thread differ)",
    },
    "OmikujiParabel": {"check_fit_idempotent": "omikuji takes no seed: repeated fits differ slightly"},
    "OmikujiBonsai": {"check_fit_idempotent": "omikuji takes no seed: repeated fits differ slightly"},
}


def expected_failed_checks(estimator):
    return {**NOT_APPLICABLE, **NOT_APPLICABLE_TO.get(type(estimator).__name__, {})}


@parametrize_with_checks([FAST[name]() for name in DEFAULT_SUITE], expected_failed_checks=expected_failed_checks)
def test_scikit_learn_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny data: empty label columns, convergence
        check(estimator)


@pytest.mark.slow
@parametrize_with_checks(slow_suite_estimators(), expected_failed_checks=expected_failed_checks)
def test_scikit_learn_checks_on_wrappers_and_library_baselines(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(estimator)


@pytest.mark.parametrize("name", sorted(MODEL_CLASSES))
def test_every_registered_model_is_a_multilabel_classifier(name):
    missing = missing_dependency(name)
    if missing is not None:  # an optional baseline of the [compare] extra, not installed here
        pytest.skip(missing)
    cls = get_model_class(name)
    model = FAST[name]() if name in FAST else cls()
    assert is_classifier(model)
    tags = model.__sklearn_tags__()
    assert tags.classifier_tags.multi_label and not tags.classifier_tags.multi_class
    assert tags.target_tags.multi_output and not tags.target_tags.single_output
    assert tags.input_tags.sparse


def test_wrappers_are_classifiers():
    for model in (FAST["ensemble"](), FAST["calibration"]()):
        assert is_classifier(model)


# ---- what the inapplicable checks would cover, with 0/1 labels -----------------------------------------
@pytest.fixture(scope="module")
def problem():
    X, Y = linear_multilabel_problem(n=60, d=8, n_labels=3, seed=2, density=0.6)
    return X.toarray(), Y


@pytest.mark.parametrize("name", ["logistic", "mlgpf", "bmls", "bnmc", "knn"])  # the wrappers see what these see
def test_feature_dtypes_and_sparse_formats_give_the_same_model(name, problem):
    """float32, float64, int64 and int32 X, and X in every scipy sparse format, fit the same model
    (to float32 rounding): all become the same float32 CSR."""
    X, Y = problem
    X = np.round(X * 4)  # integral, so the integer dtypes hold the same values
    reference = FAST[name]().set_params(random_state=0).fit(X, Y).predict_proba(X)
    variants = [X.astype(np.float32), X.astype(np.int64), X.astype(np.int32)]
    variants += [sp.csr_matrix(X).asformat(fmt) for fmt in ("coo", "csc", "dok", "lil", "dia", "bsr")]
    variants += [sp.csr_array(X)]
    index64 = sp.csr_matrix(X)
    index64.indices, index64.indptr = index64.indices.astype(np.int64), index64.indptr.astype(np.int64)
    variants.append(index64)
    for variant in variants:
        model = FAST[name]().set_params(random_state=0).fit(variant, Y)
        np.testing.assert_allclose(model.predict_proba(variant), reference, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{type(variant).__name__} {getattr(variant, 'dtype', '')}")


@pytest.mark.parametrize("name", ["logistic", "knn", "bmls"])
def test_one_feature_and_not_an_array(name, problem):
    X, Y = problem
    model = FAST[name]().set_params(random_state=0)
    model.fit(X[:, :1], Y)
    assert model.predict_proba(X[:, :1]).shape == Y.shape
    # array-likes that are not arrays (nested lists) fit the same model
    from_lists = FAST[name]().set_params(random_state=0).fit(X[:, :1].tolist(), Y.tolist())
    np.testing.assert_allclose(from_lists.predict_proba(X[:, :1].tolist()), model.predict_proba(X[:, :1]),
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(FAST))
def test_proba_is_monotone_in_the_scores_per_label(name, problem):
    """decision_function and predict_proba rank every label's rows the same way. MLGPF's default
    scores are posterior mean utilities while its probabilities also integrate over each row's own
    predictive variance, so the two can rank rows differently; with ``rank_by="proba"`` they agree."""
    X, Y = problem
    model = FAST[name]().set_params(random_state=0)
    if name == "mlgpf":
        model.set_params(rank_by="proba")
    model.fit(X, Y)
    proba, scores = model.predict_proba(X), model.decision_function(X)
    for label in range(Y.shape[1]):
        order = np.argsort(scores[:, label], kind="stable")
        assert np.all(np.diff(proba[order, label]) >= -1e-6), label


def test_one_dimensional_y_is_refused_with_the_way_out():
    X, Y = linear_multilabel_problem(n=20, d=4, n_labels=1)
    with pytest.raises(ValueError, match=r"1-D target of type 'binary'.*reshape\(-1, 1\)"):
        LogisticRegression().fit(X, Y[:, 0])
    with pytest.raises(ValueError, match="Only binary classification is supported.*LabelBinarizer"):
        LogisticRegression().fit(X, np.arange(20) % 3)
    model = LogisticRegression(device="cpu").fit(X, Y[:, :1])
    assert model.predict_proba(X).shape == (20, 1)
    np.testing.assert_array_equal(model.classes_, [0])


def test_classes_are_the_label_columns():
    X, Y = linear_multilabel_problem(n=40, d=5, n_labels=4)
    model = LogisticRegression(device="cpu").fit(X, Y)
    np.testing.assert_array_equal(model.classes_, np.arange(4))
    assert not hasattr(LogisticRegression(), "classes_")


@pytest.mark.parametrize("name", ["logistic", "bmls", "ensemble", "calibration"])
def test_sample_weight_is_refused_before_any_work(name):
    """Also by the wrappers, which pass other fit arguments on to their members, and with a 1-D y
    (scikit-learn's check_classifiers_one_label_sample_weights wants sample_weight named first)."""
    X, Y = linear_multilabel_problem(n=20, d=4, n_labels=2)
    for labels in (Y, Y[:, 0]):
        with pytest.raises(TypeError, match="unexpected keyword argument 'sample_weight'"):
            FAST[name]().fit(X, labels, sample_weight=np.ones(20))


@pytest.mark.parametrize("name", ["mlgpf", "bnmc"])
def test_partial_fit_takes_scikit_learns_classes_argument(name):
    X, Y = linear_multilabel_problem(n=40, d=5, n_labels=3, seed=1, density=0.6)
    with_classes = FAST[name]().set_params(random_state=0).partial_fit(X, Y, classes=np.array([0, 1]))
    without = FAST[name]().set_params(random_state=0).partial_fit(X, Y)
    np.testing.assert_array_equal(with_classes.predict_proba(X), without.predict_proba(X))
    with pytest.raises(ValueError, match="classes must be None or a subset of"):
        FAST[name]().partial_fit(X, Y, classes=["cat", "dog"])
    with pytest.raises(ValueError, match="X has 4 features, but .* is expecting 5 features"):
        without.partial_fit(X[:, :4].toarray(), Y)


def test_mlgpf_with_more_latent_processes_than_labels():
    """One label and P = 2 latent GPs: Phi^T Phi is singular, the warm start takes the minimum-norm
    latent targets instead of failing."""
    X, Y = linear_multilabel_problem(n=60, d=5, n_labels=1, seed=4, density=0.6)
    proba = FAST["mlgpf"]().set_params(random_state=0).fit(X, Y).predict_proba(X)
    assert proba.shape == (60, 1) and np.all((proba > 0) & (proba < 1))


def test_library_baseline_pickles_and_predicts_the_same():
    if missing_dependency("napkinxc_plt") is not None:
        pytest.skip(missing_dependency("napkinxc_plt"))
    import pickle

    X, Y = linear_multilabel_problem(n=60, d=5, n_labels=3, seed=4, density=0.6)
    model = get_model_class("napkinxc_plt")(n_threads=1, random_state=0).fit(X, Y)
    copy = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(copy.predict_proba(X), model.predict_proba(X))


def test_clone_of_every_model_keeps_its_parameters():
    for make in FAST.values():
        model = make()
        assert isinstance(model, MultiLabelEstimator)
        assert clone(model).get_params(deep=False).keys() == model.get_params(deep=False).keys()
