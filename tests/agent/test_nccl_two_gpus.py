"""Block copy and KV move between two agents on two GPUs, over NCCL.

Agent A serves `cuda:0`, agent B `cuda:1`. B copies A's whole block (LoadBlock with a
source: `transfer/block_copy.py` picks NCCL when both ends are CUDA), then a request's K/V
prefix moves from A's replica to B's (`control/kv_move.py`, NCCL likewise). Continuing
on B must give `transformers`' greedy tokens (float32) from the moved pages. Skipped, with
the reason, on a machine with fewer than two GPUs; it needs no change to run on two.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from tessera.cli import local_agents
from tessera.control import kv_move
from tessera.rpc.v1 import agent_pb2 as pb
from tests.agent.test_agent_rpc import _stub, generate
from tests.conftest import hf_greedy

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        GPUS < 2, reason=f"needs 2 CUDA devices for two NCCL ranks ({GPUS} on this machine)"
    ),
]


@pytest.fixture
def two_gpu_agents():  # type: ignore[no-untyped-def]  # pragma: no cover - no GPU in CI
    started = [local_agents.start_agent(f"gpu-{i}", f"cuda:{i}", 1) for i in range(2)]
    yield started
    for a in started:
        local_agents.stop_agent(a)


def test_block_copy_and_kv_move_over_nccl(  # pragma: no cover - no GPU in CI
    two_gpu_agents: list[local_agents.AgentProcess], tiny_llama: Path
) -> None:
    a, b = two_gpu_agents
    local_agents.load_pipeline([a], str(tiny_llama), [(0, 8)], "src", device="cuda:0")
    prompt = [0, *range(100, 140)]
    want = hf_greedy(tiny_llama, prompt, 25)

    # block copy: B loads the whole block from A's GPU
    src = pb.BlockSource(address=a.address, replica_id="src", stage_index=0)
    _stub(b).LoadBlock(
        pb.LoadBlockRequest(
            model_path=str(tiny_llama),
            layer_start=0,
            layer_end=8,
            device="cuda:1",
            replica_id="dst",
            stage_index=0,
            num_stages=1,
            kv_bytes=32 << 20,
            source=src,
        ),
        timeout=120,
    )
    assert any("over nccl" in line for line in b.output), b.output[-20:]
    other = [0, *range(200, 230)]  # not a prefix of `prompt`: B caches nothing of it
    assert generate(b, other, "dst", max_tokens=8)[0] == hf_greedy(tiny_llama, other, 8)

    # KV move: the prefix computed on A continues on B from the moved pages
    first, _ = generate(a, prompt, "src", max_tokens=20)
    assert first == want[:20]
    so_far = prompt + first
    moved = asyncio.run(
        kv_move.move_prefix(
            so_far,
            [kv_move.StageRef(a.address, "src", 0, 0, 8)],
            [kv_move.StageRef(b.address, "dst", 0, 0, 8)],
            timeout=60,
            tls=None,
        )
    )
    assert (moved.tokens, moved.transport) == (48, "nccl")
    rest, _ = generate(b, so_far, "dst", max_tokens=5)
    assert rest == want[20:25]
    hits = _stub(b).Describe(pb.DescribeRequest()).kv
    assert next(int(k.prefix_hit_tokens) for k in hits if k.replica_id == "dst") == 48
