"""A block loaded in parts (issue 11): a peer over the data plane, this agent, storage.

`LoadBlock` with `switch_sources` gathers one block's parameters from a peer agent, from a
block the loading agent already hosts (in memory) and from the checkpoint; the result
serves `transformers`' greedy tokens. A part naming units past the model is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from tessera.cli import local_agents
from tessera.rpc.v1 import agent_pb2 as pb
from tests.agent.test_agent_rpc import _code, generate, load_replica
from tests.agent.test_block_copy import _copy
from tests.conftest import hf_greedy

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]


def test_block_from_a_peer_this_agent_and_storage_serves_hf_tokens(
    agents_factory: Start, tiny_llama: Path, prompts: list[list[int]]
) -> None:
    a, b = agents_factory(2)
    load_replica([a], tiny_llama, [(0, 8)], replica_id="src")
    _copy(b, tiny_llama, 4, 8, replica_id="tail", stage_index=1, num_stages=2)
    peer = pb.BlockSource(address=a.address, replica_id="src", stage_index=0)
    local = pb.BlockSource(address=b.address, replica_id="tail", stage_index=1, transport="local")
    parts = [
        pb.SwitchSource(source=peer, unit_start=0, unit_end=5),  # embedding, layers 0-3
        pb.SwitchSource(source=local, unit_start=5, unit_end=7),  # layers 4-5, in memory
        # layers 6-7 and the head: no part names them, so they come from storage
    ]
    reply = _copy(b, tiny_llama, 0, 8, replica_id="mixed", switch_sources=parts)
    assert (reply.block.layer_start, reply.block.layer_end) == (0, 8)
    want = [hf_greedy(tiny_llama, p, 8) for p in prompts[:2]]
    assert [generate(b, p, "mixed", max_tokens=8)[0] for p in prompts[:2]] == want

    bad = [pb.SwitchSource(source=peer, unit_start=0, unit_end=11)]
    code, details = _code(lambda: _copy(b, tiny_llama, 0, 8, replica_id="bad", switch_sources=bad))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "units [0, 11)" in details
