"""Per-block batching across chains on one agent (in process): a foundation replica
serving a LoRA variant and two full fine-tunes' chains, sharing the zoo's pieces,
submitted concurrently to one co-batching compute thread. Greedy tokens equal
transformers (+peft) on each model alone, whole and pipelined over 2 stages (one
compute thread and one zoo per stage's "agent"); shared instances ran one pass over
several chains' rows, differing layers ran as their own instances, and the batch limit
splits passes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path

import pytest
import torch

from tessera.policies.serving import block_batching as bb
from tessera_agent import tiny_variants
from tessera_agent.engine import (
    block_zoo,
    cobatch,
    lora,
    replica,
    runner,
    sampling,
    scheduler,
    stage,
    step,
)
from tests.conftest import hf_greedy

peft = pytest.importorskip("peft", reason="peft is the LoRA oracle (dev extra)")

NEW = 8
DIFF_A = (2, 5)  # layers fine-tune A changes
DIFF_B = (5, 6)  # layers fine-tune B changes: layer 5 has three instances


@pytest.fixture(scope="module")
def models(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cobatch")
    return {
        "ft-a": tiny_variants.make_tiny_finetune(
            tiny_llama, root / "ft-a", layers=DIFF_A, seed=11, std=0.05
        ),
        "ft-b": tiny_variants.make_tiny_finetune(
            tiny_llama, root / "ft-b", layers=DIFF_B, seed=12, std=0.05
        ),
        "lora": tiny_variants.make_tiny_lora(tiny_llama, root / "lora", r=4, seed=13),
    }


class _CoDownstream:
    """The next stage on another "agent": its steps go to that agent's compute thread,
    as `stage_server._step` sends them."""

    def __init__(self, r: runner.StageRunner, ex: concurrent.futures.Executor) -> None:
        self.runner, self.ex = r, ex
        self.num_pages = r.cache.layout.num_pages

    async def submit(self, inp: step.StepInput) -> step.StepOutput:
        return await cobatch.run_step(self.ex, self.runner, inp)

    async def close(self) -> None:
        pass


def _load(path: Path, a: int, b: int, idx: int, zoo: block_zoo.BlockZoo) -> stage.Stage:
    spec = stage.BlockSpec(str(path), a, b, stage_index=idx, kv_bytes=4 << 20, page_size=16)
    return stage.load_stage(spec, torch.device("cpu"), 1 << 30, zoo=zoo)


def _peft_greedy(base: Path, adapter: Path, prompt: list[int], new: int) -> list[int]:
    from tests.engine.test_lora import _peft_greedy as pg

    return pg(str(base), str(adapter), tuple(prompt), new)


async def _serve(
    base: Path,
    models: dict[str, Path],
    splits: list[tuple[int, int]],
    jobs: list[tuple[str, list[int]]],
    limits: bb.BatchLimits,
) -> tuple[list[list[int]], list[cobatch.CoBatchExecutor]]:
    """Every job (chain name, prompt) submitted at once while the compute threads are
    held, so the first steps of every chain are queued together."""
    execs = [cobatch.CoBatchExecutor(limits) for _ in splits]
    zoos = [block_zoo.BlockZoo() for _ in splits]
    paths = {"base": base, "ft-a": models["ft-a"], "ft-b": models["ft-b"]}
    engines: dict[str, replica.ReplicaEngine] = {}
    for name, path in paths.items():
        stages = [_load(path, a, b, i, zoos[i]) for i, (a, b) in enumerate(splits)]
        if name == "base":
            cfg = stages[0].cfg
            for st, (a, b) in zip(stages, splits, strict=True):
                st.runner.attach_adapters([lora.read_adapter(models["lora"], "lora", cfg, a, b)])
        connect = None
        if len(stages) > 1:
            rest = stages[1]

            async def connect(r: runner.StageRunner = rest.runner) -> replica.Downstream:
                return _CoDownstream(r, execs[1])

        sched = scheduler.SchedulerConfig(max_model_len=stages[0].cfg.max_positions)
        engines[name] = replica.ReplicaEngine(stages[0].runner, execs[0], sched, connect)
    gates = [threading.Event() for _ in execs]
    for ex, gate in zip(execs, gates, strict=True):
        ex.submit(gate.wait)
    params = sampling.SamplingParams(max_tokens=NEW, ignore_eos=True)

    async def one(i: int, chain: str, prompt: list[int]) -> list[int]:
        variant = "lora" if chain == "lora" else ""
        eng = engines["base" if chain == "lora" else chain]
        out = []
        async for ev in eng.generate(f"s{i}", prompt, params, variant):
            if ev.token is not None:
                out.append(ev.token)
        return out

    async def release() -> None:
        await asyncio.sleep(0.3)  # every engine has queued its first step by now
        for gate in gates:
            gate.set()

    try:
        got = await asyncio.gather(release(), *(one(i, c, p) for i, (c, p) in enumerate(jobs)))
    finally:
        for eng in engines.values():
            await eng.close()
        for ex in execs:
            ex.shutdown()
    return list(got[1:]), execs


def _want(base: Path, models: dict[str, Path], chain: str, prompt: list[int]) -> list[int]:
    if chain == "lora":
        return _peft_greedy(base, models["lora"], prompt, NEW)
    return hf_greedy(base if chain == "base" else models[chain], prompt, NEW)


@pytest.mark.parametrize("splits", [[(0, 8)], [(0, 4), (4, 8)]], ids=["whole", "pipeline"])
def test_cobatched_chains_match_each_model_alone(
    tiny_llama: Path,
    models: dict[str, Path],
    prompts: list[list[int]],
    splits: list[tuple[int, int]],
) -> None:
    jobs = [
        ("base", prompts[0]),
        ("ft-a", prompts[1]),
        ("ft-b", prompts[2]),
        ("lora", prompts[3]),
        ("ft-a", prompts[4]),
        ("base", prompts[7]),
        ("ft-b", prompts[5]),
    ]
    got, execs = asyncio.run(_serve(tiny_llama, models, splits, jobs, bb.BatchLimits()))
    for (chain, prompt), tokens in zip(jobs, got, strict=True):
        assert tokens == _want(tiny_llama, models, chain, prompt), chain
    # the variants really differ from the foundation on these prompts
    for chain in ("ft-a", "ft-b", "lora"):
        assert _want(tiny_llama, models, chain, prompts[1]) != hf_greedy(
            tiny_llama, prompts[1], NEW
        )
    first = execs[0].stats
    assert first.costeps >= 1 and first.cobatched_steps >= 3
    # layer 3 is the foundation's in all three chains: one pass over their rows
    assert first.passes[("layer.3", 3)] >= 1
    # layer 2: the foundation's instance for base and ft-b, ft-a's own beside it
    assert first.passes[("layer.2", 2)] >= 1 and first.passes[("layer.2", 1)] >= 1
    if len(splits) == 1:
        # layer 5 differs in both fine-tunes: three instances, never a shared pass
        assert first.shared_passes("layer.5") == 0 and first.own_passes("layer.5") >= 3
        assert first.shared_passes("final") >= 1  # the LM head is shared too
    else:
        later = execs[1].stats  # the second "agent" co-batches its stage too
        assert later.costeps >= 1
        assert later.shared_passes("layer.5") == 0 and later.own_passes("layer.5") >= 3
        assert later.passes[("layer.7", 3)] >= 1 and later.shared_passes("final") >= 1


def test_batch_limit_splits_passes(
    tiny_llama: Path, models: dict[str, Path], prompts: list[list[int]]
) -> None:
    """Three 6-token prompts under a limit of 8 rows per pass: the first steps cannot
    share a pass (6 + 6 > 8), so two wait for later co-steps; the decodes (1 row each)
    share; no pass ever exceeds the limit; the tokens are still each model's."""
    prompt = prompts[2]  # 6 tokens
    jobs = [("base", prompt), ("ft-a", prompt), ("ft-b", prompt)]
    limits = bb.BatchLimits(rows_per_pass=8)
    got, execs = asyncio.run(_serve(tiny_llama, models, [(0, 8)], jobs, limits))
    for (chain, p), tokens in zip(jobs, got, strict=True):
        assert tokens == _want(tiny_llama, models, chain, p), chain
    s = execs[0].stats
    assert s.deferred >= 2
    assert max(s.max_pass_rows.values()) <= 8
    assert s.passes[("layer.3", 3)] >= 1  # the decodes were co-batched
    # with the default limit the same three prompts share their first pass
    _, execs = asyncio.run(_serve(tiny_llama, models, [(0, 8)], jobs, bb.BatchLimits()))
    assert execs[0].stats.max_pass_rows["layer.3"] == 3 * len(prompt)


def test_one_engine_runs_alone_and_plain_jobs_keep_their_order() -> None:
    """Without partners every step takes the solo path; other jobs run in order."""
    ex = cobatch.CoBatchExecutor()
    seen: list[int] = []
    futs = [ex.submit(seen.append, i) for i in range(5)]
    concurrent.futures.wait(futs)
    assert seen == [0, 1, 2, 3, 4]
    err = ex.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        err.result()
    ex.shutdown()
    with pytest.raises(RuntimeError):
        ex.submit(seen.append, 9)


def test_shutdown_runs_what_was_queued_unless_cancelled() -> None:
    ex = cobatch.CoBatchExecutor()
    gate = threading.Event()
    ex.submit(gate.wait)
    later = ex.submit(lambda: 7)
    threading.Timer(0.1, gate.set).start()
    ex.shutdown(wait=True)
    assert later.result(timeout=0) == 7
    ex = cobatch.CoBatchExecutor()
    gate = threading.Event()
    ex.submit(gate.wait)
    later = ex.submit(lambda: 7)
    ex.shutdown(wait=False, cancel_futures=True)
    gate.set()
    assert later.cancelled()
