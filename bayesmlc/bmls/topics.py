"""Text rendering of a fitted BMLS model's topics (what ``bayesmlc topics --model-dir DIR`` prints)."""

from __future__ import annotations

__all__ = ["format_topics"]


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
