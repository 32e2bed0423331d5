"""Token sampling on the last stage: greedy, temperature, top-k, top-p, per-request seed,
and log-probabilities of the chosen tokens when a request asks for them.

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
    logprobs: int | None = None  # None: none; N: the chosen token's and the top N's

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise errors.InvalidArgumentError("max_tokens: must be >= 1")
        if self.temperature < 0:
            raise errors.InvalidArgumentError("temperature: must be >= 0")
        if self.top_k < 0:
            raise errors.InvalidArgumentError("top_k: must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise errors.InvalidArgumentError("top_p: must be in (0, 1]")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise errors.InvalidArgumentError(f"logprobs: must be in [0, {MAX_LOGPROBS}]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


MAX_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprobs:
    """Log-probability of a sampled token under the model (the raw logits' log-softmax,
    before temperature, top-k or top-p), and the `n` most likely tokens with theirs."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: torch.Tensor, tokens: list[int], ns: list[int]) -> list[TokenLogprobs]:
    """logits: [N, vocab] of the rows whose tokens were `tokens`; `ns[i]` alternatives."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, torch.tensor(tokens, dtype=torch.long, device=lp.device)[:, None])
    k = max(ns, default=0)
    top_v, top_i = torch.topk(lp, k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
    out = []
    for row, n in enumerate(ns):
        alts = zip(top_i[row, :n].tolist(), top_v[row, :n].tolist(), strict=True)
        out.append(TokenLogprobs(float(chosen[row, 0]), tuple((int(i), float(v)) for i, v in alts)))
    return out


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
