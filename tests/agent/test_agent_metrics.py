"""The agent's Prometheus endpoint reports requests, tokens and KV state."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from tessera import local_agents
from tests.agent.test_agent_rpc import generate

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
