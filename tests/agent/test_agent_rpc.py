"""Agents as real processes: pipelines across processes, inventory RPCs and every error path."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tessera.cli import local_agents
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tests.conftest import hf_greedy

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]
NEW = 10


def _stub(agent: local_agents.AgentProcess) -> pb_grpc.AgentStub:
    return pb_grpc.AgentStub(transport.sync_channel(agent.address, tls=None))


def load_replica(
    agents: list[local_agents.AgentProcess],
    model: Path,
    splits: list[tuple[int, int]],
    replica_id: str = "r0",
    kv_bytes: int = 32 << 20,
) -> None:
    """Load stages last to first, each pointing at the next agent."""
    local_agents.load_pipeline(agents, str(model), splits, replica_id, kv_bytes)


def generate(
    agent: local_agents.AgentProcess, prompt: list[int], replica_id: str = "r0", **params: Any
) -> tuple[list[int], str]:
    params.setdefault("max_tokens", NEW)
    params.setdefault("ignore_eos", True)
    toks: list[int] = []
    reason = ""
    for ch in _stub(agent).Generate(
        pb.GenerateRequest(
            replica_id=replica_id, prompt_token_ids=prompt, params=pb.SamplingParams(**params)
        )
    ):
        toks.extend(ch.token_ids)
        reason = ch.finish_reason or reason
    return toks, reason


@pytest.mark.parametrize(
    "splits",
    [[(0, 8)], [(0, 4), (4, 8)], [(0, 1), (1, 6), (6, 8)]],
    ids=["one-agent", "two-agents", "three-agents-1-5-2"],
)
def test_pipeline_across_processes_matches_hf(
    agents_factory: Start, tiny_llama: Path, prompts: list[list[int]], splits: list[tuple[int, int]]
) -> None:
    agents = agents_factory(len(splits))
    load_replica(agents, tiny_llama, splits)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:  # 8 concurrent requests: real continuous batching
        out = list(pool.map(lambda p: generate(agents[0], p)[0], prompts))
    assert out == [hf_greedy(tiny_llama, p, NEW) for p in prompts]


def test_seeded_sampling_same_on_one_agent_and_pipeline(
    agents_factory: Start, tiny_llama: Path
) -> None:
    agents = agents_factory(3)
    load_replica(agents[:1], tiny_llama, [(0, 8)], replica_id="single")
    load_replica(agents[1:], tiny_llama, [(0, 3), (3, 8)], replica_id="piped")
    params = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "has_seed": True, "seed": 42}
    a, _ = generate(agents[0], [0, 9, 8, 7], "single", **params)
    b, _ = generate(agents[1], [0, 9, 8, 7], "piped", **params)
    assert a == b and a != hf_greedy(tiny_llama, [0, 9, 8, 7], NEW)


def test_describe_list_unload_and_health(agents_factory: Start, tiny_llama: Path) -> None:
    (agent,) = agents_factory(1, devices="cpu:2x256MiB")
    stub = _stub(agent)
    d = stub.Describe(pb.DescribeRequest())
    assert [x.id for x in d.devices] == ["cpu:0", "cpu:1"]
    assert all(x.capacity_bytes == 256 << 20 == x.free_bytes for x in d.devices)
    assert d.nvml_status.startswith("NVML unavailable")
    load_replica([agent], tiny_llama, [(0, 8)], kv_bytes=8 << 20)
    again = stub.LoadBlock(
        pb.LoadBlockRequest(
            model_path=str(tiny_llama),
            layer_start=0,
            layer_end=8,
            device="cpu:0",
            replica_id="r0",
            stage_index=0,
            num_stages=1,
            kv_bytes=8 << 20,
        )
    )
    assert again.already_loaded  # idempotent: the operator may re-apply after a restart
    (block,) = stub.ListBlocks(pb.ListBlocksRequest()).blocks
    assert (block.layer_start, block.layer_end, block.device) == (0, 8, "cpu:0")
    assert block.param_bytes > 0 and block.kv_bytes <= 8 << 20 and block.num_tensors == 75
    d = stub.Describe(pb.DescribeRequest())
    assert d.devices[0].free_bytes == (256 << 20) - block.param_bytes - block.kv_bytes
    assert d.kv[0].pages_used == 0
    stub.UnloadBlock(pb.UnloadBlockRequest(replica_id="r0", stage_index=0))
    assert not stub.ListBlocks(pb.ListBlocksRequest()).blocks
    assert stub.Describe(pb.DescribeRequest()).devices[0].free_bytes == 256 << 20
    health = health_pb2_grpc.HealthStub(transport.sync_channel(agent.address, tls=None))
    resp = health.Check(health_pb2.HealthCheckRequest(service="tessera.rpc.v1.Agent"))
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


def _code(fn: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    err = info.value
    return err.code(), err.details()  # type: ignore[attr-defined]


def test_error_statuses_name_the_cause(
    agents_factory: Start, tiny_llama: Path, tmp_path: Path
) -> None:
    a, b = agents_factory(2, devices="cpu:1x64MiB")
    stub = _stub(a)

    def load(**kw: Any) -> Any:
        req = {
            "model_path": str(tiny_llama),
            "layer_start": 0,
            "layer_end": 8,
            "device": "cpu:0",
            "replica_id": "x",
            "stage_index": 0,
            "num_stages": 1,
            "kv_bytes": 4 << 20,
        }
        req.update(kw)
        return lambda: stub.LoadBlock(pb.LoadBlockRequest(**req))

    code, msg = _code(load(model_path=str(tmp_path / "missing")))
    assert code == grpc.StatusCode.NOT_FOUND and "model not found" in msg
    code, msg = _code(load(layer_end=12))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "8 layers" in msg
    code, msg = _code(load(kv_bytes=200 << 20))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "cpu:0" in msg
    code, msg = _code(load(device="cpu:7"))
    assert code == grpc.StatusCode.NOT_FOUND and "cpu:7" in msg
    code, msg = _code(load(layer_end=4, num_stages=2))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "next_stage_address" in msg
    # stage mismatch: agent b holds stage 1 starting at layer 5, the leader ends at 4
    _stub(b).LoadBlock(
        pb.LoadBlockRequest(
            model_path=str(tiny_llama),
            layer_start=5,
            layer_end=8,
            device="cpu:0",
            replica_id="m",
            stage_index=1,
            num_stages=2,
            kv_bytes=4 << 20,
        )
    )
    stub.LoadBlock(
        pb.LoadBlockRequest(
            model_path=str(tiny_llama),
            layer_start=0,
            layer_end=4,
            device="cpu:0",
            replica_id="m",
            stage_index=0,
            num_stages=2,
            kv_bytes=4 << 20,
            next_stage_address=b.address,
        )
    )
    code, msg = _code(lambda: generate(a, [0, 1, 2], "m"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "stage mismatch" in msg
    code, msg = _code(lambda: generate(a, [0, 1, 2], "nope"))
    assert code == grpc.StatusCode.NOT_FOUND and "nope" in msg
    load(replica_id="ok")()
    code, msg = _code(lambda: generate(a, [0, 1, 2], "ok", max_tokens=0))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "max_tokens" in msg
    code, msg = _code(lambda: generate(a, [0, 99999], "ok"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "vocabulary" in msg
    code, msg = _code(lambda: generate(a, [0, 1, 2], "ok", max_tokens=100000))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "pool" in msg
    code, msg = _code(lambda: stub.UnloadBlock(pb.UnloadBlockRequest(replica_id="zz")))
    assert code == grpc.StatusCode.NOT_FOUND


def test_kv_exhaustion_through_agent_finishes_all(
    agents_factory: Start, tiny_llama: Path, prompts: list[list[int]]
) -> None:
    agents = agents_factory(2)
    page = 2 * 4 * 16 * 2 * 64 * 4  # bytes of one page for a 4-layer stage
    load_replica(agents, tiny_llama, [(0, 4), (4, 8)], kv_bytes=9 * page)
    from concurrent.futures import ThreadPoolExecutor

    # 40 new tokens: each request alone fits the 9 pages (at most 7), any two of the longest
    # together do not, and every request decodes long enough that they overlap however the
    # 8 calls are staggered (with 10 tokens they could finish one by one and never preempt)
    new = 40
    with ThreadPoolExecutor(8) as pool:
        out = list(pool.map(lambda p: generate(agents[0], p, max_tokens=new)[0], prompts))
    assert out == [hf_greedy(tiny_llama, p, new) for p in prompts]
    kv = _stub(agents[0]).Describe(pb.DescribeRequest()).kv[0]
    assert kv.pages_total == 9 and kv.pages_used == 0 and kv.preemptions > 0


def test_cancel_by_disconnect_frees_pages(agents_factory: Start, tiny_llama: Path) -> None:
    (agent,) = agents_factory(1)
    load_replica([agent], tiny_llama, [(0, 8)])
    stub = _stub(agent)
    call = stub.Generate(
        pb.GenerateRequest(
            replica_id="r0",
            prompt_token_ids=[0, 1, 2, 3],
            params=pb.SamplingParams(max_tokens=900, ignore_eos=True),
        )
    )
    next(call)
    assert stub.Describe(pb.DescribeRequest()).kv[0].pages_used > 0
    call.cancel()
    deadline = time.monotonic() + 10
    while stub.Describe(pb.DescribeRequest()).kv[0].pages_used and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stub.Describe(pb.DescribeRequest()).kv[0].pages_used == 0


def test_agent_rejects_gpu_without_driver() -> None:
    with pytest.raises(RuntimeError, match="no NVIDIA GPU"):
        local_agents.start_agent("gpu", devices="cuda:0")


def test_logprobs_cross_the_pipeline(agents_factory: Start, tiny_llama: Path) -> None:
    """Log-probabilities computed on the last stage reach the client through the stage
    stream and Generate, equal to transformers' (one per token, top-N best first)."""
    from tests.conftest import hf_greedy_logprobs

    agents = agents_factory(2)
    load_replica(agents, tiny_llama, [(0, 5), (5, 8)])
    prompt = [0, 11, 22, 33]
    params = pb.SamplingParams(max_tokens=NEW, ignore_eos=True, has_logprobs=True, logprobs=2)
    req = pb.GenerateRequest(replica_id="r0", prompt_token_ids=prompt, params=params)
    chunks = [c for c in _stub(agents[0]).Generate(req) if c.token_ids]
    tokens, hf_lp = hf_greedy_logprobs(tiny_llama, prompt, NEW)
    assert [t for c in chunks for t in c.token_ids] == list(tokens)
    for t, c in enumerate(chunks):
        (lp,) = c.logprobs
        assert lp.logprob == pytest.approx(float(hf_lp[t, tokens[t]]), abs=1e-4)
        assert list(lp.top_ids) == hf_lp[t].topk(2).indices.tolist()
    plain = pb.GenerateRequest(
        replica_id="r0", prompt_token_ids=prompt, params=pb.SamplingParams(max_tokens=2)
    )
    assert all(not c.logprobs for c in _stub(agents[0]).Generate(plain))
    with pytest.raises(grpc.RpcError) as info:
        list(
            _stub(agents[0]).Generate(
                pb.GenerateRequest(
                    replica_id="r0",
                    prompt_token_ids=prompt,
                    params=pb.SamplingParams(max_tokens=2, has_logprobs=True, logprobs=50),
                )
            )
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
