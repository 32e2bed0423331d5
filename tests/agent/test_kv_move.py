"""Moving a request's KV prefix between replicas with different stage splits.

A request runs on a 2-stage replica; its K/V prefix moves to a single-stage replica on
another agent, and from there to a differently split pipeline. Continuing the request
on each target (prompt = tokens so far) must give transformers' greedy tokens while the
target reports the moved prefix as prefix-cache hits: the imported K/V is what it used.
The K/V travel agent to agent over gloo (the data plane) when both agents serve a
rendezvous store, and through the client on the gRPC streams when asked to or when the
group cannot form.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from tessera.cli import local_agents
from tessera.control import kv_move
from tessera.rpc.v1 import agent_pb2 as pb
from tests.agent.test_agent_rpc import _code, _stub, generate, load_replica
from tests.conftest import hf_greedy

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]


def _refs(
    agents: list[local_agents.AgentProcess], replica_id: str, splits: list[tuple[int, int]]
) -> list[kv_move.StageRef]:
    return [
        kv_move.StageRef(a.address, replica_id, i, s, e)
        for i, (a, (s, e)) in enumerate(zip(agents, splits, strict=True))
    ]


def _hits(agent: local_agents.AgentProcess, replica_id: str) -> int:
    kv = _stub(agent).Describe(pb.DescribeRequest()).kv
    return next(int(k.prefix_hit_tokens) for k in kv if k.replica_id == replica_id)


def test_prefix_moves_across_different_splits_and_gives_hf_tokens(
    agents_factory: Start, tiny_llama: Path
) -> None:
    a, b, c = agents_factory(3)
    load_replica([a, b], tiny_llama, [(0, 3), (3, 8)], "src")
    load_replica([c], tiny_llama, [(0, 8)], "one")
    load_replica([c, a], tiny_llama, [(0, 6), (6, 8)], "piped")
    prompt = [0, *range(300, 340)]  # 41 tokens
    want = hf_greedy(tiny_llama, prompt, 30)
    first, _ = generate(a, prompt, "src", max_tokens=20)
    assert first == want[:20]
    so_far = prompt + first  # 61 tokens: 3 full pages cached on "src"

    moved = asyncio.run(
        kv_move.move_prefix(
            so_far, _refs([a, b], "src", [(0, 3), (3, 8)]), _refs([c], "one", [(0, 8)]), tls=None
        )
    )
    assert (moved.tokens, moved.pages, moved.layers) == (48, 3, 8)
    assert moved.transport == "gloo"  # agent to agent over the data plane
    rest, _ = generate(c, so_far, "one", max_tokens=5)
    assert rest == want[20:25]
    assert _hits(c, "one") == 48  # the moved pages were used, not recomputed

    # onward, from the single-stage replica to a pipeline split differently again, over
    # the gRPC streams (the fallback)
    moved = asyncio.run(
        kv_move.move_prefix(
            so_far,
            _refs([c], "one", [(0, 8)]),
            _refs([c, a], "piped", [(0, 6), (6, 8)]),
            via="grpc",
            tls=None,
        )
    )
    assert moved.tokens == 48 and moved.transport == "grpc"
    rest, _ = generate(c, so_far, "piped", max_tokens=5)
    assert rest == want[20:25] and _hits(c, "piped") == 48
    # every hold was released: no pages stay used on any leader
    for agent, rid in ((a, "src"), (c, "one"), (c, "piped")):
        kv = _stub(agent).Describe(pb.DescribeRequest()).kv
        assert next(k.pages_used for k in kv if k.replica_id == rid) == 0

    # nothing cached for these tokens: nothing moves
    nothing = asyncio.run(
        kv_move.move_prefix(
            [0, *range(400, 450)],
            _refs([c], "one", [(0, 8)]),
            _refs([a, b], "src", [(0, 3), (3, 8)]),
            tls=None,
        )
    )
    assert nothing == kv_move.Moved(0, 0, 0)


def test_kv_move_falls_back_to_grpc_when_no_group_forms(
    agents_factory: Start, tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both agents are told to use NCCL, which cannot form on CPU agents: each end fails
    its group at once (UNAVAILABLE), the move goes over gRPC instead, and the continued
    request still gives transformers' tokens from the moved pages."""
    a, b = agents_factory(2)
    load_replica([a], tiny_llama, [(0, 8)], "src")
    load_replica([b], tiny_llama, [(0, 8)], "dst")
    prompt = [0, *range(100, 140)]
    want = hf_greedy(tiny_llama, prompt, 25)
    first, _ = generate(a, prompt, "src", max_tokens=20)
    so_far = prompt + first
    real = kv_move._plane

    async def cuda(stub: object, ref: kv_move.StageRef, timeout: float) -> tuple[str, str]:
        store, _ = await real(stub, ref, timeout)  # type: ignore[arg-type]
        return store, "cuda"

    monkeypatch.setattr(kv_move, "_plane", cuda)
    moved = asyncio.run(
        kv_move.move_prefix(
            so_far, _refs([a], "src", [(0, 8)]), _refs([b], "dst", [(0, 8)]), timeout=20, tls=None
        )
    )
    assert (moved.tokens, moved.transport) == (48, "grpc")
    rest, _ = generate(b, so_far, "dst", max_tokens=5)
    assert rest == want[20:25] and _hits(b, "dst") == 48


def test_kv_move_errors_name_the_cause(agents_factory: Start, tiny_llama: Path) -> None:
    (a,) = agents_factory(1)
    load_replica([a], tiny_llama, [(0, 8)], "r", kv_bytes=4 << 20)
    stub = _stub(a)
    code, msg = _code(lambda: stub.PinPrefix(pb.PinPrefixRequest(replica_id="nope")))
    assert code == grpc.StatusCode.NOT_FOUND and "nope" in msg
    code, msg = _code(
        lambda: stub.ReservePages(pb.ReservePagesRequest(replica_id="r", num_pages=10**6))
    )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "reserve" in msg
    code, msg = _code(lambda: stub.CommitPrefix(pb.CommitPrefixRequest(replica_id="r", pin_id="x")))
    assert code == grpc.StatusCode.NOT_FOUND and "pin" in msg
    code, msg = _code(
        lambda: list(stub.ExportKV(pb.ExportKVRequest(replica_id="r", page_ids=[10**6])))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "outside" in msg
    code, msg = _code(
        lambda: list(
            stub.ExportKV(
                pb.ExportKVRequest(replica_id="r", page_ids=[0], layer_start=8, layer_end=9)
            )
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "layer 8" in msg
    pin = stub.ReservePages(pb.ReservePagesRequest(replica_id="r", num_pages=1))
    bad = pb.KVLayer(layer=0, k=pb.Tensor(shape=[1], dtype="float32", data=bytes(4)))
    msgs = [
        pb.KVImportMessage(header=pb.KVImportHeader(replica_id="r", page_ids=list(pin.page_ids))),
        pb.KVImportMessage(layer=bad),
    ]
    code, msg = _code(lambda: stub.ImportKV(iter(msgs)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "shape" in msg
    stub.ReleasePin(pb.ReleasePinRequest(replica_id="r", pin_id=pin.pin_id))
    (kv,) = stub.Describe(pb.DescribeRequest()).kv
    assert kv.pages_used == 0
    # an unreachable target: the move fails naming the step, and the source pin is released
    load_replica([a], tiny_llama, [(0, 8)], "s", kv_bytes=4 << 20)
    prompt = [0, *range(300, 340)]
    generate(a, prompt, "s", max_tokens=2)
    with pytest.raises(kv_move.MoveError, match="reserve pages on the target"):
        asyncio.run(
            kv_move.move_prefix(
                prompt,
                [kv_move.StageRef(a.address, "s", 0, 0, 8)],
                [kv_move.StageRef(a.address, "missing", 0, 0, 8)],
                tls=None,
            )
        )
    kv = stub.Describe(pb.DescribeRequest()).kv
    assert all(k.pages_used == 0 for k in kv)
