"""Public data sets and synthetic data: ``bayesmlc.datasets``.

Real benchmark sets are described by a registry (:func:`list_datasets`, :func:`get_info`), read from a
cache folder or a given path by :func:`load`, and fetched with checksums by :func:`download`.
Synthetic sets come from :func:`make_multilabel`, the benchmark-shaped :func:`make_preset` and the
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
from .data.synthetic import PRESETS, make_multilabel, make_preset, make_train_test, split

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
    "make_preset",
    "make_train_test",
    "split",
    "PRESETS",
]
