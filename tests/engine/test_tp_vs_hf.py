"""Tensor parallelism: greedy tokens equal transformers' for tp=2, tp=2 x pp=2 and tp=4,
with rank 0 here and the other ranks in a spawned process, all over gloo."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera_agent import tp_local
from tessera_agent.engine import errors, sampling, stage
from tests.conftest import hf_greedy
from tests.engine import helpers

NEW = 8
GREEDY = sampling.SamplingParams(max_tokens=NEW, ignore_eos=True)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_gqa(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 q heads over 4 KV heads, head_dim 32 while hidden / heads is 24 (q width 256 !=
    hidden 192): the q/o shapes are not square, so any mix-up of the two shows."""
    from tessera_agent import tiny_checkpoint as tc

    spec = tc.TinySpec(
        arch="qwen2",
        layers=4,
        hidden=192,
        heads=8,
        kv_heads=4,
        head_dim=32,
        intermediate=256,
        seed=5,
    )
    return tc.make_tiny(tmp_path_factory.mktemp("ckpt") / "tiny-gqa", spec)


def _check(path: Path, splits: list[tuple[int, int]], tp: int, prompts: list[list[int]]) -> None:
    rep = tp_local.TPReplica(path, splits, tp)
    try:
        out, eng = helpers.run(rep.stages, prompts, GREEDY)
    finally:
        rep.close()
    assert out == [hf_greedy(path, p, NEW) for p in prompts]
    assert eng.steps >= NEW


@pytest.mark.parametrize(
    ("splits", "tp"), [([(0, 8)], 2), ([(0, 4), (4, 8)], 2)], ids=["tp2", "tp2xpp2"]
)
def test_tiny_llama_tp(
    tiny_llama: Path, prompts: list[list[int]], splits: list[tuple[int, int]], tp: int
) -> None:
    _check(tiny_llama, splits, tp, prompts[:4])


@pytest.mark.parametrize(
    ("splits", "tp"), [([(0, 4)], 4), ([(0, 1), (1, 4)], 2)], ids=["tp4", "tp2xpp2"]
)
def test_gqa_head_dim_tp(
    tiny_gqa: Path, prompts: list[list[int]], splits: list[tuple[int, int]], tp: int
) -> None:
    _check(tiny_gqa, splits, tp, prompts[:4])


def test_tp_that_does_not_divide_the_heads_is_refused(tiny_llama: Path) -> None:
    spec = stage.BlockSpec(str(tiny_llama), 0, 8, tp_size=3)
    with pytest.raises(errors.InvalidArgumentError, match="tp=3 does not divide the model's 4"):
        stage.plan_bytes(spec)
    spec = stage.BlockSpec(str(tiny_llama), 0, 8, tp_size=4, tp_rank=0)
    with pytest.raises(errors.InvalidArgumentError, match="2 KV heads"):
        stage.plan_bytes(spec)


def test_shard_bytes_and_kv_heads(tiny_llama: Path) -> None:
    """Each of 2 ranks holds about half the layer weights and half the KV heads."""
    whole = stage.load_stage(
        stage.BlockSpec(str(tiny_llama), 0, 8, kv_bytes=1 << 20),
        __import__("torch").device("cpu"),
        1 << 30,
    )
    half = stage.load_stage(
        stage.BlockSpec(str(tiny_llama), 0, 8, kv_bytes=1 << 20, tp_size=2, tp_rank=1),
        __import__("torch").device("cpu"),
        1 << 30,
    )
    assert half.runner.cache.layout.kv_heads == whole.runner.cache.layout.kv_heads // 2
    assert half.num_pages == 2 * whole.num_pages  # same bytes, half the heads per page
    assert half.param_bytes < whole.param_bytes
    assert half.param_bytes == sum(p.numel() * 4 for p in half.runner.model.parameters())


def test_dead_rank_fails_fast_and_says_why(tiny_llama: Path, prompts: list[list[int]]) -> None:
    """Killing the process of TP rank 1 mid-decode: the running requests end with an error
    in seconds (no hang), and the stage reports not ready with the reason."""
    import asyncio
    import concurrent.futures
    import time

    from tessera_agent.engine import replica, scheduler, tp_runner

    rep = tp_local.TPReplica(tiny_llama, [(0, 8)], 2, timeout_s=10.0)
    drv = rep.stages[0].runner
    assert isinstance(drv, tp_runner.TPRunner)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    eng = replica.ReplicaEngine(drv, pool, scheduler.SchedulerConfig(max_model_len=1024))
    params = sampling.SamplingParams(max_tokens=400, ignore_eos=True)

    async def one(i: int, got: list[int]) -> None:
        async for ev in eng.generate(f"s{i}", prompts[i], params):
            if ev.token is not None:
                got.append(ev.token)

    async def main() -> tuple[list[BaseException | None], float]:
        got: list[list[int]] = [[] for _ in range(4)]
        tasks = [asyncio.create_task(one(i, got[i])) for i in range(4)]
        while min(len(g) for g in got) < 3:  # decoding
            await asyncio.sleep(0.05)
        rep.proc.kill()
        t = time.monotonic()
        try:
            done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        finally:
            await eng.close()
        return [d if isinstance(d, BaseException) else None for d in done], time.monotonic() - t

    try:
        outcomes, waited = asyncio.run(main())
    finally:
        pool.shutdown()
        rep.close()
    assert all(isinstance(o, errors.UnavailableError) for o in outcomes), outcomes
    assert waited < 20.0
    assert not drv.ready
    assert "tensor-parallel group failed" in drv.reason
