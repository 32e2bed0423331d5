"""Fewer, larger messages: `ReplicaEngine.generate_batches` groups the events that are
ready when the consumer asks (the servicer sends one `GenerateChunk` per group)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

from tessera_agent import convert
from tessera_agent.engine import replica, sampling, scheduler

from . import helpers


def test_a_slow_consumer_gets_tokens_in_batches_and_the_same_tokens(tiny_llama: Path) -> None:
    (st,) = helpers.load(tiny_llama, [(0, 8)])
    params = sampling.SamplingParams(max_tokens=12, ignore_eos=True)
    prompt = [1, 17, 42, 99, 5]
    want, _ = helpers.run([st], [prompt], params)

    async def main() -> list[list[scheduler.TokenEvent]]:
        pool = concurrent.futures.ThreadPoolExecutor(1)
        eng = replica.ReplicaEngine(
            st.runner, pool, scheduler.SchedulerConfig(max_model_len=st.cfg.max_positions)
        )
        batches = []
        try:
            async for batch in eng.generate_batches("slow", prompt, params):
                batches.append(batch)
                for _ in range(6000):  # a stalled stream: the engine finishes meanwhile
                    if eng.steps >= params.max_tokens:
                        break
                    await asyncio.sleep(0.01)
        finally:
            await eng.close()
            pool.shutdown()
        return batches

    batches = asyncio.run(main())
    tokens = [ev.token for b in batches for ev in b if ev.token is not None]
    assert tokens == want[0]
    assert len(batches) <= 2  # the first token(s), then everything made while stalled
    assert batches[-1][-1].finish_reason == "length"
    assert batches[-1][-2].token is not None  # the last token rides with its finish
    chunk = convert.chunk_from_events(batches[-1], len(prompt), len(tokens))
    assert list(chunk.token_ids) == [ev.token for ev in batches[-1] if ev.token is not None]
    assert chunk.finish_reason == "length" and chunk.completion_tokens == 12
