"""Data: the :class:`Dataset` container, file formats, the public dataset registry, synthetic data."""

from .dataset import Dataset

__all__ = ["Dataset"]
