"""The agent's hosting, in process: generations side by side, rewire, refusals, memory.

`hosting.Hosting` is what the servicer delegates every load and unload to; these tests
drive it directly (no gRPC) on the tiny checkpoint, plus the one block ↔ proto
conversion and the validated per-load defaults.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
from pathlib import Path

import pytest

from tessera import blocks
from tessera.rpc import blocks as rpc_blocks
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import booking, devices, hosting, load_config
from tessera_agent.engine import errors, sampling
from tests.conftest import hf_greedy

MiB = 1 << 20


def _hosting(
    capacity: int = 256 * MiB, zoo: bool = True, gc_settle: bool = False
) -> tuple[hosting.Hosting, devices.Device]:
    dev = devices.Device("cpu:0", "cpu", "virtual CPU device", capacity)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    defaults = load_config.LoadDefaults(block_zoo=zoo, gc_settle=gc_settle)
    h = hosting.Hosting("a0", booking.Booking("a0", [dev]), defaults, pool)
    return h, dev


def _block(path: Path, replica: str, gen: int, **kw: object) -> blocks.Block:
    return blocks.Block(str(path), 0, 8, replica_id=replica, generation=gen, kv_bytes=8 * MiB, **kw)  # type: ignore[arg-type]


async def _greedy(h: hosting.Hosting, replica: str) -> list[int]:
    params = sampling.SamplingParams(max_tokens=5, ignore_eos=True)
    out = []
    async for ev in h.leader(replica).generate(f"{replica}-req", [3, 1, 4, 1], params):
        if ev.token is not None:
            out.append(ev.token)
    return out


def test_generations_coexist_then_the_old_one_is_freed(tiny_llama: Path) -> None:
    async def run() -> None:
        h, dev = _hosting()
        old = await h.load(_block(tiny_llama, "default.d.r0.g1", 1))
        assert old.how == "loaded" and dev.free_bytes < dev.capacity_bytes
        after_one = dev.free_bytes
        new = await h.load(_block(tiny_llama, "default.d.r0.g2", 2))
        assert new.how == "loaded" and dev.free_bytes < after_one
        # both serve transformers' greedy tokens, side by side
        want = hf_greedy(tiny_llama, [3, 1, 4, 1], 5)
        assert await _greedy(h, "default.d.r0.g1") == want
        assert await _greedy(h, "default.d.r0.g2") == want
        held = [(b.replica_id, b.generation, b.param_bytes > 0) for b, _ in h.held()]
        assert held == [("default.d.r0.g1", 1, True), ("default.d.r0.g2", 2, True)]
        await h.unload("default.d.r0.g1", 0)
        assert dev.free_bytes == after_one  # the old generation's bytes came back
        assert await _greedy(h, "default.d.r0.g2")
        with pytest.raises(errors.NotFoundError, match="no stage 0"):
            await h.unload("default.d.r0.g1", 0)
        await h.close()

    asyncio.run(run())


def test_same_block_again_rewire_and_refusals(tiny_llama: Path) -> None:
    async def run() -> None:
        h, _ = _hosting()
        first = _block(tiny_llama, "x.g1", 1, num_stages=2, next_address="")
        with pytest.raises(errors.InvalidArgumentError, match="num_stages"):
            await h.load(dataclasses.replace(first, end=8))  # stage 0 of 2 ends the model
        stage0 = dataclasses.replace(first, end=4, next_address="127.0.0.1:1")
        assert (await h.load(stage0)).how == "loaded"
        assert (await h.load(stage0)).how == "already loaded"
        moved = dataclasses.replace(stage0, next_address="127.0.0.1:2")
        assert (await h.load(moved)).how == "rewired"
        assert h.get("x.g1", 0).next_address == "127.0.0.1:2"
        with pytest.raises(errors.FailedPreconditionError, match="new replica id"):
            await h.load(dataclasses.replace(stage0, end=5))
        with pytest.raises(errors.InvalidArgumentError, match="tp_size"):
            await h.load(dataclasses.replace(stage0, replica_id="y.g1", tp_size=2))
        with pytest.raises(errors.NotFoundError, match="cuda:7"):
            await h.load(dataclasses.replace(stage0, replica_id="z.g1", device="cuda:7"))
        await h.close()

    asyncio.run(run())


def test_a_second_generation_that_does_not_fit_is_refused(tiny_llama: Path) -> None:
    async def run() -> None:
        # without the block zoo: with it, the same checkpoint's second copy shares every
        # parameter and fits (tests/variants/test_block_zoo.py)
        h, dev = _hosting(capacity=48 * MiB, zoo=False)
        await h.load(_block(tiny_llama, "d.r0.g1", 1))
        with pytest.raises(errors.ResourceExhaustedError):
            await h.load(_block(tiny_llama, "d.r0.g2", 2))
        assert [b.replica_id for b, _ in h.held()] == ["d.r0.g1"]  # nothing half-loaded
        assert len(dev.used) == 1
        await h.close()

    asyncio.run(run())


def test_block_proto_round_trip() -> None:
    b = blocks.Block(
        "/m",
        2,
        6,
        replica_id="ns.d.r1.g3",
        stage_index=1,
        device="cuda:1",
        dtype="bfloat16",
        kv_bytes=5,
        page_size=32,
        num_stages=3,
        next_address="h:9",
        generation=3,
        tp_size=2,
        tp_rank=1,
        param_bytes=7,
    )
    assert rpc_blocks.from_proto(rpc_blocks.to_proto(b)) == b
    req = rpc_blocks.load_request(b)
    assert rpc_blocks.from_load_request(req) == dataclasses.replace(b, param_bytes=0)
    # an old client's request (no generation, no tp fields) reads as generation 0, tp 1/0
    bare = rpc_blocks.from_load_request(pb.LoadBlockRequest(model_path="/m", layer_end=8))
    assert (bare.generation, bare.tp_size, bare.tp_rank, bare.dtype) == (0, 1, 0, "auto")
    assert blocks.parse_replica_id("ns.d.r1.g3") == blocks.ReplicaName("ns.d", "r1", 3)
    assert blocks.parse_replica_id("r0") == blocks.ReplicaName("", "r0", 0)
    with pytest.raises(ValueError, match="tp"):
        blocks.Block("/m", 0, 1, tp_size=2, tp_rank=2)


def test_load_defaults_are_validated() -> None:
    with pytest.raises(ValueError, match="dtype"):
        load_config.LoadDefaults(dtype="int8")
    with pytest.raises(ValueError, match="max_num_seqs"):
        load_config.LoadDefaults(max_num_seqs=0)
    req = pb.LoadBlockRequest(model_path="/m", layer_end=8)
    got = rpc_blocks.from_load_request(req, dtype="float16", page_size=8)
    assert (got.dtype, got.page_size) == ("float16", 8)


def test_cost_profile_sets_the_lookahead_cost(tmp_path: Path) -> None:
    """An agent's `--cost-profile` (a `tessera profile` JSON) gives lookahead's Eq. 1;
    none gives the documented default; a bad file is a clear error."""
    import json

    from tessera.cost import analytic
    from tessera.planner import manifest
    from tessera.policies.overload import lookahead, microbatch
    from tessera_agent import server

    examples = Path(__file__).resolve().parents[2] / "examples"
    shape = manifest.read_model_shape(examples / "models" / "llama-2-13b", "llama-2-13b")
    prof = analytic.analytic_profile(shape, "a100-80gb")
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(prof.to_json()))
    assert server.split_config(str(path)).cost == lookahead.cost_from_profile(prof, 1)
    assert server.split_config("").cost == microbatch.DEFAULT_COST
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="cost_profile"):
        server.split_config(str(tmp_path / "bad.json"))


def test_the_heap_is_frozen_after_a_load_and_a_dropped_stage_is_freed(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In an agent process (`LoadDefaults.gc_settle`), a load ends with the heap frozen, so the
    collector's full passes skip it while serving; the unloaded stage does not outlive the
    unload (that a reclaiming settle collects frozen cycles: tests/core/test_gc_heap.py)."""
    import gc
    import weakref

    async def run() -> None:
        h, _ = _hosting(gc_settle=True)
        done = await h.load(_block(tiny_llama, "default.d.r0.g1", 1))
        model = weakref.ref(done.hosted.stage.runner.model)
        del done
        assert gc.get_freeze_count() > 0  # settled before the load answered
        await h.unload("default.d.r0.g1", 0)
        await asyncio.sleep(0)  # the reclaiming settle runs once unload's frame is gone
        assert model() is None
        await h.close()

    try:
        asyncio.run(run())
    finally:
        gc.unfreeze()
