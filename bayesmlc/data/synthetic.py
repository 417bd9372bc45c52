"""Synthetic multi-label data shaped like bag-of-words benchmarks, generated in row chunks.

The generator is a topic model read both ways. Each row has a sparse mixture ``pi_i`` over ``rank``
latent topics; its words are drawn from the topics' vocabularies (plus a background of popular words),
so the features are sparse, non-negative, Zipf-distributed and low-rank like real bag-of-words
matrices. The labels are then drawn from the *observed features*: the label-topic weights of a row are

    z_i = normalise(x_i) @ W,          theta_i proportional to z_i ** topic_sharpness,

with ``W`` (n_features x rank) sparse, ``W[w, t]`` the posterior probability that a draw of word w
came from topic t; each label draw picks a topic from ``theta_i`` and a label from that topic's block
of labels (or, with probability ``label_noise``, a label from the global power law). The matrix of
label probabilities is therefore ``Theta(X) @ Phi`` with ``Phi`` (rank x n_labels) non-negative: labels
are correlated through a rank-``rank`` structure that is a function of the features, so a model that
reads ``X`` well beats the most-frequent-label baseline by a wide margin. ``docs/datasets.md`` has the
full process, measurements and design choices.

Nothing of size n_samples x n_features or n_samples x n_labels is ever dense; rows are generated in
chunks of :data:`CHUNK_ROWS`, each from its own random stream spawned from one seed, so the output is a
pure function of the arguments and the seed.
"""

from __future__ import annotations

import math
import warnings
from typing import Optional

import numpy as np
import scipy.sparse as sp

from ..exceptions import ValidationError
from .dataset import Dataset

__all__ = [
    "make_multilabel",
    "make_shape",
    "make_train_test",
    "split",
    "SHAPES",
    "CHUNK_ROWS",
    "default_rank",
]

#: Rows generated per chunk (and per random stream). Fixed, so that results never depend on memory.
CHUNK_ROWS = 8192

#: Largest number of stored entries of an *observed-entries* label mask (the :class:`Dataset` contract
#: stores observed entries, so the mask costs n_samples x n_labels x (1 - missing_fraction) entries).
MAX_MASK_ENTRIES = 200_000_000

_FEATURE_KINDS = ("count", "binary", "real")
_MAX_ROUNDS = 40  # rounds of extra draws for rows that have not reached their number of distinct items

#: Default labels per topic (see :func:`default_rank`).
LABELS_PER_TOPIC = 4

# Shapes of public benchmark training sets (Extreme Classification Repository, published statistics).
# ``n_samples`` is the published number of TRAINING rows; ``scale`` multiplies it. The bibtex exponents
# are calibrated so that the generated rank-frequency slopes match ../shared/datasets/bibtex/train.txt
# (labels: 0.53 over ranks 10-79, generated 0.53; features: 0.78 over ranks 10-918, generated 0.72);
# the other exponents, and Delicious' features per row (not published), are plausible choices, not fits.
SHAPES = {
    "bibtex": dict(
        n_samples=4880, n_features=1836, n_labels=159, features_per_row=68.7, labels_per_row=2.40,
        feature_kind="binary", label_power=0.7, feature_power=1.0,
    ),
    "delicious": dict(
        n_samples=12920, n_features=500, n_labels=983, features_per_row=18.0, labels_per_row=19.03,
        feature_kind="binary", label_power=0.8, feature_power=0.85,
    ),
    "eurlex-4k": dict(
        n_samples=15539, n_features=5000, n_labels=3993, features_per_row=236.0, labels_per_row=5.31,
        feature_kind="real", label_power=0.9, feature_power=0.85,
    ),
    "amazoncat-13k": dict(
        n_samples=1186239, n_features=203882, n_labels=13330, features_per_row=71.0, labels_per_row=5.04,
        feature_kind="real", label_power=1.0, feature_power=1.0,
    ),
}


# --------------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------------
def _check_int(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValidationError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise ValidationError(f"{name} must be >= {low}, got {value}")
    return int(value)


def _check_float(value, name: str, low: float, high: float, *, high_open: bool = False) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValidationError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number) or number < low or number > high or (high_open and number >= high):
        bracket = ")" if high_open else "]"
        raise ValidationError(f"{name} must be in [{low}, {high}{bracket}, got {value!r}")
    return number


def _seed_from(random_state) -> int:
    """A recordable integer seed: ``random_state`` itself when it is an int, else one drawn from it."""
    if random_state is None:
        return int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        if random_state < 0:
            raise ValidationError(f"random_state must be non-negative, got {random_state}")
        return int(random_state)
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, 2**63 - 1))
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(0, 2**31 - 1))
    raise ValidationError(f"random_state must be None, an int or a numpy Generator, got {random_state!r}")


# --------------------------------------------------------------------------------------------------
# sampling building blocks
# --------------------------------------------------------------------------------------------------
def _zipf_weights(n: int, power: float) -> np.ndarray:
    """Unnormalised popularity of ranks 0..n-1: (rank + 1) ** -power."""
    return np.arange(1, n + 1, dtype=np.float64) ** (-power)


class _TopicItems:
    """Items (words or labels) with Zipf popularity, and one group of items per topic.

    Items are identified by popularity rank internally; ``column_of_rank`` maps a rank to the public
    column index (a random permutation, so that column order carries no information). With
    ``vocabulary_size=None`` the items are dealt at random into equal, disjoint blocks (labels); else
    each topic draws its own random vocabulary of about that many items, vocabularies overlapping
    (words). Inside its group an item is drawn with probability proportional to its popularity.
    """

    def __init__(self, n_items: int, n_topics: int, power: float, rng: np.random.Generator,
                 vocabulary_size: Optional[int] = None):
        weights = _zipf_weights(n_items, power)
        self.n_items, self.n_topics = n_items, n_topics
        self.column_of_rank = rng.permutation(n_items)
        total = weights.sum()
        self.probability = weights / total  # global popularity, by rank
        self.global_cdf = np.cumsum(self.probability)
        self.global_cdf[-1] = 1.0

        if vocabulary_size is None:
            member_topic = rng.permutation(np.arange(n_items) % n_topics)
            member_rank = np.arange(n_items)
        else:
            drawn_topic = np.repeat(np.arange(n_topics), vocabulary_size)
            keys = np.unique(drawn_topic * n_items + rng.integers(0, n_items, size=drawn_topic.size))
            member_topic, member_rank = keys // n_items, keys % n_items
        # Members grouped by topic, ascending rank inside a group. The flat CDF of topic t runs over
        # (t, t + 1], so ``searchsorted(topic_cdf, t + u)`` samples from topic t in one call.
        order = np.lexsort((member_rank, member_topic))
        self.member_topic, self.member_rank = member_topic[order], member_rank[order]
        grouped = self.probability[self.member_rank]
        group_size = np.bincount(self.member_topic, minlength=n_topics)
        group_end = np.cumsum(group_size)
        group_start = group_end - group_size
        self.block_mass = np.bincount(self.member_topic, weights=grouped, minlength=n_topics)
        within = np.cumsum(grouped)
        within -= np.repeat(within[group_start] - grouped[group_start], group_size)
        self.topic_cdf = self.member_topic + np.minimum(within / self.block_mass[self.member_topic], 1.0)
        self.topic_cdf[group_end - 1] = np.arange(1, n_topics + 1)

    def column_probability(self) -> np.ndarray:
        """Global popularity of each column."""
        out = np.empty(self.n_items)
        out[self.column_of_rank] = self.probability
        return out

    def from_background(self, u: np.ndarray) -> np.ndarray:
        rank = np.minimum(np.searchsorted(self.global_cdf, u, side="right"), self.n_items - 1)
        return self.column_of_rank[rank]

    def from_topics(self, topics: np.ndarray, u: np.ndarray) -> np.ndarray:
        slot = np.minimum(np.searchsorted(self.topic_cdf, topics + u, side="right"), self.topic_cdf.size - 1)
        return self.column_of_rank[self.member_rank[slot]]


class _SparseRows:
    """Non-negative weights over a few columns per row (CSR layout), sampled row-wise in one call."""

    def __init__(self, rows: np.ndarray, cols: np.ndarray, weights: np.ndarray, n_rows: int):
        # ``rows`` sorted ascending (columns in any order inside a row) and every row owning at least one
        # positive weight (callers ensure it).
        self.cols = cols
        self.indptr = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=n_rows))))
        start = self.indptr[:-1]
        weights = weights / np.add.reduceat(weights, start)[rows]  # each row sums to 1
        cum = np.cumsum(weights)
        before = cum[start] - weights[start]
        # The CDF of row r runs over (r, r + 1], so ``searchsorted(cdf, r + u)`` samples from row r
        # (clipped so that rounding never breaks the order at a row boundary).
        self.cdf = rows + np.clip(cum - before[rows], 0.0, 1.0)
        self.cdf[self.indptr[1:] - 1] = np.arange(1, n_rows + 1)

    def sample(self, owners: np.ndarray, u: np.ndarray) -> np.ndarray:
        slot = np.searchsorted(self.cdf, owners + u, side="right")
        slot = np.minimum(slot, self.indptr[owners + 1] - 1)
        return self.cols[slot]


def _draw_items(rng: np.random.Generator, owners: np.ndarray, items: "_TopicItems", row_topics: "_SparseRows",
                background_fraction: float) -> np.ndarray:
    """One item (word or label) per entry of ``owners``: from the background distribution with
    probability ``background_fraction``, else from a topic drawn from the owner row's topic weights."""
    u_source, u_topic, u_item = rng.random((3, owners.size))
    out = np.empty(owners.size, dtype=np.int64)
    background = u_source < background_fraction
    out[background] = items.from_background(u_item[background])
    topical = ~background
    topics = row_topics.sample(owners[topical], u_topic[topical])
    out[topical] = items.from_topics(topics, u_item[topical])
    return out


def _first_distinct(targets: np.ndarray, draw, width: int, oversample: float):
    """Draw items per row until each row i has ``targets[i]`` distinct ones; keep the first ones drawn.

    ``draw(owners)`` returns one item in [0, width) per entry of ``owners`` (local row ids). Returns the
    (row, item, multiplicity) triples of the kept items, sorted by row then item; the multiplicity
    counts every draw of that item for that row. Rows are set aside as soon as they are complete, so a
    round only re-sorts the draws of rows still short; a row still short after :data:`_MAX_ROUNDS`
    rounds keeps what it has.
    """
    n_rows = targets.shape[0]
    kept_keys, kept_counts = [], []
    active = np.flatnonzero(targets > 0)
    needed = targets.astype(np.int64)
    carried = np.empty(0, dtype=np.int64)  # draws of the active rows so far, in draw order
    for round_no in range(_MAX_ROUNDS):
        if active.size == 0:
            break
        # Rows still short after a round are the ones whose items repeat a lot: draw more for them.
        owners = np.repeat(active, np.ceil(oversample * 2.0 ** min(round_no, 6) * needed[active]).astype(np.int64) + 2)
        keys = np.concatenate((carried, owners * width + draw(owners)))
        unique_keys, first_position, multiplicity = np.unique(keys, return_index=True, return_counts=True)
        rows = unique_keys // width
        distinct = np.bincount(rows, minlength=n_rows)
        complete = distinct >= targets  # among the rows drawn in this round (others have distinct 0)
        if round_no == _MAX_ROUNDS - 1:
            complete[active] = True
        settle = complete[rows]
        rows, first_position = rows[settle], first_position[settle]
        # Rank of each distinct item within its row by the position of its first draw.
        order = np.lexsort((first_position, rows))
        row_start = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=n_rows))[:-1]))
        rank_in_row = np.empty_like(order)
        rank_in_row[order] = np.arange(order.size) - row_start[rows[order]]
        keep = rank_in_row < targets[rows]
        kept_keys.append(unique_keys[settle][keep])
        kept_counts.append(multiplicity[settle][keep])
        carried = keys[~complete[keys // width]]
        active = active[~complete[active]]
        needed = targets - distinct
    keys = np.concatenate(kept_keys) if kept_keys else np.empty(0, dtype=np.int64)
    counts = np.concatenate(kept_counts) if kept_counts else np.empty(0, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order]
    return keys // width, keys % width, counts


def _counts_at_least_one(rng: np.random.Generator, mean: float, size: int, cap: int, dispersion: float) -> np.ndarray:
    """Integers in [1, cap] with mean about ``mean``: 1 + Poisson(rate), rate ~ Gamma(1/dispersion) with
    mean ``mean - 1`` (plain Poisson when ``dispersion`` is 0)."""
    if mean <= 1.0:
        return np.ones(size, dtype=np.int64)
    if dispersion > 0:
        rates = rng.gamma(1.0 / dispersion, (mean - 1.0) * dispersion, size=size)
    else:
        rates = np.full(size, mean - 1.0)
    return np.minimum(1 + rng.poisson(rates), cap).astype(np.int64)


# --------------------------------------------------------------------------------------------------
# the generator
# --------------------------------------------------------------------------------------------------
def default_rank(n_features: int, n_labels: int) -> int:
    """Default number of topics: one per ``LABELS_PER_TOPIC`` labels, at most one per 8 features."""
    return int(max(1, min(n_labels // LABELS_PER_TOPIC, n_features // 8, n_labels, n_features)))


def vocabulary_size(n_features: int, n_topics: int, features_per_row: float, topics_per_row: float) -> int:
    """Words per topic: enough for a row to find its distinct words in its topics (4 x the topical
    words a row needs from one topic), at least an equal share of the vocabulary, at most all of it,
    and at most 2e7 (topic, word) pairs in all."""
    wanted = max(-(-n_features // n_topics), int(np.ceil(4.0 * features_per_row / topics_per_row)))
    return int(max(1, min(wanted, n_features, max(-(-n_features // n_topics), 20_000_000 // n_topics))))


def make_multilabel(
    n_samples: int,
    n_features: int,
    n_labels: int,
    *,
    features_per_row: Optional[float] = None,
    labels_per_row: Optional[float] = None,
    rank: Optional[int] = None,
    label_power: float = 0.8,
    feature_power: float = 0.85,
    topics_per_row: float = 2.0,
    background_fraction: float = 0.2,
    label_noise: float = 0.05,
    topic_sharpness: float = 4.0,
    missing_fraction: float = 0.0,
    feature_kind: str = "count",
    random_state=None,
) -> Dataset:
    """Generate a sparse multi-label data set whose labels depend on its features through K topics.

    Generative process (all sparse; see the module docstring and ``docs/datasets.md``):

    1. Labels get Zipf popularity c_l ~ (rank_l)^-label_power and are split at random into K equal
       blocks, one per topic; topic t is chosen by rows with prevalence proportional to its block's
       popularity mass, so the marginal label frequencies keep the power law.
    2. Row i picks 1 + Poisson(topics_per_row - 1) topics by prevalence with Dirichlet(1) weights pi_i.
    3. Its words: each draw is a background word (Zipf over all features) with probability
       ``background_fraction``, else a word of topic t ~ pi_i (words are split at random into K equal
       blocks, Zipf inside a block); draws continue until the row has its number of distinct features.
    4. Label topic weights from the features: z_i = normalise(x_i) @ W with W (D x K) sparse, one
       non-zero per word, W[w, topic(w)] = probability that a draw of w came from its topic rather than
       the background; theta_i proportional to z_i ** topic_sharpness.
    5. Labels: 1 + Poisson(labels_per_row - 1) distinct labels, each drawn from the global power law
       with probability ``label_noise``, else from the block of topic t ~ theta_i.

    Parameters
    ----------
    n_samples, n_features, n_labels:
        Shape: N rows, D feature columns, L label columns.
    features_per_row:
        Mean number of distinct non-zero features per row (over-dispersed, at least 1); default
        min(30, max(1, n_features / 4)).
    labels_per_row:
        Mean number of positive labels per row, >= 1; default min(3, max(1, n_labels / 4)).
    rank:
        Number of topics K (the rank of the label-probability matrix Theta @ Phi). Default: one topic
        per 4 labels, at most one per 8 features (:func:`default_rank`).
    label_power, feature_power:
        Zipf exponents of label and feature popularity (frequency of the r-th most popular ~ r^-power).
    topics_per_row:
        Mean number of topic draws of a row, >= 1 (repeated draws merge, so a row has at most K).
    background_fraction:
        Share of a row's word draws taken from the global Zipf distribution (topic-free words).
    label_noise:
        Share of label draws taken from the global power law instead of the row's topics.
    topic_sharpness:
        Exponent gamma in theta_i ~ z_i ** gamma; larger makes labels follow the row's dominant topics.
    missing_fraction:
        Fraction of label entries (positives included) hidden uniformly at random: each entry is
        independently unobserved with this probability and left out of ``label_mask``. ``Y`` keeps the
        complete labels. 0 gives ``label_mask=None``.
    feature_kind:
        ``"count"`` (number of draws of each word), ``"binary"`` (presence) or ``"real"`` (tf-idf,
        (1 + log count) * idf, rows scaled to unit L2 norm, like the XC repository's BoW files).
    random_state:
        None, an int or a numpy Generator. The seed actually used is recorded in ``source["seed"]``.

    Returns
    -------
    Dataset
        ``X`` (N, D) float32 CSR, ``Y`` (N, L) 0/1 CSR, ``label_mask`` (N, L) or None, and ``source``
        holding the generator name, every parameter and the seed.

    Examples
    --------
    >>> ds = make_multilabel(200, 300, 20, random_state=0)
    >>> ds.n_samples, ds.n_features, ds.n_labels
    (200, 300, 20)
    >>> (make_multilabel(200, 300, 20, random_state=0).Y != ds.Y).nnz
    0
    """
    n_samples = _check_int(n_samples, "n_samples", 1)
    n_features = _check_int(n_features, "n_features", 1)
    n_labels = _check_int(n_labels, "n_labels", 1)
    if features_per_row is None:
        features_per_row = min(30.0, max(1.0, n_features / 4))
    if labels_per_row is None:
        labels_per_row = min(3.0, max(1.0, n_labels / 4))
    features_per_row = _check_float(features_per_row, "features_per_row", 1.0, float(n_features))
    labels_per_row = _check_float(labels_per_row, "labels_per_row", 1.0, float(n_labels))
    if rank is None:
        rank = default_rank(n_features, n_labels)
    rank = _check_int(rank, "rank", 1)
    if rank > min(n_features, n_labels):
        raise ValidationError(
            f"rank must be at most min(n_features, n_labels) = {min(n_features, n_labels)}, got {rank}"
        )
    label_power = _check_float(label_power, "label_power", 0.0, 10.0)
    feature_power = _check_float(feature_power, "feature_power", 0.0, 10.0)
    topics_per_row = _check_float(topics_per_row, "topics_per_row", 1.0, 1e6)  # drawn topics merge
    background_fraction = _check_float(background_fraction, "background_fraction", 0.0, 1.0, high_open=True)
    label_noise = _check_float(label_noise, "label_noise", 0.0, 1.0)
    topic_sharpness = _check_float(topic_sharpness, "topic_sharpness", 0.0, 100.0)
    missing_fraction = _check_float(missing_fraction, "missing_fraction", 0.0, 1.0, high_open=True)
    if feature_kind not in _FEATURE_KINDS:
        raise ValidationError(f"feature_kind must be one of {_FEATURE_KINDS}, got {feature_kind!r}")
    if missing_fraction > 0:
        observed_entries = n_samples * n_labels * (1.0 - missing_fraction)
        if observed_entries > MAX_MASK_ENTRIES:
            raise ValidationError(
                f"missing_fraction={missing_fraction} on {n_samples} x {n_labels} labels would store "
                f"{observed_entries:.3g} observed entries in label_mask (limit {MAX_MASK_ENTRIES:.3g}); "
                "use fewer rows or labels, or a larger missing_fraction"
            )
    seed = _seed_from(random_state)

    params = dict(
        n_samples=n_samples, n_features=n_features, n_labels=n_labels, features_per_row=features_per_row,
        labels_per_row=labels_per_row, rank=rank, label_power=label_power, feature_power=feature_power,
        topics_per_row=topics_per_row, background_fraction=background_fraction, label_noise=label_noise,
        topic_sharpness=topic_sharpness, missing_fraction=missing_fraction, feature_kind=feature_kind,
    )

    global_seq, data_seq, mask_seq = np.random.SeedSequence(seed).spawn(3)
    global_rng = np.random.default_rng(global_seq)
    model = _TopicModel(
        words=_TopicItems(n_features, rank, feature_power, global_rng,
                          vocabulary_size=vocabulary_size(n_features, rank, features_per_row, topics_per_row)),
        labels=_TopicItems(n_labels, rank, label_power, global_rng),
        features_per_row=features_per_row, labels_per_row=labels_per_row, topics_per_row=topics_per_row,
        background_fraction=background_fraction, label_noise=label_noise, topic_sharpness=topic_sharpness,
        feature_kind=feature_kind,
    )

    X, Y, mask = _generate_rows(model, data_seq, mask_seq, n_samples, missing_fraction)
    source = {"generator": "bayesmlc.datasets.make_multilabel", **params, "seed": seed}
    return Dataset(X=X, Y=Y, label_mask=mask, source=source)


def _generate_rows(model: "_TopicModel", data_seq, mask_seq, n_samples: int, missing_fraction: float):
    """X, Y and the label mask (``None`` without missing entries), generated in chunks of
    ``CHUNK_ROWS`` rows, each chunk from its own spawned seed."""
    n_labels = model.labels.n_items
    n_chunks = -(-n_samples // CHUNK_ROWS)
    x_parts, y_parts, mask_parts = [], [], []
    for chunk_seq, chunk_mask_seq, start in zip(
        data_seq.spawn(n_chunks), mask_seq.spawn(n_chunks), range(0, n_samples, CHUNK_ROWS)
    ):
        n_rows = min(CHUNK_ROWS, n_samples - start)
        x_chunk, y_chunk = model.generate(np.random.default_rng(chunk_seq), n_rows)
        x_parts.append(x_chunk)
        y_parts.append(y_chunk)
        if missing_fraction > 0:
            mask_parts.append(_observed_mask(np.random.default_rng(chunk_mask_seq), n_rows, n_labels, missing_fraction))
    X = _stack_csr(x_parts, model.words.n_items, np.float32)
    Y = _stack_csr(y_parts, n_labels, np.float32)
    mask = _stack_csr(mask_parts, n_labels, np.float32) if mask_parts else None
    return X, Y, mask


class _TopicModel:
    """The fixed (seed-level) structure of a synthetic set, and the generation of one chunk of rows."""

    def __init__(self, words: _TopicItems, labels: _TopicItems, *, features_per_row, labels_per_row,
                 topics_per_row, background_fraction, label_noise, topic_sharpness, feature_kind):
        self.words, self.labels = words, labels
        self.features_per_row, self.labels_per_row = features_per_row, labels_per_row
        self.topics_per_row, self.background_fraction = topics_per_row, background_fraction
        self.label_noise, self.topic_sharpness, self.feature_kind = label_noise, topic_sharpness, feature_kind
        self.n_topics = words.block_mass.size
        # Topic prevalence = popularity mass of its label block: label frequencies keep the power law.
        self.prevalence = labels.block_mass / labels.block_mass.sum()
        self.prevalence_cdf = np.cumsum(labels.block_mass)
        self.prevalence_cdf /= self.prevalence_cdf[-1]
        self.prevalence_cdf[-1] = 1.0
        # W[w, t] = P(a draw of word w came from topic t) under a uniform prior over topics (a
        # prevalence prior would be amplified by topic_sharpness), background included in the
        # normaliser: z_i = normalise(x_i) @ W estimates the topic shares of row i.
        word_probability = words.column_probability()
        member_word = words.column_of_rank[words.member_rank]
        from_topic = ((1.0 - background_fraction) / self.n_topics
                      * words.probability[words.member_rank] / words.block_mass[words.member_topic])
        evidence = np.bincount(member_word, weights=from_topic, minlength=words.n_items)
        evidence += background_fraction * word_probability
        self.word_topic = sp.csr_matrix(
            (from_topic / evidence[member_word], (member_word, words.member_topic)),
            shape=(words.n_items, self.n_topics),
        )
        # idf of each column from its background popularity (for feature_kind="real").
        self.idf = np.log1p(1.0 / (words.n_items * word_probability))

    def generate(self, rng: np.random.Generator, n_rows: int):
        """One chunk: X and Y rows as (data, indices, row lengths) parts."""
        words, labels, n_topics = self.words, self.labels, self.n_topics

        # Row topic mixtures pi_i: 1 + Poisson(topics_per_row - 1) topics by prevalence, Dirichlet(1).
        n_row_topics = _counts_at_least_one(rng, self.topics_per_row, n_rows, n_topics, dispersion=0.0)
        owners = np.repeat(np.arange(n_rows), n_row_topics)
        topics = np.minimum(np.searchsorted(self.prevalence_cdf, rng.random(owners.size), side="right"), n_topics - 1)
        keys, inverse = np.unique(owners * n_topics + topics, return_inverse=True)
        weights = np.bincount(inverse, weights=rng.standard_exponential(owners.size))
        mixture = _SparseRows(keys // n_topics, keys % n_topics, weights, n_rows)

        def draw_word(owners):
            return _draw_items(rng, owners, words, mixture, self.background_fraction)

        feature_targets = _counts_at_least_one(rng, self.features_per_row, n_rows, words.n_items, dispersion=0.5)
        x_rows, x_cols, x_counts = _first_distinct(feature_targets, draw_word, words.n_items, oversample=2.0)
        if self.feature_kind == "count":
            x_values = x_counts.astype(np.float64)
        elif self.feature_kind == "binary":
            x_values = np.ones(x_cols.size)
        else:  # tf-idf with unit-L2 rows
            x_values = (1.0 + np.log(x_counts)) * self.idf[x_cols]
            x_values /= np.sqrt(np.bincount(x_rows, weights=x_values**2, minlength=n_rows))[x_rows]

        # z_i = normalise(x_i) @ W (sparse), theta_i ~ z_i ** topic_sharpness.
        row_mass = np.bincount(x_rows, weights=x_values, minlength=n_rows)
        x_normalised = sp.csr_matrix((x_values / row_mass[x_rows], (x_rows, x_cols)), shape=(n_rows, words.n_items))
        z = sp.csr_matrix(x_normalised @ self.word_topic)
        z.eliminate_zeros()
        z.sort_indices()
        topics_per_z_row = np.diff(z.indptr)
        theta_rows = np.repeat(np.arange(n_rows), topics_per_z_row)
        theta_topics = z.indices.astype(np.int64)
        theta_weights = np.maximum(z.data ** self.topic_sharpness, np.finfo(float).tiny)
        orphans = np.flatnonzero(topics_per_z_row == 0)  # rows of background words outside every topic
        if orphans.size:  # such rows take their topics from the prevalence prior
            theta_rows = np.concatenate((theta_rows, np.repeat(orphans, n_topics)))
            theta_topics = np.concatenate((theta_topics, np.tile(np.arange(n_topics), orphans.size)))
            theta_weights = np.concatenate((theta_weights, np.tile(self.prevalence, orphans.size)))
            order = np.argsort(theta_rows, kind="stable")
            theta_rows, theta_topics, theta_weights = theta_rows[order], theta_topics[order], theta_weights[order]
        theta = _SparseRows(theta_rows, theta_topics, theta_weights, n_rows)

        def draw_label(owners):  # label noise: a label drawn from the background distribution
            return _draw_items(rng, owners, labels, theta, self.label_noise)

        label_targets = _counts_at_least_one(rng, self.labels_per_row, n_rows, labels.n_items, dispersion=0.0)
        y_rows, y_cols, _ = _first_distinct(label_targets, draw_label, labels.n_items, oversample=1.5)

        x_part = (x_values.astype(np.float32), x_cols.astype(np.int32), np.bincount(x_rows, minlength=n_rows))
        y_part = (np.ones(y_cols.size, np.float32), y_cols.astype(np.int32), np.bincount(y_rows, minlength=n_rows))
        return x_part, y_part


def _observed_mask(rng, n_rows: int, n_labels: int, missing_fraction: float):
    """CSR part of the observed-entries mask: each entry observed independently w.p. 1 - missing_fraction."""
    block = max(1, 4_000_000 // n_labels)
    cols, lengths = [], []
    for start in range(0, n_rows, block):
        rows_here = min(block, n_rows - start)
        observed = rng.random((rows_here, n_labels), dtype=np.float32) >= missing_fraction
        r, c = np.nonzero(observed)
        cols.append(c.astype(np.int32))
        lengths.append(np.bincount(r, minlength=rows_here))
    cols = np.concatenate(cols)
    return np.ones(cols.size, np.float32), cols, np.concatenate(lengths)


def _stack_csr(parts, n_columns: int, dtype) -> sp.csr_matrix:
    """Concatenate (data, indices, row lengths) parts into one CSR matrix with sorted indices."""
    data = np.concatenate([p[0] for p in parts]).astype(dtype, copy=False)
    indices = np.concatenate([p[1] for p in parts])
    lengths = np.concatenate([p[2] for p in parts])
    indptr = np.zeros(lengths.size + 1, dtype=np.int64 if data.size >= 2**31 else np.int32)
    np.cumsum(lengths, out=indptr[1:])
    matrix = sp.csr_matrix((data, indices, indptr), shape=(lengths.size, n_columns))
    matrix.has_sorted_indices = True
    matrix.has_canonical_format = True
    return matrix


# --------------------------------------------------------------------------------------------------
# benchmark shapes and splits
# --------------------------------------------------------------------------------------------------
def make_shape(name: str, scale: float = 1.0, random_state=None, **overrides) -> Dataset:
    """A synthetic set shaped like a public benchmark's training set.

    ``name`` is one of :data:`SHAPES` (``bibtex``, ``delicious``, ``eurlex-4k``, ``amazoncat-13k``).
    ``scale`` multiplies the number of ROWS only (features, labels, per-row densities stay those of the
    real set); ``make_shape("amazoncat-13k", scale=0.1)`` has 118,624 rows. ``overrides`` replace any
    other :func:`make_multilabel` argument (for example ``missing_fraction``).
    """
    key = str(name).lower()
    if key not in SHAPES:
        raise ValidationError(f"unknown shape {name!r}; known shapes: {', '.join(SHAPES)}")
    scale = _check_float(scale, "scale", 0.0, 1e6)
    params = dict(SHAPES[key])
    n_samples = max(1, int(round(params.pop("n_samples") * scale)))
    params.update(overrides)
    dataset = make_multilabel(n_samples, params.pop("n_features"), params.pop("n_labels"),
                              random_state=random_state, **params)
    dataset.source = {"preset": key, "scale": scale, **dataset.source}
    return dataset


def split(dataset: Dataset, test_fraction: float = 0.25, random_state=None):
    """Split rows uniformly at random into (train, test); ``test_fraction`` of the rows go to test.

    Both parts keep their rows in the original order; ``source`` gains ``split``, ``test_fraction`` and
    ``split_seed`` (the seed used, recorded also when ``random_state`` is None).
    """
    test_fraction = _check_float(test_fraction, "test_fraction", 0.0, 1.0)
    if not 0.0 < test_fraction < 1.0:
        raise ValidationError(f"test_fraction must be strictly between 0 and 1, got {test_fraction}")
    n_test = int(round(dataset.n_samples * test_fraction))
    if n_test == 0 or n_test == dataset.n_samples:
        raise ValidationError(
            f"test_fraction={test_fraction} of {dataset.n_samples} rows leaves an empty train or test split"
        )
    seed = _seed_from(random_state)
    order = np.random.default_rng(seed).permutation(dataset.n_samples)
    test_rows, train_rows = np.sort(order[:n_test]), np.sort(order[n_test:])
    train, test = dataset.subset(train_rows), dataset.subset(test_rows)
    for part, name in ((train, "train"), (test, "test")):
        part.source = {**dataset.source, "split": name, "test_fraction": test_fraction, "split_seed": seed}
    return train, test


def make_train_test(n_samples: int, n_features: int, n_labels: int, *, test_fraction: float = 0.25,
                    random_state=None, **kwargs):
    """:func:`make_multilabel` followed by :func:`split` (rows are i.i.d., so any split is fair)."""
    seed = _seed_from(random_state)
    dataset = make_multilabel(n_samples, n_features, n_labels, random_state=seed, **kwargs)
    return split(dataset, test_fraction, random_state=seed + 1)


#: earlier names (a "preset" is a model configuration, :mod:`bayesmlc.presets`), still readable
DEPRECATED_NAMES = {"PRESETS": "SHAPES", "make_preset": "make_shape"}


def __getattr__(name: str):
    """``PRESETS`` and ``make_preset``, the earlier names of :data:`SHAPES` and :func:`make_shape`,
    with a FutureWarning."""
    if name in DEPRECATED_NAMES:
        current = DEPRECATED_NAMES[name]
        warnings.warn(f"bayesmlc's synthetic {name} was renamed {current} (presets are model configurations, "
                      f"bayesmlc.presets); {name} will be removed", FutureWarning, stacklevel=2)
        return globals()[current]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
