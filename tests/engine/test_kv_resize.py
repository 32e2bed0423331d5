"""A replica's KV pool shrinks and grows back mid-decode (issue 34: a transition on a
full device): the leader's allocator compacts held pages below the limit, every stage
copies those pages and releases the top of its pool, later the pool grows again. Two
pipeline stages, requests running and queued across both resizes; every greedy token
equals transformers'."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tessera_agent.engine import config as config_mod
from tessera_agent.engine import kv_cache, memory_shift, page_allocator, scheduler, stage
from tests.conftest import hf_greedy
from tests.engine.test_memory_shift import GREEDY, NEW, PAGE, _step

POOL = 32


def _load(path: Path, start: int, end: int, kv_bytes: int) -> stage.Stage:
    spec = stage.BlockSpec(
        str(path),
        start,
        end,
        replica_id="r",
        stage_index=int(start > 0),
        kv_bytes=kv_bytes,
        page_size=PAGE,
    )
    return stage.load_stage(spec, torch.device("cpu"), 1 << 30)


def test_shrink_and_grow_mid_decode_tokens_match_hf(
    tiny_llama: Path, prompts: list[list[int]]
) -> None:
    cfg = config_mod.ModelConfig.from_path(tiny_llama)
    per_page = kv_cache.KVLayout(4, 1, PAGE, cfg.num_kv_heads, cfg.head_dim).bytes_per_page
    stages = [_load(tiny_llama, 0, 4, POOL * per_page), _load(tiny_llama, 4, 8, POOL * per_page)]
    assert [s.num_pages for s in stages] == [POOL, POOL]
    chosen = [prompts[i] for i in (1, 3, 0, 4, 7, 2)]
    alloc = page_allocator.PageAllocator(POOL, PAGE, prefix_caching=False)
    sched = scheduler.Scheduler(
        alloc, scheduler.SchedulerConfig(max_model_len=cfg.max_positions, max_batched_tokens=64)
    )
    assert alloc.grow("filler", 12 * PAGE)  # low pages taken, so requests sit high
    for i, p in enumerate(chosen):
        sched.add(f"q{i}", p, GREEDY)
    sink: dict[str, list[int]] = {}
    while not any(len(v) >= 3 for v in sink.values()):
        _step(sched, stages, sink)
    alloc.free("filler")
    held = alloc.held_pages
    top = max(p for s in sched.running for p in alloc.block_table(s.seq_id))
    limit = held + 2
    if top < limit:
        pytest.skip("the running requests hold no page above the limit")
    with pytest.raises(ValueError):
        alloc.resize(held - 1)  # never below what the requests hold
    moves = alloc.resize(limit)
    assert moves and all(old >= limit > new for old, new in moves.items())
    for st in stages:
        memory_shift.resize_pool(st, moves, limit)
        assert st.num_pages == limit and st.kv_bytes == limit * per_page
        assert st.spec.kv_bytes == st.kv_bytes
    for _ in range(4):  # decode on the small pool (requests queue for memory)
        _step(sched, stages, sink)
    assert alloc.resize(POOL) == {}
    for st in stages:
        memory_shift.resize_pool(st, {}, POOL)
        assert st.num_pages == POOL
    while sched.has_work():
        _step(sched, stages, sink)
    out = [sink[f"q{i}"] for i in range(len(chosen))]
    assert out == [hf_greedy(tiny_llama, p, NEW) for p in chosen]
