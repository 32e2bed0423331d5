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


def test_the_next_step_is_handed_to_the_compute_thread_before_tokens_go_out(
    tiny_llama: Path,
) -> None:
    """Issue 16: the compute thread starts step N+1 before the loop streams step N's tokens
    (the consumer sees a token only after the following step was submitted), and the
    tokens stay those of transformers-checked `helpers.run`."""
    (st,) = helpers.load(tiny_llama, [(0, 8)])
    params = sampling.SamplingParams(max_tokens=6, ignore_eos=True)
    prompt = [1, 17, 42, 99, 5]
    want, _ = helpers.run([st], [prompt], params)
    order: list[str] = []

    class Recording(concurrent.futures.ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def,override]
            order.append("submit")
            return super().submit(fn, *args, **kwargs)

    async def main() -> list[int]:
        pool = Recording(1)
        eng = replica.ReplicaEngine(
            st.runner, pool, scheduler.SchedulerConfig(max_model_len=st.cfg.max_positions)
        )
        got = []
        try:
            async for ev in eng.generate("overlap", prompt, params):
                if ev.token is not None:
                    order.append("token")
                    got.append(ev.token)
        finally:
            await eng.close()
            pool.shutdown()
        return got

    assert asyncio.run(main()) == want[0]
    # Each token but the last reaches the consumer after the step making the next one was
    # submitted: the k-th token is preceded by at least k + 1 submits.
    submits = 0
    tokens = 0
    for what in order:
        if what == "submit":
            submits += 1
        else:
            tokens += 1
            if tokens < params.max_tokens:
                assert submits >= tokens + 1, order
