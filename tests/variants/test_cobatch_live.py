"""Per-block batching live, on agent processes: a foundation replica and a full
fine-tune's chain, both pipelined over the same 2 agents (stage 0 on one, stage 1 on the
other, the zoo sharing their identical layers). Concurrent requests on both chains give
each model's `transformers` tokens, and both agents' `/metrics` show steps run in
co-steps: the leaders' (replica hook) and the stage stream's (stage server hook)."""

from __future__ import annotations

import concurrent.futures
import socket
import urllib.request
from pathlib import Path

import pytest

from tessera.cli import local_agents
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import tiny_variants
from tests.conftest import hf_greedy

pytestmark = pytest.mark.slow

NEW = 16


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cobatched(port: int) -> int:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name == "tessera_agent_cobatch_steps_total" and smp.labels["mode"] == (
                "cobatched"
            ):
                return int(smp.value)
    raise AssertionError("no tessera_agent_cobatch_steps metric")


def test_chains_cobatch_live_and_match_transformers(
    tiny_llama: Path, tmp_path: Path, prompts: list[list[int]]
) -> None:
    ft = tiny_variants.make_tiny_finetune(tiny_llama, tmp_path / "ft", layers=(1, 6), seed=5)
    ports = [_port(), _port()]
    agents = []
    try:
        for i, port in enumerate(ports):
            # a generous wait for partners: CI's contention must not decide this test
            extra = ["--metrics-port", str(port), "--cobatch-linger-ms", "50"]
            agents.append(local_agents.start_agent(f"co-{i}", "cpu:1x512MiB", 1, extra_args=extra))
        splits = [(0, 4), (4, 8)]
        local_agents.load_pipeline(agents, str(tiny_llama), splits, "base", 8 << 20)
        local_agents.load_pipeline(agents, str(ft), splits, "ft", 8 << 20)
        stub = pb_grpc.AgentStub(transport.sync_channel(agents[0].address, tls=None))

        def gen(rid: str, prompt: list[int]) -> list[int]:
            params = pb.SamplingParams(max_tokens=NEW, ignore_eos=True)
            req = pb.GenerateRequest(replica_id=rid, prompt_token_ids=prompt, params=params)
            return [t for ch in stub.Generate(req, timeout=300) for t in ch.token_ids]

        jobs = [(rid, p) for p in prompts[:3] for rid in ("base", "ft")]
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            got = list(pool.map(lambda j: gen(*j), jobs))
        for (rid, prompt), tokens in zip(jobs, got, strict=True):
            assert tokens == hf_greedy(tiny_llama if rid == "base" else ft, prompt, NEW), rid
        assert hf_greedy(ft, prompts[0], NEW) != hf_greedy(tiny_llama, prompts[0], NEW)
        assert _cobatched(ports[0]) > 0  # leaders: replica.ReplicaEngine's hook
        assert _cobatched(ports[1]) > 0  # stage 1: the stage stream's hook
    finally:
        for a in agents:
            local_agents.stop_agent(a)
