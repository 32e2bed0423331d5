"""The hash-locked installs (issue 28): what requirements/*.lock pin, and whether they are fresh.

pyproject.toml is the only place version ranges are declared; `make lock` (uv) resolves them
into three locks with hashes: `dev.lock` (tests and development: everything, torch's CPU
wheel included), `agent.lock` (the agent image) and `control-plane.lock` (the operator and
gateway image), the latter two constrained to the dev lock's versions so that the images hold
exactly what the tests ran against. `make lock` ends with `--write-stamp`, which records a
fingerprint of pyproject.toml's dependency declarations in `requirements/locks.stamp`; the
tests in tests/install/test_locks.py compare it with pyproject.toml, so a range edited
without `make lock` fails with the command to run. Callers: the Makefile, those tests,
tests/image (the control-plane pins).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REQ = ROOT / "requirements"
DEV_LOCK = REQ / "dev.lock"
AGENT_LOCK = REQ / "agent.lock"
CONTROL_PLANE_LOCK = REQ / "control-plane.lock"
LOCKS = (DEV_LOCK, AGENT_LOCK, CONTROL_PLANE_LOCK)
STAMP = REQ / "locks.stamp"
FIX = "run `make lock`, then `make test` (docs/dependencies.md)"

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)")
_HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> dict[str, list[str]]:
    """The dependency declarations the locks are made from (runtime, the dev extra, the
    control-plane roots and overrides), as sorted lists of lines."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]

    def lines(path: Path) -> list[str]:
        raw = (ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines())
        return sorted(ln for ln in raw if ln)

    return {
        "dependencies": sorted(project["dependencies"]),
        "dev": sorted(project["optional-dependencies"]["dev"]),
        "control-plane.in": lines(REQ / "control-plane.in"),
        "control-plane.overrides": lines(REQ / "control-plane.overrides"),
    }


def fingerprint() -> str:
    text = json.dumps(declared(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def pins(lock: Path) -> dict[str, str]:
    """Canonical name -> exact version of every requirement in a lock (each must be `==`)."""
    out: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        match = _PIN.match(line)
        if match:
            out[canonical(match.group(1))] = match.group(3)
    return out


def unhashed(lock: Path) -> list[str]:
    """Requirements of a lock that carry no sha256 hash (pip --require-hashes refuses them)."""
    blocks: list[tuple[str, str]] = []
    for line in lock.read_text().splitlines():
        if _PIN.match(line):
            blocks.append((line.split()[0], ""))
        elif blocks and line.startswith(" "):
            blocks[-1] = (blocks[-1][0], blocks[-1][1] + line)
    return [name for name, rest in blocks if not _HASH.search(rest)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-stamp", action="store_true", help=f"rewrite {STAMP.name}")
    args = parser.parse_args(argv)
    stamp = "# written by `make lock`: sha256 of pyproject.toml's dependency declarations\n"
    stamp += fingerprint() + "\n"
    if args.write_stamp:
        STAMP.write_text(stamp)
    else:
        sys.stdout.write(stamp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
