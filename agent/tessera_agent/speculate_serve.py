"""Speculation on the served path (BlockLLM §5.2): a bottleneck stage's step.

A `speculate` variant's chain marks its bottleneck block (`Block.speculate_zoo`); `prepare`
loads the zoo's surrogate for it. Each step reaching the block (`stage_server`) runs
`run_step`: the block computes while the surrogate's guess goes on to the next stage (on
another agent); per sequence the guess is checked against the real rows
(`policies.variants.speculation`); sequences that missed go downstream again from the real
rows with the same step id and KV slots, so the recompute overwrites the guess before any
later step reads it. Tokens come back through this stage; non-greedy steps run plain.
Surrogate kinds: `low_rank` and `pseudo` (a copy of the block, right, wrong or half right
on purpose: tests and benches). `slow_s` slows a block for benches. Design: docs/variants.md.
Callers: `hosting.Hosting.load`, `stage_server`, `variants.annotate`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from tessera import blocks
from tessera.policies.variants import speculation
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent.engine import cobatch, errors, replica, runner, step
from tessera_agent.speculative_stages import SpeculationStats

if TYPE_CHECKING:
    from tessera_agent import surrogate  # transformers: loaded only where it serves

SLOW_ENV = "TESSERA_BENCH_SLOW_BLOCK"
WRONG = ("never", "always", "half")  # a pseudo surrogate's made-up errors
OFFSET = 1.0  # what a pseudo surrogate adds to the rows it gets wrong

Guess = Callable[[step.StepInput], torch.Tensor]


class _Loaded(Protocol):
    runner: runner.StageRunner


LoadStage = Callable[[blocks.Block, torch.device, int], _Loaded]


@dataclass
class SpeculateHook:
    """A bottleneck block's loaded surrogate, its record, and what it did."""

    guess: Guess
    kind: str  # "low_rank" or "pseudo"
    rank: int
    cosine: float  # the zoo's held-out cosine (low_rank); 1.0 for pseudo
    folder: str
    tolerance: speculation.Tolerance = field(default_factory=speculation.Tolerance)
    stats: SpeculationStats = field(default_factory=SpeculationStats)
    pool: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(1, "surrogate")
    )


class _LowRank:
    def __init__(self, sur: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.sur = sur

    def __call__(self, inp: step.StepInput) -> torch.Tensor:
        assert inp.hidden is not None
        with torch.inference_mode():
            return self.sur(inp.hidden.float()).to(inp.hidden.dtype)


class _Pseudo:
    """The block's copy (its own KV pool), wrong on purpose: never, always, or for every
    other sequence of a step (every other step when the step has one)."""

    def __init__(self, copy: runner.StageRunner, wrong: str) -> None:
        self.copy, self.wrong, self.calls = copy, wrong, 0

    def __call__(self, inp: step.StepInput) -> torch.Tensor:
        out = self.copy.execute(inp).hidden
        assert out is not None
        self.calls += 1
        if self.wrong == "never":
            return out
        out = out.clone()
        a = 0
        for i, c in enumerate(inp.chunks):
            if self.wrong == "always" or (i + self.calls) % 2 == 0:
                out[a : a + c.num_tokens] += OFFSET
            a += c.num_tokens
        return out


def check(spec: blocks.Block) -> tuple[surrogate.LowRank | None, dict[str, Any], str]:
    """The zoo's surrogate for this block, its record and folder, before anything loads:
    InvalidArgument / NotFound / FailedPrecondition naming why it cannot serve."""
    from tessera_agent import surrogate_zoo

    if spec.stage_index == 0 or spec.stage_index >= spec.num_stages - 1:
        raise errors.InvalidArgumentError(
            f"speculate: stage {spec.stage_index} of {spec.num_stages}: a speculated block "
            "needs a stage before it (hidden states in) and one after it"
        )
    layers = (spec.start, spec.end)
    zoo, model = Path(spec.speculate_zoo), Path(spec.model_path)
    try:
        sur, meta = surrogate_zoo.open_zoo(zoo, model, layers)
    except LookupError as exc:
        raise errors.NotFoundError(f"speculate: {exc}") from exc
    except (ValueError, OSError) as exc:
        raise errors.FailedPreconditionError(f"speculate: {exc}") from exc
    return sur, meta, str(surrogate_zoo.zoo_path(zoo, model, layers))


def prepare(
    spec: blocks.Block, device: torch.device, kv_bytes: int, load_stage: LoadStage
) -> SpeculateHook:
    """The surrogate a bottleneck block guesses with (module docstring); `kv_bytes` is the
    loaded block's KV pool, which a pseudo surrogate's copy matches (same pages);
    `load_stage` loads that copy (`engine.stage.load_stage`, passed in by hosting)."""
    from tessera_agent import surrogate

    sur, meta, folder = check(spec)
    kind = str(meta.get("kind", "low_rank"))
    if kind == "pseudo":
        copy = load_stage(
            blocks.Block(
                spec.model_path,
                spec.start,
                spec.end,
                replica_id=f"{spec.replica_id}-surrogate",
                stage_index=spec.stage_index,
                num_stages=spec.num_stages,
                dtype=spec.dtype,
                kv_bytes=kv_bytes,
                page_size=spec.page_size,
            ),
            device,
            1 << 62,
        )
        return SpeculateHook(_Pseudo(copy.runner, str(meta["wrong"])), kind, 0, 1.0, folder)
    if sur is None:
        raise errors.FailedPreconditionError(f"speculate: {folder}: no surrogate tensors")
    low = surrogate.LowRank(*(t.to(device) for t in (sur.mean_in, sur.a, sur.b, sur.mean_up)))
    quality = meta.get("quality", {})
    return SpeculateHook(
        _LowRank(low), kind, int(meta.get("rank", 0)), float(quality.get("cosine", 0.0)), folder
    )


def slow_s(spec: blocks.Block, raw: str) -> float:
    """Seconds each step of this block is made slow on purpose (benches; module docstring);
    `raw`: the agent's `$TESSERA_BENCH_SLOW_BLOCK` ("start,end,ms"), read by `tessera agent`."""
    if not raw:
        return 0.0
    a, b, ms = raw.split(",")
    return float(ms) / 1000.0 if (spec.start, spec.end) == (int(a), int(b)) else 0.0


async def compute(
    executor: concurrent.futures.Executor,
    runner_: runner.StageRunner,
    inp: step.StepInput,
    slow: float,
) -> step.StepOutput:
    """The block's own step on the compute thread, `slow` seconds late on purpose."""
    if slow:
        await asyncio.sleep(slow)
    return await cobatch.run_step(executor, runner_, inp)


async def run_step(
    executor: concurrent.futures.Executor,
    runner_: runner.StageRunner,
    inp: step.StepInput,
    downstream: replica.Downstream,
    hook: SpeculateHook,
    slow: float = 0.0,
) -> step.StepOutput:
    """One step of a speculated bottleneck stage (module docstring)."""
    if inp.hidden is None or not inp.chunks or not _greedy(inp.chunks):
        hook.stats.plain_steps += 1
        out = await compute(executor, runner_, inp, slow)
        return await downstream.submit(step.next_stage_input(inp, out))
    hook.stats.speculated_steps += 1
    loop = asyncio.get_running_loop()
    real_f = asyncio.ensure_future(compute(executor, runner_, inp, slow))  # starts now
    try:
        guess = await loop.run_in_executor(hook.pool, hook.guess, inp)
        ahead = step.StepInput(inp.step_id, inp.chunks, hidden=guess, finished=inp.finished)
        spec = await downstream.submit(ahead)
    finally:
        real = await real_f
    if real.hidden is None:
        raise errors.EngineError("the bottleneck stage returned no hidden states")
    missed = _missed(inp.chunks, guess, real.hidden, hook.tolerance)
    hook.stats.hits += len(inp.chunks) - len(missed)
    hook.stats.misses += len(missed)
    if not missed:
        return spec
    if len(missed) < len(inp.chunks):
        hook.stats.mixed_steps += 1
    chunks = [c for c in inp.chunks if c.seq_id in missed]
    rows = torch.cat([real.hidden[a : a + c.num_tokens] for a, c in _rows(chunks, inp.chunks)])
    fix = await downstream.submit(step.StepInput(inp.step_id, chunks, hidden=rows))
    return step.StepOutput(
        inp.step_id,
        sampled={**{k: v for k, v in spec.sampled.items() if k not in missed}, **fix.sampled},
        logprobs={**{k: v for k, v in spec.logprobs.items() if k not in missed}, **fix.logprobs},
    )


def _greedy(chunks: Sequence[step.SeqChunk]) -> bool:
    return all(c.params.greedy for c in chunks if c.sample)


def _rows(
    wanted: Sequence[step.SeqChunk], chunks: Sequence[step.SeqChunk]
) -> list[tuple[int, step.SeqChunk]]:
    """Each wanted chunk with its first row in the step's hidden states."""
    first, a = {}, 0
    for c in chunks:
        first[c.seq_id] = a
        a += c.num_tokens
    return [(first[c.seq_id], c) for c in wanted]


def _missed(
    chunks: Sequence[step.SeqChunk],
    guess: torch.Tensor,
    real: torch.Tensor,
    tol: speculation.Tolerance,
) -> set[str]:
    out = set()
    g = guess.to(real.device, real.dtype)
    for a, c in _rows(chunks, chunks):
        r = real[a : a + c.num_tokens]
        diff = float((g[a : a + c.num_tokens] - r).abs().max())
        if not speculation.agrees(diff, float(r.abs().max()), tol):
            out.add(c.seq_id)
    return out


def to_proto(spec: blocks.Block, hook: SpeculateHook) -> pb.BlockSpeculate:
    """`BlockInfo.speculate`: as loaded, with what the speculation did so far."""
    s = hook.stats
    return pb.BlockSpeculate(
        zoo=spec.speculate_zoo,
        kind=hook.kind,
        rank=hook.rank,
        cosine=hook.cosine,
        folder=hook.folder,
        speculated_steps=s.speculated_steps,
        plain_steps=s.plain_steps,
        hits=s.hits,
        misses=s.misses,
        mixed_steps=s.mixed_steps,
    )


def close(hook: SpeculateHook | None) -> None:
    if hook is not None:
        hook.pool.shutdown(wait=False)
