"""Speculative execution of a bottleneck stage inside the engine's stepping (BlockLLM §5.2).

`SpeculativeStages` is a `replica.Downstream`: the stages after a leader, in this process, one
single-thread executor each, driven by the leader's `ReplicaEngine` (its batching and paged KV).
At the bottleneck stage `b`, each step: the stage computes on its thread while the surrogate
guesses its rows and the stages after `b` run from the guess; per sequence, guessed and real
rows are compared (`policies.speculation.agrees`, float32-exact): agreeing sequences keep the
result, the others rerun after `b` from the real rows as a step of their own. Their KV slots
are the same, so the rerun overwrites the guess's writes before any later step reads them.
A step with a non-greedy sampled chunk runs unspeculated. Guarantee: speed may change, tokens
never. The surrogate maps the bottleneck's step input to guessed rows; `delay_s` slows a stage
on purpose. Callers: tests, `tessera bench speculate` (`bench_speculate_engine`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from tessera.policies.variants import speculation
from tessera_agent.engine import runner, step

Surrogate = Callable[[step.StepInput], torch.Tensor]


@dataclass
class SpeculationStats:
    """What the speculation did, per step and per sequence-step."""

    speculated_steps: int = 0
    plain_steps: int = 0  # not speculated: a non-greedy sampled chunk, or nothing to guess
    hits: int = 0  # sequence-steps whose downstream result from the guess was kept
    misses: int = 0  # sequence-steps recomputed from the real output
    mixed_steps: int = 0  # speculated steps with both hits and misses

    @property
    def hit_rate(self) -> float:
        seen = self.hits + self.misses
        return self.hits / seen if seen else 0.0


class SpeculativeStages:
    """The stages after the leader, the `bottleneck` one speculated (module docstring)."""

    def __init__(
        self,
        runners: Sequence[runner.StageRunner],
        bottleneck: int,
        surrogate: Surrogate,
        tolerance: speculation.Tolerance | None = None,
        delay_s: Mapping[int, float] | None = None,
        enabled: bool = True,
    ) -> None:
        if not 0 <= bottleneck < len(runners) - 1:
            raise ValueError(
                f"bottleneck {bottleneck}: must have a stage after it (0 <= b < {len(runners) - 1})"
            )
        self.runners, self.bottleneck, self.surrogate = list(runners), bottleneck, surrogate
        self.tolerance = tolerance or speculation.Tolerance()
        self.delay_s = dict(delay_s or {})
        self.enabled = enabled  # off: every step runs the stages in turn (the baseline)
        self.num_pages = min(r.cache.layout.num_pages for r in self.runners)
        self._pools = [concurrent.futures.ThreadPoolExecutor(1) for _ in self.runners]
        self._guess = concurrent.futures.ThreadPoolExecutor(1)
        self.stats = SpeculationStats()

    async def submit(self, inp: step.StepInput) -> step.StepOutput:
        b = self.bottleneck
        cur = inp
        out = step.StepOutput(step_id=inp.step_id)
        for i in range(b):
            out = await self._run(i, cur)
            cur = step.next_stage_input(inp, out)
        if not self.enabled or cur.hidden is None or not cur.chunks or not _greedy(cur.chunks):
            self.stats.plain_steps += 1
            return await self._tail(b, cur)
        self.stats.speculated_steps += 1
        loop = asyncio.get_running_loop()
        real_f = asyncio.ensure_future(self._run(b, cur))  # the bottleneck starts now
        try:
            guess = await loop.run_in_executor(self._guess, self.surrogate, cur)
            spec = await self._tail(b + 1, _with_hidden(cur, guess))
        finally:
            real = await real_f
        if real.hidden is None:
            raise RuntimeError("the bottleneck stage returned no hidden states")
        missed = self._missed(cur.chunks, guess, real.hidden)
        hits = len(cur.chunks) - len(missed)
        self.stats.hits += hits
        self.stats.misses += len(missed)
        if not missed:
            return spec
        if hits:
            self.stats.mixed_steps += 1
        chunks = [c for c in cur.chunks if c.seq_id in missed]
        rows = torch.cat(
            [real.hidden[a : a + c.num_tokens] for a, c in _rows(cur.chunks) if c.seq_id in missed]
        )
        fix = await self._tail(b + 1, step.StepInput(inp.step_id, chunks, hidden=rows))
        kept = {k: v for k, v in spec.sampled.items() if k not in missed}
        logprobs = {k: v for k, v in spec.logprobs.items() if k not in missed}
        return step.StepOutput(
            step_id=inp.step_id,
            hidden=_merged_hidden(cur.chunks, spec.hidden, fix.hidden, missed),
            sampled={**kept, **fix.sampled},
            logprobs={**logprobs, **fix.logprobs},
        )

    def _missed(
        self, chunks: Sequence[step.SeqChunk], guess: torch.Tensor, real: torch.Tensor
    ) -> set[str]:
        out = set()
        g = guess.to(real.device, real.dtype)
        for a, c in _rows(chunks):
            r = real[a : a + c.num_tokens]
            diff = float((g[a : a + c.num_tokens] - r).abs().max())
            if not speculation.agrees(diff, float(r.abs().max()), self.tolerance):
                out.add(c.seq_id)
        return out

    async def _tail(self, start: int, inp: step.StepInput) -> step.StepOutput:
        """Stages `start`.. in turn; the last one's output."""
        cur, out = inp, step.StepOutput(step_id=inp.step_id)
        for i in range(start, len(self.runners)):
            out = await self._run(i, cur)
            cur = step.next_stage_input(inp, out)
        return out

    async def _run(self, i: int, inp: step.StepInput) -> step.StepOutput:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pools[i], self._execute, i, inp)

    def _execute(self, i: int, inp: step.StepInput) -> step.StepOutput:
        delay = self.delay_s.get(i, 0.0)
        if delay:
            time.sleep(delay)
        return self.runners[i].execute(inp)

    async def close(self) -> None:
        for p in [*self._pools, self._guess]:
            p.shutdown(wait=False)


def _greedy(chunks: Sequence[step.SeqChunk]) -> bool:
    return all(c.params.greedy for c in chunks if c.sample)


def _rows(chunks: Sequence[step.SeqChunk]) -> list[tuple[int, step.SeqChunk]]:
    """Each chunk with its first row in the step's hidden states."""
    out, a = [], 0
    for c in chunks:
        out.append((a, c))
        a += c.num_tokens
    return out


def _with_hidden(inp: step.StepInput, hidden: torch.Tensor) -> step.StepInput:
    return step.StepInput(
        inp.step_id,
        inp.chunks,
        hidden=hidden,
        finished=inp.finished,
        result_on_link=inp.result_on_link,
    )


def _merged_hidden(
    chunks: Sequence[step.SeqChunk],
    spec: torch.Tensor | None,
    fix: torch.Tensor | None,
    missed: set[str],
) -> torch.Tensor | None:
    """The stages' hidden output (when the last stage does not end the model): the guess's
    rows for hits, the recomputed rows for misses, in the step's row order."""
    if spec is None or fix is None:
        return None
    parts, f = [], 0
    for a, c in _rows(chunks):
        if c.seq_id in missed:
            parts.append(fix[f : f + c.num_tokens])
            f += c.num_tokens
        else:
            parts.append(spec[a : a + c.num_tokens])
    return torch.cat(parts)
