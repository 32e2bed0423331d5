"""Speculation inside the engine's stepping: a replica engine (continuous batching, paged KV)
over 4 stages whose second is speculated. With the surrogate right, wrong, or right for
some sequences of a batch and wrong for others, every sequence's greedy tokens equal the
non-speculative path and `transformers`; a miss's recompute leaves the downstream KV pools
what the non-speculative path writes (later tokens, which read them, still agree)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tessera_agent import speculative_stages
from tessera_agent.engine import replica, runner, sampling, scheduler, stage, step
from tests.conftest import hf_greedy
from tests.engine import helpers

SPLITS = [(0, 2), (2, 4), (4, 6), (6, 8)]
PROMPTS = [list(range(10, 30)), [5, 6, 7], list(range(100, 140)), [42] * 9]
NEW = 10
GREEDY = sampling.SamplingParams(max_tokens=NEW, ignore_eos=True)


def _shadow(path: Path) -> runner.StageRunner:
    """A copy of the bottleneck stage with a KV pool of its own: a surrogate that is right."""
    a, b = SPLITS[1]
    return helpers.load(path, [(0, 1), (a, b)])[1].runner


def _right(shadow: runner.StageRunner) -> speculative_stages.Surrogate:
    def guess(inp: step.StepInput) -> torch.Tensor:
        out = shadow.execute(inp).hidden
        assert out is not None
        return out

    return guess


def _wrong_for(
    shadow: runner.StageRunner, wrong: Callable[[int], bool]
) -> speculative_stages.Surrogate:
    """The right guess, made wrong for the chunks at the positions `wrong` names."""
    right = _right(shadow)

    def guess(inp: step.StepInput) -> torch.Tensor:
        h = right(inp).clone()
        a = 0
        for k, c in enumerate(inp.chunks):
            if wrong(k):
                h[a : a + c.num_tokens] += 0.5
            a += c.num_tokens
        return h

    return guess


async def _generate(
    stages: list[stage.Stage], ds: speculative_stages.SpeculativeStages
) -> list[list[int]]:
    pool = concurrent.futures.ThreadPoolExecutor(1)

    async def connect() -> replica.Downstream:
        return ds

    cfg = scheduler.SchedulerConfig(
        max_model_len=stages[0].cfg.max_positions,
        max_batched_tokens=32,  # prefills in chunks, batched with other sequences' decodes
        eos_token_ids=stages[0].cfg.eos_token_ids,
    )
    eng = replica.ReplicaEngine(stages[0].runner, pool, cfg, connect)

    async def one(i: int) -> list[int]:
        await asyncio.sleep(0.01 * i)  # arrivals apart: continuous batching joins them
        return [
            ev.token
            async for ev in eng.generate(f"seq{i}", PROMPTS[i], GREEDY)
            if ev.token is not None
        ]

    try:
        return list(await asyncio.gather(*(one(i) for i in range(len(PROMPTS)))))
    finally:
        await eng.close()
        pool.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_llama: Path) -> list[list[int]]:
    torch.set_num_threads(1)
    plain, _ = helpers.run(helpers.load(tiny_llama, SPLITS), PROMPTS, GREEDY)
    assert plain == [hf_greedy(tiny_llama, p, NEW) for p in PROMPTS]
    return plain


@pytest.mark.parametrize("case", ["right", "wrong", "half"])
def test_tokens_equal_the_plain_path_whatever_the_surrogate(
    tiny_llama: Path, reference: list[list[int]], case: str
) -> None:
    stages = helpers.load(tiny_llama, SPLITS)
    shadow = _shadow(tiny_llama)
    surrogate = {
        "right": _right(shadow),
        "wrong": _wrong_for(shadow, lambda k: True),
        "half": _wrong_for(shadow, lambda k: k % 2 == 1),  # every batch of 2+: mixed
    }[case]
    ds = speculative_stages.SpeculativeStages([s.runner for s in stages[1:]], 0, surrogate)
    got = asyncio.run(_generate(stages, ds))
    assert got == reference
    st = ds.stats
    assert st.speculated_steps > 0 and st.plain_steps == 0
    if case == "right":
        assert st.misses == 0 and st.hits > 0 and st.hit_rate == 1.0
    elif case == "wrong":
        assert st.hits == 0 and st.misses > 0
    else:  # batches where some sequences hit and others miss
        assert st.hits > 0 and st.misses > 0 and st.mixed_steps > 0


def test_a_sampled_step_is_not_speculated_and_the_last_stage_is_refused(tiny_llama: Path) -> None:
    stages = helpers.load(tiny_llama, SPLITS)
    runners = [s.runner for s in stages[1:]]
    with pytest.raises(ValueError, match="stage after it"):
        speculative_stages.SpeculativeStages(runners, 2, lambda inp: torch.zeros(1))
    ds = speculative_stages.SpeculativeStages(runners, 0, _right(_shadow(tiny_llama)))
    chunk = step.SeqChunk("s", 0, 3, (0,), True, sampling.SamplingParams(temperature=0.7, seed=1))
    hidden = torch.randn(3, stages[0].cfg.hidden_size)

    async def go() -> step.StepOutput:
        try:
            return await ds.submit(step.StepInput(1, [chunk], hidden=hidden))
        finally:
            await ds.close()

    out = asyncio.run(go())
    assert "s" in out.sampled and ds.stats.plain_steps == 1 and ds.stats.speculated_steps == 0
