"""What a kernel can rank on a set, without MLGPF's approximations: exact and Nystroem kernel ridge.

Usage (from the repository root)::

    python benchmarks/probe_kernel_ridge.py --train ../shared/datasets/delicious/train.txt
    python benchmarks/probe_kernel_ridge.py --train TRAIN.txt --test TEST.txt --final

Without ``--final`` the rows of ``--train`` are split 80/20 (``split``, seed 0, as
``ablate_mlgpf_bands.py`` does) and the figures are on the held-out 20%; with it the model is fitted on
all of ``--train`` and scored on ``--test``. Rows are L2-normalised (no idf). Every label is one
kernel ridge regression of its 0/1 column minus the column mean (one solve for all labels):

    F = K_*X (K_XX + lam I)^-1 (Y - ybar) + ybar,

with the linear kernel, the squared exponential exp(-|x - x'|^2 / (2 l^2)) and the order-1 arc-cosine
kernel (Cho and Saul, "Kernel methods for deep learning", NIPS 2009: a one-hidden-layer ReLU network
of infinite width). ``--nystroem`` also fits the SE kernel on M k-means centres (the subspace of
regression functions an M-inducing-input sparse GP spans: Williams and Seeger, NIPS 2001), and
``--rank`` keeps the top P right singular vectors of the fitted training utilities (the rank of
MLGPF's f = Phi h). Prints P@1, P@5, PSP@1 and PSP@5 (in %) a line. Needs N x N float64 in memory
(1.3 GB for delicious's 12,920 rows).
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy.linalg


def _arc_cosine(gram: np.ndarray, norms_a: np.ndarray, norms_b: np.ndarray) -> np.ndarray:
    """k1(x, x') = |x||x'| (sin t + (pi - t) cos t) / pi, t the angle between x and x'."""
    scale = np.outer(norms_a, norms_b)
    cosine = np.clip(gram / np.maximum(scale, 1e-300), -1.0, 1.0)
    angle = np.arccos(cosine)
    return scale / np.pi * (np.sin(angle) + (np.pi - angle) * cosine)


def ridge_weights(K: np.ndarray, Y: np.ndarray, lam: float) -> np.ndarray:
    """Kernel ridge weights (K + lam I)^-1 (Y - ybar) of every label (column of the dense 0/1 ``Y``) at
    once: the held-out utilities are K_held @ weights + ybar."""
    return scipy.linalg.solve(K + lam * np.eye(len(K)), Y - Y.mean(axis=0), assume_a="pos")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", required=True)
    parser.add_argument("--test")
    parser.add_argument("--final", action="store_true", help="fit on all of --train, score --test")
    parser.add_argument("--ridge", type=float, nargs="+", default=[1.0], help="lam values")
    parser.add_argument("--nystroem", type=int, nargs="*", default=[200, 500, 1000, 2000], help="M values")
    parser.add_argument("--rank", type=int, nargs="*", default=[50, 100, 200], help="P values")
    args = parser.parse_args(argv)

    from sklearn.cluster import KMeans
    from sklearn.preprocessing import normalize

    from bayesmlc.data.io import conform_widths, read_dataset
    from bayesmlc.data.synthetic import split
    from bayesmlc.metrics import inverse_propensity, metrics_by_band

    data = read_dataset(args.train)
    if args.final:
        if not args.test:
            parser.error("--final needs --test")
        fit, held = data, conform_widths(read_dataset(args.test), data.n_features, data.n_labels, args.test)
    else:
        fit, held = split(data, 0.2, random_state=0)
    propensities = inverse_propensity(fit.Y)

    def report(name: str, scores: np.ndarray) -> None:
        bands = metrics_by_band(held.Y, scores, fit.Y, ks=(1, 5), propensities=propensities)
        cells = "  ".join(f"{key} {100 * bands.overall(key):6.2f}" for key in ("P@1", "P@5", "PSP@1", "PSP@5"))
        print(f"{name:<28} {cells}", flush=True)

    A, B = normalize(fit.X).toarray(), normalize(held.X).toarray()
    Y = fit.Y.toarray().astype(np.float64)
    mean = Y.mean(axis=0)
    gram, cross = A @ A.T, B @ A.T
    norms_a, norms_b = np.linalg.norm(A, axis=1), np.linalg.norm(B, axis=1)
    se = lambda inner, scale: np.exp(-(2.0 - 2.0 * inner) / (2.0 * scale**2))  # unit-norm rows
    kernels = {"linear": (gram, cross), "se l=0.5": (se(gram, 0.5), se(cross, 0.5)),
               "se l=1": (se(gram, 1.0), se(cross, 1.0)),
               "arc-cosine": (_arc_cosine(gram, norms_a, norms_a), _arc_cosine(cross, norms_b, norms_a))}
    for lam in args.ridge:
        for name, (K, K_held) in kernels.items():
            alpha = ridge_weights(K, Y, lam)
            report(f"exact {name} lam={lam:g}", K_held @ alpha + mean)
            if name == "se l=1":
                _, _, right = np.linalg.svd(K @ alpha, full_matrices=False)
                for rank in args.rank:
                    kept = right[:rank]
                    report(f"  output rank {rank}", K_held @ alpha @ kept.T @ kept + mean)
        for M in args.nystroem:
            centres = normalize(KMeans(M, n_init=1, random_state=0).fit(A).cluster_centers_)
            K_zz, K_xz, K_hz = se(centres @ centres.T, 1.0), se(A @ centres.T, 1.0), se(B @ centres.T, 1.0)
            weights = scipy.linalg.solve(K_xz.T @ K_xz + lam * K_zz + 1e-6 * np.eye(M), K_xz.T @ (Y - mean),
                                         assume_a="pos")
            report(f"nystroem se l=1 M={M} lam={lam:g}", K_hz @ weights + mean)


if __name__ == "__main__":
    main()
