"""Prefix caching: the allocator's bookkeeping, and tokens unchanged by cache hits.

Unit tests pin the page accounting (sharing, reference counts, the last token always
computed, LRU eviction, exact prefix keys). Oracle tests: prompts that share prefixes get
transformers' greedy tokens on one stage and on a pipeline, whether they hit the cache,
run at once, or evict each other from a small pool.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tessera_agent.engine import kv_cache, page_allocator, sampling
from tests.conftest import hf_greedy
from tests.engine import helpers

PS = 4
GREEDY = sampling.SamplingParams(max_tokens=8, ignore_eos=True)


def _computed(a: page_allocator.PageAllocator, seq: str, tokens: list[int]) -> None:
    assert a.grow(seq, len(tokens))
    a.register(seq, tokens, len(tokens))


def test_full_pages_are_shared_and_the_last_token_is_always_computed() -> None:
    a = page_allocator.PageAllocator(8, PS)
    first = list(range(10))  # pages [0-3] [4-7] full, [8-9] partial
    _computed(a, "a", first)
    assert a.cached_pages == 2
    assert a.share_prefix("b", [*range(8), 99, 98]) == 8  # both full pages
    assert a.block_table("b") == a.block_table("a")[:2]
    assert a.share_prefix("c", list(range(8))) == 4  # 8 tokens: the last page is recomputed
    assert a.share_prefix("d", [0, 1, 2, 7, 4]) == 0  # differs inside the first page
    assert a.share_prefix("b", first) == 0  # b already has pages
    before = a.free_pages
    a.free("a")  # b and c still hold the shared pages; a's partial page is free again
    assert a.free_pages == before + 1 and a.cached_pages == 2
    a.free("b")
    a.free("c")
    assert a.free_pages == 8 and a.used_pages == 0 and a.cached_pages == 2


def test_keys_name_the_whole_prefix_not_just_the_page() -> None:
    a = page_allocator.PageAllocator(8, PS)
    _computed(a, "a", [1, 1, 1, 1, 2, 2, 2, 2, 0])
    a.free("a")
    # same second page after a different first page: no hit for it
    assert a.share_prefix("b", [3, 3, 3, 3, 2, 2, 2, 2, 0]) == 0
    assert a.share_prefix("c", [1, 1, 1, 1, 2, 2, 2, 2, 5]) == 8


def test_cached_pages_are_evicted_least_recently_released_first() -> None:
    a = page_allocator.PageAllocator(4, PS)
    _computed(a, "x", [1] * 4 + [0])  # page for [1]*4 cached, partial page freed
    _computed(a, "y", [2] * 4 + [0])
    a.free("x")
    a.free("y")
    assert a.free_pages == 4 and a.cached_pages == 2
    assert a.grow("z", 12)  # 3 pages: 2 fresh, then evicts x's (released first)
    assert a.cached_pages == 1
    assert a.share_prefix("p", [1] * 4 + [0]) == 0
    assert a.share_prefix("q", [2] * 4 + [0]) == 4
    assert not a.grow("r", 4)  # q holds the last cached page, z the rest
    a.free("q")
    assert a.grow("r", 4) and a.cached_pages == 0


def test_disabled_caches_nothing() -> None:
    a = page_allocator.PageAllocator(4, PS, prefix_caching=False)
    _computed(a, "a", list(range(9)))
    a.free("a")
    assert a.cached_pages == 0 and a.share_prefix("b", list(range(9))) == 0


def _prompts(n: int, shared: int, tail: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    prefix = [0, *torch.randint(5, 500, (shared - 1,), generator=g).tolist()]
    return [prefix + torch.randint(5, 500, (tail + i,), generator=g).tolist() for i in range(n)]


def test_hits_give_hf_tokens_on_one_stage_and_a_pipeline(tiny_llama: Path) -> None:
    prompts = _prompts(4, shared=40, tail=3)
    want = [hf_greedy(tiny_llama, p, 8) for p in prompts]
    for splits in ([(0, 8)], [(0, 3), (3, 8)]):
        stages = helpers.load(tiny_llama, splits)
        # the first request's prefill registers its pages long before the others arrive
        out, eng = helpers.run(stages, prompts, GREEDY, delays=[0, 1.0, 1.0, 1.0])
        assert out == want
        assert eng.stats().prefix_hit_tokens == 3 * 32  # 2 full pages of 16 each, 3 times


def test_small_pool_shared_prefixes_and_preemption_keep_hf_tokens(tiny_llama: Path) -> None:
    per_page = kv_cache.KVLayout(4, 1, 16, 2, 64).bytes_per_page
    stages = helpers.load(tiny_llama, [(0, 4), (4, 8)], kv_bytes=10 * per_page)
    prompts = _prompts(6, shared=35, tail=5, seed=1) + _prompts(2, shared=20, tail=2, seed=2)
    params = sampling.SamplingParams(max_tokens=24, ignore_eos=True)
    out, eng = helpers.run(stages, prompts, params, delays=[0.02 * i for i in range(8)])
    assert out == [hf_greedy(tiny_llama, p, 24) for p in prompts]
    stats = eng.stats()
    assert stats.prefix_hit_tokens > 0 and stats.preemptions > 0 and stats.kv_pages_used == 0
