"""The control-plane image's dependencies: roots in requirements/control-plane.in, pins in the lock.

The control-plane image installs the project with `pip install --no-deps` over
requirements/control-plane.lock (hashed, written by `make lock`), so that list must be
closed: every requirement of every listed distribution (markers evaluated, no extras) is
listed too, except the distributions requirements/control-plane.overrides removes (and what
only they pull in). `closure()` computes that set from the installed metadata of the .venv
(the same wheels the tests run against). Callers: tests/image/test_control_plane_imports.py
(checks the committed lock) and tests/image/image_check.py.
"""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

from tests.install import locks

ROOT = locks.ROOT
ROOTS_FILE = ROOT / "requirements" / "control-plane.in"
OVERRIDES_FILE = ROOT / "requirements" / "control-plane.overrides"
PINS_FILE = locks.CONTROL_PLANE_LOCK
# Never in the control-plane image: the model runtime and what only it pulls in.
FORBIDDEN = ("torch", "transformers", "triton", "nvidia-")


def _names(path: Path) -> list[str]:
    """Requirement lines of a requirements file, comments and blanks dropped."""
    lines = (ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines())
    return [ln for ln in lines if ln]


def roots() -> list[NormalizedName]:
    return [canonicalize_name(Requirement(ln).name) for ln in _names(ROOTS_FILE)]


def excluded() -> set[NormalizedName]:
    """Distributions left out on purpose (the overrides), with their own dependencies."""
    return {canonicalize_name(Requirement(ln).name) for ln in _names(OVERRIDES_FILE)}


def pins() -> dict[NormalizedName, str]:
    """The committed pins: normalized name -> exact version."""
    return {canonicalize_name(n): v for n, v in locks.pins(PINS_FILE).items()}


def requires(dist: str) -> list[NormalizedName]:
    """Names an installed distribution requires on this platform, without extras."""
    found = []
    for raw in md.distribution(dist).requires or []:
        req = Requirement(raw)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            found.append(canonicalize_name(req.name))
    return found


def closure(
    start: list[NormalizedName], skip: set[NormalizedName] | None = None
) -> dict[NormalizedName, str]:
    """Every distribution `start` needs, transitively, with its installed version; the
    names in `skip` are not followed."""
    seen: dict[NormalizedName, str] = {}
    stack = list(start)
    while stack:
        name = stack.pop()
        if name not in seen and name not in (skip or set()):
            seen[name] = md.version(name)
            stack.extend(requires(name))
    return dict(sorted(seen.items()))
