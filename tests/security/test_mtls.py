"""Mutual TLS between agents and their clients, and the agent's authorization interceptor.

Two agent processes hold agent certificates of one CA made in the test; the test process
plays the operator (loads a 2-stage pipeline, so stage 0 streams to stage 1 over mTLS, and
a block copy, so one agent fetches weights from the other) and the gateway (greedy tokens
must equal transformers'). A client without a certificate, with one from another CA, or
in plaintext is refused; a certificate whose role may not call a method gets
PERMISSION_DENIED; a load outside the model root is refused with the reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tessera.cli import local_agents
from tessera.control import kv_move
from tessera.policies.security import access
from tessera.rpc import pki, transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tests.conftest import hf_greedy

pytestmark = pytest.mark.slow
PROMPT = [0, *range(300, 320)]


@pytest.fixture(scope="module")
def pki_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pki")
    ours = pki.make_authority()
    dirs = {r: pki.write_leaf(ours, root / "ours" / r, r) for r in sorted(access.ROLES)}
    dirs["no-role"] = pki.write_leaf(ours, root / "ours" / "no-role", "intern")
    foreign = pki.make_authority("someone-else")
    dirs["foreign"] = pki.write_leaf(foreign, root / "foreign", access.ADMIN)
    return dirs


@pytest.fixture(scope="module")
def secure_agents(
    pki_dirs: dict[str, Path], tiny_llama: Path
) -> Iterator[list[local_agents.AgentProcess]]:
    env = {transport.TLS_DIR_ENV: str(pki_dirs[access.AGENT])}
    root = ["--model-root", str(tiny_llama.parent)]
    agents: list[local_agents.AgentProcess] = []
    try:
        for i in range(2):
            agents.append(
                local_agents.start_agent(f"tls-{i}", "cpu:1x512MiB", 1, extra_args=root, env=env)
            )
        assert all("(mtls)" in "\n".join(a.output) for a in agents)
        yield agents
    finally:
        for a in agents:
            local_agents.stop_agent(a)


def _stub(agent: local_agents.AgentProcess, folder: Path) -> pb_grpc.AgentStub:
    return pb_grpc.AgentStub(
        transport.sync_channel(agent.address, transport.TlsFiles.from_dir(folder))
    )


def _code(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    return err.value.code()  # type: ignore[no-any-return]


def test_pipeline_over_mtls_gives_transformers_tokens(
    secure_agents: list[local_agents.AgentProcess],
    pki_dirs: dict[str, Path],
    tiny_llama: Path,
) -> None:
    a, b = secure_agents
    as_operator = transport.TlsFiles.from_dir(pki_dirs[access.OPERATOR])
    local_agents.load_pipeline(
        [dataclasses.replace(x, tls=as_operator) for x in (a, b)],
        str(tiny_llama),
        [(0, 4), (4, 8)],
        "piped",
    )
    # replica "copied" runs b -> a; its stage 0 on b copies layers 0-4 from agent a's
    # "piped" stage 0 (agent-to-agent FetchTensors) instead of reading the checkpoint
    operator = _stub(a, pki_dirs[access.OPERATOR])
    for i, (agent, (start, end)) in reversed(list(enumerate([(b, (0, 4)), (a, (4, 8))]))):
        req = pb.LoadBlockRequest(
            model_path=str(tiny_llama),
            layer_start=start,
            layer_end=end,
            device="cpu:0",
            replica_id="copied",
            stage_index=i,
            num_stages=2,
            kv_bytes=16 << 20,
            next_stage_address=a.address if i == 0 else "",
        )
        if i == 0:
            req.source.CopyFrom(pb.BlockSource(address=a.address, replica_id="piped"))
        reply = _stub(agent, pki_dirs[access.OPERATOR]).LoadBlock(req, timeout=120)
        assert (reply.block.layer_start, reply.block.layer_end) == (start, end)
    assert operator.ListBlocks(pb.ListBlocksRequest(), timeout=10) is not None
    want = hf_greedy(tiny_llama, PROMPT, 12)
    gateway = _stub(a, pki_dirs[access.GATEWAY])
    assert local_agents.generate_tokens(gateway, "piped", PROMPT, 12) == want
    assert (
        local_agents.generate_tokens(_stub(b, pki_dirs[access.GATEWAY]), "copied", PROMPT, 12)
        == want
    )
    # a KV move, orchestrated with the gateway's certificate (Pin/Export/Import/Commit)
    other = [0, *range(400, 420)]
    want2 = hf_greedy(tiny_llama, other, 15)
    assert local_agents.generate_tokens(gateway, "piped", other, 12) == want2[:12]
    moved = asyncio.run(
        kv_move.move_prefix(
            other + want2[:12],
            [
                kv_move.StageRef(a.address, "piped", 0, 0, 4),
                kv_move.StageRef(b.address, "piped", 1, 4, 8),
            ],
            [
                kv_move.StageRef(b.address, "copied", 0, 0, 4),
                kv_move.StageRef(a.address, "copied", 1, 4, 8),
            ],
            tls=transport.TlsFiles.from_dir(pki_dirs[access.GATEWAY]),
        )
    )
    assert moved.tokens == 32
    rest = local_agents.generate_tokens(
        _stub(b, pki_dirs[access.GATEWAY]), "copied", other + want2[:12], 3
    )
    assert rest == want2[12:]


def test_clients_without_our_certificate_are_refused(
    secure_agents: list[local_agents.AgentProcess], pki_dirs: dict[str, Path]
) -> None:
    a = secure_agents[0]
    ours = transport.TlsFiles.from_dir(pki_dirs[access.ADMIN])
    ca = ours.ca.read_bytes()
    opts = [("grpc.ssl_target_name_override", transport.AGENT_SERVER_NAME)]
    no_cert = grpc.secure_channel(a.address, grpc.ssl_channel_credentials(ca), options=opts)
    foreign = transport.TlsFiles.from_dir(pki_dirs["foreign"])
    foreign_cert = grpc.secure_channel(
        a.address,
        grpc.ssl_channel_credentials(ca, foreign.key.read_bytes(), foreign.cert.read_bytes()),
        options=opts,
    )
    plaintext = grpc.insecure_channel(a.address)
    for ch in (no_cert, foreign_cert, plaintext):
        stub = pb_grpc.AgentStub(ch)
        assert _code(lambda s=stub: s.Describe(pb.DescribeRequest(), timeout=10)) == (
            grpc.StatusCode.UNAVAILABLE
        )
        ch.close()
    # and a server presenting another CA's certificate is not trusted by our clients
    srv_ca_mismatch = transport.TlsFiles(foreign.ca, ours.cert, ours.key)
    stub = pb_grpc.AgentStub(transport.sync_channel(a.address, srv_ca_mismatch))
    assert _code(lambda: stub.Describe(pb.DescribeRequest(), timeout=10)) == (
        grpc.StatusCode.UNAVAILABLE
    )
    assert _stub(a, pki_dirs[access.ADMIN]).Describe(pb.DescribeRequest(), timeout=10).agent_id


def test_roles_and_model_root_are_enforced(
    secure_agents: list[local_agents.AgentProcess],
    pki_dirs: dict[str, Path],
    tiny_llama: Path,
) -> None:
    a = secure_agents[0]
    gateway, operator = _stub(a, pki_dirs[access.GATEWAY]), _stub(a, pki_dirs[access.OPERATOR])
    load = pb.LoadBlockRequest(
        model_path=str(tiny_llama), layer_start=0, layer_end=8, device="cpu:0",
        replica_id="nope", stage_index=0, num_stages=1, kv_bytes=16 << 20,
    )  # fmt: skip
    denied = grpc.StatusCode.PERMISSION_DENIED
    assert _code(lambda: gateway.LoadBlock(load, timeout=30)) == denied
    fetch = pb.FetchTensorsRequest(replica_id="piped", stage_index=0, names=[])
    assert _code(lambda: list(gateway.FetchTensors(fetch, timeout=30))) == denied
    pin = pb.PinPrefixRequest(replica_id="piped", token_ids=[1])
    assert _code(lambda: operator.PinPrefix(pin, timeout=30)) == denied  # KV pins: gateways
    export = pb.ExportKVRequest(replica_id="piped", stage_index=0, page_ids=[0])
    assert _code(lambda: list(_stub(a, pki_dirs[access.AGENT]).ExportKV(export))) == denied
    gen = pb.GenerateRequest(replica_id="piped", prompt_token_ids=[1], params=pb.SamplingParams())
    assert _code(lambda: list(operator.Generate(gen, timeout=30))) == denied
    assert _code(lambda: list(_stub(a, pki_dirs[access.AGENT]).Generate(gen))) == denied
    for path in ("/etc", f"{tiny_llama.parent}/../../etc", "relative/model"):
        bad = pb.LoadBlockRequest()
        bad.CopyFrom(load)
        bad.model_path = path
        with pytest.raises(grpc.RpcError) as err:
            operator.LoadBlock(bad, timeout=30)
        assert err.value.code() == denied and "model_path" in err.value.details()
    assert "outside the model root" in _details(lambda: operator.LoadBlock(
        pb.LoadBlockRequest(model_path="/etc"), timeout=30))  # fmt: skip
    # our CA, but no Tessera role in the OU: authenticated, not authorized
    no_role = _stub(a, pki_dirs["no-role"])
    with pytest.raises(grpc.RpcError) as err:
        no_role.Describe(pb.DescribeRequest(), timeout=10)
    assert err.value.code() == denied and "no Tessera role" in err.value.details()
    # everyone may look
    for role in (access.GATEWAY, access.OPERATOR, access.AGENT):
        assert _stub(a, pki_dirs[role]).ListBlocks(pb.ListBlocksRequest(), timeout=10) is not None


def _details(call: object) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    return err.value.details()  # type: ignore[no-any-return]
