"""``label_cardinality="at_least_one"``: per-label probabilities conditioned on a non-empty row,
against a hand-worked case, rejection sampling, and the independent model's own probabilities."""

import numpy as np
import pytest
import scipy.sparse as sp

from bayesmlc import ValidationError
from bayesmlc.base import MultiLabelEstimator, at_least_one_label
from bayesmlc.bmls import BMLS
from bayesmlc.bnmc import BNMC
from bayesmlc.gp import MLGPF


def test_hand_worked_case():
    # two labels at 1/2: P(some label) = 3/4, so each becomes (1/2) / (3/4) = 2/3; a sure label stays 1;
    # a row with nothing possible stays 0
    out = at_least_one_label(np.array([[0.5, 0.5], [1.0, 0.3], [0.0, 0.0], [0.2, 0.0]]))
    np.testing.assert_allclose(out, [[2 / 3, 2 / 3], [1.0, 0.3], [0.0, 0.0], [1.0, 0.0]], rtol=1e-6)


def test_matches_rejection_sampling_of_independent_labels():
    rng = np.random.default_rng(0)
    proba = rng.uniform(0.0, 0.4, size=(4, 6)) ** 2  # rows with few likely labels: conditioning matters
    draws = 400_000
    conditioned = at_least_one_label(proba)
    for row, p in enumerate(proba):
        y = rng.random((draws, p.size)) < p
        kept = y[y.any(axis=1)]  # reject the empty label vectors
        empirical = kept.mean(axis=0)
        se = np.sqrt(empirical * (1 - empirical) / kept.shape[0])
        assert np.all(np.abs(conditioned[row] - empirical) < 4 * se + 1e-4)
        assert conditioned[row].sum() >= 1.0 - 1e-5  # a non-empty row expects at least one label


SMALL = {
    "mlgpf": lambda **kw: MLGPF(n_latent=3, n_inducing=10, subspace_rank=6, epochs=3, n_threads=1, **kw),
    "bnmc": lambda **kw: BNMC(truncation=4, n_passes=1, **kw),
    "bmls": lambda **kw: BMLS(n_topics=4, schedule="fixed", n_burnin=10, n_draws=5, thin=1, **kw),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_estimators_condition_their_own_probabilities(name, tmp_path):
    rng = np.random.default_rng(1)
    X = sp.csr_matrix((rng.random((80, 12)) < 0.3).astype(np.float32))
    Y = (rng.random((80, 5)) < 0.3).astype(np.float32)
    Y[~Y.any(axis=1), 0] = 1.0  # every row has a label
    Y = sp.csr_matrix(Y)
    independent = SMALL[name](random_state=0).fit(X, Y)
    conditioned = SMALL[name](random_state=0, label_cardinality="at_least_one").fit(X, Y)
    np.testing.assert_allclose(conditioned.predict_proba(X), at_least_one_label(independent.predict_proba(X)),
                               rtol=1e-5, atol=1e-7)
    # the ranking is the model's: scores and top-k unchanged
    np.testing.assert_array_equal(conditioned.decision_function(X), independent.decision_function(X))
    path = tmp_path / "model.npz"
    conditioned.save(path)
    loaded = MultiLabelEstimator.load(path)
    assert loaded.label_cardinality == "at_least_one"
    np.testing.assert_array_equal(loaded.predict_proba(X), conditioned.predict_proba(X))


def test_empty_training_rows_warn_and_bad_values_are_refused():
    rng = np.random.default_rng(2)
    X = sp.csr_matrix((rng.random((40, 6)) < 0.4).astype(np.float32))
    Y = sp.csr_matrix(np.eye(40, 4, dtype=np.float32))  # 36 of 40 rows have no label
    with pytest.warns(UserWarning, match="36 of 40 training rows have none"):
        BNMC(truncation=3, n_passes=1, random_state=0, label_cardinality="at_least_one").fit(X, Y)
    with pytest.raises(ValidationError, match="label_cardinality"):
        BNMC(label_cardinality="one").fit(X, Y)
