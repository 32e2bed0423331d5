"""Speculative execution of bottleneck blocks with surrogates (BlockLLM §5.2).

A `SpeculativeChain` runs a model's `block_parts.Part`s in turn, except at blocks with a
surrogate: the real block starts on a worker thread, the surrogate guesses its output, and the
downstream blocks run from the guess. When the real output arrives it is compared
(`policies.speculation.agrees`): agreed, the result is kept (a hit); not, the downstream
caches are cut back and rerun from the real output (a miss). So tokens equal the plain chain's
whenever kept guesses are within the (tight) tolerance; tests check this against `transformers`.
Inputs: the parts, a surrogate per speculated block (hidden -> hidden, e.g.
`surrogate.LowRank`), a `Tolerance`. Callers: `tessera bench speculate`, tests. Runs beside
the engine (a chain of `transformers` parts), not inside `engine/`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from tessera.policies.variants import speculation
from tessera_agent import block_parts

Surrogate = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class SpecStats:
    """What speculation did: guesses made, kept (hits), thrown away (misses)."""

    speculated: int = 0
    hits: int = 0
    misses: int = 0
    max_abs_diff: list[float] = field(default_factory=list)  # per guess, real vs guess
    cosine: list[float] = field(default_factory=list)  # per guess: mean over its tokens

    @property
    def hit_rate(self) -> float:
        return self.hits / self.speculated if self.speculated else 0.0


class SpeculativeChain:
    """Parts run in order, speculating at the blocks in `surrogates` (module docstring)."""

    def __init__(
        self,
        parts: Sequence[block_parts.Part],
        surrogates: Mapping[int, Surrogate],
        tolerance: speculation.Tolerance | None = None,
    ) -> None:
        last = len(parts) - 1
        for i in surrogates:
            if not 0 <= i < last:
                raise ValueError(f"block {i}: only blocks before the last one can be speculated")
        self.parts = list(parts)
        self.surrogates = dict(surrogates)
        self.tolerance = tolerance or speculation.Tolerance()
        self.stats = SpecStats()
        self._pool = ThreadPoolExecutor(max(1, len(self.surrogates)), "speculate")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _run(self, k: int, x: torch.Tensor) -> torch.Tensor:
        while k < len(self.parts):
            guess_of = self.surrogates.get(k)
            if guess_of is None:
                x = self.parts[k](x)
                k += 1
                continue
            marks = [p.length() for p in self.parts[k + 1 :]]
            pending = self._pool.submit(self.parts[k], x)
            with torch.inference_mode():
                guess = guess_of(x)
            out = self._run(k + 1, guess)
            real = pending.result()
            diff = float((real - guess).abs().max())
            self.stats.speculated += 1
            self.stats.max_abs_diff.append(diff)
            cos = torch.nn.functional.cosine_similarity(real, guess, dim=-1).mean()
            self.stats.cosine.append(float(cos))
            if speculation.agrees(diff, float(real.abs().max()), self.tolerance):
                self.stats.hits += 1
                return out
            self.stats.misses += 1
            for part, mark in zip(self.parts[k + 1 :], marks, strict=True):
                part.crop(mark)
            x = real
            k += 1
        return x

    def generate(self, prompt: Sequence[int], max_new: int) -> tuple[list[int], list[float]]:
        """Greedy tokens, and the seconds each took (the first includes the prefill)."""
        for p in self.parts:
            p.reset()
        for sur in self.surrogates.values():
            reset = getattr(sur, "reset", None)  # a surrogate with a cache of its own
            if callable(reset):
                reset()
        x = torch.tensor([list(prompt)])
        out: list[int] = []
        times: list[float] = []
        for _ in range(max_new):
            began = time.perf_counter()
            logits = self._run(0, x)
            tok = int(logits[0, -1].argmax())
            times.append(time.perf_counter() - began)
            out.append(tok)
            x = torch.tensor([[tok]])
        return out, times
