"""Algorithm 2's batch cut on a running replica (issue 15): `set_max_num_seqs`.

Six requests decode together; after a few steps the cap drops to 2 sequences per step,
later it is lifted (0 = the loaded limit). Every step after the cut advances at most 2
sequences, no request is stopped, and the greedy tokens are transformers'.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

from tessera_agent.engine import replica, sampling, scheduler, step
from tests.conftest import hf_greedy
from tests.engine import helpers

NEW = 10
GREEDY = sampling.SamplingParams(max_tokens=NEW, ignore_eos=True)


def test_batch_cut_caps_steps_mid_decode_and_keeps_hf_tokens(
    tiny_llama: Path, prompts: list[list[int]]
) -> None:
    stages = helpers.load(tiny_llama, [(0, 8)])
    runner = stages[0].runner
    sizes: list[tuple[int, int]] = []  # (cap when the step ran, sequences in it)
    eng: replica.ReplicaEngine | None = None
    execute = runner.execute

    def spy(inp: step.StepInput) -> step.StepOutput:
        assert eng is not None
        sizes.append((eng.sched_cfg.max_num_seqs, len(inp.chunks)))
        return execute(inp)

    runner.execute = spy  # type: ignore[method-assign]
    chosen = prompts[:6]

    async def go() -> list[list[int]]:
        nonlocal eng
        pool = concurrent.futures.ThreadPoolExecutor(1)
        cfg = scheduler.SchedulerConfig(
            max_model_len=stages[0].cfg.max_positions,
            eos_token_ids=stages[0].cfg.eos_token_ids,
        )
        eng = replica.ReplicaEngine(runner, pool, cfg)
        loaded = cfg.max_num_seqs
        seen = 0

        async def one(i: int) -> list[int]:
            nonlocal seen
            assert eng is not None
            out = []
            async for ev in eng.generate(f"s{i}", chosen[i], GREEDY):
                if ev.token is not None:
                    out.append(ev.token)
                    seen += 1
                    if seen == 12:  # every request has its first tokens: cut
                        assert eng.set_max_num_seqs(2) == loaded
                        assert eng.stats().max_num_seqs == 2
                    if seen == 40:  # lift it again
                        assert eng.set_max_num_seqs(0) == 2
            return out

        try:
            return list(await asyncio.gather(*(one(i) for i in range(len(chosen)))))
        finally:
            await eng.close()
            pool.shutdown()

    out = asyncio.run(go())
    assert out == [hf_greedy(tiny_llama, p, NEW) for p in chosen]
    assert eng is not None and eng.stats().max_num_seqs == eng.loaded_max_num_seqs
    capped = [n for cap, n in sizes if cap == 2]
    # the step scheduled just before the cut may run after it; every later one is capped
    assert len(capped) > 1 and max(capped[1:]) <= 2
    assert max(n for _, n in sizes) > 2  # before it, the batch was larger
