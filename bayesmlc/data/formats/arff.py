"""Mulan / MEKA multi-label ARFF, dense and sparse.

::

    @relation 'tiny: -C -2'
    @attribute f0 numeric
    @attribute 'word two' {0,1}
    @attribute happy {0,1}
    @attribute sad {0,1}
    @data
    0.5,1,1,0
    {0 2.5,2 1,3 1}

Which attributes are labels, in order of precedence:

1. the Mulan XML file (``<labels><label name="..."/>...</labels>``), given as ``label_names_file``
   or found next to the ARFF file with the same stem (``emotions-train.arff`` -> ``emotions.xml``
   or ``emotions-train.xml``);
2. ``n_labels``: the last ``n_labels`` attributes (the Mulan convention);
3. MEKA's ``-C n`` option in the relation name: the first ``n`` attributes, or the last ``|n|``
   when ``n`` is negative.

Label attributes are nominal ``{0,1}`` (or numeric holding 0/1); a missing label value ``?`` is an
unobserved entry of :attr:`Dataset.label_mask`. Feature attributes are numeric, or nominal with
numeric categories (Mulan writes binary word features as ``{0,1}``); a value is its number. String,
date and relational attributes, and missing feature values, are errors.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp

from ...exceptions import DataFormatError
from ..dataset import Dataset

__all__ = ["read_arff", "write_arff", "read_mulan_xml", "find_mulan_xml"]

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_MEKA_C = re.compile(r"(?:^|\s)-C\s+(-?\d+)")


@dataclass
class _Attribute:
    name: str
    kind: str  # "numeric" or "nominal"
    categories: Optional[List[str]] = None
    line: int = 0


def _unquote(token: str) -> str:
    token = token.strip()
    if len(token) >= 2 and token[0] == token[-1] and token[0] in "'\"":
        body = token[1:-1]
        return re.sub(r"\\(.)", r"\1", body)
    return token


def _split_values(text: str, path, line_no: int) -> List[str]:
    """Split comma-separated ARFF values, honouring single and double quotes."""
    if "'" not in text and '"' not in text:
        return [part.strip() for part in text.split(",")]
    values, current, quote, escaped = [], [], None, False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\" and quote:
            current.append(char)
            escaped = True
        elif quote:
            current.append(char)
            if char == quote:
                quote = None
        elif char in "'\"":
            current.append(char)
            quote = char
        elif char == ",":
            values.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if quote:
        raise DataFormatError(f"unterminated quote {quote} in {text[:60]!r}", path=path, line=line_no)
    values.append("".join(current).strip())
    return values


def _parse_attribute(rest: str, path, line_no: int) -> _Attribute:
    rest = rest.strip()
    if rest[:1] in ("'", '"'):
        quote = rest[0]
        at = 1
        while at < len(rest) and (rest[at] != quote or rest[at - 1] == "\\"):
            at += 1
        if at >= len(rest):
            raise DataFormatError(f"unterminated quoted attribute name in {rest[:60]!r}", path=path, line=line_no)
        name, type_text = _unquote(rest[: at + 1]), rest[at + 1:].strip()
    else:
        match = re.match(r"([^\s{]+)\s*(.*)$", rest)
        if match is None:
            raise DataFormatError("@attribute without a name", path=path, line=line_no)
        name, type_text = match.group(1), match.group(2).strip()
    lowered = type_text.lower()
    if lowered in ("numeric", "real", "integer"):
        return _Attribute(name, "numeric", line=line_no)
    if type_text.startswith("{"):
        if not type_text.endswith("}"):
            raise DataFormatError(f"attribute {name!r}: nominal list {type_text[:60]!r} does not end with '}}'",
                                  path=path, line=line_no)
        categories = [_unquote(v) for v in _split_values(type_text[1:-1], path, line_no)]
        return _Attribute(name, "nominal", categories, line=line_no)
    if not type_text:
        raise DataFormatError(f"attribute {name!r} has no type", path=path, line=line_no)
    raise DataFormatError(
        f"attribute {name!r} has type {type_text.split()[0]!r}: only numeric and nominal attributes are supported",
        path=path, line=line_no,
    )


def read_mulan_xml(path) -> List[str]:
    """Label names, in document order, from a Mulan XML labels file (nested labels included)."""
    path = Path(path)
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as exc:
        raise DataFormatError(f"not a valid Mulan labels XML file: {exc}", path=path, line=exc.position[0]) from None
    except OSError as exc:
        raise DataFormatError(f"cannot read the labels XML file: {exc.strerror}", path=path) from None
    names = [element.get("name") for element in root.iter() if element.tag.rsplit("}", 1)[-1] == "label"]
    if not names or any(name is None for name in names):
        raise DataFormatError("expected <labels> with <label name=\"...\"/> elements", path=path)
    return names


def find_mulan_xml(arff_path) -> Optional[Path]:
    """The Mulan XML next to an ARFF file: same stem, or the stem before the last ``-`` (``x-train`` -> ``x``)."""
    arff_path = Path(arff_path)
    stems = [arff_path.stem]
    if "-" in arff_path.stem:
        stems.append(arff_path.stem.rsplit("-", 1)[0])
    for stem in stems:
        candidate = arff_path.with_name(stem + ".xml")
        if candidate.exists():
            return candidate
    return None


def _number(token: str, attribute: _Attribute, path, line_no: int) -> float:
    if attribute.kind == "nominal":
        value = _unquote(token)
        if value not in attribute.categories:
            raise DataFormatError(
                f"value {value!r} of attribute {attribute.name!r} is not one of its categories {attribute.categories}",
                path=path, line=line_no,
            )
        token = value
    try:
        number = float(token)
    except ValueError:
        raise DataFormatError(f"non-numeric value {token[:40]!r} for attribute {attribute.name!r}",
                              path=path, line=line_no) from None
    if not math.isfinite(number) or abs(number) > _FLOAT32_MAX:
        raise DataFormatError(f"value {token[:40]!r} for attribute {attribute.name!r} is NaN, infinite or beyond float32",
                              path=path, line=line_no)
    return number


def _label_positions(attributes: List[_Attribute], relation: str, label_names: Optional[Sequence[str]],
                     n_labels: Optional[int], path, xml_path) -> List[int]:
    names = [a.name for a in attributes]
    if label_names is not None:
        where = {name: i for i, name in enumerate(names)}
        missing = [name for name in label_names if name not in where]
        if missing:
            raise DataFormatError(
                f"labels {missing[:5]} named in {xml_path} are not attributes of the ARFF file", path=path
            )
        if len(set(label_names)) != len(label_names):
            repeated = sorted({name for name in label_names if label_names.count(name) > 1})
            raise DataFormatError(f"labels {repeated[:5]} are named more than once in {xml_path}", path=path)
        return [where[name] for name in label_names]
    if n_labels is not None:
        if not 0 < n_labels < len(attributes):
            raise DataFormatError(f"n_labels={n_labels} but the file has {len(attributes)} attributes", path=path)
        return list(range(len(attributes) - n_labels, len(attributes)))
    match = _MEKA_C.search(relation)
    if match:
        count = int(match.group(1))
        if count == 0 or abs(count) >= len(attributes):
            raise DataFormatError(f"the relation's -C {count} does not fit {len(attributes)} attributes", path=path)
        return list(range(count)) if count > 0 else list(range(len(attributes) + count, len(attributes)))
    raise DataFormatError(
        "cannot tell which attributes are labels: no Mulan .xml next to the file, no n_labels given and no MEKA "
        "'-C n' in the @relation name", path=path,
    )


def _read_header(stream, path) -> Tuple[str, List[_Attribute], int]:
    """The header up to ``@data``: the relation name, the attributes and the line number of ``@data``."""
    attributes: List[_Attribute] = []
    relation = ""
    line_no = 0
    for raw in stream:
        line_no += 1
        line = raw.strip()
        if not line or line.startswith("%"):
            continue
        lowered = line.lower()
        if lowered.startswith("@relation"):
            relation = _unquote(line[len("@relation"):])
        elif lowered.startswith("@attribute"):
            attributes.append(_parse_attribute(line[len("@attribute"):], path, line_no))
        elif lowered.startswith("@data"):
            break
        else:
            raise DataFormatError(f"unexpected header line {line[:60]!r} (expected @relation, @attribute or @data)",
                                  path=path, line=line_no)
    else:
        raise DataFormatError("no @data section", path=path, line=line_no)
    if not attributes:
        raise DataFormatError("no @attribute declarations before @data", path=path, line=line_no)
    return relation, attributes, line_no


def _check_attributes(attributes: List[_Attribute], label_pos: List[int], path) -> None:
    """Unique names, labels nominal {0,1}, and only numeric categories for nominal features."""
    first_line = {}
    for attribute in attributes:
        if attribute.name in first_line:
            raise DataFormatError(f"duplicate attribute name {attribute.name!r} (first declared at line "
                                  f"{first_line[attribute.name]})", path=path, line=attribute.line)
        first_line[attribute.name] = attribute.line
    for pos in label_pos:
        attribute = attributes[pos]
        if attribute.kind == "nominal" and sorted(attribute.categories) != ["0", "1"]:
            raise DataFormatError(
                f"label attribute {attribute.name!r} must be nominal {{0,1}}, has categories {attribute.categories}",
                path=path, line=attribute.line,
            )
    for attribute in attributes:
        if attribute.kind == "nominal":
            for category in attribute.categories:
                try:
                    float(category)
                except ValueError:
                    raise DataFormatError(
                        f"nominal attribute {attribute.name!r} has non-numeric category {category!r}: "
                        "only numeric categories can be read as features", path=path, line=attribute.line,
                    ) from None


def _sparse_row_pairs(line: str, n_attributes: int, path, line_no: int) -> list:
    """The (attribute index, token) pairs of a sparse row ``{i v, j w, ...}``."""
    if not line.endswith("}"):
        raise DataFormatError(f"sparse row {line[:60]!r} does not end with '}}'", path=path, line=line_no)
    body = line[1:-1].strip()
    pairs = []
    seen = set()
    for item in (_split_values(body, path, line_no) if body else []):
        parts = item.split(None, 1)
        if len(parts) != 2 or not (parts[0].isascii() and parts[0].isdigit()):
            raise DataFormatError(f"malformed sparse entry {item[:40]!r}: expected 'index value'",
                                  path=path, line=line_no)
        index = int(parts[0])
        if index >= n_attributes:
            raise DataFormatError(f"attribute index {index} out of range: the header declares "
                                  f"{n_attributes} attributes", path=path, line=line_no)
        if index in seen:
            raise DataFormatError(f"duplicate attribute index {index} in the row", path=path, line=line_no)
        seen.add(index)
        pairs.append((index, parts[1].strip()))
    return pairs


class _Entries:
    """The (row, column, value) triplets of the features, the positive labels and the missing labels."""

    def __init__(self):
        self.x_rows, self.x_cols, self.x_vals = [], [], []
        self.y_rows, self.y_cols, self.missing_rows, self.missing_cols = [], [], [], []

    def add(self, row: int, pairs, attributes: List[_Attribute], column: np.ndarray, path, line_no: int) -> None:
        """Add a row's pairs; ``column[i]`` >= 0 is attribute i's feature column, < 0 its label -(j + 1)."""
        for index, token in pairs:
            target = column[index]
            if token == "?":
                if target >= 0:
                    raise DataFormatError(f"missing value '?' for feature {attributes[index].name!r}: "
                                          "missing features are not supported", path=path, line=line_no)
                self.missing_rows.append(row)
                self.missing_cols.append(int(-target - 1))
                continue
            value = _number(token, attributes[index], path, line_no)
            if target >= 0:
                if value != 0:
                    self.x_rows.append(row)
                    self.x_cols.append(int(target))
                    self.x_vals.append(value)
            elif value not in (0.0, 1.0):
                raise DataFormatError(f"label {attributes[index].name!r} has value {token!r}: labels are 0/1",
                                      path=path, line=line_no)
            elif value == 1.0:
                self.y_rows.append(row)
                self.y_cols.append(int(-target - 1))

    def matrices(self, n_rows: int, n_features: int, n_labels: int):
        """X, Y (CSR float32) and the label mask (``None`` when no label value is missing)."""
        X = sp.csr_matrix((np.asarray(self.x_vals, dtype=np.float32),
                           (np.asarray(self.x_rows, dtype=np.int64), np.asarray(self.x_cols, dtype=np.int64))),
                          shape=(n_rows, n_features))
        Y = sp.csr_matrix((np.ones(len(self.y_rows), dtype=np.float32),
                           (np.asarray(self.y_rows, dtype=np.int64), np.asarray(self.y_cols, dtype=np.int64))),
                          shape=(n_rows, n_labels))
        mask = None
        if self.missing_rows:  # '?' label values are unobserved entries; every other entry is observed
            observed = np.ones(Y.shape, dtype=bool)
            observed[self.missing_rows, self.missing_cols] = False
            mask = sp.csr_matrix(observed, dtype=np.float32)
        return X, Y, mask


def read_arff(path, *, n_labels: Optional[int] = None, label_names_file=None) -> Dataset:
    """Read a Mulan/MEKA multi-label ARFF file (dense or sparse rows) into a :class:`Dataset`."""
    path = Path(path)
    xml_path = Path(label_names_file) if label_names_file is not None else (
        None if n_labels is not None else find_mulan_xml(path))
    label_names = read_mulan_xml(xml_path) if xml_path is not None else None

    # utf-8-sig: a byte-order mark some editors write is skipped, as in the XC and svmlight readers
    with open(path, "r", encoding="utf-8-sig", errors="replace", newline=None) as stream:
        relation, attributes, line_no = _read_header(stream, path)
        label_pos = _label_positions(attributes, relation, label_names, n_labels, path, xml_path)
        _check_attributes(attributes, label_pos, path)
        # column of each attribute: >= 0 feature column, < 0 label column -(j + 1)
        is_label = np.zeros(len(attributes), dtype=bool)
        is_label[label_pos] = True
        column = np.empty(len(attributes), dtype=np.int64)
        column[~is_label] = np.arange(int((~is_label).sum()))
        column[label_pos] = -(np.arange(len(label_pos)) + 1)

        entries = _Entries()
        row = 0
        for raw in stream:
            line_no += 1
            line = raw.strip()
            if not line or line.startswith("%"):
                continue
            if line.startswith("{"):
                pairs = _sparse_row_pairs(line, len(attributes), path, line_no)
            else:
                values = _split_values(line, path, line_no)
                if len(values) != len(attributes):
                    raise DataFormatError(f"row has {len(values)} values, the header declares {len(attributes)} "
                                          "attributes", path=path, line=line_no)
                pairs = list(enumerate(values))
            entries.add(row, pairs, attributes, column, path, line_no)
            row += 1
    X, Y, mask = entries.matrices(row, int((~is_label).sum()), len(label_pos))
    feature_names = [a.name for a, lab in zip(attributes, is_label) if not lab]
    return Dataset(X=X, Y=Y, label_mask=mask, feature_names=feature_names,
                   label_names=[attributes[p].name for p in label_pos],
                   source={"relation": relation} if relation else {})


def _quote(name: str) -> str:
    if name and re.fullmatch(r"[A-Za-z0-9_.\-]+", name) and not name.startswith("@"):
        return name
    return "'" + name.replace("\\", "\\\\").replace("'", "\\'") + "'"


def write_arff(path, dataset: Dataset, *, relation: Optional[str] = None, xml: bool = True) -> Tuple[Path, Optional[Path]]:
    """Write ``dataset`` as a sparse Mulan ARFF file (features numeric, then labels ``{0,1}``).

    With ``xml=True`` the Mulan labels file ``<stem>.xml`` is written beside it. Unobserved label
    entries (``label_mask``) are written as ``?``. Returns the paths written.
    """
    path = Path(path)
    feature_names = list(dataset.feature_names) if dataset.feature_names is not None else [
        f"f{i}" for i in range(dataset.n_features)]
    label_names = list(dataset.label_names) if dataset.label_names is not None else [
        f"label{j}" for j in range(dataset.n_labels)]
    clash = set(feature_names) & set(label_names)
    if clash or len(set(feature_names)) < len(feature_names) or len(set(label_names)) < len(label_names):
        raise DataFormatError(f"attribute names must be unique across features and labels (e.g. {sorted(clash)[:3]})",
                              path=path)
    from .xc import format_values

    D = dataset.n_features
    X, Y = dataset.X, dataset.Y
    mask = dataset.label_mask
    lines = [f"@relation {_quote(relation or path.stem)}", ""]
    lines += [f"@attribute {_quote(n)} numeric" for n in feature_names]
    lines += [f"@attribute {_quote(n)} {{0,1}}" for n in label_names]
    lines += ["", "@data"]
    text = format_values(X.data)
    for i in range(dataset.n_samples):
        lo, hi = X.indptr[i], X.indptr[i + 1]
        entries = [f"{c} {t}" for c, t in zip(X.indices[lo:hi].tolist(), text[lo:hi].tolist())]
        positives = set(Y.indices[Y.indptr[i]: Y.indptr[i + 1]].tolist())
        if mask is None:
            entries += [f"{D + j} 1" for j in sorted(positives)]
        else:
            observed = set(mask.indices[mask.indptr[i]: mask.indptr[i + 1]].tolist())
            for j in range(dataset.n_labels):
                if j not in observed:
                    entries.append(f"{D + j} ?")
                elif j in positives:
                    entries.append(f"{D + j} 1")
        lines.append("{" + ",".join(entries) + "}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    xml_path = None
    if xml:
        xml_path = path.with_suffix(".xml")
        body = "".join(f'  <label name="{_xml_escape(n)}"></label>\n' for n in label_names)
        xml_path.write_text('<?xml version="1.0" encoding="utf-8"?>\n'
                            f'<labels xmlns="http://mulan.sourceforge.net/labels">\n{body}</labels>\n', encoding="utf-8")
    return path, xml_path


def _xml_escape(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;"))
