"""The leader's microbatch policy (issue 13, lookahead microbatching): pure, no engine."""

from __future__ import annotations

import pytest

from tessera.policies.overload import lookahead, microbatch

COST = lookahead.ChunkCost(alpha=1e-4, beta=1e-3, gamma=1e-3)


def _window(
    chunks: list[tuple[int, int]], dropped: bool = True, inflight: int = 2
) -> microbatch.Window:
    cs = tuple(lookahead.Chunk(f"s{i}", p, c) for i, (p, c) in enumerate(chunks))
    return microbatch.Window(cs, len(cs), inflight, 256, dropped)


def test_auto_splits_by_cost_only_when_dropped_and_deep() -> None:
    cfg = microbatch.SplitConfig("auto", COST, min_tokens=8)
    deep = [(0, 40), (0, 40)]  # 80 tokens >= 2 x 2 stages x 8
    assert microbatch.next_budget(_window(deep), cfg).split == "lookahead"
    assert microbatch.next_budget(_window(deep, dropped=False), cfg).split == "count"
    shallow = [(100, 1)] * 4  # four decodes: 4 tokens < 32
    b = microbatch.next_budget(_window(shallow), cfg)
    assert (b.split, b.max_seqs, b.max_tokens) == ("count", 2, None)
    whole = microbatch.next_budget(_window(deep, inflight=1), cfg)
    assert whole == microbatch.Budget("none")


def test_lookahead_gives_long_context_decodes_fewer_tokens_than_token_count() -> None:
    # 16 decodes after 400 tokens each, then a 64-token prompt: a decode costs like ~4
    # prompt tokens, so equal cost puts the cut before the prompt's middle.
    chunks = [(400, 1)] * 16 + [(0, 64)]
    la = microbatch.next_budget(_window(chunks), microbatch.SplitConfig("lookahead", COST, 8))
    tc = microbatch.next_budget(_window(chunks), microbatch.SplitConfig("token_count", COST, 8))
    assert tc.max_tokens == 40  # 80 tokens / 2
    assert la.max_tokens is not None and la.max_tokens < tc.max_tokens
    # the two halves the leader will run have (nearly) equal modelled cost
    window = microbatch.window_chunks(_window(chunks).chunks, 2, 256)
    first, rest = lookahead.cut(lookahead.Microbatch(window), la.max_tokens)
    a, b = COST.batch(first.chunks), COST.batch(rest.chunks)
    assert abs(a - b) / (a + b) < 0.05
    fa, fb = (COST.batch(m.chunks) for m in lookahead.cut(lookahead.Microbatch(window), 40))
    assert abs(fa - fb) > abs(a - b)


def test_window_caps_at_one_round_of_microbatches() -> None:
    chunks = _window([(0, 300), (0, 300)]).chunks
    w = microbatch.window_chunks(chunks, 2, 256)
    assert [c.tokens for c in w] == [300, 212]
    b = microbatch.next_budget(
        _window([(0, 300), (0, 300)]), microbatch.SplitConfig("lookahead", COST)
    )
    assert b.max_tokens is not None and b.max_tokens <= 256


def test_empty_window_and_bad_config() -> None:
    cfg = microbatch.SplitConfig("lookahead", COST)
    assert microbatch.next_budget(_window([]), cfg).split == "count"
    with pytest.raises(ValueError, match="split"):
        microbatch.SplitConfig("bogus")
    with pytest.raises(ValueError, match="min_tokens"):
        microbatch.SplitConfig(min_tokens=0)


def test_chunk_cost_defaults_without_a_profile() -> None:
    assert microbatch.chunk_cost(None, 4) == microbatch.DEFAULT_COST


def test_measured_bubble() -> None:
    assert lookahead.measured_bubble([1.0, 1.0], 2.0) == pytest.approx(0.5)
    assert lookahead.measured_bubble([2.0, 2.0], 2.0) == 0.0
    with pytest.raises(ValueError):
        lookahead.measured_bubble([], 1.0)


def test_a_drops_pipeline_keeps_one_microbatch_in_flight_on_shared_cpu_cores() -> None:
    assert microbatch.in_flight(2) == 2  # one per stage, at least 2
    assert microbatch.in_flight(3) == 3
    assert microbatch.in_flight(2, shared_cpu=True) == 1  # stages share one machine's cores
    assert microbatch.in_flight(3, shared_cpu=True) == 1
    assert microbatch.in_flight(2, configured=3, shared_cpu=True) == 3  # the agent's flag wins
    assert microbatch.in_flight(4, configured=1) == 1
