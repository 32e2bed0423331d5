"""Module docstrings say role, inputs and caller in about ten lines (issue 36): at most
`MAX_LINES`; history and measurements belong in docs/ and commits.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("src", "agent", "operator")
MAX_LINES = 15


def _lines(path: Path) -> int:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
    return doc.count("\n") + 1 if doc else 0


def test_module_docstrings_are_short() -> None:
    long = {
        str(path.relative_to(ROOT))
        for tree in TREES
        for path in (ROOT / tree).rglob("*.py")
        if "rpc/v1" not in path.as_posix() and _lines(path) > MAX_LINES
    }
    assert long == set(), "cut the docstring to role, inputs and caller"
