"""Oracle: replicated layer runs (CoCoServe) give transformers' greedy tokens.

In-process: a replica of the tiny model on one stage; a run of its layers is replicated
onto a second "device" (a `LocalHolder` on its own thread) while requests decode, more
requests join after it and some finish before; the split is sticky per request. Then
migrations and evictions mid-decode. Every sequence must still get HF's tokens.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import torch

from tessera_agent.engine import replica, run_holders, sampling, scaling_ops, scheduler, stage
from tests.conftest import hf_greedy
from tests.engine import helpers

NEW = 16
GREEDY = sampling.SamplingParams(max_tokens=NEW, ignore_eos=True)
ORIGIN = "a0/cpu:0"

Op = Callable[[stage.Stage, replica.ReplicaEngine, concurrent.futures.Executor], Awaitable[None]]


def _holder(st: stage.Stage, start: int, end: int, name: str) -> scaling_ops.HolderFactory:
    async def make() -> run_holders.Holder:
        return scaling_ops.local_replica(
            st.runner, start, end, torch.device("cpu"), name, st.spec.model_path
        )

    return make


async def _drive(
    st: stage.Stage,
    prompts: list[list[int]],
    delays: list[float],
    ops: list[tuple[int, Op]],
    prefix_caching: bool = True,
    after_op: dict[int, int] | None = None,
) -> tuple[list[list[int]], replica.ReplicaEngine]:
    """Generate every prompt; op i runs once the engine has made `ops[i][0]` steps;
    request j waits for op `after_op[j]` to be done (then its delay) when named."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    cfg = scheduler.SchedulerConfig(
        max_model_len=st.cfg.max_positions,
        max_batched_tokens=32,
        eos_token_ids=st.cfg.eos_token_ids,
        prefix_caching=prefix_caching,
    )
    eng = replica.ReplicaEngine(st.runner, pool, cfg)

    done = [asyncio.Event() for _ in ops]

    async def one(i: int) -> list[int]:
        if after_op and i in after_op:
            await done[after_op[i]].wait()
        await asyncio.sleep(delays[i])
        return [
            ev.token
            async for ev in eng.generate(f"s{i}", prompts[i], GREEDY)
            if ev.token is not None
        ]

    gens = [asyncio.ensure_future(one(i)) for i in range(len(prompts))]

    async def control() -> None:
        for k, (at, op) in enumerate(ops):
            while eng.steps < at:
                assert not all(g.done() for g in gens), f"every request ended before step {at}"
                await asyncio.sleep(0.001)
            await op(st, eng, pool)
            done[k].set()

    try:
        *out, _ = await asyncio.gather(*gens, control())
    finally:
        await eng.close()
        pool.shutdown()
    return list(out), eng


def _replicate(start: int, end: int, name: str) -> Op:
    async def op(
        st: stage.Stage, eng: replica.ReplicaEngine, ex: concurrent.futures.Executor
    ) -> None:
        await scaling_ops.replicate(
            st.runner, ex, ORIGIN, start, end, _holder(st, start, end, name), eng.live_pages
        )

    return op


def _evict(start: int, end: int, name: str) -> Op:
    async def op(
        st: stage.Stage, eng: replica.ReplicaEngine, ex: concurrent.futures.Executor
    ) -> None:
        res = await scaling_ops.evict(st.runner, ex, start, end, name)
        assert res.target == ORIGIN or res.target.startswith("a")

    return op


def _migrate(start: int, end: int, source: str, name: str) -> Op:
    async def op(
        st: stage.Stage, eng: replica.ReplicaEngine, ex: concurrent.futures.Executor
    ) -> None:
        res = await scaling_ops.migrate(
            st.runner, ex, start, end, source, _holder(st, start, end, name), ORIGIN,
            eng.live_pages,
        )  # fmt: skip
        assert res.kv_pages > 0 and res.kv_bytes > 0  # requests' K/V really moved

    return op


def _expected(path: Path, prompts: list[list[int]]) -> list[list[int]]:
    return [hf_greedy(path, p, NEW) for p in prompts]


# Requests join before, at and after the change; short ones finish while others decode.
DELAYS = [0.0, 0.0, 0.0, 0.05, 0.1, 0.15, 0.2, 0.25]


@pytest.mark.parametrize(
    ("start", "end"), [(3, 4), (2, 4), (0, 8)], ids=["1-layer", "2-layers", "all-layers"]
)
def test_replicated_run_matches_hf(
    tiny_llama: Path, prompts: list[list[int]], start: int, end: int
) -> None:
    st = helpers.load(tiny_llama, [(0, 8)])[0]
    out, _ = asyncio.run(_drive(st, prompts, DELAYS, [(3, _replicate(start, end, "a0/cpu:1"))]))
    assert out == _expected(tiny_llama, prompts)
    (run,) = st.runner.runs
    assert (run.start, run.end) == (start, end)
    assert run.placed.get("a0/cpu:1", 0) >= 1  # the replica really served requests
    assert run.placed.get(ORIGIN, 0) >= 1


def test_two_replicas_and_prefix_cache_pages_follow(
    tiny_llama: Path, prompts: list[list[int]]
) -> None:
    """Two replicas of one run; prompts sharing a cached prefix land on holders that did
    not compute it: the pages they lack are copied first."""
    st = helpers.load(tiny_llama, [(0, 8)])[0]
    shared = prompts[5][:40]
    ps = [shared + p[1:6] for p in prompts[:6]]
    # both replicas are made at step 3, once the first prompt's prefill (two chunks) has put
    # its prefix pages in the cache; the others arrive after that, however slow the machine
    # (on wall-clock delays alone they could arrive mid-prefill and find nothing cached).
    # They arrive together: a joiner goes to the holder furthest below its share of the
    # running requests, so one arriving alone after the others finished (a fast machine, a
    # decode graph already compiled in the process) lands on the origin, which has every
    # page, and nothing is copied. Five at once always spread over the three holders.
    ops = [(3, _replicate(1, 3, "a0/cpu:1")), (3, _replicate(1, 3, "a1/cpu:0"))]
    delays = [0.0] * 6
    after_op = {j: 1 for j in range(1, len(ps))}
    out, _ = asyncio.run(_drive(st, ps, delays, ops, after_op=after_op))
    assert out == _expected(tiny_llama, ps)
    run = st.runner.runs[0]
    assert len(run.holders) == 3
    assert run.copied_pages > 0


def test_evict_and_migrate_mid_decode(tiny_llama: Path, prompts: list[list[int]]) -> None:
    """Replicate [2, 6), evict the replica mid-decode (its requests' K/V back to the
    origin), migrate the origin's [2, 6) to another device (weights released on the
    stage), replicate again and migrate that replica: HF's tokens throughout."""
    st = helpers.load(tiny_llama, [(0, 8)])[0]
    ops = [
        (2, _replicate(2, 6, "a0/cpu:1")),
        (5, _evict(2, 6, "a0/cpu:1")),
        (8, _migrate(2, 6, ORIGIN, "a1/cpu:0")),
        (10, _replicate(2, 6, "a0/cpu:1")),
        (13, _migrate(2, 6, "a0/cpu:1", "a2/cpu:0")),
    ]
    delays = [0.0, 0.0, 0.0, 0.02, 0.05, 0.08, 0.0, 0.01]
    # the last two join the second replica, so its migration carries their K/V
    out, eng = asyncio.run(_drive(st, prompts, delays, ops, after_op={6: 3, 7: 3}))
    assert out == _expected(tiny_llama, prompts)
    (run,) = st.runner.runs
    assert run.home == "a1/cpu:0" and ORIGIN not in run.holders
    assert set(run.holders) == {"a1/cpu:0", "a2/cpu:0"}
    assert isinstance(st.runner.model.layers[3], run_holders.VacatedLayer)
    assert st.runner.cache.k[3].numel() == 0  # the origin's K/V of the run is released
    assert eng.steps > 13


def test_bad_ranges_are_refused(tiny_llama: Path) -> None:
    from tessera_agent.engine import errors

    st = helpers.load(tiny_llama, [(0, 4), (4, 8)])[0]
    with pytest.raises(errors.InvalidArgumentError, match="not within"):
        scaling_ops.local_replica(st.runner, 3, 6, torch.device("cpu"), "x")


def test_run_on_a_later_pipeline_stage(tiny_llama: Path, prompts: list[list[int]]) -> None:
    """A 2-stage pipeline; layers [5, 7) of stage 1 are replicated mid-decode (stage 1's
    own executor orders the change), then the origin's copy migrates: HF's tokens."""
    stages = helpers.load(tiny_llama, [(0, 4), (4, 8)])
    ds = stage.LocalDownstream([stages[1].runner])
    pool = concurrent.futures.ThreadPoolExecutor(1)
    cfg = scheduler.SchedulerConfig(
        max_model_len=stages[0].cfg.max_positions,
        max_batched_tokens=32,
        eos_token_ids=stages[0].cfg.eos_token_ids,
    )

    async def connect() -> replica.Downstream:
        return ds

    async def main() -> list[list[int]]:
        eng = replica.ReplicaEngine(stages[0].runner, pool, cfg, connect)
        ex = ds._pools[0]  # stage 1's compute thread
        r1 = stages[1].runner

        async def one(i: int) -> list[int]:
            await asyncio.sleep(DELAYS[i])
            out = []
            async for ev in eng.generate(f"s{i}", prompts[i], GREEDY):
                if ev.token is not None:
                    out.append(ev.token)
            return out

        gens = [asyncio.ensure_future(one(i)) for i in range(len(prompts))]
        while eng.steps < 2:
            await asyncio.sleep(0.001)
        await scaling_ops.replicate(r1, ex, ORIGIN, 5, 7, _holder(stages[1], 5, 7, "a1/cpu:0"))
        while eng.steps < 10:
            assert not all(g.done() for g in gens)
            await asyncio.sleep(0.001)
        await scaling_ops.migrate(
            r1, ex, 5, 7, ORIGIN, _holder(stages[1], 5, 7, "a2/cpu:0"), ORIGIN
        )
        try:
            return list(await asyncio.gather(*gens))
        finally:
            await eng.close()
            pool.shutdown()

    out = asyncio.run(main())
    assert out == _expected(tiny_llama, prompts)
    (run,) = stages[1].runner.runs
    assert set(run.holders) == {"a1/cpu:0", "a2/cpu:0"} and run.placed.get("a1/cpu:0", 0) >= 1
