"""The agent's Prometheus endpoint reports requests, tokens and KV state."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from tessera.cli import local_agents
from tessera.rpc.v1 import agent_pb2 as pb
from tests.agent.test_agent_rpc import _stub, generate

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics")


def test_metrics_endpoint(tiny_llama: Path) -> None:
    port = _free_port()
    agent = local_agents.start_agent("m", "cpu:1x512MiB", extra_args=["--metrics-port", str(port)])
    try:
        local_agents.load_pipeline([agent], str(tiny_llama), [(0, 8)], "r0")
        toks, reason = generate(agent, [0, 5, 6], max_tokens=5)
        assert len(toks) == 5 and reason == "length"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        local_agents.stop_agent(agent)
    assert _value(text, 'tessera_agent_generated_tokens_total{replica="r0"}') == 5
    assert _value(text, 'tessera_agent_prompt_tokens_total{replica="r0"}') == 3
    assert _value(text, 'tessera_agent_requests_total{outcome="length",replica="r0"}') == 1
    assert _value(text, 'tessera_agent_kv_pages_used{replica="r0"}') == 0
    assert _value(text, 'tessera_agent_kv_pages_total{replica="r0"}') > 0
    assert _value(text, 'tessera_agent_device_capacity_bytes{device="cpu:0"}') == 512 << 20
    assert _value(text, 'tessera_agent_replica_steps_total{replica="r0"}') >= 5


@pytest.mark.parametrize("caching", [True, False], ids=["prefix-caching", "no-prefix-caching"])
def test_prefix_cache_hits_are_counted_and_can_be_turned_off(
    tiny_llama: Path, caching: bool
) -> None:
    from tests.conftest import hf_greedy

    port = _free_port()
    extra = ["--metrics-port", str(port)] + ([] if caching else ["--no-prefix-caching"])
    agent = local_agents.start_agent("pc", "cpu:1x512MiB", extra_args=extra)
    prefix = [0, *range(100, 140)]  # 41 tokens: 2 full pages of 16
    prompts = [[*prefix, 7, 8], [*prefix, 9]]
    try:
        local_agents.load_pipeline([agent], str(tiny_llama), [(0, 8)], "r0")
        for p in prompts:  # one after the other: the second finds the first's pages
            assert generate(agent, p, max_tokens=6)[0] == hf_greedy(tiny_llama, p, 6)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        (kv,) = _stub(agent).Describe(pb.DescribeRequest()).kv
    finally:
        local_agents.stop_agent(agent)
    assert kv.prefix_hit_tokens == (32 if caching else 0)  # Describe says it too
    assert (kv.cached_pages > 0) == caching
    hits = _value(text, 'tessera_agent_prefix_cache_hit_tokens_total{replica="r0"}')
    assert hits == (32 if caching else 0)
    assert (_value(text, 'tessera_agent_prefix_cache_pages{replica="r0"}') > 0) == caching
