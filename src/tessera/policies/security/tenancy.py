"""Which deployment a caller's certificate is bound to, and whether it may touch a replica (pure).

Inputs: the URI SANs of a verified client certificate and the replica id a call names.
Called by the agent's authorization interceptor (`tessera_agent.authz`) for every call that
names a replica, and by `tessera.rpc.pki` and the chart/operator docs to write the URI.

A gateway certificate names its scope in one URI SAN (the SPIFFE form, trust domain
`tessera`): `spiffe://tessera/ns/<namespace>/sd/<deployment>` binds it to one
ServingDeployment, `spiffe://tessera/ns/<namespace>` to every ServingDeployment of a
namespace (what the chart's cert-manager Certificate per namespace carries). A replica's
owner is read from its id, which only the operator (the one role that loads) chooses:
`<namespace>.<deployment>.<name>.g<generation>` (`tessera.blocks.replica_id`). Ids of
another shape are local ones (tests, benches): only a certificate bound to nothing may
name those, and only when they hold no dot, so an id that fails to parse is never open.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tessera import blocks
from tessera.policies.security import access

SCHEME = "spiffe://tessera/"

# Calls that name a replica of a deployment (the field `replica_id`, or the header of an
# ImportKV stream, or each `start` of a GenerateMux stream).
REPLICA_METHODS = frozenset(
    {
        "Generate",
        "GenerateMux",
        "Cancel",
        "PinPrefix",
        "ReservePages",
        "CommitPrefix",
        "ReleasePin",
        "ExportKV",
        "ImportKV",
        "OverloadShift",
        "ScalingBatchLimit",
        "ScalingReplicate",
        "ScalingMigrate",
        "ScalingEvict",
        "VariantAdapters",
        "SleepReplica",
        "WakeReplica",
    }
)
# Roles whose certificates are bound to a deployment; the operator and agents are the
# cluster's own and serve every deployment, `admin` is a person's tool.
BOUND_ROLES = frozenset({access.GATEWAY})


@dataclass(frozen=True)
class Scope:
    """What a certificate is bound to: a namespace, and one deployment of it or all ("")."""

    namespace: str
    deployment: str = ""

    def uri(self) -> str:
        return uri(self.namespace, self.deployment)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.deployment or '*'}"


def uri(namespace: str, deployment: str = "") -> str:
    """The URI SAN binding a certificate to `namespace` (and `deployment`, when given)."""
    if not _label(namespace) or (deployment and not _label(deployment)):
        raise ValueError(f"not DNS labels: namespace {namespace!r}, deployment {deployment!r}")
    tail = f"/sd/{deployment}" if deployment else ""
    return f"{SCHEME}ns/{namespace}{tail}"


def _label(text: str) -> bool:
    ok = set("abcdefghijklmnopqrstuvwxyz0123456789-")
    return 0 < len(text) <= 63 and set(text) <= ok and text[0] != "-" and text[-1] != "-"


@dataclass(frozen=True)
class Parsed:
    """The certificate's scope (None: bound to nothing) or why its URIs are unusable."""

    scope: Scope | None
    problem: str = ""


def parse(uris: Iterable[str]) -> Parsed:
    """The scope named by a certificate's URI SANs (others than ours are ignored)."""
    ours = [u for u in uris if u.startswith(SCHEME)]
    if not ours:
        return Parsed(None)
    if len(ours) > 1:
        return Parsed(None, f"the certificate names {len(ours)} Tessera scopes; one at most")
    parts = ours[0][len(SCHEME) :].split("/")
    if len(parts) in (2, 4) and parts[0] == "ns" and _label(parts[1]):
        if len(parts) == 2:
            return Parsed(Scope(parts[1]))
        if parts[2] == "sd" and _label(parts[3]):
            return Parsed(Scope(parts[1], parts[3]))
    return Parsed(None, f"malformed scope URI {ours[0]!r} (want {SCHEME}ns/<ns>[/sd/<name>])")


def owner(replica_id: str) -> Scope | None:
    """The deployment owning a replica id the operator built; None for any other id."""
    r = blocks.parse_replica_id(replica_id)
    if not r.deployment:
        return None
    namespace, deployment = r.deployment.split(".", 1)
    if not (_label(namespace) and _label(deployment)):
        return None
    return Scope(namespace, deployment)


def check_replica(
    method: str, role: str | None, scope: Scope | None, replica_id: str
) -> access.Decision:
    """May a caller of `role` bound to `scope` name `replica_id` in `method`?"""
    if role not in BOUND_ROLES or method not in REPLICA_METHODS:
        return access.ALLOW
    own = owner(replica_id)
    if scope is None:
        if own is None and "." not in replica_id:
            return access.ALLOW  # a local replica (tests, benches): no deployment to bind
        return access.Decision(
            False,
            f"{method}: the {role} certificate is bound to no deployment (no URI SAN "
            f"{SCHEME}ns/<ns>/sd/<name>) and replica {replica_id!r} belongs to one",
        )
    if own is None:
        return access.Decision(
            False, f"{method}: replica {replica_id!r} belongs to no deployment of {scope}"
        )
    if own.namespace != scope.namespace or (
        scope.deployment and own.deployment != scope.deployment
    ):
        return access.Decision(
            False,
            f"{method}: the {role} certificate is bound to {scope}; "
            f"replica {replica_id!r} belongs to {own}",
        )
    return access.ALLOW
