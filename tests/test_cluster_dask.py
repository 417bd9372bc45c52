"""Batch scoring with Dask (issue 39; the ``[dask]`` extra, which ``.ci/run`` installs): dask-ml's
``ParallelPostFit`` over a dask array of CSR blocks, on a local two-worker ``distributed`` cluster
bound to 127.0.0.1 without a dashboard, gives the in-process predictions.

Each worker is a separate process: the model reaches it pickled (``MLGPF.__getstate__``), so this
also checks that a shipped model scores as the original does. Most of the test's time (about 20 s on
the 2-core VM) is the two workers importing torch and scikit-learn to unpickle the first task.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

try:
    import dask.array as da
    from dask_ml.wrappers import ParallelPostFit
    from distributed import Client, LocalCluster
except ImportError as error:  # not installed, or installed but broken (pandas against an older numpy)
    cause = error.__cause__ or error
    pytest.skip(f"the [dask] extra does not import ({cause}): pip install 'bayesmlc[dask]'", allow_module_level=True)

from bayesmlc.data.synthetic import make_multilabel  # noqa: E402
from bayesmlc.gp import MLGPF  # noqa: E402

BLOCK_ROWS = 64


@pytest.fixture(scope="module")
def client():
    """Two single-threaded worker processes and a scheduler on the loopback address, no dashboard."""
    with LocalCluster(host="127.0.0.1", dashboard_address=None, n_workers=2, threads_per_worker=1,
                      processes=True) as cluster, Client(cluster) as dask_client:
        yield dask_client


@pytest.fixture(scope="module")
def problem():
    data = make_multilabel(600, 40, 9, features_per_row=8, labels_per_row=2, random_state=17)
    model = MLGPF(n_latent=3, n_inducing=8, subspace_rank=6, epochs=2, random_state=0, device="cpu")
    return model.fit(data.X[:400], data.Y[:400]), data.X[400:]


def _blockwise(model, X, method):
    """In this process: ``method`` on each block of BLOCK_ROWS rows, stacked (the scoring a worker does)."""
    return np.vstack([getattr(model, method)(X[start:start + BLOCK_ROWS]) for start in range(0, X.shape[0], BLOCK_ROWS)])


def test_the_cluster_is_two_other_processes_on_the_loopback_address(client):
    workers = client.scheduler_info()["workers"]
    assert len(workers) == 2
    assert all(address.startswith("tcp://127.0.0.1:") for address in [client.scheduler.address, *workers])
    pids = client.run(os.getpid)
    assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()


def test_parallel_post_fit_over_csr_blocks_equals_in_process_predictions(client, problem):
    model, X = problem
    blocks = da.from_array(X, chunks=(BLOCK_ROWS, X.shape[1]), asarray=False)  # each chunk a scipy CSR matrix
    assert blocks.numblocks == (4, 1)
    proba = ParallelPostFit(estimator=model).predict_proba(blocks)
    assert proba.chunks == ((64, 64, 64, 8), (model.n_labels_,))
    computed = proba.compute()
    # the same blocks scored here: equal up to float32 rounding (another process, another thread count)
    np.testing.assert_allclose(computed, _blockwise(model, X, "predict_proba"), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(computed, model.predict_proba(X), rtol=2e-5, atol=1e-6)
    assert np.ptp(computed, axis=0).max() > 1e-2  # the rows get different probabilities


def test_top_k_labels_blockwise_on_the_cluster(client, problem):
    """The top-k recipe of docs/scaling.md: ``map_blocks`` of ``predict_topk`` on each CSR block."""
    model, X = problem
    blocks = da.from_array(X, chunks=(BLOCK_ROWS, X.shape[1]), asarray=False)
    labels = blocks.map_blocks(lambda block: model.predict_topk(block, 3)[0], dtype=np.int64,
                               chunks=(blocks.chunks[0], (3,)), meta=np.empty((0, 3), dtype=np.int64)).compute()
    scores = model.decision_function(X)
    np.testing.assert_array_equal(labels, np.argsort(-scores, axis=1, kind="stable")[:, :3])
