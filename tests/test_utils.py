"""Shared numerical helpers of bayesmlc.utils against SciPy and NumPy."""

import numpy as np

from bayesmlc.utils import logit, sigmoid, softplus


def test_sigmoid_logit_and_softplus_match_scipy_and_stay_finite():
    from scipy.special import expit, log_expit
    from scipy.special import logit as scipy_logit

    x = np.concatenate([np.linspace(-30.0, 30.0, 601), [-800.0, -50.0, 50.0, 800.0, 0.0]])
    # the tanh form is accurate to 1e-16 absolute (not relative: far left it rounds to 0 earlier than expit)
    np.testing.assert_allclose(sigmoid(x), expit(x), rtol=1e-14, atol=1e-16)
    np.testing.assert_array_equal(sigmoid(np.array([-800.0, 0.0, 800.0])), [0.0, 0.5, 1.0])
    # log(1 + e^x): numpy's logaddexp(0, x); -softplus(-x) is log sigmoid(x)
    np.testing.assert_allclose(softplus(x), np.logaddexp(0.0, x), rtol=1e-15, atol=0)
    np.testing.assert_allclose(-softplus(-x), log_expit(x), rtol=1e-14, atol=0)
    assert softplus(np.array([800.0]))[0] == 800.0 and softplus(np.array([-800.0]))[0] == 0.0
    p = np.linspace(0.001, 0.999, 999)
    np.testing.assert_allclose(logit(p), scipy_logit(p), rtol=1e-12)
    np.testing.assert_allclose(sigmoid(logit(p)), p, rtol=1e-12)
    # the floor keeps 0 and 1 finite: logit(floor) = log(floor / (1 - floor))
    np.testing.assert_allclose(logit(np.array([0.0, 1.0]), floor=1e-4), [np.log(1e-4 / 0.9999), np.log(0.9999 / 1e-4)],
                               rtol=1e-12)
    with np.errstate(divide="ignore"):
        assert np.isneginf(logit(np.array([0.0]), floor=0.0))[0]


def test_run_blocks_covers_every_index_once_on_each_thread_count():
    """thread_bounds splits range(n) into at most one block per thread, each at least the minimum
    (one block below it); run_blocks runs each non-empty block once, inline when it is the only one."""
    import threading

    from bayesmlc.threads import use_threads
    from bayesmlc.utils import run_blocks, thread_bounds

    for threads, n, minimum, blocks in ((1, 1000, 10, 1), (2, 1000, 10, 2), (2, 1000, 600, 1), (2, 0, 10, 1)):
        with use_threads(threads):
            bounds = thread_bounds(n, minimum)
        assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == blocks + 1 and bounds == sorted(bounds)
        seen = np.zeros(n, dtype=int)
        names = set()

        def work(begin, end):
            seen[begin:end] += 1
            names.add(threading.current_thread().name)

        run_blocks(bounds, work)
        np.testing.assert_array_equal(seen, 1)
        if n:  # one block inline, several on the pool's threads
            assert (names == {threading.main_thread().name}) == (blocks == 1)
