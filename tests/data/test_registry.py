"""Tests of the dataset registry, ``load`` and ``download``.

Downloads go to a local HTTP server on 127.0.0.1 (a thread, port 0) serving ``../shared/datasets``
or a corrupted copy of it; nothing reaches the internet.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from bayesmlc import datasets
from bayesmlc.data import registry
from bayesmlc.exceptions import ValidationError
from conftest import shared_dataset_dir

STAGED = ["bibtex", "bibtex_xc", "emotions", "scene", "yeast", "medical", "enron"]


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------
def _read_xc_by_hand(path: Path):
    """Independent minimal reader of the XC text format: (X, Y) as dense float arrays."""
    lines = path.read_text().splitlines()
    n, d, l = (int(v) for v in lines[0].split())
    X, Y = np.zeros((n, d)), np.zeros((n, l))
    for i, line in enumerate(lines[1:]):
        head, _, rest = line.partition(" ")
        for label in filter(None, head.split(",")):
            Y[i, int(label)] = 1
        for pair in rest.split():
            index, value = pair.split(":")
            X[i, int(index)] = float(value)
    return X, Y


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _Server:
    """A static file server on 127.0.0.1 that counts the requests it gets."""

    def __init__(self, root: Path):
        self.requests = []
        server = self

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_GET(self):
                server.requests.append(self.path)
                super().do_GET()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    """Make sure urllib talks to 127.0.0.1 directly, whatever proxy the environment sets."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


# --------------------------------------------------------------------------------------------------
# registry contents
# --------------------------------------------------------------------------------------------------
def test_every_required_dataset_is_registered():
    names = datasets.list_datasets()
    for name in ["bibtex", "bibtex_xc", "delicious", "mediamill", "eurlex-4k", "rcv1-2k", "wiki10-31k",
                 "amazoncat-13k", "emotions", "scene", "yeast", "medical", "enron", "corel5k"]:
        assert name in names


def test_names_are_case_and_punctuation_insensitive():
    assert datasets.get_info("EURLex-4K").name == "eurlex-4k"
    assert datasets.get_info("eurlex").name == "eurlex-4k"
    assert datasets.get_info("AmazonCat13K").name == "amazoncat-13k"
    assert datasets.get_info("bibtex-xc").name == "bibtex_xc"
    with pytest.raises(ValidationError, match="known datasets: bibtex"):
        datasets.get_info("imagenet")


def test_published_shapes_are_consistent():
    for info in registry.REGISTRY.values():
        assert info.n_train > 0 and info.n_test > 0 and info.n_features > 0 and info.n_labels > 0
        assert 1.0 <= info.labels_per_row <= info.n_labels
        assert info.split and info.source_url.startswith("http")
    # Spot values from the XC repository's table and Mulan's page.
    eurlex = datasets.get_info("eurlex-4k")
    assert (eurlex.n_train, eurlex.n_test, eurlex.n_features, eurlex.n_labels) == (15539, 3809, 5000, 3993)
    amazon = datasets.get_info("amazoncat-13k")
    assert (amazon.n_train, amazon.n_features, amazon.n_labels, amazon.labels_per_row) == (1186239, 203882, 13330, 5.04)
    assert datasets.get_info("medical").split == "Mulan split"
    assert datasets.get_info("bibtex_xc").split.startswith("XC repository split")


def test_propensity_constants():
    # Jain et al. 2016: A=0.55, B=1.5 except Wikipedia-LSHTC (0.5, 0.4) and Amazon-670K (0.6, 2.6).
    for name in ["bibtex", "delicious", "eurlex-4k", "amazoncat-13k", "wiki10-31k", "emotions"]:
        info = datasets.get_info(name)
        assert (info.propensity_a, info.propensity_b) == (0.55, 1.5)
    for name, constants in (("amazon-670k", (0.6, 2.6)), ("wikilshtc-325k", (0.5, 0.4))):
        info = datasets.get_info(name)
        assert (info.propensity_a, info.propensity_b) == constants


def test_to_dict_is_plain():
    out = datasets.get_info("emotions").to_dict()
    assert out["name"] == "emotions" and out["files"][0]["name"] == "train.txt"
    assert all(isinstance(f["sha256"], str) for f in out["files"])


# --------------------------------------------------------------------------------------------------
# the catalogue file
# --------------------------------------------------------------------------------------------------
def _catalogue_document() -> dict:
    import json
    from importlib import resources

    return json.loads(resources.files("bayesmlc.data").joinpath("catalogue.json").read_text(encoding="utf-8"))


def test_catalogue_entries_hold_the_published_values():
    """A few whole records, written out by hand from the XC repository's table, Mulan's page,
    Jain et al. 2016 and the SOURCE.md files of the staged copies."""
    jain = "Jain, Prabhu, Varma, KDD 2016 (propensity model); pyxclib and napkinXC defaults"
    xc = "http://manikvarma.org/downloads/XC/XMLRepository.html"
    mulan_commit = "GitHub tsoumakas/mulan commit 43f6389095ad71984264db4387a8074b22bc7d4a"
    expected = {
        "emotions": registry.DatasetInfo(
            name="emotions", title="emotions", n_train=391, n_test=202, n_features=72, n_labels=6,
            labels_per_row=1.869, feature_kind="dense real (audio)", split="Mulan split",
            source=f"Trohidis et al., ISMIR 2008; {mulan_commit}, converted from ARFF to XC text",
            source_url="http://mulan.sourceforge.net/datasets-mlc.html", propensity_a=0.55, propensity_b=1.5,
            propensity_source=jain,
            files=(
                registry.DataFile("train.txt", 325285,
                                  "bdb9bc594b734acabe883c781992622092a2c0187f83937a188a0e4f4ec737ea"),
                registry.DataFile("test.txt", 168157,
                                  "5d90df163fc4fa52617bfe2e69738f653e525ed6c089f50308546e6640a46621"),
                registry.DataFile("labels.txt", 83,
                                  "ee43ed1fa61facf798eff078883ee3ec4bb101747e3578d9cdd52ce437312a92", required=False),
                registry.DataFile("features.txt", 2031,
                                  "dae5fbc56e516ea730c2e5fe1de7ca8c84ef17dca10ea6b10ec35070a1e89773", required=False),
            ),
        ),
        "amazon-670k": registry.DatasetInfo(
            name="amazon-670k", title="Amazon-670K", n_train=490449, n_test=153025, n_features=135909,
            n_labels=670091, labels_per_row=5.45, feature_kind="sparse tf-idf (bag of words)",
            split="XC repository split", source="McAuley, Leskovec, RecSys 2013 (Amazon co-purchases)",
            source_url=xc, propensity_a=0.6, propensity_b=2.6, propensity_source=jain,
            train_names=("train.txt", "amazon_train.txt"), test_names=("test.txt", "amazon_test.txt"),
            aliases=("amazon670k",),
        ),
        "corel5k": registry.DatasetInfo(
            name="corel5k", title="Corel5k", n_train=4500, n_test=500, n_features=499, n_labels=374,
            labels_per_row=3.522, feature_kind="sparse binary (image blobs)", split="Mulan split",
            source="Duygulu et al., ECCV 2002", source_url="http://mulan.sourceforge.net/datasets-mlc.html",
        ),
    }
    for name, info in expected.items():
        assert registry.REGISTRY[name] == info
        assert registry.REGISTRY[name].aliases == info.aliases  # compare=True, but say it
    xc_test = registry.REGISTRY["bibtex_xc"].files[1]
    assert (xc_test.name, xc_test.size, xc_test.required) == ("test.txt", 2335600, True)
    assert xc_test.url == ("https://raw.githubusercontent.com/aresPanos/mlgpf/"
                           "54961660a62fd449b99848015d5ca020defd9412/data/bibtex/test.txt")
    assert registry.REGISTRY["bibtex"].files[2:] == registry.REGISTRY["bibtex_xc"].files[2:]  # shared name files
    assert registry.REGISTRY["wikilshtc-325k"].aliases == ("wikilshtc",)
    assert registry.get_info("rcv1x").test_names == ("test.txt", "rcv1x_test.txt")


def test_every_catalogue_record_validates():
    import dataclasses

    document = _catalogue_document()
    assert (document["format"], document["format_version"]) == ("bayesmlc-dataset-catalogue", 1)
    info_fields = {f.name: f for f in dataclasses.fields(registry.DatasetInfo)}
    file_fields = {f.name for f in dataclasses.fields(registry.DataFile)}
    required = {name for name, f in info_fields.items()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    names, aliases = [], []
    for record in document["datasets"]:
        assert required <= set(record) <= set(info_fields), record.get("name")
        assert record["name"] == record["name"].strip().lower()
        for key in ("n_train", "n_test", "n_features", "n_labels"):
            assert type(record[key]) is int and record[key] > 0, (record["name"], key)
        for key in ("labels_per_row", "propensity_a", "propensity_b"):
            if key in record:
                assert type(record[key]) is float, (record["name"], key)
        assert 1.0 <= record["labels_per_row"] <= record["n_labels"]
        for key in ("title", "feature_kind", "split", "source", "source_url", "propensity_source", "notes"):
            if key in record:
                assert isinstance(record[key], str) and record[key].strip() == record[key], (record["name"], key)
        assert record["source_url"].startswith("http")
        for key in ("train_names", "test_names", "aliases"):
            value = record.get(key, [])
            assert isinstance(value, list) and all(isinstance(v, str) and v for v in value), (record["name"], key)
        file_names = []
        for entry in record.get("files", []):
            assert {"name", "size", "sha256"} <= set(entry) <= file_fields, (record["name"], entry)
            assert type(entry["size"]) is int and entry["size"] > 0
            assert len(entry["sha256"]) == 64 and set(entry["sha256"]) <= set("0123456789abcdef")
            assert entry.get("url") is None or entry["url"].startswith("https://")
            assert type(entry.get("required", True)) is bool
            file_names.append(entry["name"])
        if file_names:  # a downloadable set has both splits, under load()'s first names
            info = registry.REGISTRY[record["name"]]
            assert info.train_names[0] in file_names and info.test_names[0] in file_names
        assert len(set(file_names)) == len(file_names)
        names.append(record["name"])
        aliases.extend(record.get("aliases", []))
    assert names == registry.list_datasets()  # file order is registry order, nothing dropped
    assert len(set(names + aliases)) == len(names) + len(aliases)


def test_catalogue_ships_as_package_data():
    import tomllib

    pyproject = tomllib.loads((Path(registry.__file__).parents[2] / "pyproject.toml").read_text())
    assert "catalogue.json" in pyproject["tool"]["setuptools"]["package-data"]["bayesmlc.data"]
    assert registry.CATALOGUE_FILE == "catalogue.json"
    assert (Path(registry.__file__).parent / "catalogue.json").is_file()


def test_a_malformed_catalogue_record_is_named(monkeypatch, tmp_path):
    import json
    from importlib import resources

    document = _catalogue_document()
    document["datasets"][3]["n_rows"] = 1
    (tmp_path / "catalogue.json").write_text(json.dumps(document))
    monkeypatch.setattr(resources, "files", lambda package: tmp_path)
    with pytest.raises(ValueError, match="record 'mediamill'.*n_rows"):
        registry._read_catalogue()
    document["format_version"] = 2
    (tmp_path / "catalogue.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match="version 1"):
        registry._read_catalogue()


@pytest.mark.parametrize("name", STAGED)
def test_recorded_files_match_the_shared_copies(name):
    folder = shared_dataset_dir(name)
    info = datasets.get_info(name)
    assert {f.name for f in info.files} == {"train.txt", "test.txt", "labels.txt", "features.txt"}
    for entry in info.files:
        path = folder / entry.name
        assert path.stat().st_size == entry.size, entry.name
        assert _sha256(path) == entry.sha256, entry.name
    # The header of each split file carries the published shape.
    for split, rows in (("train", info.n_train), ("test", info.n_test)):
        header = (folder / f"{split}.txt").open().readline().split()
        assert [int(v) for v in header] == [rows, info.n_features, info.n_labels]


# --------------------------------------------------------------------------------------------------
# load
# --------------------------------------------------------------------------------------------------
def test_load_from_a_folder_matches_an_independent_reader():
    folder = shared_dataset_dir("emotions")
    train, test = datasets.load("emotions", split="both", path=folder)
    X, Y = _read_xc_by_hand(folder / "train.txt")
    np.testing.assert_allclose(train.X.toarray(), X, rtol=1e-6)
    np.testing.assert_array_equal(train.Y.toarray(), Y)
    assert (test.n_samples, test.n_features, test.n_labels) == (202, 72, 6)
    assert train.label_names[0] == (folder / "labels.txt").read_text().splitlines()[0]
    assert train.source["dataset"] == "emotions" and train.source["split"] == "train"
    assert test.source["split"] == "test"


def test_load_from_the_cache_folder(tmp_path, monkeypatch):
    folder = shared_dataset_dir("medical")
    target = tmp_path / "medical"
    target.mkdir()
    shutil.copy(folder / "test.txt", target / "test.txt")
    test = datasets.load("medical", split="test", data_home=tmp_path)
    assert (test.n_samples, test.n_features, test.n_labels) == (645, 1449, 45)
    # BAYESMLC_DATA is the default cache folder.
    monkeypatch.setenv("BAYESMLC_DATA", str(tmp_path))
    assert datasets.load("medical", split="test").n_samples == 645
    assert registry.data_home() == tmp_path


def test_load_a_single_file():
    path = shared_dataset_dir("bibtex_xc") / "test.txt"
    test = datasets.load("bibtex_xc", split="test", path=path)
    assert (test.n_samples, test.n_features, test.n_labels) == (2515, 1836, 159)
    with pytest.raises(ValidationError, match="split='both'"):
        datasets.load("bibtex_xc", split="both", path=path)


def test_load_accepts_the_xc_repository_file_names(tmp_path):
    folder = shared_dataset_dir("emotions")
    shutil.copy(folder / "train.txt", tmp_path / "eurlex_train.txt")
    with pytest.warns(UserWarning, match="differs from the published EURLex-4K"):
        ds = datasets.load("eurlex-4k", path=tmp_path)
    assert ds.n_samples == 391


def test_load_warns_about_a_file_that_differs_from_the_registry(tmp_path):
    folder = shared_dataset_dir("emotions")
    lines = (folder / "test.txt").read_text().splitlines(keepends=True)
    (tmp_path / "test.txt").write_text("".join(lines[:1] + lines[2:3] + lines[2:]))  # row 1 replaced by row 2
    with pytest.warns(UserWarning, match="sha256"):
        datasets.load("emotions", split="test", path=tmp_path)


def test_missing_files_give_a_clear_error(tmp_path):
    with pytest.raises(datasets.DatasetNotFoundError) as info:
        datasets.load("eurlex-4k", data_home=tmp_path)
    message = str(info.value)
    assert str(tmp_path / "eurlex-4k" / "train.txt") in message
    assert "eurlex_train.txt" in message
    assert registry.XC_REPOSITORY_URL in message
    with pytest.raises(datasets.DatasetNotFoundError, match=r"download\('emotions'\)"):
        datasets.load("emotions", split="test", data_home=tmp_path)
    with pytest.raises(datasets.DatasetNotFoundError, match="mulan"):
        datasets.load("corel5k", data_home=tmp_path)
    with pytest.raises(ValidationError, match="split"):
        datasets.load("emotions", split="validation", data_home=tmp_path)


# --------------------------------------------------------------------------------------------------
# download
# --------------------------------------------------------------------------------------------------
def test_download_verifies_and_loads(tmp_path, shared_datasets):
    shared_dataset_dir("scene")
    with _Server(shared_datasets / "scene") as server:
        folder = datasets.download("scene", data_home=tmp_path, base_url=server.url + "/", progress=False)
        assert folder == tmp_path / "scene"
        assert sorted(server.requests) == ["/features.txt", "/labels.txt", "/test.txt", "/train.txt"]
        for entry in datasets.get_info("scene").files:
            assert _sha256(folder / entry.name) == entry.sha256
        assert not list(folder.glob(".*.part"))
        train, test = datasets.load("scene", split="both", data_home=tmp_path)
        assert (train.n_samples, train.n_features, train.n_labels) == (1211, 294, 6)
        assert test.n_samples == 1196 and len(train.label_names) == 6

        # Verified files already present are not fetched again; force=True fetches them again.
        server.requests.clear()
        datasets.download("scene", data_home=tmp_path, base_url=server.url, progress=False)
        assert server.requests == []
        datasets.download("scene", data_home=tmp_path, base_url=server.url, progress=False, force=True)
        assert len(server.requests) == 4


def test_corrupted_download_is_rejected(tmp_path):
    source = shared_dataset_dir("emotions")
    served = tmp_path / "served"
    shutil.copytree(source, served)
    data = bytearray((served / "train.txt").read_bytes())
    data[-2] = ord("7") if data[-2] != ord("7") else ord("8")  # same size, one byte changed
    (served / "train.txt").write_bytes(bytes(data))
    bad_sha = hashlib.sha256(bytes(data)).hexdigest()
    good_sha = datasets.get_info("emotions").files[0].sha256
    home = tmp_path / "home"
    with _Server(served) as server:
        with pytest.raises(datasets.DownloadError) as info:
            datasets.download("emotions", data_home=home, base_url=server.url, progress=False)
    message = str(info.value)
    assert "train.txt" in message and bad_sha in message and good_sha in message
    assert not (home / "emotions" / "train.txt").exists()
    assert not list((home / "emotions").glob(".*"))  # the temporary file is gone


def test_truncated_download_is_rejected(tmp_path):
    source = shared_dataset_dir("yeast")
    served = tmp_path / "served"
    shutil.copytree(source, served)
    (served / "test.txt").write_bytes((source / "test.txt").read_bytes()[:1000])
    with _Server(served) as server:
        with pytest.raises(datasets.DownloadError, match="test.txt.*size 1000 bytes, expected 1176022"):
            datasets.download("yeast", data_home=tmp_path / "home", base_url=server.url, progress=False)
    assert not (tmp_path / "home" / "yeast" / "test.txt").exists()
    # A file larger than recorded is cut off as soon as it overflows.
    (served / "test.txt").write_bytes((source / "test.txt").read_bytes() * 2)
    with _Server(served) as server:
        with pytest.raises(datasets.DownloadError, match=r"test.txt.*size \d+\+ bytes, expected 1176022"):
            datasets.download("yeast", data_home=tmp_path / "home", base_url=server.url, progress=False)
    assert not (tmp_path / "home" / "yeast" / "test.txt").exists()


def test_a_stale_local_file_is_replaced(tmp_path):
    source = shared_dataset_dir("medical")
    target = tmp_path / "medical"
    target.mkdir()
    (target / "train.txt").write_text("stale\n")
    with _Server(source) as server:
        with pytest.warns(UserWarning, match="does not match"):
            datasets.download("medical", data_home=tmp_path, base_url=server.url, progress=False)
    assert _sha256(target / "train.txt") == datasets.get_info("medical").files[0].sha256


def test_missing_optional_name_file_is_skipped(tmp_path):
    source = shared_dataset_dir("medical")
    served = tmp_path / "served"
    served.mkdir()
    for name in ("train.txt", "test.txt", "labels.txt"):
        shutil.copy(source / name, served / name)
    with _Server(served) as server:
        with pytest.warns(UserWarning, match="features.txt not found"):
            folder = datasets.download("medical", data_home=tmp_path / "home", base_url=server.url, progress=False)
    assert (folder / "labels.txt").exists() and not (folder / "features.txt").exists()
    # A missing required file is an error.
    (served / "test.txt").unlink()
    with _Server(served) as server:
        with pytest.raises(datasets.DownloadError, match="test.txt.*404"):
            datasets.download("medical", data_home=tmp_path / "other", base_url=server.url, progress=False)


def test_download_without_a_url_says_what_to_do(tmp_path):
    with pytest.raises(datasets.DownloadError, match="(?s)no public URL is known for train.txt.*base_url"):
        datasets.download("emotions", data_home=tmp_path, progress=False)
    with pytest.raises(datasets.DownloadError, match="(?s)no checksummed files.*XMLRepository"):
        datasets.download("amazoncat-13k", data_home=tmp_path, progress=False)
    assert datasets.get_info("bibtex_xc").files[1].url.startswith("https://raw.githubusercontent.com/aresPanos/mlgpf/")


def test_unreachable_server_is_a_download_error(tmp_path):
    with _Server(tmp_path) as server:
        url = server.url
    with pytest.raises(datasets.DownloadError, match="cannot download train.txt"):
        datasets.download("emotions", data_home=tmp_path / "home", base_url=url, progress=False, timeout=5)
