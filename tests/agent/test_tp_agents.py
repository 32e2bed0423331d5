"""Tensor parallelism across agent processes: groups formed at load over gloo, the oracle,
Describe's view of the group, and a rank that dies (fail fast, then reload re-forms)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from tessera.cli import local_agents
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tests.conftest import hf_greedy

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]
NEW = 8


def _stub(agent: local_agents.AgentProcess) -> pb_grpc.AgentStub:
    return pb_grpc.AgentStub(transport.sync_channel(agent.address, tls=None))


def load_tp(
    ranks: list[list[local_agents.AgentProcess]],
    model: Path,
    splits: list[tuple[int, int]],
    replica_id: str,
    timeout_s: float = 30.0,
    devices: list[list[str]] | None = None,
) -> None:
    """ranks[i][k]: the agent holding rank k of stage i (on devices[i][k], default cpu:0);
    stage i's rank 0 is the one the previous stage talks to. Every rank meets on the
    leader agent's store."""
    store = _stub(ranks[0][0]).Describe(pb.DescribeRequest()).store_address
    dp = pb.DataPlane(
        store_address=store, group=f"{replica_id}-{uuid.uuid4().hex[:8]}", timeout_s=timeout_s
    )
    for i in reversed(range(len(splits))):
        for k, agent in enumerate(ranks[i]):
            nxt = ranks[i + 1][0].address if i + 1 < len(splits) else ""
            _stub(agent).LoadBlock(
                pb.LoadBlockRequest(
                    model_path=str(model),
                    layer_start=splits[i][0],
                    layer_end=splits[i][1],
                    device=devices[i][k] if devices else "cpu:0",
                    replica_id=replica_id,
                    stage_index=i,
                    num_stages=len(splits),
                    kv_bytes=16 << 20,
                    next_stage_address=nxt,
                    tp_size=len(ranks[i]),
                    tp_rank=k,
                    data_plane=dp,
                )
            )


def _generate(agent: local_agents.AgentProcess, replica_id: str, prompt: list[int]) -> list[int]:
    return local_agents.generate_tokens(_stub(agent), replica_id, prompt, NEW)


def _states(agent: local_agents.AgentProcess) -> dict[tuple[str, int], pb.BlockInfo]:
    d = _stub(agent).Describe(pb.DescribeRequest())
    return {(b.replica_id, b.stage_index): b for b in d.blocks}


def test_tp2_and_tp2xpp2_over_two_agents(
    agents_factory: Start, tiny_llama: Path, prompts: list[list[int]]
) -> None:
    a, b = agents_factory(2)
    load_tp([[a, b]], tiny_llama, [(0, 8)], "tp2")
    load_tp([[a, b], [b, a]], tiny_llama, [(0, 4), (4, 8)], "tp2pp2")  # 2 ranks per agent
    for p in prompts[:3]:
        want = hf_greedy(tiny_llama, p, NEW)
        assert _generate(a, "tp2", p) == want
        assert _generate(a, "tp2pp2", p) == want
    blocks = _states(b)
    assert blocks[("tp2", 0)].tp_size == 2 and blocks[("tp2", 0)].tp_rank == 1
    assert blocks[("tp2", 0)].transport == "gloo"
    assert blocks[("tp2", 0)].group_state == "ready"
    assert blocks[("tp2pp2", 1)].tp_rank == 0
    # Unloading rank 0 stops the group; the follower's block can then be unloaded too.
    for agent, rank_stage in ((a, 0), (b, 0)):
        _stub(agent).UnloadBlock(pb.UnloadBlockRequest(replica_id="tp2", stage_index=rank_stage))
    assert ("tp2", 0) not in _states(a)


def test_tp_rank_without_a_data_plane_is_refused(agents_factory: Start, tiny_llama: Path) -> None:
    (a,) = agents_factory(1)
    with pytest.raises(grpc.RpcError) as err:
        _stub(a).LoadBlock(
            pb.LoadBlockRequest(
                model_path=str(tiny_llama),
                layer_start=0,
                layer_end=8,
                device="cpu:0",
                replica_id="x",
                num_stages=1,
                tp_size=2,
                tp_rank=0,
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "store_address" in (err.value.details() or "")
    with pytest.raises(grpc.RpcError) as err:
        _stub(a).LoadBlock(
            pb.LoadBlockRequest(
                model_path=str(tiny_llama),
                layer_start=0,
                layer_end=8,
                device="cpu:0",
                replica_id="x",
                num_stages=1,
                tp_size=3,
                tp_rank=0,
                data_plane=pb.DataPlane(store_address="127.0.0.1:1", group="g"),
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not divide" in (err.value.details() or "")


def test_killed_rank_fails_fast_then_reload_reforms(
    agents_factory: Start, tiny_llama: Path, prompts: list[list[int]]
) -> None:
    """Rank 1's agent is killed mid-decode: the request ends UNAVAILABLE within seconds,
    the leader's block reports the failed group with the reason, a tp=1 replica on the same
    agent keeps serving, and reloading the stage with a new rank 1 re-forms the group."""
    a, b = agents_factory(2)
    local_agents.load_pipeline([a], str(tiny_llama), [(0, 8)], "solo", 16 << 20)
    load_tp([[a, b]], tiny_llama, [(0, 8)], "tp", timeout_s=10.0)
    assert _generate(a, "tp", prompts[0]) == hf_greedy(tiny_llama, prompts[0], NEW)
    got: list[int] = []
    outcome: list[BaseException] = []

    def long_request() -> None:
        try:
            for ch in _stub(a).Generate(
                pb.GenerateRequest(
                    replica_id="tp",
                    prompt_token_ids=prompts[1],
                    params=pb.SamplingParams(max_tokens=800, ignore_eos=True),
                )
            ):
                got.extend(ch.token_ids)
        except grpc.RpcError as exc:
            outcome.append(exc)

    t = threading.Thread(target=long_request)
    t.start()
    deadline = time.monotonic() + 60
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    b.proc.kill()
    killed = time.monotonic()
    t.join(timeout=60)
    assert not t.is_alive(), "the request hung after its TP peer died"
    assert time.monotonic() - killed < 20
    assert outcome and outcome[0].code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    info = _states(a)[("tp", 0)]
    assert info.group_state == "failed" and "tensor-parallel group failed" in info.group_reason
    want = hf_greedy(tiny_llama, prompts[2], NEW)
    assert _generate(a, "solo", prompts[2]) == want  # the other replica serves on
    # Reload: a new group (new formation key) with a fresh rank 1.
    _stub(a).UnloadBlock(pb.UnloadBlockRequest(replica_id="tp", stage_index=0))
    (c,) = agents_factory(1)
    load_tp([[a, c]], tiny_llama, [(0, 8)], "tp", timeout_s=10.0)
    assert _generate(a, "tp", prompts[2]) == want
    assert _states(a)[("tp", 0)].group_state == "ready"


def test_pipeline_hidden_states_over_the_stage_link(
    agents_factory: Start, tiny_llama: Path, prompts: list[list[int]]
) -> None:
    """A 3-stage pipeline loaded with a data plane sends its hidden states stage to stage
    over gloo links and its sampled tokens straight back from the last stage to the leader
    over a gloo return link (the blocks say so), and still gives transformers' tokens, also
    for a request asking for log-probabilities (those stay on the stream); loaded without
    one, the same pipeline uses the gRPC stream."""
    agents = agents_factory(3)
    splits = [(0, 3), (3, 5), (5, 8)]
    local_agents.load_pipeline(agents, str(tiny_llama), splits, "link", 16 << 20)
    local_agents.load_pipeline(agents, str(tiny_llama), splits, "plain", 16 << 20, data_plane=False)
    for p in prompts[:3]:
        want = hf_greedy(tiny_llama, p, NEW)
        assert _generate(agents[0], "link", p) == want
        assert _generate(agents[0], "plain", p) == want
    for a in agents[:2]:
        blocks = _states(a)
        assert blocks[("link", agents.index(a))].activations == "gloo"
        assert blocks[("plain", agents.index(a))].activations == "grpc"
    leader = _states(agents[0])
    assert (leader[("link", 0)].results, leader[("plain", 0)].results) == ("gloo", "grpc")
    chunks = list(
        _stub(agents[0]).Generate(
            pb.GenerateRequest(
                replica_id="link",
                prompt_token_ids=prompts[0],
                params=pb.SamplingParams(
                    max_tokens=NEW, ignore_eos=True, has_logprobs=True, logprobs=1
                ),
            )
        )
    )
    assert [t for ch in chunks for t in ch.token_ids] == hf_greedy(tiny_llama, prompts[0], NEW)
    assert sum(len(ch.logprobs) for ch in chunks) == NEW
    assert _states(agents[0])[("link", 0)].results == "gloo"  # the link stays in use


def _free(agent: local_agents.AgentProcess) -> dict[str, int]:
    d = _stub(agent).Describe(pb.DescribeRequest())
    return {dev.id: dev.free_bytes for dev in d.devices}


def test_one_agent_hosts_both_ranks_on_its_two_devices(
    agents_factory: Start, tiny_llama: Path, prompts: list[list[int]]
) -> None:
    """A node agent with two declared devices serves tp=2 alone: rank 0 on cpu:0 and rank 1
    on cpu:1, each its own gloo group member on its own thread of the one process; greedy
    tokens equal transformers'; unloading the stage frees both devices; loaded again, the
    ranks unload one by one (rank 1 then answers for the stage), and a rank on a device
    already holding another rank of the stage is refused."""
    (a,) = agents_factory(1, devices="cpu:2x512MiB")
    empty = _free(a)
    load_tp([[a, a]], tiny_llama, [(0, 8)], "node", devices=[["cpu:0", "cpu:1"]])
    for p in prompts[:2]:
        assert _generate(a, "node", p) == hf_greedy(tiny_llama, p, NEW)
    d = _stub(a).Describe(pb.DescribeRequest())
    held = sorted((b.tp_rank, b.device, b.tp_size, b.group_state, b.transport) for b in d.blocks)
    assert held == [(0, "cpu:0", 2, "ready", "gloo"), (1, "cpu:1", 2, "ready", "gloo")]
    used = _free(a)
    assert all(used[dev] < empty[dev] for dev in ("cpu:0", "cpu:1"))
    # No rank named: every rank of the stage held here goes, and its memory with it.
    _stub(a).UnloadBlock(pb.UnloadBlockRequest(replica_id="node", stage_index=0))
    assert not _stub(a).ListBlocks(pb.ListBlocksRequest()).blocks
    assert _free(a) == empty
    # Loaded again, the two ranks form a new group in the same process and serve again.
    load_tp([[a, a]], tiny_llama, [(0, 8)], "node", devices=[["cpu:0", "cpu:1"]])
    assert _generate(a, "node", prompts[2]) == hf_greedy(tiny_llama, prompts[2], NEW)
    # Rank 0 alone: its memory goes, rank 1 stays listed (it now answers for the stage).
    _stub(a).UnloadBlock(pb.UnloadBlockRequest(replica_id="node", stage_index=0, tp_rank=0))
    left = [(b.tp_rank, b.device) for b in _stub(a).ListBlocks(pb.ListBlocksRequest()).blocks]
    assert left == [(1, "cpu:1")]
    assert _free(a) == {"cpu:0": empty["cpu:0"], "cpu:1": used["cpu:1"]}
    with pytest.raises(grpc.RpcError) as err:  # one device per rank
        _stub(a).LoadBlock(
            pb.LoadBlockRequest(
                model_path=str(tiny_llama),
                layer_start=0,
                layer_end=8,
                device="cpu:1",
                replica_id="node",
                num_stages=1,
                tp_size=2,
                tp_rank=0,
                data_plane=pb.DataPlane(store_address="127.0.0.1:1", group="g"),
            )
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "rank 1 of tp=2 is already on cpu:1; rank 0 needs a device" in (
        err.value.details() or ""
    )
    _stub(a).UnloadBlock(pb.UnloadBlockRequest(replica_id="node", stage_index=0, tp_rank=1))
    assert not _stub(a).ListBlocks(pb.ListBlocksRequest()).blocks
    assert _free(a) == empty
