"""Baseline: one L2-regularised logistic regression per label, fitted for all labels at once."""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np
import scipy.optimize
import torch
from sklearn.exceptions import ConvergenceWarning
from tqdm.auto import tqdm

from .base import MultiLabelEstimator
from .fitted_state import check_fitted_state
from .state_checks import LOGISTIC_FIELDS
from .parameters import Boolean, Integer, Real
from .preprocessing import FeaturePreprocessor, legacy_preprocessor_state
from .utils import csr_to_torch, iter_batches, numpy_rng, resolve_device

__all__ = ["LogisticRegression"]

_CHUNK_ROWS = 8192
#: labels per L-BFGS-B problem (the objective separates over labels)
_LABEL_BLOCK = 256


class LogisticRegression(MultiLabelEstimator):
    """Independent per-label logistic regressions (one-vs-rest), the field's standard baseline.

    Minimises, for every label l at once,

        C * sum_i m_il * log(1 + exp(-s_il (x_i . w_l + b_l))) + 0.5 * ||w_l||^2,

    with s_il = +1 for a positive and -1 otherwise, and m_il = 1 where the label entry is observed
    (0 where ``label_mask`` hides it). This is scikit-learn's ``LogisticRegression(C=C)`` objective
    per label, solved by SciPy's L-BFGS-B over the (D + 1) x 256 parameters of each block of 256 labels
    in turn (the objective separates over labels; blocks bound the solver's memory). The objective and its
    closed-form gradient are computed with torch on ``device`` from sparse ``X`` (never densified).

    Parameters
    ----------
    C : float, default=1.0
        Inverse regularisation strength (as in scikit-learn).
    max_iter : int, default=100
        L-BFGS iterations per block of labels. A block that reaches it before ``tol`` is met gives
        one ``sklearn.exceptions.ConvergenceWarning`` per fit (as scikit-learn's lbfgs solver does).
    tol : float, default=1e-6
        L-BFGS-B stops when the largest gradient entry of the objective / (C n) falls below it.
    standardize : bool, default=False
        Divide each feature by its standard deviation (without centring, so sparsity is kept;
        ``preprocessor_``). Useful for dense real-valued features (emotions, scene, yeast).
    n_threads : int or None, default=None
        CPU threads of torch and the BLAS during fit and prediction; None: one per idle core, fewer
        when other processes keep the cores busy (:func:`bayesmlc.threads.compute_threads`).
    random_state : int, Generator or None
        Unused by the deterministic solver; kept for the common contract.
    device : {"auto", "cpu", "cuda"}
    verbose : bool
        Show a progress bar of the L-BFGS iterations on stderr.

    Attributes
    ----------
    preprocessor_ : FeaturePreprocessor, the feature scaling (``scale_``: column standard deviations)
    coef_ : ndarray (D, L), intercept_ : ndarray (L,), n_iter_ : int

    Examples
    --------
    >>> from bayesmlc.linear import LogisticRegression
    >>> import numpy as np
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    >>> Y = np.array([[1, 0], [0, 1], [1, 1], [0, 0]])
    >>> model = LogisticRegression(C=10.0).fit(X, Y)
    >>> model.predict(X).toarray().astype(int).tolist()
    [[1, 0], [0, 1], [1, 1], [0, 0]]
    """

    def __init__(self, C=1.0, max_iter=100, tol=1e-6, standardize=False, n_threads=None, random_state=None, device="auto",
                 verbose=False):
        self.C = C
        self.max_iter = max_iter
        self.tol = tol
        self.standardize = standardize
        self.n_threads = n_threads
        self.random_state = random_state
        self.device = device
        self.verbose = verbose

    _parameter_constraints = {
        "C": [Real(0, low_open=True)],
        "max_iter": [Integer(1)],
        "tol": [Real(0)],
        "standardize": [Boolean()],
        "n_threads": [None, Integer(1)],
    }

    def _preprocessor(self) -> FeaturePreprocessor:
        return FeaturePreprocessor(standardize=self.standardize, with_mean=False)

    def _fit(self, X, Y, label_mask):
        numpy_rng(self.random_state)  # validates the argument
        device = resolve_device(self.device)
        start = time.perf_counter()
        n, d = X.shape
        n_labels = Y.shape[1]
        self.preprocessor_ = self._preprocessor().fit(X)
        X = self.preprocessor_.transform(X)
        chunks = []
        for rows in iter_batches(n, _CHUNK_ROWS):
            block = X[rows]
            chunks.append((
                csr_to_torch(block, device),
                csr_to_torch(block.T.tocsr(), device),  # X^T for the gradient, as CSR
                torch.from_numpy(Y[rows].toarray()).to(device),
                None if label_mask is None else torch.from_numpy(label_mask[rows].toarray()).to(device),
            ))
        prior = np.clip(self.label_prior_, 1e-6, 1 - 1e-6)
        initial_bias = np.log(prior / (1 - prior))
        # the objective is a sum over labels, so blocks of labels are independent problems: solving them
        # one after another bounds L-BFGS-B's memory (2 x maxcor x D x block doubles), which for all
        # labels at once is 6.4 GB at D = 5000, L = 4000
        blocks = [np.arange(begin, min(begin + _LABEL_BLOCK, n_labels)) for begin in range(0, n_labels, _LABEL_BLOCK)]
        # objective / n of every block at its starting point (w = 0, b = logit(prior)) in closed form:
        # sum_i m_il softplus(b_l) - y_il b_l
        observed = (np.full(n_labels, n, dtype=np.float64) if label_mask is None
                    else np.asarray(label_mask.sum(axis=0), dtype=np.float64).ravel())
        positives = np.asarray((Y if label_mask is None else Y.multiply(label_mask)).sum(axis=0), dtype=np.float64).ravel()
        initial_per_label = (observed * np.logaddexp(0.0, initial_bias) - positives * initial_bias) / n
        block_values = [float(initial_per_label[labels].sum()) for labels in blocks]
        self.coef_ = np.zeros((d, n_labels), dtype=np.float32)
        self.intercept_ = np.zeros(n_labels, dtype=np.float32)
        self.n_iter_ = 0
        unconverged = []  # labels of the blocks that stopped at max_iter
        bar = tqdm(total=self.max_iter * len(blocks), desc="L-BFGS", unit="it", disable=not self.verbose, file=sys.stderr)
        with bar:
            for index, labels in enumerate(blocks):
                def record(value, index=index):
                    """History: the whole objective, other blocks at their current values."""
                    block_values[index] = value
                    self.history_["objective"].append(-sum(block_values) * n)  # log posterior up to a constant
                    self.history_["wall_time"].append(time.perf_counter() - start)

                weights, bias, n_iter, converged = self._solve_block(chunks, labels, initial_bias[labels], n, d, device,
                                                                     record, bar)
                self.coef_[:, labels] = weights
                self.intercept_[labels] = bias
                self.n_iter_ = max(self.n_iter_, n_iter)
                if not converged:
                    unconverged.append(labels)
        if unconverged:
            self._warn_not_converged(np.concatenate(unconverged), n_labels)

    def _warn_not_converged(self, labels: np.ndarray, n_labels: int) -> None:
        """One ConvergenceWarning for the labels whose L-BFGS-B stopped at ``max_iter``."""
        shown = ", ".join(map(str, labels[:5])) + (" ..." if labels.size > 5 else "")
        warnings.warn(
            f"LogisticRegression: L-BFGS-B stopped at max_iter={self.max_iter} iterations before the gradient met "
            f"tol={self.tol:g} for {labels.size} of {n_labels} labels ({shown}); increase max_iter or tol, or "
            "scale the features (standardize=True)", ConvergenceWarning, stacklevel=4)

    def _solve_block(self, chunks, labels, initial_bias, n, d, device, record, bar):
        """L-BFGS-B on the labels ``labels``; returns their weights (D, |labels|), biases, iterations and
        whether the solver converged (False when it stopped at ``max_iter``)."""
        n_block = labels.size
        n_weights = d * n_block
        columns = torch.from_numpy(labels).to(device)
        # this block's label columns, selected once for all the solver's evaluations
        block_chunks = [(x, x_t, y.index_select(1, columns), None if m is None else m.index_select(1, columns))
                        for x, x_t, y, m in chunks]

        def value_and_gradient(theta: np.ndarray):
            """Objective / (C n) and its gradient; the gradient of the log-loss is X^T (sigmoid - y)."""
            params = torch.from_numpy(theta.astype(np.float32)).to(device)
            weights, bias = params[:n_weights].view(d, n_block), params[n_weights:]
            value = 0.5 * float((weights * weights).sum()) / (self.C * n)
            grad_weights = weights / (self.C * n)
            grad_bias = torch.zeros_like(bias)
            for x, x_t, y, m in block_chunks:
                logits = torch.sparse.mm(x, weights) + bias
                # log(1 + exp(-s f)) summed, in the stable softplus form
                losses = torch.nn.functional.softplus(logits) - y * logits
                residual = torch.sigmoid(logits) - y
                if m is not None:
                    losses, residual = losses * m, residual * m
                value += float(losses.sum()) / n
                grad_weights = grad_weights + torch.sparse.mm(x_t, residual) / n
                grad_bias = grad_bias + residual.sum(0) / n
            record(value)
            gradient = torch.cat([grad_weights.reshape(-1), grad_bias]).cpu().numpy().astype(np.float64)
            return value, gradient

        theta0 = np.concatenate([np.zeros(n_weights), initial_bias])
        result = scipy.optimize.minimize(
            value_and_gradient, theta0, jac=True, method="L-BFGS-B",
            options={"maxiter": self.max_iter, "gtol": self.tol, "maxcor": 20},
            callback=lambda _: bar.update(1),
        )
        weights = result.x[:n_weights].reshape(d, n_block).astype(np.float32)
        stopped_at_limit = not result.success and int(result.nit) >= self.max_iter
        return weights, result.x[n_weights:].astype(np.float32), int(result.nit), not stopped_at_limit

    def _decision_function(self, X):
        return np.asarray(self.preprocessor_.transform(X) @ self.coef_) + self.intercept_

    def _set_state(self, state: dict) -> None:
        # files written before FeaturePreprocessor held feature_scale_ = 1 / standard deviation
        super()._set_state(legacy_preprocessor_state(state, self._preprocessor().get_params(), reciprocal_scale=True))

    def _check_fitted_state(self) -> None:
        check_fitted_state(self, LOGISTIC_FIELDS)
