"""The import graph has no cycle, counting imports under `if TYPE_CHECKING:` (issue 30).

A cycle makes module order matter and layers meaningless; one closed only through
`TYPE_CHECKING` imports still ties the modules together for readers and type checkers.
The graph is grimp's (the one import-linter checks the layers contract on), over
tessera, tessera_agent and tessera_operator; the test lists every strongly connected
set of modules. Run by `make lint` and the suite.

A module that needs a type from a module above it declares what it needs as a `Protocol`
of its own (as `attention.PackedRows`, `packed_linear.Stage` and
`compile_policy.DecodeGraph` do) rather than importing it under `TYPE_CHECKING`.
"""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

PACKAGES = ("tessera", "tessera_agent", "tessera_operator")


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    m = stack.pop()
                    on.discard(m)
                    members.append(m)
                    if m == node:
                        break
                if len(members) > 1:
                    out.append(sorted(members))
    return out


def test_no_import_cycle() -> None:
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False)
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_a_cycle_is_found() -> None:
    graph = grimp.ImportGraph()
    for m in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(m)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.x")
    graph.add_import(importer="a.y", imported="a.z")
    assert cycles(graph) == [["a.x", "a.y"]]


def test_a_type_checking_cycle_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cycle closed only under `if TYPE_CHECKING:` counts, as in the graph above."""
    pkg = tmp_path / "tc_cycle_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tc_cycle_pkg import high\n"
    )
    (pkg / "high.py").write_text("from tc_cycle_pkg import low\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("tc_cycle_pkg", exclude_type_checking_imports=False, cache_dir=None)
    assert cycles(graph) == [["tc_cycle_pkg.high", "tc_cycle_pkg.low"]]
