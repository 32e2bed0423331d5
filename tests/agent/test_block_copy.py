"""Block copy between agent processes over gRPC (LoadBlock with a source, FetchTensors).

The copies are made on agents that only see config.json (no weights on their disk), as
whole blocks and as sub-ranges of a hosted block, and served as a pipeline; greedy tokens
must equal `transformers`. Every failure is a status naming the cause.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.cli import local_agents
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent.engine import config
from tests.agent.test_agent_rpc import _code, _stub, generate, load_replica
from tests.conftest import hf_greedy

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]


def _config_only(model: Path, tmp_path: Path) -> Path:
    out = tmp_path / "config-only"
    out.mkdir()
    shutil.copy(model / "config.json", out / "config.json")
    return out


def _copy(
    to: local_agents.AgentProcess, model: Path, start: int, end: int, **kw: Any
) -> pb.LoadBlockReply:
    req: dict[str, Any] = {
        "model_path": str(model),
        "layer_start": start,
        "layer_end": end,
        "device": "cpu:0",
        "stage_index": 0,
        "num_stages": 1,
        "kv_bytes": 8 << 20,
    }
    req.update(kw)
    reply: pb.LoadBlockReply = _stub(to).LoadBlock(pb.LoadBlockRequest(**req), timeout=60)
    return reply


def _free_port_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_copied_blocks_serve_the_same_tokens_as_hf(
    agents_factory: Start, tiny_llama: Path, prompts: list[list[int]], tmp_path: Path
) -> None:
    a, b = agents_factory(2)
    load_replica([a], tiny_llama, [(0, 8)], replica_id="src")
    bare = _config_only(tiny_llama, tmp_path)
    src = pb.BlockSource(address=a.address, replica_id="src", stage_index=0)

    # a whole replica copied to an agent that has no weights on disk
    reply = _copy(b, bare, 0, 8, replica_id="whole", source=src)
    assert (reply.block.layer_start, reply.block.layer_end) == (0, 8)
    want = [hf_greedy(tiny_llama, p, 8) for p in prompts[:3]]
    assert [generate(b, p, "whole", max_tokens=8)[0] for p in prompts[:3]] == want

    # a 2-stage pipeline of sub-range copies: stage 1 onto the source agent itself
    _copy(a, bare, 5, 8, replica_id="piped", stage_index=1, num_stages=2, source=src)
    _copy(
        b,
        bare,
        0,
        5,
        replica_id="piped",
        num_stages=2,
        next_stage_address=a.address,
        source=src,
    )
    assert [generate(b, p, "piped", max_tokens=8)[0] for p in prompts[:3]] == want

    # re-issuing a copy is idempotent, and the copy survives the source's unload
    assert _copy(b, bare, 0, 8, replica_id="whole", source=src).already_loaded
    _stub(a).UnloadBlock(pb.UnloadBlockRequest(replica_id="src", stage_index=0))
    assert generate(b, prompts[0], "whole", max_tokens=8)[0] == want[0]


def test_copy_failures_are_statuses_naming_the_cause(
    agents_factory: Start, tiny_llama: Path, tmp_path: Path
) -> None:
    a, b = agents_factory(2)
    bare = _config_only(tiny_llama, tmp_path)
    tail = {"replica_id": "tail", "stage_index": 1, "num_stages": 2}
    _copy(a, tiny_llama, 4, 8, **tail)  # from a's own disk: the last stage, layers [4, 8)

    def copy(**source: Any) -> Callable[[], object]:
        src = {"address": a.address, "replica_id": "tail", "stage_index": 1, **source}
        return lambda: _copy(b, bare, 0, 8, replica_id="c", source=pb.BlockSource(**src))

    code, msg = _code(copy(replica_id="nope"))
    assert code == grpc.StatusCode.NOT_FOUND and "nope" in msg and a.address in msg
    code, msg = _code(copy())  # the source holds layers [4, 8) only
    assert code == grpc.StatusCode.NOT_FOUND
    assert "tensor not held: model.embed_tokens.weight" in msg and "[4, 8)" in msg
    code, msg = _code(copy(address=_free_port_address()))
    assert code == grpc.StatusCode.UNAVAILABLE and "unreachable" in msg
    code, msg = _code(copy(address=""))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "source.address" in msg
    # a block that cannot fit is refused before any transfer (the source is not even reachable)
    too_big = pb.BlockSource(address=_free_port_address(), replica_id="tail")
    code, msg = _code(
        lambda: _copy(b, bare, 0, 8, replica_id="c", kv_bytes=1 << 40, source=too_big)
    )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "KV cache" in msg
    # without a source, the config-only folder is not a checkpoint
    code, msg = _code(lambda: _copy(b, bare, 0, 8, replica_id="c"))
    assert code == grpc.StatusCode.NOT_FOUND and "model not found" in msg
    # FetchTensors itself
    fetch = _stub(a).FetchTensors
    cfg = config.ModelConfig.from_path(tiny_llama)
    name = "model.layers.5.mlp.up_proj.weight"
    req = pb.FetchTensorsRequest(replica_id="tail", stage_index=1, names=[name], chunk_bytes=1000)
    chunks = list(fetch(req, timeout=10))
    total = cfg.intermediate_size * cfg.hidden_size * 4
    assert [c.offset for c in chunks] == list(range(0, total, 1000))
    assert {(c.name, tuple(c.shape), c.total_bytes) for c in chunks} == {
        (name, (cfg.intermediate_size, cfg.hidden_size), total)
    }
    code, msg = _code(lambda: list(fetch(pb.FetchTensorsRequest(replica_id="tail", stage_index=1))))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "names" in msg
    # no failure left a half-loaded block behind
    assert not _stub(b).ListBlocks(pb.ListBlocksRequest()).blocks
