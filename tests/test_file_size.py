"""Modules stay under `MAX_LINES` lines (issue 36): a file past it is split by concept,
not trimmed to fit. Generated gRPC stubs (`*_pb2*.py`) are not counted.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("src", "agent", "operator")
MAX_LINES = 400


def _modules() -> dict[str, int]:
    return {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for tree in TREES
        for path in (ROOT / tree).rglob("*.py")
        if "_pb2" not in path.name
    }


def test_modules_are_short() -> None:
    long = {p: n for p, n in _modules().items() if n > MAX_LINES}
    assert long == {}, f"split by concept: over {MAX_LINES} lines"
