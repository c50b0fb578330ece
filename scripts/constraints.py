"""constraints.txt: the exact version of every package that gpushare-k8s and its extras install.

    python scripts/constraints.py           write constraints.txt from the running environment
    python scripts/constraints.py --check   name every difference between the two; exit 1 if any

The Makefile's installs (`make`, CI's `make test`) and the image's (Dockerfile) pass the file to
pip as ``--constraint``: they install these versions and no other. ``make constraints`` moves
them: it upgrades .venv to the newest versions pyproject.toml's ranges allow and runs this script
to write what it installed; the tests then run on exactly that set, and the two files are
committed together. ``make test`` runs ``--check`` (tests/test_constraints.py), which fails when
pyproject.toml names a package constraints.txt does not pin, or a range the pin is outside, or
when the environment is not the pinned set.

The set is what pyproject.toml's dependencies and the extras of ``EXTRAS`` require, followed
through each installed distribution's own requirements (environment markers evaluated for this
interpreter): a package the environment holds for another reason (installed by hand, left behind
by a dropped dependency, the ``bench`` extra's profilers) gets no pin. The pins are resolved on
the interpreter the script runs on (Python 3.11, as in the image).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
CONSTRAINTS = ROOT / "constraints.txt"
EXTRAS = ("sim", "test")
"""The extras the Makefile installs (``pip install -e '.[sim,test]'``); the image installs none."""

HEADER = """\
# The exact versions that `make` (CI included) and the image install: pip --constraint.
# Written by `make constraints` (scripts/constraints.py) from the environment the tests ran on;
# do not edit by hand. Every package that pyproject.toml's dependencies and its extras
# ({extras}) install on Python {python}.
"""


def roots(pyproject: Path = PYPROJECT) -> list[Requirement]:
    """pyproject.toml's dependencies and those of ``EXTRAS``, markers evaluated here."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    texts = list(project["dependencies"])
    for extra in EXTRAS:
        texts += project["optional-dependencies"][extra]
    return [r for r in map(Requirement, texts) if _applies(r, ())]


def _applies(requirement: Requirement, extras: Iterable[str]) -> bool:
    """Whether ``requirement`` holds on this interpreter for a dependent installed with
    ``extras``."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": e}) for e in ("", *extras))


def closure(start: Iterable[Requirement]) -> tuple[dict[str, metadata.Distribution], set[str]]:
    """The installed distributions that ``start`` needs, by canonical name, and the names of
    those needed but not installed."""
    found: dict[str, metadata.Distribution] = {}
    missing: set[str] = set()
    extras_seen: dict[str, set[str]] = {}
    queue = list(start)
    while queue:
        requirement = queue.pop()
        name = canonicalize_name(requirement.name)
        extras = set(requirement.extras)
        if name in found and extras <= extras_seen[name]:
            continue
        try:
            dist = found.get(name) or metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            missing.add(name)
            continue
        found[name] = dist
        extras_seen[name] = extras_seen.get(name, set()) | extras
        for text in dist.requires or ():
            needed = Requirement(text)
            if _applies(needed, extras_seen[name]):
                queue.append(needed)
    return found, missing


def render(dists: dict[str, metadata.Distribution]) -> str:
    """constraints.txt's text for ``dists``."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    lines = [HEADER.format(extras=", ".join(EXTRAS), python=python)]
    lines += [f"{dists[n].metadata['Name']}=={dists[n].version}\n" for n in sorted(dists)]
    return "".join(lines)


def read_pins(path: Path = CONSTRAINTS) -> dict[str, str]:
    """constraints.txt's ``name==version`` lines, by canonical name."""
    pins: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def problems(pins: dict[str, str]) -> list[str]:
    """Every way the pins, pyproject.toml and the running environment disagree."""
    found: list[str] = []
    wanted = roots()
    for requirement in wanted:
        pinned = pins.get(canonicalize_name(requirement.name))
        if pinned is None:
            found.append(f"pyproject.toml requires {requirement}; constraints.txt pins no version")
        elif not requirement.specifier.contains(pinned, prereleases=True):
            found.append(f"pyproject.toml requires {requirement}; constraints.txt pins {pinned}")
    dists, missing = closure(wanted)
    for name in sorted(missing - pins.keys()):
        found.append(f"{name} is required, not installed and not pinned")
    for name, dist in sorted(dists.items()):
        if name not in pins:
            found.append(f"{name} {dist.version} is installed and required but not pinned")
        elif pins[name] != dist.version:
            found.append(f"{name} {dist.version} is installed, constraints.txt pins {pins[name]}")
    if not missing:
        found += [f"{name}=={pins[name]} is pinned but nothing requires it" for name in
                  sorted(pins.keys() - dists.keys())]  # fmt: skip
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--check", action="store_true", help="compare instead of writing; exit 1 on a difference"
    )
    args = parser.parse_args(argv)
    if args.check:
        found = problems(read_pins())
        for problem in found:
            print(f"constraints.txt: {problem}", file=sys.stderr)
        if found:
            print("constraints.txt: `make` installs the pins; `make constraints` moves them",
                  file=sys.stderr)  # fmt: skip
        return 1 if found else 0
    dists, missing = closure(roots())
    if missing:
        print(f"not installed: {', '.join(sorted(missing))} (make constraints installs them)",
              file=sys.stderr)  # fmt: skip
        return 1
    CONSTRAINTS.write_text(render(dists), encoding="utf-8")
    print(f"{CONSTRAINTS.relative_to(ROOT)}: {len(dists)} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
