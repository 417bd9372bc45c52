"""Registry of public multi-label benchmark sets: shapes, splits, propensity constants, files, loading.

Every entry records what the literature publishes about a set (rows in the train and test split,
features D, labels L, average labels per row), the split convention, the constants (A, B) of Jain et
al.'s propensity model, and, for the sets staged in the project's ``shared/datasets`` folder, the size
and sha256 of every file so that a download or a local copy can be verified.

Propensity constants. Jain, Prabhu and Varma, "Extreme multi-label loss functions for recommendation,
tagging, ranking & other missing label applications", KDD 2016, define p_l = 1 / (1 + C (N_l + B)^-A),
C = (ln N - 1)(B + 1)^A, with A = 0.55, B = 1.5 for every data set except Wikipedia-LSHTC (A = 0.5,
B = 0.4) and Amazon (A = 0.6, B = 2.6). The reference tools apply the non-default pairs only to the
Wikipedia-LSHTC/Wikipedia-500K and Amazon-670K/Amazon-3M sets: ``pyxclib`` (kunaldahiya/pyxclib,
``compute_inv_propensity``: "Wikpedia-500K: 0.5/0.4, Amazon-670K, Amazon-3M: 0.6/2.6, Others:
0.55/1.5") and napkinXC (mwydmuch/napkinXC, ``experiments/calculate_Jain_et_al_inv_ps.py``, which
keys on the ``wikiLSHTC``/``WikipediaLarge-500K`` and ``amazon``/``amazon-3M`` folders, while
AmazonCat-13K lives in ``amazonCat``). So AmazonCat-13K and Wiki10-31K use the default pair here.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional, Tuple

from ..exceptions import DatasetNotFoundError, DownloadError, ValidationError
from ..safe_io import remove_stale_temporaries, temporary_prefix

__all__ = [
    "DataFile",
    "DatasetInfo",
    "DownloadError",
    "DatasetNotFoundError",
    "REGISTRY",
    "XC_REPOSITORY_URL",
    "MULAN_URL",
    "get_info",
    "list_datasets",
    "data_home",
    "dataset_folder",
    "load",
    "download",
    "file_sha256",
]

XC_REPOSITORY_URL = "http://manikvarma.org/downloads/XC/XMLRepository.html"
MULAN_URL = "http://mulan.sourceforge.net/datasets-mlc.html"
JAIN_2016 = "Jain, Prabhu, Varma, KDD 2016 (propensity model); pyxclib and napkinXC defaults"

_DEFAULT_A, _DEFAULT_B = 0.55, 1.5


@dataclass(frozen=True)
class DataFile:
    """One file of a staged data set: name in the data set's folder, size in bytes, sha256, URL.

    ``url`` is None when no public copy of this exact file is known (then :func:`download` needs a
    ``base_url`` mirror). ``required=False`` marks the label/feature name files, which :func:`load`
    does not need.
    """

    name: str
    size: int
    sha256: str
    url: Optional[str] = None
    required: bool = True


@dataclass(frozen=True)
class DatasetInfo:
    """What is known about a public multi-label data set.

    Attributes
    ----------
    name: registry key (lower case), e.g. ``"eurlex-4k"``.
    title: the name used in the literature, e.g. ``"EURLex-4K"``.
    n_train, n_test, n_features, n_labels: published shape of the standard split.
    labels_per_row: published average number of labels per row.
    feature_kind: what the features are.
    split: the split convention (whose train/test partition the numbers refer to).
    source: where the data originally comes from, as text.
    source_url: page to get the original files from.
    propensity_a, propensity_b: constants (A, B) of Jain et al.'s propensity model for this set.
    files: verified files of the XC-text conversion (empty when no checksummed copy is known).
    train_names, test_names: file names :func:`load` accepts for each split, first match wins.
    notes: anything a user must know (reconstructed files, unusual splits).
    """

    name: str
    title: str
    n_train: int
    n_test: int
    n_features: int
    n_labels: int
    labels_per_row: float
    feature_kind: str
    split: str
    source: str
    source_url: str
    propensity_a: float = _DEFAULT_A
    propensity_b: float = _DEFAULT_B
    propensity_source: str = JAIN_2016
    files: Tuple[DataFile, ...] = ()
    train_names: Tuple[str, ...] = ("train.txt",)
    test_names: Tuple[str, ...] = ("test.txt",)
    notes: str = ""
    aliases: Tuple[str, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict:
        """Plain-Python description (for JSON)."""
        out = asdict(self)
        out["files"] = [asdict(f) for f in self.files]
        out.pop("aliases")
        return out

    @property
    def downloadable(self) -> bool:
        """Whether checksummed files are recorded (download then works with a URL or a mirror)."""
        return bool(self.files)


def _staged(train: Tuple[int, str], test: Tuple[int, str], labels: Tuple[int, str], features: Tuple[int, str],
            test_url: Optional[str] = None) -> Tuple[DataFile, ...]:
    """The four files of a folder in shared/datasets (sizes and sha256 of train/test from its SOURCE.md;
    labels.txt and features.txt measured on the staged copies, which SOURCE.md does not list)."""
    return (
        DataFile("train.txt", *train),
        DataFile("test.txt", *test, url=test_url),
        DataFile("labels.txt", *labels, required=False),
        DataFile("features.txt", *features, required=False),
    )


_BIBTEX_NAMES = dict(
    labels=(2122, "1350ec51060650137a0d7496560f8c4601c0483d47e291c5a26e3a3968effae4"),
    features=(14695, "228aaf53fef8e30f3042e0f2fe8ec9a19e88e85403e41a8ac53424128c1b6896"),
)

_ENTRIES = [
    # ---- Extreme Classification Repository (shapes from its dataset table) ----
    DatasetInfo(
        name="bibtex", title="Bibtex", n_train=4880, n_test=2515, n_features=1836, n_labels=159,
        labels_per_row=2.40, feature_kind="sparse binary (bag of words)",
        split="BMLS split (Zhao et al., AISTATS 2018): the XC repository's Bibtex with another of its random splits",
        source="Katakis, Tsoumakas, Vlahavas, ECML/PKDD 2008 Discovery Challenge; via GitHub ethanhezhao/BMLS "
               "data/bibtex.mat (commit 428997713364e5cc6f21ee55f009eac4820541d3), converted to XC text",
        source_url=XC_REPOSITORY_URL,
        files=_staged(
            (2198282, "7c3810332d05e88ee9bd4143fa47ea999c24ea5b4a52740071979d2d89d61d58"),
            (1129203, "aa1c301b5d2d3d8cfbfc5927ac1ebcd6aa33144114215398bae1c0dcf481c92d"),
            **_BIBTEX_NAMES,
        ),
        notes="Same 7395 instances as bibtex_xc, split differently: never train on one and test on the other.",
    ),
    DatasetInfo(
        name="bibtex_xc", title="Bibtex (XC split)", n_train=4880, n_test=2515, n_features=1836, n_labels=159,
        labels_per_row=2.40, feature_kind="sparse binary (bag of words)",
        split="XC repository split, as used by the MLGPF papers (GitHub aresPanos/mlgpf)",
        source="test.txt: byte copy of aresPanos/mlgpf data/bibtex/test.txt (commit "
               "54961660a62fd449b99848015d5ca020defd9412); train.txt reconstructed as Mulan bibtex.arff minus "
               "the test rows",
        source_url=XC_REPOSITORY_URL,
        files=_staged(
            (4546107, "b5d72f65de4993832a54325826f25edc64cf007265a2f59778be73e3da2ad59e"),
            (2335600, "423fa44beab9243d0a389cc2d21cb1b7720c0591ec5099b8fb6a569196f6f897"),
            **_BIBTEX_NAMES,
            test_url="https://raw.githubusercontent.com/aresPanos/mlgpf/"
                     "54961660a62fd449b99848015d5ca020defd9412/data/bibtex/test.txt",
        ),
        notes="train.txt has the XC training rows in Mulan's order, not the original XC order.",
        aliases=("bibtex-xc",),
    ),
    DatasetInfo(
        name="delicious", title="Delicious", n_train=12920, n_test=3185, n_features=500, n_labels=983,
        labels_per_row=19.03, feature_kind="sparse binary (bag of words)", split="XC repository split",
        source="Tsoumakas, Katakis, Vlahavas, MMD 2008 (del.icio.us tags)", source_url=XC_REPOSITORY_URL,
    ),
    DatasetInfo(
        name="mediamill", title="Mediamill", n_train=30993, n_test=12914, n_features=120, n_labels=101,
        labels_per_row=4.38, feature_kind="dense real (video)", split="XC repository split",
        source="Snoek et al., ACM Multimedia 2006", source_url=XC_REPOSITORY_URL,
    ),
    DatasetInfo(
        name="eurlex-4k", title="EURLex-4K", n_train=15539, n_test=3809, n_features=5000, n_labels=3993,
        labels_per_row=5.31, feature_kind="sparse tf-idf (bag of words)", split="XC repository split",
        source="Mencia, Fuernkranz, 2008 (EUR-Lex)", source_url=XC_REPOSITORY_URL,
        train_names=("train.txt", "eurlex_train.txt"), test_names=("test.txt", "eurlex_test.txt"),
        aliases=("eurlex", "eur-lex"),
    ),
    DatasetInfo(
        name="rcv1-2k", title="RCV1-2K", n_train=623847, n_test=155962, n_features=47236, n_labels=2456,
        labels_per_row=4.79, feature_kind="sparse tf-idf (bag of words)", split="XC repository split",
        source="Lewis et al., JMLR 2004 (RCV1)", source_url=XC_REPOSITORY_URL,
        train_names=("train.txt", "rcv1x_train.txt"), test_names=("test.txt", "rcv1x_test.txt"),
        aliases=("rcv1", "rcv1-x", "rcv1x"),
    ),
    DatasetInfo(
        name="wiki10-31k", title="Wiki10-31K", n_train=14146, n_test=6616, n_features=101938, n_labels=30938,
        labels_per_row=18.64, feature_kind="sparse tf-idf (bag of words)", split="XC repository split",
        source="Zubiaga, 2012 (Wiki10+)", source_url=XC_REPOSITORY_URL,
        train_names=("train.txt", "wiki10_train.txt"), test_names=("test.txt", "wiki10_test.txt"),
        aliases=("wiki10",),
    ),
    DatasetInfo(
        name="amazoncat-13k", title="AmazonCat-13K", n_train=1186239, n_test=306782, n_features=203882,
        n_labels=13330, labels_per_row=5.04, feature_kind="sparse tf-idf (bag of words)",
        split="XC repository split", source="McAuley, Leskovec, RecSys 2013 (Amazon product categories)",
        source_url=XC_REPOSITORY_URL,
        train_names=("train.txt", "amazonCat_train.txt"), test_names=("test.txt", "amazonCat_test.txt"),
        aliases=("amazoncat",),
    ),
    DatasetInfo(
        name="amazon-670k", title="Amazon-670K", n_train=490449, n_test=153025, n_features=135909,
        n_labels=670091, labels_per_row=5.45, feature_kind="sparse tf-idf (bag of words)",
        split="XC repository split", source="McAuley, Leskovec, RecSys 2013 (Amazon co-purchases)",
        source_url=XC_REPOSITORY_URL, propensity_a=0.6, propensity_b=2.6,
        train_names=("train.txt", "amazon_train.txt"), test_names=("test.txt", "amazon_test.txt"),
        aliases=("amazon670k",),
    ),
    DatasetInfo(
        name="wikilshtc-325k", title="WikiLSHTC-325K", n_train=1778351, n_test=587084, n_features=1617899,
        n_labels=325056, labels_per_row=3.19, feature_kind="sparse tf-idf (bag of words)",
        split="XC repository split", source="Partalas et al., LSHTC 2015 (Wikipedia)",
        source_url=XC_REPOSITORY_URL, propensity_a=0.5, propensity_b=0.4,
        train_names=("train.txt", "wikiLSHTC_train.txt"), test_names=("test.txt", "wikiLSHTC_test.txt"),
        aliases=("wikilshtc",),
    ),
    # ---- Mulan (shapes and cardinality from the Mulan data page; the split shipped by Mulan) ----
    DatasetInfo(
        name="emotions", title="emotions", n_train=391, n_test=202, n_features=72, n_labels=6,
        labels_per_row=1.869, feature_kind="dense real (audio)", split="Mulan split",
        source="Trohidis et al., ISMIR 2008; GitHub tsoumakas/mulan commit "
               "43f6389095ad71984264db4387a8074b22bc7d4a, converted from ARFF to XC text",
        source_url=MULAN_URL,
        files=_staged(
            (325285, "bdb9bc594b734acabe883c781992622092a2c0187f83937a188a0e4f4ec737ea"),
            (168157, "5d90df163fc4fa52617bfe2e69738f653e525ed6c089f50308546e6640a46621"),
            labels=(83, "ee43ed1fa61facf798eff078883ee3ec4bb101747e3578d9cdd52ce437312a92"),
            features=(2031, "dae5fbc56e516ea730c2e5fe1de7ca8c84ef17dca10ea6b10ec35070a1e89773"),
        ),
    ),
    DatasetInfo(
        name="scene", title="scene", n_train=1211, n_test=1196, n_features=294, n_labels=6,
        labels_per_row=1.074, feature_kind="dense real (image)", split="Mulan split",
        source="Boutell et al., Pattern Recognition 2004; GitHub tsoumakas/mulan commit "
               "43f6389095ad71984264db4387a8074b22bc7d4a, converted from ARFF to XC text",
        source_url=MULAN_URL,
        files=_staged(
            (4374437, "941136dd61665f5128d0a5e69c8bfdfbb8397669bdc5c5841a0308c7150658a8"),
            (4323367, "05882bbd06946751ce3319ce83620325761edc1d8797d9ef27c146bc28eb6957"),
            labels=(46, "d53aa1cbdb62c348f59c6b46c75cfb183e07563ee06e8ed5ef884f264db4e5ff"),
            features=(1950, "02cdecd53bc979ea6b7eabf470b58e62da2a5c75499e13585e244b7673cac72b"),
        ),
    ),
    DatasetInfo(
        name="yeast", title="yeast", n_train=1500, n_test=917, n_features=103, n_labels=14,
        labels_per_row=4.237, feature_kind="dense real (gene expression)", split="Mulan split",
        source="Elisseeff, Weston, NIPS 2001; GitHub tsoumakas/mulan commit "
               "43f6389095ad71984264db4387a8074b22bc7d4a, converted from ARFF to XC text",
        source_url=MULAN_URL,
        files=_staged(
            (1924152, "fb516f1bca70d64f182545836db897e74c3bddce4c7f2ed83be2171eac4ae23a"),
            (1176022, "bd07f23b68eeaef034ac6c9accb865854b1483107bea4a77c0f33229ec9d88c6"),
            labels=(103, "4e455a8943689ec5f37053a099d26a57b89ebf05086db73f14bca68b3bbef14e"),
            features=(613, "bc2a433c0e0ec27ae53dd5b55614ea6fb07ea0511f45a480ef16642260a4e6c2"),
        ),
    ),
    DatasetInfo(
        name="medical", title="medical", n_train=333, n_test=645, n_features=1449, n_labels=45,
        labels_per_row=1.245, feature_kind="sparse binary (text)", split="Mulan split",
        source="Pestian et al., BioNLP 2007; GitHub tsoumakas/mulan commit "
               "43f6389095ad71984264db4387a8074b22bc7d4a, converted from ARFF to XC text",
        source_url=MULAN_URL,
        files=_staged(
            (28060, "4e7efd05e837eaa4167be15657f5fd1fca687243e4dfac0b08bf6bdec6999fe8"),
            (55195, "575152851739342826ac6515aad1498bdadb0f0a0122a4ea7f340ab98afa06a4"),
            labels=(682, "0aaf4a8be9adf281cad3e0a1d0927b1035ad6b40e325797507fc1f8761224e22"),
            features=(12830, "6e17a6bad4cadbfaab6eeb9c5a0ab897082c4c2df16b448534671aff51cd32e9"),
        ),
        notes="Mulan's split has fewer training rows (333) than test rows (645).",
    ),
    DatasetInfo(
        name="enron", title="enron", n_train=1123, n_test=579, n_features=1001, n_labels=53,
        labels_per_row=3.378, feature_kind="sparse binary (text)", split="Mulan split",
        source="UC Berkeley Enron Email Analysis Project, Mulan/MEKA version; GitHub tsoumakas/mulan commit "
               "43f6389095ad71984264db4387a8074b22bc7d4a, converted from ARFF to XC text",
        source_url=MULAN_URL,
        files=_staged(
            (564254, "7499e8234201856cd0a39c8c5815c049de4186636616a4c900bb3e9138566c4a"),
            (289535, "5178c5c31578b17d152617952f48797b662f266ca914e532f1b4540c27870f24"),
            labels=(283, "5b057a7bbe020a7d6789d1a9b70dc467fd122c5c070d9ee7468131e9f08a16cd"),
            features=(7010, "1961d0593e5a388de662f7c57ee8f98195a5485a8d4d7da03e4a88db14e7b7fc"),
        ),
    ),
    DatasetInfo(
        name="corel5k", title="Corel5k", n_train=4500, n_test=500, n_features=499, n_labels=374,
        labels_per_row=3.522, feature_kind="sparse binary (image blobs)", split="Mulan split",
        source="Duygulu et al., ECCV 2002", source_url=MULAN_URL,
    ),
]

#: All known data sets by registry key.
REGISTRY = {info.name: info for info in _ENTRIES}
_ALIASES = {alias: info.name for info in _ENTRIES for alias in info.aliases}


def _key(name: str) -> str:
    if not isinstance(name, str):
        raise ValidationError(f"dataset name must be a string, got {name!r}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in REGISTRY:
        squashed = key.replace("-", "").replace("_", "")
        matches = [k for k in REGISTRY if k.replace("-", "").replace("_", "") == squashed]
        if len(matches) != 1:
            raise ValidationError(f"unknown dataset {name!r}; known datasets: {', '.join(REGISTRY)}")
        key = matches[0]
    return key


def list_datasets() -> list:
    """Registry keys of every known data set, in registry order."""
    return list(REGISTRY)


def get_info(name: str) -> DatasetInfo:
    """The :class:`DatasetInfo` of a data set (name case-insensitive; ``EURLex-4K``, ``eurlex`` work)."""
    return REGISTRY[_key(name)]


def data_home(data_home=None) -> Path:
    """The cache folder: ``data_home`` if given, else ``$BAYESMLC_DATA``, else ``~/.cache/bayesmlc``."""
    if data_home is not None:
        return Path(data_home).expanduser()
    env = os.environ.get("BAYESMLC_DATA")
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/bayesmlc").expanduser()


def dataset_folder(name: str, data_home_=None) -> Path:
    """Folder of a data set inside the cache folder: ``<data_home>/<registry key>``."""
    return data_home(data_home_) / _key(name)


def file_sha256(path, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk_size), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------------
def _how_to_get(info: Optional[DatasetInfo], folder: Path) -> str:
    if info is None:
        return f"put the XC-format files train.txt and test.txt in {folder}"
    lines = [f"To get {info.title}:"]
    if info.downloadable:
        lines.append(f"  bayesmlc.datasets.download({info.name!r}) with a URL or base_url mirror of the files "
                     f"({', '.join(f.name for f in info.files)}), or")
    lines.append(f"  download the original from {info.source_url} and save it in Extreme Classification text "
                 f"format as {folder / info.train_names[0]} and {folder / info.test_names[0]}, or")
    lines.append("  pass path= to the folder or file that holds them.")
    return "\n".join(lines)


def _find(folder: Path, names) -> Optional[Path]:
    for candidate in names:
        if (folder / candidate).is_file():
            return folder / candidate
    return None


def _read_split(path: Path, info: Optional[DatasetInfo], split: str, cache, n_features: Optional[int] = None):
    from .io import read_dataset

    # read_dataset also picks up labels.txt / features.txt beside the file as names.
    dataset = read_dataset(path, cache=cache)
    if n_features is not None and dataset.n_features < n_features:
        dataset = dataset.with_features_width(n_features)
    source = dict(dataset.source)
    source["split"] = split
    if info is not None:
        source["dataset"] = info.name
        expected_rows = info.n_train if split == "train" else info.n_test
        published = (expected_rows, info.n_features, info.n_labels)
        recorded = {entry.name: entry.sha256 for entry in info.files}
        if "sha256" in source and recorded.get(path.name, source["sha256"]) != source["sha256"]:
            warnings.warn(
                f"{path}: sha256 {source['sha256']} differs from the registry's verified {info.title} "
                f"{path.name} ({recorded[path.name]}); results may not compare with published ones",
                stacklevel=3,
            )
        if (dataset.n_samples, dataset.n_features, dataset.n_labels) != published:
            warnings.warn(
                f"{path}: shape {dataset.n_samples} x {dataset.n_features} x {dataset.n_labels} differs from "
                f"the published {info.title} {split} split {published[0]} x {published[1]} x {published[2]}",
                stacklevel=3,
            )
    return replace(dataset, source=source)


def load(name: Optional[str] = None, split: str = "train", data_home=None, path=None, cache=False):
    """Load a data set's train split, test split, or both, from the cache folder or a given path.

    Parameters
    ----------
    name:
        Registry key (see :func:`list_datasets`); may be None when ``path`` is given.
    split:
        ``"train"``, ``"test"`` or ``"both"`` (returns ``(train, test)``, test padded to train's width).
    data_home:
        Cache folder; default ``$BAYESMLC_DATA`` or ``~/.cache/bayesmlc``. Files are looked for in
        ``<data_home>/<name>/`` under the names in the registry entry (``train.txt``, ``test.txt``,
        or the XC repository's own names such as ``eurlex_train.txt``).
    path:
        A folder holding the files (used instead of the cache), or one data file (then ``split`` must
        not be ``"both"``).
    cache:
        Passed to :func:`~bayesmlc.data.io.read_dataset`: ``True`` keeps a parsed ``.npz`` copy next to
        each text file so that a large set is parsed once.

    Returns
    -------
    Dataset or (Dataset, Dataset)
        Read by :func:`bayesmlc.data.io.read_dataset` (which takes names from ``labels.txt`` /
        ``features.txt`` beside the data); ``source`` records the path, split and registry name.

    Raises
    ------
    DatasetNotFoundError
        When a file is missing; the message says where it looked and how to get the data.
    """
    if split not in ("train", "test", "both"):
        raise ValidationError(f"split must be 'train', 'test' or 'both', got {split!r}")
    if name is None and path is None:
        raise ValidationError("load() needs a dataset name or a path")
    info = get_info(name) if name is not None else None
    train_names = info.train_names if info else ("train.txt",)
    test_names = info.test_names if info else ("test.txt",)

    if path is not None:
        path = Path(path).expanduser()
        if path.is_file():
            if split == "both":
                raise ValidationError(f"path={str(path)!r} is a single file; split='both' needs a folder")
            return _read_split(path, info, split, cache)
        folder = path
    else:
        folder = dataset_folder(name, data_home)

    wanted = ("train", "test") if split == "both" else (split,)
    found = {}
    for part in wanted:
        names = train_names if part == "train" else test_names
        hit = _find(folder, names)
        if hit is None:
            looked = ", ".join(str(folder / n) for n in names)
            raise DatasetNotFoundError(
                f"no {part} file for {info.title if info else 'this dataset'}: looked for {looked}\n"
                + _how_to_get(info, folder)
            )
        found[part] = hit
    if split != "both":
        return _read_split(found[split], info, split, cache)
    train = _read_split(found["train"], info, "train", cache)
    test = _read_split(found["test"], info, "test", cache, n_features=train.n_features)
    if test.n_features > train.n_features:
        train = train.with_features_width(test.n_features)
    return train, test


# --------------------------------------------------------------------------------------------------
# downloading
# --------------------------------------------------------------------------------------------------
def _matches(path: Path, entry: DataFile) -> bool:
    return path.is_file() and path.stat().st_size == entry.size and file_sha256(path) == entry.sha256


def _fetch(url: str, entry: DataFile, folder: Path, progress: bool, timeout: float) -> Path:
    """Stream ``url`` into a temporary file in ``folder``; verify size and sha256; move it into place."""
    from tqdm.auto import tqdm

    target = folder / entry.name
    remove_stale_temporaries(folder)  # what a killed download left behind
    handle, temp_name = tempfile.mkstemp(dir=folder, prefix=temporary_prefix(entry.name), suffix=".part")
    temp = Path(temp_name)
    digest = hashlib.sha256()
    received = 0
    try:
        with os.fdopen(handle, "wb") as out:
            try:
                response = urllib.request.urlopen(url, timeout=timeout)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                raise DownloadError(f"cannot download {entry.name} from {url}: {exc}") from None
            with response, tqdm(total=entry.size, unit="B", unit_scale=True, desc=entry.name,
                                disable=not progress, leave=False) as bar:
                while True:
                    try:
                        block = response.read(1 << 16)
                    except OSError as exc:  # connection reset, read timeout
                        raise DownloadError(f"transfer of {entry.name} from {url} failed: {exc}") from None
                    if not block:
                        break
                    out.write(block)
                    digest.update(block)
                    received += len(block)
                    bar.update(len(block))
                    if received > entry.size:  # wrong file: stop instead of filling the disk
                        break
        if received != entry.size:
            raise DownloadError(
                f"{entry.name} from {url}: size {received}{'+' if received > entry.size else ''} bytes, "
                f"expected {entry.size}; sha256 of what arrived {digest.hexdigest()}, expected {entry.sha256}"
            )
        if digest.hexdigest() != entry.sha256:
            raise DownloadError(
                f"{entry.name} from {url}: sha256 mismatch: got {digest.hexdigest()}, expected {entry.sha256}"
            )
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return target


def download(name: str, data_home=None, base_url: Optional[str] = None, force: bool = False,
             progress: bool = True, timeout: float = 60.0) -> Path:
    """Download a data set's files into ``<data_home>/<name>/``, verifying size and sha256 of each.

    Parameters
    ----------
    name:
        Registry key of a data set with recorded files (``get_info(name).files`` not empty).
    data_home:
        Cache folder (see :func:`data_home`).
    base_url:
        Mirror to fetch from: each file is requested as ``base_url + "/" + file name``. Without it each
        file's registry URL is used, and a file without one is an error that says so.
    force:
        Download again even when a verified copy is already present.
    progress:
        Show a tqdm progress bar per file on stderr.
    timeout:
        Seconds to wait on the connection.

    Each file is written to a temporary file beside its target and moved into place only after its
    size and sha256 match; on a mismatch the temporary file is deleted and :class:`DownloadError` names
    the file and both hashes. Files already present and verified are kept (unless ``force``); a present
    file that does not verify is replaced. A missing optional name file (labels.txt, features.txt) on
    the server is skipped with a warning. Only the standard library (urllib) talks to the network.

    Returns
    -------
    Path
        The data set's folder, ready for :func:`load`.
    """
    info = get_info(name)
    folder = dataset_folder(info.name, data_home)
    if not info.files:
        raise DownloadError(
            f"no checksummed files are recorded for {info.title}, so it cannot be downloaded and verified "
            f"automatically.\n" + _how_to_get(info, folder)
        )
    plan = []
    for entry in info.files:
        url = base_url.rstrip("/") + "/" + entry.name if base_url else entry.url
        if url is None and entry.required:
            raise DownloadError(
                f"{info.title}: no public URL is known for {entry.name} (its sha256 is {entry.sha256}); pass "
                f"base_url= pointing to a mirror that serves it, or see {info.source_url}"
            )
        plan.append((entry, url))
    folder.mkdir(parents=True, exist_ok=True)
    for entry, url in plan:
        target = folder / entry.name
        if not force and target.exists():
            if _matches(target, entry):
                continue
            warnings.warn(f"{target} does not match the registry's size/sha256; downloading it again", stacklevel=2)
        if url is None:
            warnings.warn(f"{info.title}: no URL for optional file {entry.name}; skipped", stacklevel=2)
            continue
        try:
            _fetch(url, entry, folder, progress, timeout)
        except DownloadError as exc:
            if entry.required or "HTTP Error 404" not in str(exc):
                raise
            warnings.warn(f"optional file {entry.name} not found at {url}; skipped", stacklevel=2)
    return folder

