"""BMLS's topics: how many ``n_topics="auto"`` gives (:func:`auto_topics`), and the text rendering
of a fitted model's topics (what ``bayesmlc topics --model-dir DIR`` prints)."""

from __future__ import annotations

import numpy as np

__all__ = ["AUTO_LABELS_PER_TOPIC", "auto_topic_cap", "auto_topics", "format_topics"]

# n_topics="auto": K = sqrt(positive label entries of the training rows), within [AUTO_MIN_TOPICS, a cap]
# (the papers' K = 100 on Bibtex, whose 11,729 positives give 108); too many topics for few positives
# ranks far worse (docs/experiments.md, "BMLS: the number of topics"). The cap is AUTO_MAX_TOPICS, raised
# to one topic per AUTO_LABELS_PER_TOPIC labels on large label spaces, where 100 topics lump dozens of
# labels together (EURLex-4K shape: K = 100 / 300, P@1 37.3 / 48.1), but never beyond
# AUTO_TOPIC_ENTRIES entries of a (L + D + 1, K) draw, so that wide models (AmazonCat-13K) keep K = 100
# and their prediction cost and file size (docs/experiments.md, "BMLS: topics on large label spaces").
AUTO_MIN_TOPICS = 10
AUTO_MAX_TOPICS = 100
AUTO_LABELS_PER_TOPIC = 10
AUTO_TOPIC_ENTRIES = 2**22


def auto_topic_cap(n_labels: int, n_features_bias: int) -> int:
    """The most topics ``n_topics="auto"`` gives: max(AUTO_MAX_TOPICS, min(n_labels //
    AUTO_LABELS_PER_TOPIC, AUTO_TOPIC_ENTRIES // (n_labels + n_features_bias)))."""
    by_labels = int(n_labels) // AUTO_LABELS_PER_TOPIC
    by_size = AUTO_TOPIC_ENTRIES // max(int(n_labels) + int(n_features_bias), 1)
    return max(AUTO_MAX_TOPICS, min(by_labels, by_size))


def auto_topics(n_positives: int, n_labels: int = 0, n_features_bias: int = 0) -> int:
    """``n_topics="auto"``: round(sqrt(n_positives)) clipped to [AUTO_MIN_TOPICS, :func:`auto_topic_cap`]
    of ``n_labels`` labels and ``n_features_bias`` features (the bias column included)."""
    root = round(float(np.sqrt(max(int(n_positives), 0))))
    return int(np.clip(root, AUTO_MIN_TOPICS, auto_topic_cap(n_labels, n_features_bias)))


def _name(names, index: int, prefix: str) -> str:
    if names is not None and 0 <= index < len(names):
        return str(names[index])
    return f"{prefix}{index}"


def format_topics(model, n_top: int = 10, label_names=None, feature_names=None) -> str:
    """One block per topic (most used first): its top labels with phi_lk and the features that push it
    most with exp(E[log h_dk]) (the multiplicative effect of the feature on theta_k; 1 = no effect).

    ``label_names`` / ``feature_names``: sequences of names (e.g. from the training dataset), or None
    for ``label<i>`` / ``feature<i>``.
    """
    import math

    lines = []
    for topic in model.topics(n_top):
        lines.append(
            f"topic {topic['topic']}  (usage {topic['usage']:.1f} label tokens per sweep, bias b = {math.exp(topic['bias']):.3g})"
        )
        labels = ", ".join(f"{_name(label_names, l, 'label')} ({w:.3f})" for l, w in topic["labels"])
        features = ", ".join(f"{_name(feature_names, d, 'feature')} (x{math.exp(v):.2f})" for d, v in topic["features"])
        lines.append(f"  labels:   {labels}")
        lines.append(f"  features: {features}")
    return "\n".join(lines)
