"""BMLS: Bayesian multi-label learning with sparse features and labels, and label co-occurrences
(Zhao, Rai, Du & Buntine, AISTATS 2018), trained by Gibbs sampling."""

from .missing import remove_labels, subsample_instances
from .model import BMLS, cooccurrence_matrix
from .topics import format_topics

__all__ = ["BMLS", "cooccurrence_matrix", "remove_labels", "subsample_instances", "format_topics"]
