"""Who may call which agent RPC, and which checkpoint paths a load may name (pure).

Inputs: the RPC's method name, the caller's role (the Organizational Unit of its client
certificate, or `None` on a plaintext loopback deployment) and, for loads, the path and the
agent's model root. Called by the agent's authorization interceptor (`tessera_agent.authz`).
Roles get what they need, nothing more: `operator` places blocks and observes agents (and moves
KV for its overload driver); `gateway` runs requests and moves KV within its own deployment
(`policies.security.tenancy` checks its URI SAN); `agent` peers stream stages and copy blocks;
`admin` (a person's tools) may do everything. So weights are readable by agents only, KV by
gateways and the operator. Every new agent RPC needs a rule here; the table is in
docs/security.md.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

OPERATOR = "operator"
GATEWAY = "gateway"
AGENT = "agent"
ADMIN = "admin"
ROLES = frozenset({OPERATOR, GATEWAY, AGENT, ADMIN})

_ANY = frozenset({OPERATOR, GATEWAY, AGENT, ADMIN})
_KV = frozenset({GATEWAY, ADMIN})

# Methods of tessera.rpc.v1.Agent and grpc.health.v1.Health; absent means refused.
METHOD_ROLES: dict[str, frozenset[str]] = {
    "Describe": _ANY,
    "ListBlocks": _ANY,
    "Check": _ANY,
    "Watch": _ANY,
    "LoadBlock": frozenset({OPERATOR, ADMIN}),
    "UnloadBlock": frozenset({OPERATOR, ADMIN}),
    "Profile": frozenset({OPERATOR, ADMIN}),
    "StageStream": frozenset({AGENT, ADMIN}),
    "FetchTensors": frozenset({AGENT, ADMIN}),
    "PushTensors": frozenset({AGENT, ADMIN}),  # a block copy over the data plane
    "Generate": frozenset({GATEWAY, ADMIN}),
    "Cancel": frozenset({GATEWAY, ADMIN}),
    "GenerateMux": frozenset({GATEWAY, ADMIN}),  # issue 16: many requests on one stream
    "PinPrefix": _KV,
    "ReservePages": _KV,
    "CommitPrefix": _KV,
    "ReleasePin": _KV,
    # the overload driver's page moves (a drop's K/V between stages) are the operator's
    "ExportKV": _KV | {OPERATOR},
    "ImportKV": _KV | {OPERATOR},
    "VariantAdapters": frozenset({OPERATOR, ADMIN}),  # issue 14: reads adapter folders
    # issue 13: an overload pause/drop/restore changes placement like a load: the
    # operator's (its loop runs in `tessera up`'s control process, never in a gateway)
    "OverloadShift": frozenset({OPERATOR, ADMIN}),
    # issue 15: placing replicated layer runs is the operator's (or a person's) decision;
    # the run itself is served agent to agent (the origin drives its remote holders)
    "ScalingReplicate": frozenset({OPERATOR, ADMIN}),
    "ScalingMigrate": frozenset({OPERATOR, ADMIN}),
    "ScalingEvict": frozenset({OPERATOR, ADMIN}),
    "ScalingBatchLimit": frozenset({OPERATOR, ADMIN}),  # Algorithm 2's batch cut
    "ScalingRunLoad": frozenset({AGENT, ADMIN}),
    "ScalingRunStep": frozenset({AGENT, ADMIN}),
    "ScalingRunExportKV": frozenset({AGENT, ADMIN}),
    "ScalingRunImportKV": frozenset({AGENT, ADMIN}),
    "ScalingRunUnload": frozenset({AGENT, ADMIN}),
    # issue 32: sleeping is the autoscaler's (the operator's) decision; a held request's
    # gateway wakes its own deployment's sleeping replica (tenancy checks the replica)
    "SleepReplica": frozenset({OPERATOR, ADMIN}),
    "WakeReplica": frozenset({OPERATOR, GATEWAY, ADMIN}),
    # issue 32: the operator asks an agent to measure its links; that agent pulls filler
    # from its peers' ProbeSend (agent to agent, as block copies are)
    "ProbeLinks": frozenset({OPERATOR, ADMIN}),
    "ProbeSend": frozenset({AGENT, ADMIN}),
}

# Requests whose `model_path` field names a checkpoint folder the agent will read.
PATH_METHODS = frozenset({"LoadBlock", "Profile", "ScalingRunLoad"})
# Requests whose `adapters[].path` fields name folders the agent will read (issue 14).
ADAPTER_PATH_METHODS = frozenset({"VariantAdapters"})


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""  # why not, for the gRPC status message


ALLOW = Decision(True)


def method_name(full_method: str) -> str:
    """`/tessera.rpc.v1.Agent/LoadBlock` -> `LoadBlock`."""
    return full_method.rsplit("/", 1)[-1]


def authorize(method: str, role: str | None) -> Decision:
    """May a caller of `role` call `method`? `None`: unauthenticated loopback mode (all)."""
    if role is None:
        return ALLOW
    allowed = METHOD_ROLES.get(method)
    if allowed is None:
        return Decision(False, f"{method} is not open to any role")
    if role not in allowed:
        return Decision(
            False,
            f"role {role!r} may not call {method} (allowed: {', '.join(sorted(allowed))})",
        )
    return ALLOW


def check_model_path(path: str, resolved: str, model_root: str | None) -> Decision:
    """Is a load of `path` (which resolves, links followed, to `resolved`) inside the root?

    The caller resolves symbolic links (I/O); this only compares normalised absolute paths,
    so `..` and links cannot leave the root."""
    if not model_root:
        return ALLOW
    root = posixpath.normpath(model_root)
    target = posixpath.normpath(resolved)
    if not posixpath.isabs(target):
        return Decision(False, f"model_path {path!r} must be an absolute path under {root}")
    if target != root and not target.startswith(root.rstrip("/") + "/"):
        return Decision(False, f"model_path {path!r} is outside the model root {root}")
    return ALLOW
