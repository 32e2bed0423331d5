"""Speculative execution: tokens equal the plain chain and `transformers` whether the
surrogate is right, wrong or half right; the policy's rules; the low-rank surrogate."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from tessera.policies.variants import speculation
from tessera_agent import block_parts, speculate, surrogate

PROMPT = [1, 50, 60, 70, 80, 90]
NEW = 12


class HalfRight:
    """The real block (its own copy and cache), then wrong on every other call."""

    def __init__(self, part: block_parts.Part, every: int = 2) -> None:
        self.part, self.every, self.calls = part, every, 0

    def reset(self) -> None:
        self.part.reset()
        self.calls = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.part(x)
        self.calls += 1
        if self.every and self.calls % self.every == 0:
            return out + 0.5 * torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        return out


def wrong(x: torch.Tensor) -> torch.Tensor:
    return x + 0.01  # close, but not within the tolerance


def _oracle(model: Any) -> list[int]:
    ids = torch.tensor([PROMPT])
    out = model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    return [int(t) for t in out[0, len(PROMPT) :]]


def _run(model: Any, bounds: list[int], surrogates: dict[int, Any]) -> tuple[list[int], Any]:
    chain = speculate.SpeculativeChain(block_parts.cut(model, bounds), surrogates)
    try:
        tokens, _ = chain.generate(PROMPT, NEW)
    finally:
        chain.close()
    return tokens, chain.stats


def test_parts_in_a_row_give_transformers_tokens(tiny_model: Any) -> None:
    parts = block_parts.cut(tiny_model, [0, 2, 3, 6])
    assert block_parts.greedy(parts, PROMPT, NEW) == _oracle(tiny_model)


def test_right_surrogate_hits_every_step_and_keeps_tokens(tiny_model: Any) -> None:
    tokens, stats = _run(
        tiny_model, [0, 2, 3, 6], {1: HalfRight(block_parts.Part(tiny_model, 2, 3), 0)}
    )
    assert tokens == _oracle(tiny_model)
    assert (stats.speculated, stats.hits, stats.misses) == (NEW, NEW, 0)


def test_wrong_surrogate_misses_every_step_and_keeps_tokens(tiny_model: Any) -> None:
    tokens, stats = _run(tiny_model, [0, 2, 3, 6], {1: wrong})
    assert tokens == _oracle(tiny_model)
    assert (stats.hits, stats.misses) == (0, NEW)


def test_half_right_surrogate_keeps_tokens(tiny_model: Any) -> None:
    tokens, stats = _run(
        tiny_model, [0, 2, 3, 6], {1: HalfRight(block_parts.Part(tiny_model, 2, 3))}
    )
    assert tokens == _oracle(tiny_model)
    assert (stats.hits, stats.misses) == (NEW // 2, NEW // 2)


def test_two_speculated_blocks_nested_keep_tokens(tiny_model: Any) -> None:
    """Block 1 half right, block 3 wrong: the guess of 3 runs inside the guess of 1."""
    surrogates = {1: HalfRight(block_parts.Part(tiny_model, 1, 2)), 3: wrong}
    tokens, stats = _run(tiny_model, [0, 1, 2, 3, 4, 6], surrogates)
    assert tokens == _oracle(tiny_model)
    assert stats.hits == NEW // 2 and stats.misses > NEW


def test_the_last_block_is_never_speculated(tiny_model: Any) -> None:
    with pytest.raises(ValueError):
        speculate.SpeculativeChain(block_parts.cut(tiny_model, [0, 3, 6]), {1: wrong})


def test_low_rank_surrogate_fits_and_tokens_stay(tiny_model: Any) -> None:
    parts = block_parts.cut(tiny_model, [0, 2, 4, 6])
    rng = random.Random(0)
    seqs = [[rng.randrange(512) for _ in range(48)] for _ in range(6)]
    fit = surrogate.fit_low_rank(parts, 1, seqs, rank=8)
    assert fit.rank == 8 and 0.0 < fit.cosine <= 1.0
    tokens, stats = _run(tiny_model, [0, 2, 4, 6], {1: fit.surrogate})
    assert tokens == _oracle(tiny_model)
    assert stats.speculated == NEW


def test_pick_follows_the_papers_rules() -> None:
    secs = [1.0, 5.0, 4.0, 3.0, 9.0]
    sur = {i: 0.1 for i in range(5)}
    assert speculation.pick(secs, sur, 1) == (1,)  # 4 is last: never
    assert speculation.pick(secs, sur, 2) == (1, 3)  # 2 is next to 1: skipped
    assert speculation.pick(secs, {1: 6.0, 2: 0.1}, 1) == (2,)  # a slower surrogate is no use
    assert speculation.pick(secs, sur, 0) == ()


def test_agrees_is_the_tolerance() -> None:
    tol = speculation.Tolerance(rtol=1e-3, atol=1e-6)
    assert speculation.agrees(0.0, 10.0, speculation.Tolerance())
    assert speculation.agrees(0.009, 10.0, tol)
    assert not speculation.agrees(0.02, 10.0, tol)
    with pytest.raises(ValueError):
        speculation.Tolerance(rtol=-1.0)


def test_bench_speculate_quick_reports_hit_rate_and_ratio() -> None:
    import argparse

    from tessera_agent import bench_speculate

    parser = argparse.ArgumentParser()
    bench_speculate.add_arguments(parser)
    args = parser.parse_args(["--quick", "--bottleneck-ms", "10", "--hop-ms", "1"])
    out = bench_speculate.run(args)
    assert out["speculated_blocks"] == [1]
    assert out["runs"]["off"]["tokens_equal_oracle"]  # the engine path's runs
    parts = out["parts_path"]["runs"]
    assert parts["off"]["tokens_equal_transformers"]
    for name in ("lowrank", "pseudo", "pseudo_half"):
        assert out["runs"][name]["tokens_equal"], name
        assert parts[name]["tokens_equal"], name
    assert out["runs"]["pseudo"]["hit_rate"] == parts["pseudo"]["hit_rate"] == 1.0
    assert out["runs"]["pseudo_half"]["hit_rate"] == parts["pseudo_half"]["hit_rate"] == 0.5
    assert 0.0 <= out["hit_rate"] <= 1.0 and out["latency_ratio"] > 0
