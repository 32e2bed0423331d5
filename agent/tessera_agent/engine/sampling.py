"""Token sampling on the last stage: greedy, temperature, top-k, top-p, per-request seed,
and log-probabilities of the chosen tokens when a request asks for them.

Called by `runner.py` with the logits of the rows to sample (`Sampler.sample_step`: tokens
chosen and log-probabilities gathered on the logits' device, then one copy to the host per
step). Each seeded request owns a `torch.Generator`, kept by the last stage until the
leader reports the sequence finished, so the same seed gives the same tokens whether the
model runs on one agent or a pipeline.
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
    toks = torch.tensor(tokens, dtype=torch.long, device=logits.device)
    return _read(_gather(logits, toks, list(range(len(tokens))), ns))[1]


def _gather(
    logits: torch.Tensor, tokens: torch.Tensor, asked: list[int], ns: list[int]
) -> tuple[torch.Tensor, int, int, list[int]]:
    """Everything a step returns, packed on the device into one float64 vector: the N
    tokens, then for the `asked` rows their chosen log-probabilities and top-k values and
    ids (k = the largest of `ns`). float64 holds every token id and float32 exactly."""
    n, k = tokens.shape[0], max(ns, default=0)
    if not asked:
        return tokens.to(torch.float64), n, k, ns
    rows = logits[torch.tensor(asked, device=logits.device)] if len(asked) < n else logits
    lp = torch.log_softmax(rows.float(), dim=-1)
    chosen = lp.gather(1, tokens[torch.tensor(asked, device=tokens.device)][:, None])
    top_v, top_i = torch.topk(lp, k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
    parts = (tokens, chosen.flatten(), top_v.flatten(), top_i.flatten())
    return torch.cat([t.to(torch.float64) for t in parts]), n, k, ns


def _read(
    packed: tuple[torch.Tensor, int, int, list[int]],
) -> tuple[list[int], list[TokenLogprobs]]:
    """The step's one device-to-host copy, unpacked: tokens, and the asked rows' logprobs."""
    vec, n, k, ns = packed
    host = to_host(vec).tolist()
    tokens = [int(t) for t in host[:n]]
    a = len(ns) if len(host) > n else 0
    chosen = host[n : n + a]
    top_v, top_i = host[n + a : n + a + a * k], host[n + a + a * k :]
    out = []
    for row, m in enumerate(ns[:a]):
        alts = zip(top_i[row * k : row * k + m], top_v[row * k : row * k + m], strict=True)
        out.append(TokenLogprobs(chosen[row], tuple((int(i), v) for i, v in alts)))
    return tokens, out


def to_host(t: torch.Tensor) -> torch.Tensor:
    """The one place a step's results leave the device (tests count the calls)."""
    return t.cpu()


class Sampler:
    """Chooses one token per row; keeps each seeded sequence's generator.

    Rows are sampled in batches, as real engines do: every unseeded row of a step in one
    draw from the sampler's own generator, each seeded row with its sequence's generator
    (so a seed gives the same tokens whatever else shares the step)."""

    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}
        self._shared: torch.Generator | None = None  # unseeded rows: fresh entropy per stage

    def forget(self, seq_id: str) -> None:
        self._generators.pop(seq_id, None)

    def sample(
        self, logits: torch.Tensor, seq_ids: list[str], params: list[SamplingParams]
    ) -> list[int]:
        """logits: [N, vocab] float; returns one token id per row."""
        return self.sample_step(logits, seq_ids, params)[0]

    def sample_step(
        self, logits: torch.Tensor, seq_ids: list[str], params: list[SamplingParams]
    ) -> tuple[list[int], dict[int, TokenLogprobs]]:
        """One token per row of `logits` [N, vocab], and the log-probabilities of the rows
        whose request asks for them (by row). Tokens are chosen and log-probabilities
        gathered on the logits' device; the results reach the host in one copy."""
        tokens = self.choose(logits, seq_ids, params)
        asked = [i for i, p in enumerate(params) if p.logprobs is not None]
        ns = [params[i].logprobs or 0 for i in asked]
        toks, lps = _read(_gather(logits, tokens, asked, ns))
        return toks, dict(zip(asked, lps, strict=True))

    def choose(
        self, logits: torch.Tensor, seq_ids: list[str], params: list[SamplingParams]
    ) -> torch.Tensor:
        """The chosen token of every row, on the logits' device ([N] int64)."""
        out = logits.argmax(dim=-1)
        free = [row for row, p in enumerate(params) if not p.greedy and p.seed is None]
        if free:
            if self._shared is None or self._shared.device != logits.device:
                self._shared = torch.Generator(device=logits.device)
                self._shared.seed()
            rows = torch.tensor(free, device=logits.device)
            out[rows] = draw(logits[rows], [params[r] for r in free], self._shared)
        for row, (sid, p) in enumerate(zip(seq_ids, params, strict=True)):
            if p.greedy or p.seed is None:
                continue
            gen = self._generators.get(sid)
            if gen is None:
                gen = self._generators[sid] = torch.Generator(device=logits.device)
                gen.manual_seed(p.seed)
            out[row : row + 1] = draw(logits[row : row + 1], [p], gen)
        return out


def draw(logits: torch.Tensor, params: list[SamplingParams], gen: torch.Generator) -> torch.Tensor:
    """One token per row of `logits` [N, vocab] under each row's temperature, top-k and
    top-p (all rows non-greedy), drawn with `gen`: softmax, filters, then the exponential
    race (argmax of p / E with E ~ Exp(1), an exact categorical draw) in a few batched ops
    instead of a dozen per row."""
    vocab = logits.shape[-1]
    temps = torch.tensor([p.temperature for p in params], dtype=torch.float32)
    x = logits.float() / temps.to(logits.device)[:, None]
    ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    if any(ks):
        k = torch.tensor([kk or vocab for kk in ks], device=x.device)
        top = torch.topk(x, int(k.max()), dim=-1).values
        kth = top.gather(1, (k - 1)[:, None])
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if any(p.top_p < 1.0 for p in params):
        tp = torch.tensor([p.top_p if p.top_p < 1.0 else float("inf") for p in params])
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        # keep the smallest prefix reaching top_p (rows without top-p keep everything)
        drop = (cum - sorted_p) > tp.to(x.device)[:, None]
        probs = torch.zeros_like(probs).scatter_(1, order, sorted_p.masked_fill(drop, 0.0))
    e = torch.empty_like(probs).exponential_(generator=gen)
    e.clamp_min_(torch.finfo(probs.dtype).tiny)  # E = 0 would make 0 / 0 of a dropped token
    return (probs / e).argmax(dim=-1)
