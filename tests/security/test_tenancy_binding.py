"""Certificates bound to a deployment, enforced by a real agent over mutual TLS (issue 31).

One agent process (agent certificate, `--model-root`); the test loads replica r0 of
deployment team-b/chat with the operator's certificate, then calls it with gateway
certificates bound (URI SAN) to team-a/chat, to team-b/chat, and to the team-b namespace.
A's certificate is refused on B's replica for Generate, GenerateMux, ExportKV, ImportKV,
ReservePages, CommitPrefix and OverloadShift, PERMISSION_DENIED naming both deployments
(OverloadShift: the gateway role may not call it at all); B's certificates generate.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tessera import blocks
from tessera.cli import local_agents
from tessera.policies.security import access, tenancy
from tessera.rpc import pki, transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow
B = blocks.replica_id("team-b", "chat", "r0", 1)
DENIED = grpc.StatusCode.PERMISSION_DENIED


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pki")
    ca = pki.make_authority()
    out = {r: pki.write_leaf(ca, root / r, r) for r in (access.AGENT, access.OPERATOR)}
    for name, scope in (
        ("gw-a", tenancy.uri("team-a", "chat")),
        ("gw-b", tenancy.uri("team-b", "chat")),
        ("gw-b-ns", tenancy.uri("team-b")),
        ("gw-bad", "spiffe://tessera/ns/team-b/sd/../x"),
    ):
        out[name] = pki.write_leaf(ca, root / name, access.GATEWAY, scope=scope)
    return out


@pytest.fixture(scope="module")
def agent(certs: dict[str, Path], tiny_llama: Path) -> Iterator[local_agents.AgentProcess]:
    env = {transport.TLS_DIR_ENV: str(certs[access.AGENT])}
    a = local_agents.start_agent(
        "tenant", "cpu:1x512MiB", 1, extra_args=["--model-root", str(tiny_llama.parent)], env=env
    )
    try:
        op = _stub(a, certs[access.OPERATOR])
        op.LoadBlock(
            pb.LoadBlockRequest(
                model_path=str(tiny_llama), layer_start=0, layer_end=8, device="cpu:0",
                replica_id=B, stage_index=0, num_stages=1, kv_bytes=16 << 20,
            ),
            timeout=120,
        )  # fmt: skip
        yield a
    finally:
        local_agents.stop_agent(a)


def _stub(agent: local_agents.AgentProcess, folder: Path) -> pb_grpc.AgentStub:
    return pb_grpc.AgentStub(
        transport.sync_channel(agent.address, transport.TlsFiles.from_dir(folder))
    )


def _refused(call: object) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    assert err.value.code() == DENIED, err.value.details()
    return err.value.details()  # type: ignore[no-any-return]


def test_a_gateway_of_deployment_a_is_refused_on_b(
    agent: local_agents.AgentProcess, certs: dict[str, Path]
) -> None:
    a = _stub(agent, certs["gw-a"])
    gen = pb.GenerateRequest(
        replica_id=B, request_id="x", prompt_token_ids=[1, 2, 3],
        params=pb.SamplingParams(max_tokens=2, ignore_eos=True),
    )  # fmt: skip
    msg = _refused(lambda: list(a.Generate(gen, timeout=30)))
    assert "team-a/chat" in msg and "team-b/chat" in msg
    mux = iter([pb.GenerateMuxRequest(start=gen)])
    assert "team-b/chat" in _refused(lambda: list(a.GenerateMux(mux, timeout=30)))
    export = pb.ExportKVRequest(replica_id=B, stage_index=0, page_ids=[0])
    assert "team-b/chat" in _refused(lambda: list(a.ExportKV(export, timeout=30)))
    header = pb.KVImportHeader(replica_id=B, stage_index=0, page_ids=[0])
    imports = iter([pb.KVImportMessage(header=header)])
    assert "team-b/chat" in _refused(lambda: a.ImportKV(imports, timeout=30))
    reserve = pb.ReservePagesRequest(replica_id=B, num_pages=1)
    assert "team-b/chat" in _refused(lambda: a.ReservePages(reserve, timeout=30))
    commit = pb.CommitPrefixRequest(replica_id=B)
    assert "team-b/chat" in _refused(lambda: a.CommitPrefix(commit, timeout=30))
    for op in ("pause", "drop"):
        shift = pb.OverloadShiftRequest(replica_id=B, stage_index=0, op=op)
        assert "OverloadShift" in _refused(lambda s=shift: a.OverloadShift(s, timeout=30))
    # a scope URI that does not parse is refused outright, whatever the call
    bad = _stub(agent, certs["gw-bad"])
    assert "malformed" in _refused(lambda: bad.Describe(pb.DescribeRequest(), timeout=30))


def test_b_gateways_serve_b(agent: local_agents.AgentProcess, certs: dict[str, Path]) -> None:
    for name in ("gw-b", "gw-b-ns"):
        assert len(local_agents.generate_tokens(_stub(agent, certs[name]), B, [1, 2, 3], 3)) == 3
    start = pb.GenerateRequest(
        replica_id=B, request_id="m1", prompt_token_ids=[1, 2, 3],
        params=pb.SamplingParams(max_tokens=2, ignore_eos=True),
    )  # fmt: skip
    replies = list(
        _stub(agent, certs["gw-b"]).GenerateMux(iter([pb.GenerateMuxRequest(start=start)]))
    )
    tokens = [t for r in replies for e in r.entries for t in e.chunk.token_ids]
    assert len(tokens) == 2


def test_a_variant_load_reads_its_foundation_under_the_model_root(
    agent: local_agents.AgentProcess, certs: dict[str, Path], tiny_llama: Path
) -> None:
    load = pb.LoadBlockRequest(
        model_path=str(tiny_llama), layer_start=0, layer_end=8, device="cpu:0",
        replica_id="variant", stage_index=0, num_stages=1, kv_bytes=16 << 20,
        share=pb.VariantShare(foundation_path="/etc", threshold=0.98),
    )  # fmt: skip
    op = _stub(agent, certs[access.OPERATOR])
    msg = _refused(lambda: op.LoadBlock(load, timeout=30))
    assert "share.foundation_path '/etc' is outside the model root" in msg
