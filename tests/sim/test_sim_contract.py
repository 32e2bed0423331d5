"""The simulator imports the policies, planner, cost and workload modules, never the
shells (agent, operator, gateway, rpc, cli); the import-linter contract says so."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = (
    "tessera_agent",
    "tessera_operator",
    "tessera.gateway",
    "tessera.rpc",
    "tessera.cli",
    "torch",
    "grpc",
    "kopf",
)


def test_contract_is_declared() -> None:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = doc["tool"]["importlinter"]["contracts"]
    sim = [
        c
        for c in contracts
        if "tessera.sim" in c.get("source_modules", []) and c["type"] == "forbidden"
    ]
    assert sim, "no forbidden contract covers tessera.sim"
    forbidden = set().union(*(set(c["forbidden_modules"]) for c in sim))
    assert set(FORBIDDEN) <= forbidden
    assert any(c.get("allow_indirect_imports") is False for c in sim)


def test_sim_and_policies_import_no_shell() -> None:
    for folder in ("src/tessera/sim", "src/tessera/policies"):
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                for name in names:
                    assert not name.startswith(FORBIDDEN), f"{path.name} imports {name}"


def test_gateway_router_is_the_policy() -> None:
    from tessera.gateway import router
    from tessera.policies.routing import shares as routing

    assert router.Router is routing.Router
