"""Token sampling on the last stage: greedy, temperature, top-k, top-p, per-request seed.

Called by `runner.py` with the logits of the rows to sample. Each seeded request owns a
`torch.Generator`, kept by the last stage until the leader reports the sequence finished,
so the same seed gives the same tokens whether the model runs on one agent or a pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tessera_agent.engine import errors


@dataclass(frozen=True)
class SamplingParams:
    """How to choose tokens and when to stop, per request."""

    max_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = disabled
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise errors.InvalidArgumentError("max_tokens: must be >= 1")
        if self.temperature < 0:
            raise errors.InvalidArgumentError("temperature: must be >= 0")
        if self.top_k < 0:
            raise errors.InvalidArgumentError("top_k: must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise errors.InvalidArgumentError("top_p: must be in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class Sampler:
    """Chooses one token per row; keeps each seeded sequence's generator."""

    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, seq_id: str) -> None:
        self._generators.pop(seq_id, None)

    def sample(
        self, logits: torch.Tensor, seq_ids: list[str], params: list[SamplingParams]
    ) -> list[int]:
        """logits: [N, vocab] float; returns one token id per row."""
        out = logits.argmax(dim=-1).tolist()
        for row, (sid, p) in enumerate(zip(seq_ids, params, strict=True)):
            if p.greedy:
                continue
            out[row] = self._sample_row(logits[row].float(), sid, p)
        return [int(t) for t in out]

    def _sample_row(self, row: torch.Tensor, seq_id: str, p: SamplingParams) -> int:
        row = row / p.temperature
        if p.top_k and p.top_k < row.numel():
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, dim=-1)
        if p.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_p, dim=-1)
            drop = (cum - sorted_p) > p.top_p  # keep the smallest prefix reaching top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
            probs = probs / probs.sum()
        gen = self._generators.get(seq_id)
        if gen is None:
            gen = torch.Generator()
            if p.seed is not None:
                gen.manual_seed(p.seed)
            else:
                gen.seed()
            self._generators[seq_id] = gen
        return int(torch.multinomial(probs, 1, generator=gen).item())
