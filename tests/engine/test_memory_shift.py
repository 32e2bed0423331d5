"""Parameters and KV share one budget: dropping layers grows the KV pool of a running block.

The KunServe drop of two whole-model replicas into one 2-stage pipeline, in process and
mid-decode: replica A keeps layers [0, 4), its peer B keeps [4, 8); the running requests'
K/V of layers 4-7 is copied from A to B first; both pools grow by exactly the bytes freed;
the allocator gains pages while the running requests keep theirs; requests that were
queued for memory start. Then the restore, mid-decode again: held pages are compacted
below the original pool, A takes layers 4-7 back from B with the running requests' KV,
and both pools return to their original size. Every request's greedy tokens equal
transformers'.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tessera_agent.engine import config as config_mod
from tessera_agent.engine import (
    kv_cache,
    memory_shift,
    page_allocator,
    sampling,
    scheduler,
    stage,
    step,
)
from tests.conftest import hf_greedy

NEW = 12
PAGE = 4
POOL_PAGES = 16  # 64 tokens: two of the prompts below at a time
GREEDY = sampling.SamplingParams(max_tokens=NEW, ignore_eos=True)


def _load(path: Path, kv_bytes: int, rid: str) -> stage.Stage:
    spec = stage.BlockSpec(str(path), 0, 8, replica_id=rid, kv_bytes=kv_bytes, page_size=PAGE)
    return stage.load_stage(spec, torch.device("cpu"), 1 << 30)


def _step(sched: scheduler.Scheduler, stages: list[stage.Stage], sink: dict[str, list[int]]) -> int:
    """One engine step through the pipeline: schedule, run every stage, postprocess;
    sampled tokens land in `sink`."""
    planned = sched.schedule()
    assert planned is not None
    inp = planned.input
    out = step.StepOutput(step_id=inp.step_id)
    for st in stages:
        out = st.runner.execute(inp)
        inp = step.next_stage_input(inp, out)
    for ev in sched.postprocess(planned, out.sampled, out.logprobs):
        if ev.token is not None:
            sink.setdefault(ev.seq_id, []).append(ev.token)
    return len(planned.seqs)


def test_drop_and_restore_mid_decode_tokens_match_hf(
    tiny_llama: Path, prompts: list[list[int]]
) -> None:
    cfg = config_mod.ModelConfig.from_path(tiny_llama)
    per_page = kv_cache.KVLayout(8, 1, PAGE, cfg.num_kv_heads, cfg.head_dim).bytes_per_page
    a = _load(tiny_llama, POOL_PAGES * per_page, "a")
    b = _load(tiny_llama, POOL_PAGES * per_page, "b")  # the peer replica, idle here
    assert a.num_pages == b.num_pages == POOL_PAGES
    budget_a = a.param_bytes + a.kv_bytes  # the device budget the block books

    chosen = [prompts[i] for i in (1, 3, 0, 4, 7)]  # 18, 41, 4, 10, 24 tokens
    alloc = page_allocator.PageAllocator(POOL_PAGES, PAGE, prefix_caching=False)
    sched = scheduler.Scheduler(
        alloc, scheduler.SchedulerConfig(max_model_len=cfg.max_positions, max_batched_tokens=64)
    )
    for i, p in enumerate(chosen):
        sched.add(f"q{i}", p, GREEDY)

    sink: dict[str, list[int]] = {}
    # Whole-model execution on A until requests are decoding while others wait for memory.
    for _ in range(6):
        _step(sched, [a], sink)
    running = [s for s in sched.running if s.num_computed]
    assert running and sched.waiting, "the pool should be full with a queue behind it"
    decoding = [s for s in running if s.output]
    assert decoding, "some request should be mid-decode at the drop"
    tables = {s.seq_id: list(alloc.block_table(s.seq_id)) for s in running}
    before_wait = len(sched.waiting)

    # Exchange: the running requests' K/V of layers 4-7 goes from A to B (same page ids).
    for s in running:
        for layer in range(4, 8):
            k, v = a.runner.cache.export_sequence(layer, tables[s.seq_id], s.num_computed)
            b.runner.cache.import_sequence(layer, tables[s.seq_id], k, v)
    shift_a = memory_shift.drop_layers(a, 0, 4)
    shift_b = memory_shift.drop_layers(b, 4, 8)

    # Accounting: every freed parameter byte and the dropped layers' KV became pages.
    for sh, st in ((shift_a, a), (shift_b, b)):
        assert sh.freed_param_bytes > 0 and sh.pages_before == POOL_PAGES
        half = kv_cache.KVLayout(4, 1, PAGE, cfg.num_kv_heads, cfg.head_dim).bytes_per_page
        assert sh.pages_after == (sh.kv_bytes_before + sh.freed_param_bytes) // half
        assert sh.pages_after > 2 * POOL_PAGES  # half the layers' KV alone doubles the pages
        assert st.param_bytes + st.kv_bytes <= budget_a  # still within the device budget
    assert a.param_bytes + shift_a.freed_param_bytes + shift_a.kv_bytes_before == budget_a
    assert a.runner.model.is_first and not a.runner.model.is_last
    assert b.runner.model.is_last and not b.runner.model.is_first
    assert a.tensor_names()[-1].startswith("model.layers.3.")

    alloc.add_pages(memory_shift.allocator_target([a, b]) - alloc.num_pages)
    assert alloc.num_pages == min(shift_a.pages_after, shift_b.pages_after)
    for s in running:  # running requests keep their pages
        assert list(alloc.block_table(s.seq_id)) == tables[s.seq_id]

    # Cooperative execution as a 2-stage pipeline: queued requests start at once.
    _step(sched, [a, b], sink)
    assert len(sched.waiting) < before_wait
    while sched.waiting or alloc.used_pages > POOL_PAGES:
        _step(sched, [a, b], sink)
    running = list(sched.running)
    assert running and any(len(s.output) < NEW for s in running), "restore mid-decode"
    assert max(p for s in running for p in alloc.block_table(s.seq_id)) >= POOL_PAGES

    # Restore: A takes [4, 8) back (from B's weights) and becomes a whole replica again,
    # serving the running requests; its pool returns to exactly the pages it had.
    assert memory_shift.restored_pages(a, 0, 8) == POOL_PAGES
    moves = alloc.compact(POOL_PAGES)  # held pages move below the smaller pool
    assert moves and all(old >= POOL_PAGES > new for old, new in moves.items())
    memory_shift.move_pages(a, moves)
    memory_shift.move_pages(b, moves)
    names = b.tensor_names()
    back = memory_shift.restore_layers(a, 0, 8, {n: b.tensor(n) for n in names})
    assert back.pages_after == POOL_PAGES and a.kv_bytes == POOL_PAGES * per_page
    assert a.param_bytes + a.kv_bytes == budget_a  # the same budget, as accounted
    assert a.runner.model.is_first and a.runner.model.is_last
    for s in running:  # each running request's KV of layers 4-7 comes home from B
        table = list(alloc.block_table(s.seq_id))
        for local in range(4):
            k, v = b.runner.cache.export_sequence(local, table, s.num_computed)
            a.runner.cache.import_sequence(4 + local, table, k, v)
    b_back = memory_shift.restore_layers(b, 0, 8)  # B whole again, from the checkpoint
    assert b_back.pages_after == POOL_PAGES
    while sched.has_work():
        _step(sched, [a], sink)
    out = [sink[f"q{i}"] for i in range(len(chosen))]
    assert out == [hf_greedy(tiny_llama, p, NEW) for p in chosen]


def test_grow_pool_keeps_pages_and_contents(tiny_llama: Path) -> None:
    cfg = config_mod.ModelConfig.from_path(tiny_llama)
    per_page = kv_cache.KVLayout(8, 1, PAGE, cfg.num_kv_heads, cfg.head_dim).bytes_per_page
    st = _load(tiny_llama, 4 * per_page, "c")
    k0 = st.runner.cache.k[0]
    k0[:PAGE].fill_(1.5)
    added = memory_shift.grow_pool(st, 3 * per_page + per_page // 2)
    assert added == 3 and st.num_pages == 7 and st.kv_bytes == 7 * per_page
    assert st.runner.cache.k[0] is k0 and k0.shape[0] == 7 * PAGE  # same tensor, grown
    assert bool((k0[:PAGE] == 1.5).all()) and bool((k0[4 * PAGE :] == 0).all())
    alloc = page_allocator.PageAllocator(4, PAGE)
    assert alloc.grow("x", 4 * PAGE)
    alloc.add_pages(added)
    assert alloc.free_pages == 3 and alloc.grow("y", 3 * PAGE)
    assert set(alloc.block_table("y")) == {4, 5, 6}


def test_replica_engine_gains_pages_while_requests_run(
    tiny_llama: Path, prompts: list[list[int]]
) -> None:
    """Through the asyncio replica engine: the pool grows on the compute thread between
    steps while requests decode, the allocator follows, and every request finishes with
    transformers' tokens on more pages than it started with."""
    import asyncio
    import concurrent.futures

    from tessera_agent.engine import replica

    cfg = config_mod.ModelConfig.from_path(tiny_llama)
    per_page = kv_cache.KVLayout(8, 1, PAGE, cfg.num_kv_heads, cfg.head_dim).bytes_per_page
    st = _load(tiny_llama, POOL_PAGES * per_page, "d")
    chosen = [prompts[i] for i in (1, 3, 0, 4, 7)]
    pool = concurrent.futures.ThreadPoolExecutor(1)
    sched_cfg = scheduler.SchedulerConfig(
        max_model_len=cfg.max_positions, max_batched_tokens=64, prefix_caching=False
    )
    eng = replica.ReplicaEngine(st.runner, pool, sched_cfg)

    async def main() -> tuple[list[list[int]], list[replica.ReplicaStats]]:
        outs: list[list[int]] = [[] for _ in chosen]
        seen: list[replica.ReplicaStats] = []

        async def one(i: int) -> None:
            async for ev in eng.generate(f"q{i}", chosen[i], GREEDY):
                if ev.token is not None:
                    outs[i].append(ev.token)

        async def grow_when_decoding() -> None:
            while not any(outs):
                await asyncio.sleep(0.005)
            seen.append(eng.stats())
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(pool, memory_shift.grow_pool, st, 48 * per_page)
            assert eng.add_pages(st.num_pages) == 48
            seen.append(eng.stats())

        await asyncio.gather(*(one(i) for i in range(len(chosen))), grow_when_decoding())
        await eng.close()
        return outs, seen

    try:
        outs, seen = asyncio.run(main())
    finally:
        pool.shutdown()
    before, after = seen
    assert before.kv_pages_total == POOL_PAGES and after.kv_pages_total == POOL_PAGES + 48
    assert before.waiting > 0 and before.running > 0  # grown mid-run, with a queue
    assert outs == [hf_greedy(tiny_llama, p, NEW) for p in chosen]


def test_compact_moves_held_and_shared_pages_below_the_limit() -> None:
    alloc = page_allocator.PageAllocator(8, 2)
    alloc.add_pages(4)  # a drop grew the pool to 12
    assert alloc.grow("filler", 16)  # pages 0-7
    assert alloc.grow("a", 4)  # pages 8, 9
    alloc.register("a", [1, 2, 3, 4], 4)  # both full pages cached
    assert alloc.share_prefix("b", [1, 2, 3, 4, 5]) == 4  # b shares 8, 9
    assert alloc.grow("b", 6)  # and owns 10
    alloc.free("filler")
    moves = alloc.compact(6)
    assert alloc.num_pages == 6 and set(moves) == {8, 9, 10}
    assert all(new < 6 for new in moves.values())
    assert alloc.block_table("a") == [moves[8], moves[9]]
    assert alloc.block_table("b") == [moves[8], moves[9], moves[10]]
    assert alloc.share_prefix("c", [1, 2, 3, 4, 9]) == 4  # the cache follows the move
    assert alloc.block_table("c") == [moves[8], moves[9]]
    assert alloc.free_pages == 3 and alloc.used_pages == 3
    with_held = page_allocator.PageAllocator(4, 2)
    assert with_held.grow("x", 8)
    with pytest.raises(ValueError, match="4 are held"):
        with_held.compact(3)


def test_drop_then_restore_any_range_with_tied_head(
    tiny_llama3_sharded: Path, prompts: list[list[int]]
) -> None:
    """A block drops to its first, last or middle layers and restores from the checkpoint
    (tied embeddings: the head shares the embedding again); it then serves as before."""
    from tests.engine import helpers

    for keep in ((0, 2), (2, 4), (1, 3)):
        (st,) = helpers.load(tiny_llama3_sharded, [(0, 4)], kv_bytes=1 << 20)
        pages, params = st.num_pages, st.param_bytes
        memory_shift.drop_layers(st, *keep)
        assert st.num_pages > pages and st.param_bytes < params
        memory_shift.restore_layers(st, 0, 4)
        assert (st.num_pages, st.param_bytes) == (pages, params)
        model = st.runner.model
        assert model.lm_head is not None and model.embed_tokens is not None
        assert model.lm_head.weight is model.embed_tokens.weight
        out, _ = helpers.run([st], prompts[:2], GREEDY)
        assert out == [hf_greedy(tiny_llama3_sharded, p, NEW) for p in prompts[:2]], keep
