"""Correctness oracle: every way of running the engine gives transformers' greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.policies.overload import microbatch
from tessera_agent.engine import sampling
from tests.conftest import hf_greedy
from tests.engine import helpers

NEW = 12
GREEDY = sampling.SamplingParams(max_tokens=NEW, ignore_eos=True)


def _expected(path: Path, prompts: list[list[int]]) -> list[list[int]]:
    return [hf_greedy(path, p, NEW) for p in prompts]


@pytest.mark.parametrize(
    "splits",
    [
        [(0, 8)],
        [(0, 4), (4, 8)],
        [(0, 1), (1, 6), (6, 8)],
    ],
    ids=["full", "2-stages", "3-uneven-1-5-2"],
)
def test_greedy_matches_hf(
    tiny_llama: Path, prompts: list[list[int]], splits: list[tuple[int, int]]
) -> None:
    stages = helpers.load(tiny_llama, splits)
    out, _ = helpers.run(stages, prompts, GREEDY)
    assert out == _expected(tiny_llama, prompts)


def test_staggered_arrivals_mix_prefill_and_decode(
    tiny_llama: Path, prompts: list[list[int]]
) -> None:
    """8 prompts of different lengths, later ones arriving while earlier ones decode,
    with a small token budget so long prompts are prefilled in chunks."""
    stages = helpers.load(tiny_llama, [(0, 3), (3, 8)])
    delays = [0.0, 0.0, 0.02, 0.05, 0.05, 0.1, 0.15, 0.2]
    out, eng = helpers.run(stages, prompts, GREEDY, delays=delays, max_batched_tokens=24)
    assert out == _expected(tiny_llama, prompts)
    assert eng.steps > NEW  # really interleaved, not one batch


def test_lookahead_split_on_two_stages_matches_hf(
    tiny_llama: Path, prompts: list[list[int]]
) -> None:
    """Issue 13: a 2-stage pipeline dropped by an overload with a deep queue cuts its
    microbatches by modelled cost (lookahead), prompts chunked mid-way; same greedy tokens."""
    stages = helpers.load(tiny_llama, [(0, 4), (4, 8)])
    split = microbatch.SplitConfig("auto", microbatch.DEFAULT_COST, min_tokens=4)
    delays = [0.0, 0.0, 0.0, 0.0, 0.03, 0.03, 0.06, 0.06]
    out, eng = helpers.run(
        stages, prompts, GREEDY, delays=delays, max_batched_tokens=24, split=split, dropped=True
    )
    assert out == _expected(tiny_llama, prompts)
    assert eng.splits["lookahead"] > 0  # the deep queue was split by cost
    assert eng.splits["count"] > 0  # the decode tail was shallow: count split
    busy = eng.busy_s()
    assert len(busy) == 2 and all(b > 0 for b in busy)


def test_qwen2_arch(tiny_qwen2: Path, prompts: list[list[int]]) -> None:
    for splits in ([(0, 8)], [(0, 5), (5, 8)]):
        out, _ = helpers.run(helpers.load(tiny_qwen2, splits), prompts[:4], GREEDY)
        assert out == _expected(tiny_qwen2, prompts[:4])


def test_llama3_rope_tied_sharded(tiny_llama3_sharded: Path, prompts: list[list[int]]) -> None:
    for splits in ([(0, 4)], [(0, 2), (2, 4)]):
        out, _ = helpers.run(helpers.load(tiny_llama3_sharded, splits), prompts[:4], GREEDY)
        assert out == _expected(tiny_llama3_sharded, prompts[:4])


def test_kv_exhaustion_waits_and_finishes(tiny_llama: Path, prompts: list[list[int]]) -> None:
    """A pool too small for all requests at once: requests wait or are preempted and
    recomputed, none crashes, and every sequence still gets HF's tokens."""
    from tessera_agent.engine import kv_cache

    per_page = kv_cache.KVLayout(4, 1, 16, 2, 64).bytes_per_page
    stages = helpers.load(tiny_llama, [(0, 4), (4, 8)], kv_bytes=8 * per_page)
    out, eng = helpers.run(stages, prompts, GREEDY)
    assert out == _expected(tiny_llama, prompts)
    stats = eng.stats()
    assert stats.kv_pages_total == 8
    assert stats.kv_pages_used == 0
    assert stats.preemptions > 0 or stats.kv_pages_total * 16 < sum(len(p) + NEW for p in prompts)


def test_stop_conditions(tiny_llama: Path) -> None:
    prompt = [0, 11, 12, 13]
    ref = hf_greedy(tiny_llama, prompt, NEW)
    stop_at = ref[4]
    first = ref.index(stop_at)
    stages = helpers.load(tiny_llama, [(0, 8)])
    params = [
        sampling.SamplingParams(max_tokens=NEW, stop_token_ids=(stop_at,), ignore_eos=True),
        sampling.SamplingParams(max_tokens=3, ignore_eos=True),
    ]
    out, _ = helpers.run(stages, [prompt, prompt], params)
    assert out[0] == ref[: first + 1]  # the stop token is emitted, then generation ends
    assert out[1] == ref[:3]


def test_mistral_arch(tmp_path: Path, prompts: list[list[int]]) -> None:
    from tessera_agent import tiny_checkpoint as tc

    path = tc.make_tiny(tmp_path / "tiny-mistral", tc.TinySpec(arch="mistral", layers=4, seed=3))
    for splits in ([(0, 4)], [(0, 1), (1, 4)]):
        out, _ = helpers.run(helpers.load(path, splits), prompts[:3], GREEDY)
        assert out == _expected(path, prompts[:3])
