"""Public data sets and synthetic data: ``bayesmlc.datasets``.

Real benchmark sets are described by a registry (:func:`list_datasets`, :func:`get_info`), read from a
cache folder or a given path by :func:`load`, and fetched with checksums by :func:`download`.
Synthetic sets come from :func:`make_multilabel`, the benchmark-shaped :func:`make_shape` and the
row splitter :func:`split`.

Examples
--------
>>> from bayesmlc import datasets
>>> datasets.get_info("eurlex-4k").n_labels
3993
>>> train, test = datasets.make_train_test(400, 300, 20, random_state=0)
>>> train.n_samples, test.n_samples
(300, 100)
"""

from .data.registry import (
    MULAN_URL,
    REGISTRY,
    XC_REPOSITORY_URL,
    DataFile,
    DatasetInfo,
    DatasetNotFoundError,
    DownloadError,
    data_home,
    download,
    get_info,
    list_datasets,
    load,
)
from .data import synthetic as _synthetic
from .data.synthetic import SHAPES, make_multilabel, make_shape, make_train_test, split

__all__ = [
    "load",
    "download",
    "list_datasets",
    "get_info",
    "data_home",
    "DatasetInfo",
    "DataFile",
    "DatasetNotFoundError",
    "DownloadError",
    "REGISTRY",
    "XC_REPOSITORY_URL",
    "MULAN_URL",
    "make_multilabel",
    "make_shape",
    "make_train_test",
    "split",
    "SHAPES",
]


def __getattr__(name: str):
    """The earlier names ``PRESETS`` and ``make_preset`` (:data:`bayesmlc.data.synthetic.DEPRECATED_NAMES`),
    with a FutureWarning."""
    if name in _synthetic.DEPRECATED_NAMES:
        return getattr(_synthetic, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
