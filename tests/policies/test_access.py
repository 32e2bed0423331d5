"""The pure access policy: which role may call which agent method, and the model root."""

from __future__ import annotations

from tessera.policies.security import access


def test_weights_and_kv_are_open_only_to_the_roles_that_need_them() -> None:
    def who(method: str) -> set[str]:
        return {r for r in access.ROLES if access.authorize(method, r).allowed}

    assert who("FetchTensors") == {access.AGENT, access.ADMIN}
    assert who("ExportKV") == who("ImportKV") == {access.GATEWAY, access.OPERATOR, access.ADMIN}
    assert who("PinPrefix") == who("CommitPrefix") == {access.GATEWAY, access.ADMIN}
    # placement changes are the operator's alone (issue 31): a gateway may not pause or drop
    assert who("OverloadShift") == who("ScalingEvict") == {access.OPERATOR, access.ADMIN}
    assert who("LoadBlock") == who("Profile") == {access.OPERATOR, access.ADMIN}
    assert who("StageStream") == {access.AGENT, access.ADMIN}
    assert who("Generate") == {access.GATEWAY, access.ADMIN}
    assert who("Describe") == access.ROLES
    refused = access.authorize("UnknownMethod", access.ADMIN)
    assert not refused.allowed and "UnknownMethod" in refused.reason
    assert "gateway" in access.authorize("LoadBlock", access.GATEWAY).reason
    assert access.authorize("LoadBlock", None).allowed  # plaintext loopback: no identities


def test_every_agent_rpc_has_a_rule() -> None:
    from pathlib import Path

    proto = Path(__file__).parents[2] / "proto/tessera/rpc/v1/agent.proto"
    rpcs = {
        line.split()[1].split("(")[0]
        for line in proto.read_text().splitlines()
        if line.strip().startswith("rpc ")
    }
    assert rpcs <= set(access.METHOD_ROLES), rpcs - set(access.METHOD_ROLES)


def test_model_root() -> None:
    ok = access.check_model_path("/models/llama", "/models/llama", "/models")
    assert ok.allowed and access.check_model_path("/x", "/x", None).allowed
    for path, resolved in (
        ("/models/../etc", "/etc"),
        ("/models/link", "/etc/passwd"),  # a symlink leading out (resolved by the caller)
        ("/modelsX/a", "/modelsX/a"),  # a sibling whose name starts like the root
        ("rel", "rel"),
    ):
        d = access.check_model_path(path, resolved, "/models/")
        assert not d.allowed and repr(path) in d.reason
