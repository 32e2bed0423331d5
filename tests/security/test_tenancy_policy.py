"""The pure deployment binding (`tessera.policies.security.tenancy`): a certificate's scope URI, a
replica's owner, and whether a bound gateway may name a replica."""

from __future__ import annotations

import pytest

from tessera import blocks
from tessera.policies.security import access, tenancy

A = blocks.replica_id("team-a", "chat", "r0", 3)
B = blocks.replica_id("team-b", "chat", "r0", 1)
A2 = blocks.replica_id("team-a", "code", "r1", 1)


def test_scope_uris_round_trip_and_malformed_ones_are_named() -> None:
    assert tenancy.uri("team-a", "chat") == "spiffe://tessera/ns/team-a/sd/chat"
    assert tenancy.parse([tenancy.uri("team-a", "chat")]).scope == tenancy.Scope("team-a", "chat")
    assert tenancy.parse([tenancy.uri("team-a")]).scope == tenancy.Scope("team-a")
    assert tenancy.parse(["https://example.com/x"]) == tenancy.Parsed(None)  # not ours
    for bad in ("spiffe://tessera/ns/Team/sd/x", "spiffe://tessera/ns/a/sd/", "spiffe://tessera/x"):
        parsed = tenancy.parse([bad])
        assert parsed.scope is None and "malformed" in parsed.problem
    two = tenancy.parse([tenancy.uri("a"), tenancy.uri("b")])
    assert two.scope is None and "2 Tessera scopes" in two.problem
    with pytest.raises(ValueError):
        tenancy.uri("a.b")


def test_owner_is_read_from_ids_the_operator_builds() -> None:
    assert tenancy.owner(A) == tenancy.Scope("team-a", "chat")
    assert tenancy.owner("piped") is None
    assert tenancy.owner("a.b.c.d.g1") is None  # a dotted name never parses as an owner


def test_a_gateway_is_held_to_its_deployment() -> None:
    gw, chat = access.GATEWAY, tenancy.Scope("team-a", "chat")
    for method in ("Generate", "GenerateMux", "ExportKV", "ImportKV", "ReservePages",
                   "CommitPrefix", "PinPrefix", "ReleasePin", "Cancel", "WakeReplica"):  # fmt: skip
        assert tenancy.check_replica(method, gw, chat, A).allowed
        refused = tenancy.check_replica(method, gw, chat, B)
        assert not refused.allowed
        assert "bound to team-a/chat" in refused.reason and "team-b/chat" in refused.reason
        assert not tenancy.check_replica(method, gw, chat, A2).allowed  # same ns, other sd
    namespace = tenancy.Scope("team-a")
    assert tenancy.check_replica("Generate", gw, namespace, A2).allowed
    assert not tenancy.check_replica("Generate", gw, namespace, B).allowed
    # unbound certificates: local replicas only; bound ones: never a local replica
    assert tenancy.check_replica("Generate", gw, None, "piped").allowed
    assert "bound to no deployment" in tenancy.check_replica("Generate", gw, None, A).reason
    assert not tenancy.check_replica("Generate", gw, None, "a.b.c.d.g1").allowed
    assert not tenancy.check_replica("Generate", gw, chat, "piped").allowed
    # the cluster's own roles serve every deployment
    for role in (access.OPERATOR, access.AGENT, access.ADMIN, None):
        assert tenancy.check_replica("Generate", role, None, B).allowed
    assert tenancy.check_replica("Describe", gw, chat, B).allowed  # names no replica
