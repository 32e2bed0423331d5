"""KunServe lookahead microbatching: cost-balanced microbatches for a pipeline (§4.3).

Input: queued work as `Chunk`s (a request's next c tokens after p prefix tokens), a fitted
`ChunkCost`, a minimum microbatch size and the stage count. Output: `Microbatch`es of balanced
modelled cost (Figure 11: split recursively at half the cost until below the minimum),
token-count chunking for comparison (Sarathi-style), and `bubble_fraction`. Cost (Eq. 1): a
chunk costs ``alpha * (p*c + c*c + c) + beta * c + gamma``; a microbatch the sum of its chunks
minus (|b|-1) * gamma (Eq. 3). alpha, beta, gamma come from a non-negative least-squares fit
(scipy) to `ChunkSample`s (`samples_from_timings` from `tessera profile`'s prefill timings), or
off a stored profile (`cost_from_profile`). Called by `microbatch.py` (the dropped pipeline's
leader) and `tessera bench overload`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from tessera.cost import fit as fit_mod
from tessera.cost import profile as profile_mod

DEFAULT_MIN_TOKENS = 32


@dataclass(frozen=True)
class ChunkCost:
    """Fitted coefficients of Eq. 1 (seconds)."""

    alpha: float
    beta: float
    gamma: float
    residual: float = 0.0  # relative RMS error of the fit

    def chunk(self, prefix: int, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        p, c = float(prefix), float(tokens)
        return self.alpha * (p * c + c * c + c) + self.beta * c + self.gamma

    def batch(self, chunks: Sequence[Chunk]) -> float:
        live = [c for c in chunks if c.tokens > 0]
        if not live:
            return 0.0
        return sum(self.chunk(c.prefix, c.tokens) for c in live) - (len(live) - 1) * self.gamma


@dataclass(frozen=True)
class ChunkSample:
    """One timing: a chunk of `tokens` after `prefix` tokens took `seconds`."""

    prefix: int
    tokens: int
    seconds: float


@dataclass(frozen=True)
class Chunk:
    """A request's tokens [prefix, prefix + tokens) to compute in one microbatch."""

    request: str
    prefix: int
    tokens: int


@dataclass(frozen=True)
class Microbatch:
    chunks: tuple[Chunk, ...]

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.chunks)


def fit_chunk_cost(samples: Sequence[ChunkSample]) -> ChunkCost:
    """Least-squares fit of alpha, beta, gamma >= 0 with relative weights (so short and
    long chunks count alike), as `tessera.cost.fit` does for the layer profile."""
    if len(samples) < 3:
        raise ValueError(f"need at least 3 samples to fit 3 coefficients, got {len(samples)}")
    a = np.array(
        [[s.prefix * s.tokens + s.tokens**2 + s.tokens, s.tokens, 1.0] for s in samples],
        dtype=np.float64,
    )
    y = np.array([s.seconds for s in samples], dtype=np.float64)
    if np.any(y <= 0):
        raise ValueError("samples: seconds must be > 0")
    weighted = a / y[:, None]
    scale = np.linalg.norm(weighted, axis=0)
    scale[scale == 0] = 1.0
    coef, _ = optimize.nnls(weighted / scale, np.ones_like(y))
    coef = coef / scale
    rel = (a @ coef - y) / y
    return ChunkCost(
        float(coef[0]), float(coef[1]), float(coef[2]), float(np.sqrt(np.mean(rel**2)))
    )


def samples_from_timings(
    timings: Sequence[fit_mod.LayerTiming], num_layers: int = 1
) -> list[ChunkSample]:
    """Prefill timings of `tessera profile` (per layer, tp 1) as chunk samples of a
    `num_layers`-layer stage."""
    return [
        ChunkSample(0, t.size, t.seconds_per_layer * num_layers)
        for t in timings
        if t.kind == "prefill" and t.tp == 1
    ]


def cut(mb: Microbatch, position: int) -> tuple[Microbatch, Microbatch]:
    """Cut a microbatch after its first `position` tokens (in chunk order); a chunk cut in
    two continues in the second part with a longer prefix (it attends to the first)."""
    first: list[Chunk] = []
    rest: list[Chunk] = []
    left = position
    for c in mb.chunks:
        if left >= c.tokens:
            first.append(c)
            left -= c.tokens
        elif left > 0:
            first.append(Chunk(c.request, c.prefix, left))
            rest.append(Chunk(c.request, c.prefix + left, c.tokens - left))
            left = 0
        else:
            rest.append(c)
    return Microbatch(tuple(first)), Microbatch(tuple(rest))


def cost_from_profile(prof: profile_mod.Profile, num_layers: int) -> ChunkCost:
    """Eq. 1 for a stage of `num_layers` layers from a stored profile (`tessera profile
    --out`), without its raw samples: the profile's prefill model at tp 1,
    fixed + per_tp + per_token*n + per_token_sq*n^2, is Eq. 1 at p = 0 with
    alpha = per_token_sq, beta = per_token - per_token_sq, gamma = fixed + per_tp."""
    pf = prof.prefill
    return ChunkCost(
        alpha=num_layers * pf.per_token_sq,
        beta=num_layers * max(0.0, pf.per_token - pf.per_token_sq),
        gamma=num_layers * (pf.fixed + pf.per_tp),
    )


def split_balanced(mb: Microbatch, cost: ChunkCost) -> tuple[Microbatch, Microbatch]:
    """Figure 11's split: two halves of equal modelled cost. The paper cuts at half of
    cost(b); cutting a chunk lowers the total (Eq. 1 prices a chunk's attention as c^2,
    the two parts' as c1^2 + c1*c2 + c2^2), so we cut where the halves' own costs meet:
    the first half's cost rises and the second's falls with the cut position, so a
    binary search finds it in O(log tokens) cost evaluations."""
    total = mb.tokens
    if total < 2:
        return mb, Microbatch(())
    lo, hi = 1, total - 1  # smallest position whose first half costs >= the second
    while lo < hi:
        mid = (lo + hi) // 2
        a, b = cut(mb, mid)
        if cost.batch(a.chunks) >= cost.batch(b.chunks):
            hi = mid
        else:
            lo = mid + 1

    def gap(pos: int) -> float:
        a, b = cut(mb, pos)
        return abs(cost.batch(a.chunks) - cost.batch(b.chunks))

    best = min((p for p in (lo - 1, lo) if 1 <= p <= total - 1), key=gap)
    return cut(mb, best)


def lookahead_split(
    chunks: Sequence[Chunk],
    cost: ChunkCost,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    max_microbatches: int = 0,
) -> list[Microbatch]:
    """Figure 11: start with one microbatch of everything; split every microbatch into two
    of equal cost, level by level, until a split would leave a microbatch under `min_tokens`
    tokens (or the count would pass `max_microbatches`, when given)."""
    batch = [Microbatch(tuple(c for c in chunks if c.tokens > 0))]
    while not max_microbatches or 2 * len(batch) <= max_microbatches:
        halves = [split_balanced(b, cost) for b in batch]
        nxt = [h for pair in halves for h in pair]
        if any(h.tokens < min_tokens for h in nxt):
            break
        batch = nxt
    return batch


def token_count_split(chunks: Sequence[Chunk], num_microbatches: int) -> list[Microbatch]:
    """The baseline (Sarathi-style): equal token budgets, requests chunked in order."""
    if num_microbatches < 1:
        raise ValueError("num_microbatches: must be >= 1")
    live = [c for c in chunks if c.tokens > 0]
    total = sum(c.tokens for c in live)
    budgets = [
        total // num_microbatches + (i < total % num_microbatches) for i in range(num_microbatches)
    ]
    out: list[Microbatch] = []
    rest = list(live)
    for budget in budgets:
        part: list[Chunk] = []
        while budget and rest:
            c = rest[0]
            t = min(budget, c.tokens)
            part.append(Chunk(c.request, c.prefix, t))
            budget -= t
            if t == c.tokens:
                rest.pop(0)
            else:
                rest[0] = Chunk(c.request, c.prefix + t, c.tokens - t)
        out.append(Microbatch(tuple(part)))
    return [m for m in out if m.chunks]


def bubble_fraction(stage_times: Sequence[Sequence[float]]) -> float:
    """Idle share of an S-stage pipeline running microbatches in order, one pass each.

    `stage_times[k][s]` is microbatch k's time on stage s. Stage s starts microbatch k
    when stage s-1 has finished it and stage s has finished microbatch k-1; the bubble
    fraction is 1 - busy / (S x makespan). Equal times give (S-1)/(m+S-1) (fill and
    drain); unequal microbatches add waits on top (KunServe Figure 8)."""
    if not stage_times:
        return 0.0
    s_count = len(stage_times[0])
    if s_count == 0 or any(len(row) != s_count for row in stage_times):
        raise ValueError("stage_times: every microbatch needs one time per stage")
    finish = [0.0] * s_count
    busy = 0.0
    for row in stage_times:
        prev = 0.0
        for s, t in enumerate(row):
            start = max(prev, finish[s])
            finish[s] = prev = start + t
            busy += t
    makespan = finish[-1]
    return 0.0 if makespan <= 0 else 1.0 - busy / (s_count * makespan)


def measured_bubble(busy_s: Sequence[float], wall_s: float) -> float:
    """Idle share of a pipeline measured live: `busy_s[s]` is stage s's compute time over a
    window of `wall_s` seconds; 1 - sum(busy) / (stages x wall)."""
    if not busy_s or wall_s <= 0:
        raise ValueError("measured_bubble: need >= 1 stage and a window > 0 s")
    return max(0.0, 1.0 - sum(busy_s) / (len(busy_s) * wall_s))


def pipeline_bubble(microbatches: Sequence[Microbatch], cost: ChunkCost, stages: int) -> float:
    """Bubble fraction of the microbatches on `stages` equal stages (cost split evenly)."""
    times = [[cost.batch(m.chunks) / stages] * stages for m in microbatches]
    return bubble_fraction(times)


def use_lookahead(
    dropped: bool, queued_tokens: int, stages: int, min_tokens: int = DEFAULT_MIN_TOKENS
) -> bool:
    """Lookahead only while a replica runs dropped (pipelined) and its queue is deep:
    at least two microbatches of `min_tokens` per stage. Otherwise the normal scheduler
    (waiting for a queue to look ahead at would add latency, §4.3's discussion)."""
    return dropped and stages > 1 and queued_tokens >= 2 * stages * min_tokens
