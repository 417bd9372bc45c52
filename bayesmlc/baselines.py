"""Baselines that run through the same ``bayesmlc train`` path as the library's own models.

Each is a :class:`~bayesmlc.base.MultiLabelEstimator`, so the CLI fits, scores, saves and evaluates
it exactly like a bayesmlc model, and a comparison is a ratio measured side by side.

``knn``
    :class:`KNNBaseline`: cosine k-nearest-neighbour vote (scikit-learn is a core dependency).
``napkinxc_plt``
    :class:`NapkinXCPLT`: napkinXC's probabilistic label tree (optional: ``pip install 'bayesmlc[compare]'``).
``omikuji_parabel`` / ``omikuji_bonsai``
    :class:`OmikujiParabel` / :class:`OmikujiBonsai`: omikuji partitioned label trees with the
    Parabel variant (balanced 2-means, depth up to 20) and the Bonsai variant (unbalanced 100-means,
    depth 3), as in omikuji's README (optional, same extra).

The optional ones import their package only when fitted or loaded; :func:`missing_dependency` tells
the bench harness, without importing anything heavy, that a run must be recorded as skipped.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import warnings
import weakref

import numpy as np
import scipy.sparse as sp

from .base import MultiLabelEstimator
from .exceptions import ModelFormatError, ValidationError
from .fitted_state import check_fitted_state
from .models import COMPARE_MODELS, INSTALL_COMPARE, missing_optional_package
from .parameters import Integer, Options, Real
from .preprocessing import STANDARDIZE_CONSTRAINT, FeaturePreprocessor, legacy_preprocessor_state
from .safe_io import remove_stale_temporaries, temporary_prefix
from .state_checks import FILE_BACKED_FIELDS, KNN_FIELDS
from .threads import choose_threads, enclosing_threads
from .utils import iter_batches, numpy_rng

__all__ = [
    "KNNBaseline",
    "NapkinXCPLT",
    "OmikujiParabel",
    "OmikujiBonsai",
    "REGISTRY_ENTRIES",
    "OPTIONAL_DEPENDENCIES",
    "missing_dependency",
]

#: Entries for ``bayesmlc.models.MODEL_CLASSES`` (the CLI's ``--model`` names).
REGISTRY_ENTRIES = {
    "knn": "bayesmlc.baselines:KNNBaseline",
    "napkinxc_plt": "bayesmlc.baselines:NapkinXCPLT",
    "omikuji_parabel": "bayesmlc.baselines:OmikujiParabel",
    "omikuji_bonsai": "bayesmlc.baselines:OmikujiBonsai",
}

#: Model name -> the optional package it needs (installed by the ``[compare]`` extra).
OPTIONAL_DEPENDENCIES = COMPARE_MODELS

_INSTALL_HINT = INSTALL_COMPARE
_SCORE_ROWS = 512  # rows of test-by-train similarities held at once by the kNN baseline
#: Labels the tree baselines score per row by default: far more than the top 5 that P@k, nDCG@k, PSP@k
#: and the calibration figures read, so those figures are the ones of scoring every label; the AUCs
#: rank the scored labels above the others, which all score 0 (tied). omikuji's beam of 10 may reach
#: fewer. Scoring every label (``predict_top_k=None``) made prediction cost more than training
#: (omikuji on 5,177 rows x 8,311 labels: 289 s against 27 s).
DEFAULT_PREDICT_TOP_K = 100


def missing_dependency(model_name: str) -> str | None:
    """Why ``model_name`` cannot run here (its optional package is not installed or does not import),
    or ``None`` (:func:`bayesmlc.models.missing_optional_package`)."""
    return missing_optional_package(model_name)


def _import_optional(package: str):
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        root = package.partition(".")[0]
        raise ImportError(f"this baseline needs the optional package {root!r} ({_INSTALL_HINT}): {exc}") from None


def _resolve_threads(n_threads) -> int:
    """The threads of the package's own pool: ``n_threads``, else the count the fit runs with
    (:func:`bayesmlc.threads.compute_threads`: an enclosing ``use_threads`` block's, an
    ``OMP_NUM_THREADS`` count, or one per idle core)."""
    if n_threads is not None:
        return int(n_threads)
    return enclosing_threads() or choose_threads().threads


def _labels_scored(predict_top_k, n_labels: int) -> int:
    """How many labels a tree baseline scores per row: ``predict_top_k``, at most every label."""
    return n_labels if predict_top_k is None else min(int(predict_top_k), n_labels)


def _warn_missing_labels(name: str, label_mask) -> None:
    if label_mask is not None:
        warnings.warn(
            f"{name} cannot leave missing labels out: unobserved label entries are used as negatives",
            UserWarning,
            stacklevel=3,
        )


class _StandardisingBaseline(MultiLabelEstimator):
    """A baseline that standardises dense real features first (``preprocessor_``: ``standardize``
    "auto" does it when more than half of the training entries are non-zero, such as emotions, scene
    and yeast, where raw scales differ by orders of magnitude) and, with ``_unit_rows``, scales rows
    to unit length."""

    _unit_rows = False

    def _preprocessor(self) -> FeaturePreprocessor:
        return FeaturePreprocessor(standardize=self.standardize, normalize=self._unit_rows)

    def _set_state(self, state: dict) -> None:
        # files written before FeaturePreprocessor held feature_mean_, feature_scale_ (the std) or None
        super()._set_state(legacy_preprocessor_state(state, self._preprocessor().get_params(), reciprocal_scale=False))


def _label_lists(Y: sp.csr_matrix) -> list[list[int]]:
    """The positive label indices of each row of a CSR 0/1 matrix."""
    return [Y.indices[Y.indptr[i] : Y.indptr[i + 1]].tolist() for i in range(Y.shape[0])]


def _scores_from_pairs(rows_of_pairs, n_labels: int) -> np.ndarray:
    """Dense (n_rows, n_labels) scores from per-row lists of ``(label, score)``; absent labels score 0."""
    out = np.zeros((len(rows_of_pairs), n_labels), dtype=np.float32)
    for i, pairs in enumerate(rows_of_pairs):
        for label, score in pairs:
            if label < n_labels:
                out[i, label] = score
    return out


# ---------------------------------------------------------------------------------------------
class KNNBaseline(_StandardisingBaseline):
    """Cosine k-nearest-neighbour vote.

    A test row's ``n_neighbors`` most cosine-similar training rows vote for their labels; the score
    and probability of label l is the (similarity-weighted, if ``weighting="similarity"``) fraction of
    the neighbours that carry l among those where l is observed:

        p_l(x) = sum_j w_j y_jl m_jl / sum_j w_j m_jl,    j over the neighbours of x,

    with m the mask of observed labels (all ones without a mask). Rows with no usable neighbour
    (no shared feature, zero weights) fall back to the label prior. Scores add 1e-6 times the prior
    so that labels with equal votes rank by training frequency.

    Parameters
    ----------
    n_neighbors : int, default 10
    weighting : {"similarity", "uniform"}, default "similarity"
        Vote weights: the (non-negative part of the) cosine similarity, or 1 per neighbour.
    standardize : {"auto", True, False}, default "auto"
        Centre and scale features to unit variance before the cosine. ``"auto"`` does it when more
        than half of the training feature entries are non-zero (dense real features such as
        emotions, scene and yeast), where cosine on raw, all-positive features is nearly constant.
    random_state, device, verbose :
        Accepted for the estimator contract; the method is deterministic and runs on the CPU.

    Fitted attributes
    -----------------
    train_features_ : csr (n_train, D), the L2-normalised (and standardised) training rows
    train_labels_ : csr (n_train, L)
    train_mask_ : csr (n_train, L) or None
    preprocessor_ : FeaturePreprocessor, the standardisation (when used) and row normalisation
    """

    _parameter_constraints = {
        "n_neighbors": [Integer(1)],
        "weighting": [Options("similarity", "uniform")],
        "standardize": STANDARDIZE_CONSTRAINT,
    }
    _unit_rows = True

    def __init__(self, n_neighbors=10, weighting="similarity", standardize="auto", random_state=None,
                 device="auto", verbose=False):
        self.n_neighbors = n_neighbors
        self.weighting = weighting
        self.standardize = standardize
        self.random_state = random_state
        self.device = device
        self.verbose = verbose

    def _fit(self, X, Y, label_mask):
        self.preprocessor_ = self._preprocessor().fit(X)
        self.train_features_ = self.preprocessor_.transform(X)
        self.train_labels_ = Y
        self.train_mask_ = label_mask

    def _neighbour_weights(self, X) -> sp.csr_matrix:
        """Sparse (b, n_train) matrix holding each row's neighbour weights."""
        similarity = (self.preprocessor_.transform(X) @ self.train_features_.T).toarray()
        n_train = similarity.shape[1]
        k = min(int(self.n_neighbors), n_train)
        top = np.argpartition(-similarity, k - 1, axis=1)[:, :k]
        if self.weighting == "similarity":
            weights = np.maximum(np.take_along_axis(similarity, top, axis=1), 0.0)
        else:
            weights = np.ones(top.shape, dtype=np.float32)
        rows = np.repeat(np.arange(top.shape[0]), k)
        return sp.csr_matrix((weights.ravel(), (rows, top.ravel())), shape=similarity.shape)

    def _predict_proba(self, X) -> np.ndarray:
        out = np.empty((X.shape[0], self.n_labels_), dtype=np.float32)
        for rows in iter_batches(X.shape[0], _SCORE_ROWS):
            weights = self._neighbour_weights(X[rows])
            votes = np.asarray((weights @ self.train_labels_).todense())
            if self.train_mask_ is None:
                totals = np.asarray(weights.sum(axis=1)) * np.ones((1, self.n_labels_))
            else:
                totals = np.asarray((weights @ self.train_mask_).todense())
            usable = totals > 0
            block = np.broadcast_to(self.label_prior_, votes.shape).copy()
            block[usable] = votes[usable] / totals[usable]
            out[rows] = np.clip(block, 0.0, 1.0)
        return out

    def _decision_function(self, X) -> np.ndarray:
        return self._scores_and_proba(X)[0]

    def _scores_and_proba(self, X):
        proba = self._predict_proba(X)
        return proba + 1e-6 * self.label_prior_.astype(np.float32), proba

    def _check_fitted_state(self) -> None:
        check_fitted_state(self, KNN_FIELDS)


def _is_plain_file_name(name) -> bool:
    """True for a name that stays inside the folder it is joined to: its own basename, not empty, not
    ``.`` or ``..``, no separator, no NUL (a model file's entry names come from the file)."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and os.path.basename(name) == name
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and not os.path.isabs(name)
    )


# ---------------------------------------------------------------------------------------------
class _FileBackedModel(_StandardisingBaseline):
    """Shared machinery for baselines whose fitted model is a folder of files written by a library.

    The folder's files are kept as byte arrays in ``model_files_`` (so ``save``/``load`` stay inside the
    library's pickle-free format) and unpacked into a temporary folder when the model is loaded.
    Dense real features are standardised first (``preprocessor_``), and label
    masks are not supported by the libraries: unobserved entries are used as negatives, with a warning.
    """

    def _new_workdir(self) -> str:
        """A private temporary folder, removed with the model. Its name carries the bayesmlc marker and
        this process's id (:func:`bayesmlc.safe_io.temporary_prefix`), so the folders of a process that
        died (a native library's crash included) are removed by the next one that makes its own."""
        parent = tempfile.gettempdir()
        remove_stale_temporaries(parent)
        path = tempfile.mkdtemp(prefix=temporary_prefix("baseline"), dir=parent)
        weakref.finalize(self, shutil.rmtree, path, True)
        return path

    def _store_files(self, folder: str) -> None:
        files = {}
        for name in sorted(os.listdir(folder)):
            full = os.path.join(folder, name)
            if not os.path.isfile(full):
                raise ValidationError(f"unexpected non-file {full!r} in the {type(self).__name__} model folder")
            with open(full, "rb") as handle:
                files[name] = np.frombuffer(handle.read(), dtype=np.uint8)
        self.model_files_ = files

    def _unpacked_folder(self) -> str:
        folder = os.path.join(self._new_workdir(), "model")
        os.makedirs(folder)
        for name, content in self.model_files_.items():
            if not _is_plain_file_name(name):
                raise ModelFormatError(
                    f"{type(self).__name__} model file entry {str(name)[:100]!r} is not a plain file name"
                )
            with open(os.path.join(folder, name), "wb") as handle:
                handle.write(np.asarray(content, dtype=np.uint8).tobytes())
        return folder

    def _set_state(self, state: dict) -> None:
        files = state.get("model_files_")
        if files is not None:
            if not isinstance(files, dict):
                raise ModelFormatError(f"{type(self).__name__} model files must be a mapping of names to bytes")
            for name, content in files.items():
                if not _is_plain_file_name(name):
                    raise ModelFormatError(
                        f"{type(self).__name__} model file entry {str(name)[:100]!r} is not a plain file name"
                    )
                if not (isinstance(content, np.ndarray) and content.dtype == np.uint8 and content.ndim == 1):
                    raise ModelFormatError(f"{type(self).__name__} model file entry {name!r} is not a byte array")
        super()._set_state(state)
        self._loaded = None

    def _check_fitted_state(self) -> None:
        check_fitted_state(self, FILE_BACKED_FIELDS)

    def __getstate__(self):
        """Pickle without the library's in-memory model (it cannot be pickled); it is loaded again
        from ``model_files_`` on first use."""
        state = super().__getstate__()
        state.pop("_loaded", None)
        return state

    def _model(self):
        """The library's model, loaded from ``model_files_`` on first use after
        :meth:`_check_model_files`; the unpacked folder is removed at once when loading fails."""
        if getattr(self, "_loaded", None) is None:
            self._check_model_files()
            folder = self._unpacked_folder()
            try:
                self._loaded = self._load_from(folder)
            except BaseException:
                shutil.rmtree(os.path.dirname(folder), ignore_errors=True)
                raise
        return self._loaded

    def _check_model_files(self) -> None:
        """Refuse (``ModelFormatError``) library files whose declared sizes the bytes present cannot
        hold, before the library reads them; subclasses check what their library's format declares."""

    def _load_from(self, folder: str):  # pragma: no cover - abstract
        raise NotImplementedError

    def _fit(self, X, Y, label_mask):
        _warn_missing_labels(type(self).__name__, label_mask)
        self.preprocessor_ = self._preprocessor().fit(X)
        self._fit_library(self.preprocessor_.transform(X), Y)

    def _predict_proba(self, X) -> np.ndarray:
        return self._proba_batch(self.preprocessor_.transform(X))

    def _decision_function(self, X) -> np.ndarray:
        return self._predict_proba(X)

    def _scores_and_proba(self, X):
        proba = self._predict_proba(X)
        return proba, proba


class NapkinXCPLT(_FileBackedModel):
    """napkinXC probabilistic label tree (PLT) with logistic node classifiers.

    Scores are the tree's label probabilities for the ``predict_top_k`` most likely labels of each
    row (100 by default, :data:`DEFAULT_PREDICT_TOP_K`; None: every label); labels left out score 0.

    Parameters
    ----------
    tree_type : str, default "hierarchicalKmeans"
    arity : int, default 2
    max_leaves : int, default 100
    liblinear_c : float, default 10.0
    loss : {"log", "l2"}, default "log"
    ensemble : int, default 1
    standardize : {"auto", True, False}, default "auto"
        Centre and scale dense real features first (as :class:`KNNBaseline`).
    predict_top_k : int or None, default 100
        Labels scored per row; None scores every label (so that the AUCs rank them all).
    n_threads : int or None, default None (one per idle core, :func:`bayesmlc.threads.compute_threads`)
    random_state : int or None
    device, verbose : the estimator contract; napkinXC runs on the CPU.
    """

    _parameter_constraints = {
        "arity": [Integer(2)],
        "max_leaves": [Integer(1)],
        "liblinear_c": [Real(0, low_open=True)],
        "loss": [Options("log", "l2")],
        "ensemble": [Integer(1)],
        "standardize": STANDARDIZE_CONSTRAINT,
        "predict_top_k": [None, Integer(1)],
        "n_threads": [None, Integer(1)],
    }

    def __init__(self, tree_type="hierarchicalKmeans", arity=2, max_leaves=100, liblinear_c=10.0, loss="log",
                 ensemble=1, standardize="auto", predict_top_k=DEFAULT_PREDICT_TOP_K, n_threads=None, random_state=None,
                 device="auto", verbose=False):
        self.tree_type = tree_type
        self.arity = arity
        self.max_leaves = max_leaves
        self.liblinear_c = liblinear_c
        self.loss = loss
        self.ensemble = ensemble
        self.standardize = standardize
        self.predict_top_k = predict_top_k
        self.n_threads = n_threads
        self.random_state = random_state
        self.device = device
        self.verbose = verbose

    def _plt(self, folder: str):
        models = _import_optional("napkinxc.models")
        seed = int(numpy_rng(self.random_state).integers(0, 2**31 - 1))
        return models.PLT(
            folder, tree_type=self.tree_type, arity=int(self.arity), max_leaves=int(self.max_leaves),
            liblinear_c=float(self.liblinear_c), loss=self.loss, ensemble=int(self.ensemble), seed=seed,
            threads=_resolve_threads(self.n_threads), verbose=int(bool(self.verbose)),
        )

    def _fit_library(self, X, Y):
        folder = os.path.join(self._new_workdir(), "model")
        model = self._plt(folder)
        model.fit(X, _label_lists(Y))
        self._store_files(folder)
        self._loaded = model

    def _load_from(self, folder: str):
        model = self._plt(folder)
        model.load()
        return model

    def _check_model_files(self) -> None:
        """napkinXC's files: ``tree.bin`` whole (:func:`check_napkinxc_tree`), and ``weights.bin``
        declaring one record per tree node with at least the bytes of that many records (its weight
        vectors are not parsed: a file cut inside the last one still reaches napkinXC)."""
        files = self.model_files_
        for name in ("args.bin", "tree.bin", "weights.bin"):
            if name not in files:
                raise ModelFormatError(f"NapkinXCPLT model files lack {name}")
        n_nodes = check_napkinxc_tree(files["tree.bin"], self.n_labels_)
        weights = files["weights.bin"]
        declared = int(weights[:4].view("<i4")[0]) if weights.size >= 4 else None
        if declared != n_nodes or weights.size < 4 + _NAPKINXC_MIN_NODE_BYTES * n_nodes:
            raise ModelFormatError(f"NapkinXCPLT weights.bin ({weights.size} bytes) does not hold the weights of the "
                                   f"tree's {n_nodes} nodes (it declares {declared})")

    def _proba_batch(self, X) -> np.ndarray:
        pairs = self._model().predict_proba(X, top_k=_labels_scored(self.predict_top_k, self.n_labels_), threshold=0)
        return _scores_from_pairs(pairs, self.n_labels_)


#: napkinXC 0.7's ``weights.bin``: an int32 node count, then one record per node of at least three int32s
_NAPKINXC_MIN_NODE_BYTES = 12


def check_napkinxc_tree(content: np.ndarray, n_labels: int) -> int:
    """Check napkinXC's ``tree.bin`` (bytes) before napkinXC reads it; returns its number of nodes.

    The file is int32 little-endian: the label count k and node count t, then (index, label) per node
    (label -1 for an inner node), the root's index and each node's parent (-1 for the root): exactly
    12 + 12 t bytes. Refused (``ModelFormatError``): any other size (a tree declaring 10^6 nodes in a
    few bytes, a truncated file), k outside [1, ``n_labels``], nodes out of order, a label out of
    range or on two leaves, a parent out of range, or a root that has a parent.
    """
    raw = np.asarray(content, dtype=np.uint8)
    header = raw[:8].view("<i4") if raw.size >= 8 else np.zeros(0, np.int32)
    k, t = (int(header[0]), int(header[1])) if header.size == 2 else (0, 0)
    if not (1 <= k <= n_labels and t >= 1 and raw.size == 12 + 12 * t):
        raise ModelFormatError(f"NapkinXCPLT tree.bin ({raw.size} bytes) is not a tree of at most {n_labels} labels "
                               f"(it declares {k} labels and {t} nodes, which take {12 + 12 * max(t, 0)} bytes)")
    ints = raw.view("<i4")
    nodes, root, parents = ints[2 : 2 + 2 * t].reshape(t, 2), int(ints[2 + 2 * t]), ints[3 + 2 * t :]
    labels = nodes[:, 1]
    leaf_labels = labels[labels >= 0]
    problems = [
        (not np.array_equal(nodes[:, 0], np.arange(t)), "its nodes are not numbered in order"),
        (labels.min() < -1 or labels.max() >= k, f"a node's label lies outside [-1, {k})"),
        (np.unique(leaf_labels).size != leaf_labels.size, "a label sits on two nodes"),
        (not 0 <= root < t or parents[root] != -1, "its root is not a node without a parent"),
        (parents.min() < -1 or parents.max() >= t or np.count_nonzero(parents == -1) != 1,
         "a parent lies outside its nodes"),
    ]
    for failed, why in problems:
        if failed:
            raise ModelFormatError(f"NapkinXCPLT tree.bin is not a label tree: {why}")
    return t


@contextlib.contextmanager
def _stdout_to_stderr():
    """omikuji's Rust logger writes to file descriptor 1; keep it off stdout, where ``--json`` prints."""
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _write_xc_file(path: str, X: sp.csr_matrix, Y: sp.csr_matrix) -> None:
    """X and Y in the Extreme Classification text format (what omikuji trains from)."""
    with open(path, "w", encoding="ascii") as handle:
        handle.write(f"{X.shape[0]} {X.shape[1]} {Y.shape[1]}\n")
        for i in range(X.shape[0]):
            labels = ",".join(map(str, Y.indices[Y.indptr[i] : Y.indptr[i + 1]]))
            start, stop = X.indptr[i], X.indptr[i + 1]
            # omikuji cannot parse a row without features: an explicit zero stands in (it adds nothing)
            features = " ".join(f"{j}:{v:.9g}" for j, v in zip(X.indices[start:stop], X.data[start:stop])) or "0:0"
            handle.write(f"{labels} {features}\n")


class _OmikujiTrees(_FileBackedModel):
    """omikuji partitioned label trees; subclasses fix the tree variant (its label clustering).

    Scores are omikuji's beam-search label scores for the ``predict_top_k`` best labels per row (100
    by default, :data:`DEFAULT_PREDICT_TOP_K`; every label when that covers them all or is None, with
    a beam wide enough to reach them all); labels the beam never reaches score 0. omikuji takes no seed, so repeated
    fits can differ slightly whatever ``random_state`` says.
    """

    _parameter_constraints = {
        "n_trees": [Integer(1)],
        "linear_c": [Real(0, low_open=True)],
        "beam_size": [None, Integer(1)],
        "standardize": STANDARDIZE_CONSTRAINT,
        "predict_top_k": [None, Integer(1)],
        "n_threads": [None, Integer(1)],
    }

    def __init__(self, n_trees=3, linear_c=1.0, beam_size=None, standardize="auto", predict_top_k=DEFAULT_PREDICT_TOP_K,
                 n_threads=None, random_state=None, device="auto", verbose=False):
        self.n_trees = n_trees
        self.linear_c = linear_c
        self.beam_size = beam_size
        self.standardize = standardize
        self.predict_top_k = predict_top_k
        self.n_threads = n_threads
        self.random_state = random_state
        self.device = device
        self.verbose = verbose

    _VARIANTS = {  # omikuji hyper-parameters of each published tree method
        "parabel": {"cluster_balanced": True, "cluster_k": 2, "max_depth": 20},
        "bonsai": {"cluster_balanced": False, "cluster_k": 100, "max_depth": 3},
    }
    _variant = "parabel"

    def _hyper_parameters(self, omikuji):
        hyper = omikuji.Model.default_hyper_param()
        for key, value in self._VARIANTS[self._variant].items():
            setattr(hyper, key, value)
        hyper.n_trees = int(self.n_trees)
        hyper.linear_c = float(self.linear_c)
        return hyper

    def _fit_library(self, X, Y):
        omikuji = _import_optional("omikuji")
        workdir = self._new_workdir()
        data_path = os.path.join(workdir, "train.txt")
        _write_xc_file(data_path, X, Y)
        folder = os.path.join(workdir, "model")
        with _stdout_to_stderr():
            model = omikuji.Model.train_on_data(data_path, self._hyper_parameters(omikuji), _resolve_threads(self.n_threads))
            model.save(folder)
        os.unlink(data_path)
        self._store_files(folder)
        self._loaded = model

    def _load_from(self, folder: str):
        omikuji = _import_optional("omikuji")
        with _stdout_to_stderr():
            return omikuji.Model.load(folder)

    def _check_model_files(self) -> None:
        """omikuji's files: ``settings.json`` a JSON object whose ``n_features`` is the model's width,
        and trees ``tree0.cbor`` .. ``tree{n-1}.cbor`` of ``n_trees`` (omikuji's own reader, in Rust,
        checks their contents), nothing else."""
        import json

        files = self.model_files_
        try:
            settings = json.loads(files["settings.json"].tobytes().decode("utf-8")) if "settings.json" in files else None
        except (ValueError, UnicodeDecodeError, RecursionError):
            settings = None
        if not isinstance(settings, dict) or settings.get("n_features") != self.n_features_in_:
            raise ModelFormatError(f"{type(self).__name__} settings.json must be a JSON object with n_features "
                                   f"{self.n_features_in_}")
        trees = {f"tree{i}.cbor" for i in range(int(self.n_trees))}
        if set(files) != trees | {"settings.json"} or any(files[name].size == 0 for name in trees):
            raise ModelFormatError(f"{type(self).__name__} model files must be settings.json and {len(trees)} "
                                   f"non-empty trees tree0.cbor .. tree{len(trees) - 1}.cbor, got "
                                   f"{', '.join(sorted(files))[:200]}")

    def _proba_batch(self, X) -> np.ndarray:
        model = self._model()
        top_k = _labels_scored(self.predict_top_k, self.n_labels_)
        # scoring every label needs a beam as wide as the widest tree level (at most L nodes)
        beam_size = int(self.beam_size) if self.beam_size is not None else (self.n_labels_ if top_k == self.n_labels_ else 10)
        rows = []
        with _stdout_to_stderr():
            for i in range(X.shape[0]):
                start, stop = X.indptr[i], X.indptr[i + 1]
                pairs = list(zip(X.indices[start:stop].tolist(), X.data[start:stop].tolist()))
                rows.append(model.predict(pairs, beam_size=beam_size, top_k=top_k))
        return _scores_from_pairs(rows, self.n_labels_)


class OmikujiParabel(_OmikujiTrees):
    """omikuji with the Parabel variant: balanced 2-means label clustering, trees up to depth 20.

    Parameters
    ----------
    n_trees : int, default 3
    linear_c : float, default 1.0
    beam_size : int or None, default None
        Beam width of the tree search. None: wide enough to reach every label when
        ``predict_top_k`` is None or at least the number of labels (so AUC ranks all labels), else
        omikuji's default 10.
    standardize : {"auto", True, False}, default "auto"
        Centre and scale dense real features first (as :class:`KNNBaseline`).
    predict_top_k : int or None, default 100
        Labels scored per row; None scores every label (so that the AUCs rank them all).
    n_threads : int or None, default None (one per idle core, :func:`bayesmlc.threads.compute_threads`)
    random_state, device, verbose : the estimator contract (omikuji takes no seed; CPU only).
    """

    _variant = "parabel"


class OmikujiBonsai(_OmikujiTrees):
    """omikuji with the Bonsai variant: unbalanced 100-means label clustering, trees of depth 3.

    Parameters are those of :class:`OmikujiParabel`.
    """

    _variant = "bonsai"
