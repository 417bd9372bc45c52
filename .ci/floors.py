"""Print the pip requirements that pin every runtime dependency of pyproject.toml to its lower bound
(``numpy>=2.0`` -> ``numpy==2.0.0``), one per line, leaving out those named with ``--except``.

.ci/run installs them into a virtual environment that sees the system's packages, so that the test
suite runs against the oldest versions the project supports (docs/dependencies.md). Usage::

    python .ci/floors.py --except torch
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
#: "name>=X.Y" (optionally followed by further constraints, which a floor pin ignores)
LOWER_BOUND = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)\s*(?:,.*)?$")


def floor_pins(dependencies, excluded) -> list[str]:
    """``name==version`` for each ``name>=version`` of ``dependencies`` not in ``excluded``; a
    dependency without a lower bound is an error (it has no floor to test)."""
    pins = []
    for requirement in dependencies:
        match = LOWER_BOUND.match(requirement)
        if match is None:
            raise SystemExit(f"{PYPROJECT}: dependency {requirement!r} has no '>=' lower bound to test")
        name, version = match.groups()
        if name.lower() not in excluded:
            pins.append(f"{name}=={version}")
    return pins


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--except", dest="excluded", nargs="*", default=[], metavar="NAME",
                        help="dependencies to leave out (tested at the installed version)")
    args = parser.parse_args(argv)
    with open(PYPROJECT, "rb") as handle:
        dependencies = tomllib.load(handle)["project"]["dependencies"]
    print("\n".join(floor_pins(dependencies, {name.lower() for name in args.excluded})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
