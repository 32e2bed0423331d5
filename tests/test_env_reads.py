"""Configuration is read at the entry points and passed down (issue 36): only the modules
listed here read the process environment (`os.environ`, `os.getenv`); the others get
what they need from them (`EngineOptions`, `AgentConfig`, `GatewayConfig`, ...). A new
reader fails this test; so does a listed module that stopped reading it (take it off).

`ENTRY_POINTS` may read it: the commands, and the modules that only hand the environment
on to child processes. `NOT_YET_MOVED` still read it below an entry point: debt of issue
36, item 3 (the TLS folder: every gRPC channel and server would take the entry point's
`TlsFiles`), listed so the debt cannot grow unnoticed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("src", "agent", "operator")

ENTRY_POINTS = {
    "src/tessera/cli/agent_cmd.py",  # `tessera agent`: flags, EngineOptions from $TESSERA_*
    "src/tessera/cli/gateway_cmd.py",  # `tessera gateway`
    "src/tessera/cli/operator_cmd.py",  # `tessera operator`
    "src/tessera/cli/up_cmd.py",  # `tessera up`: $TESSERA_GENERATE_MUX for its gateway
    "src/tessera/cli/bench.py",  # `tessera bench`: $TESSERA_TRACE, agents' compile default
    "src/tessera/cli/local_agents.py",  # hands the environment on to agent processes
    "src/tessera/bench/local_up.py",  # hands the environment on to `tessera up`
    "src/tessera/cli/bench_operator_harness.py",  # hands it on to its gateway/operator processes
    "src/tessera/event_loop.py",  # which event loop a process's entry point starts
}
NOT_YET_MOVED = {
    # TESSERA_TLS_DIR, for the default `tls=True` of channel/sync_channel/add_port: the
    # agent passes `AgentConfig.tls` down; the gateway, operator, `up`, CLI and benches not yet
    "src/tessera/rpc/transport.py",
}


def _reads_environment(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "os" and node.attr in ("environ", "getenv", "environb"):
                return True
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(a.name in ("environ", "getenv") for a in node.names):
                return True
    return False


def test_only_entry_points_read_the_environment() -> None:
    readers = {
        str(path.relative_to(ROOT))
        for tree in TREES
        for path in (ROOT / tree).rglob("*.py")
        if _reads_environment(ast.parse(path.read_text(encoding="utf-8")))
    }
    assert readers - ENTRY_POINTS - NOT_YET_MOVED == set(), "read it at an entry point"
    assert (ENTRY_POINTS | NOT_YET_MOVED) - readers == set(), "no longer reads it: unlist"
