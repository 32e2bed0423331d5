"""How a pipelined replica's leader forms its next microbatch (KunServe §4.3).

Input: a `Window` (the work schedulable now, in scheduler order, as `lookahead.Chunk`s), the
replica's state (pipelined, dropped, max microbatches in flight) and a `SplitConfig`. Output: a
`Budget` (a cap on sequences and/or tokens) for the next step. Splits: "count" (default,
ceil(unfinished / max_inflight) sequences), "token_count" (equal token counts), "lookahead"
(equal modelled cost, `lookahead.lookahead_split`: long-context decodes get fewer tokens),
"auto" (lookahead while dropped and the window is deep, i.e. `lookahead.use_lookahead`: at
least 2 x stages x min_tokens tokens; count otherwise). The window is at most max_inflight x
max_batched_tokens tokens, so the first microbatch is a prefix of scheduler order, applied as a
token budget. Cost from `tessera profile` output (`chunk_cost`), else `DEFAULT_COST`, an
order-of-magnitude default, not a measurement (docs/overload.md). Called by the leader
(`tessera_agent.engine.replica`) per free pipeline slot; pure, torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.cost import profile as profile_mod
from tessera.policies.overload import lookahead

SPLITS = ("auto", "count", "token_count", "lookahead")
DEFAULT_COST = lookahead.ChunkCost(alpha=2e-8, beta=5e-5, gamma=1e-3)


@dataclass(frozen=True)
class SplitConfig:
    """How the leader splits; `split` is one of SPLITS."""

    split: str = "auto"
    cost: lookahead.ChunkCost = DEFAULT_COST
    min_tokens: int = lookahead.DEFAULT_MIN_TOKENS

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split: {self.split!r} is not one of {', '.join(SPLITS)}")
        if self.min_tokens < 1:
            raise ValueError("min_tokens: must be >= 1")


@dataclass(frozen=True)
class Window:
    """What the leader sees when it fills a slot."""

    chunks: tuple[lookahead.Chunk, ...]  # schedulable work, in scheduler order
    num_unfinished: int  # sequences waiting or running (in flight included)
    max_inflight: int  # microbatches the pipeline keeps in flight
    max_batched_tokens: int  # token budget of one step
    dropped: bool = False  # the replica is a pipeline made by an overload drop

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.chunks)


@dataclass(frozen=True)
class Budget:
    """Caps for the scheduler's next step (None: no cap beyond its limits)."""

    split: str  # the split applied: "none" (whole replica), "count", "token_count", "lookahead"
    max_seqs: int | None = None
    max_tokens: int | None = None


def window_chunks(
    chunks: Sequence[lookahead.Chunk], max_inflight: int, max_batched_tokens: int
) -> tuple[lookahead.Chunk, ...]:
    """The first max_inflight x max_batched_tokens tokens of `chunks` (the last one cut)."""
    left = max(1, max_inflight) * max_batched_tokens
    out: list[lookahead.Chunk] = []
    for c in chunks:
        if left <= 0:
            break
        if c.tokens <= 0:
            continue
        n = min(c.tokens, left)
        out.append(lookahead.Chunk(c.request, c.prefix, n))
        left -= n
    return tuple(out)


def in_flight(num_stages: int, configured: int = 0, shared_cpu: bool = False) -> int:
    """Microbatches a pipeline an overload drop made keeps in flight: `configured` when > 0
    (the agent's `--pipeline-microbatches`); 1 when its stages are CPU stages sharing one
    machine's cores (`shared_cpu`: a second microbatch overlaps no idle hardware there and
    doubles each token's fixed step costs; docs/overload.md); else one per stage (>= 2)."""
    if configured > 0:
        return configured
    return 1 if shared_cpu else max(2, num_stages)


def deep(window: Window, cfg: SplitConfig) -> bool:
    """The queue is deep enough to look ahead at (see the module docstring)."""
    return lookahead.use_lookahead(
        window.dropped, window.tokens, window.max_inflight, cfg.min_tokens
    )


def next_budget(window: Window, cfg: SplitConfig) -> Budget:
    """The caps of the next microbatch."""
    if window.max_inflight <= 1:
        return Budget("none")
    split = cfg.split
    if split == "auto":
        split = "lookahead" if deep(window, cfg) else "count"
    if split == "count" or window.tokens == 0:
        return Budget(
            "count", max_seqs=max(1, math.ceil(window.num_unfinished / window.max_inflight))
        )
    chunks = window_chunks(window.chunks, window.max_inflight, window.max_batched_tokens)
    if split == "token_count":
        mbs = lookahead.token_count_split(chunks, window.max_inflight)
    else:
        mbs = lookahead.lookahead_split(
            chunks,
            cfg.cost,
            min_tokens=min(cfg.min_tokens, max(1, sum(c.tokens for c in chunks) // 2)),
            max_microbatches=window.max_inflight,
        )
    first = mbs[0].tokens if mbs and mbs[0].tokens > 0 else sum(c.tokens for c in chunks)
    return Budget(split, max_tokens=max(1, min(first, window.max_batched_tokens)))


def chunk_cost(prof: profile_mod.Profile | None, num_layers: int) -> lookahead.ChunkCost:
    """Eq. 1 for a stage of `num_layers` layers: from a `tessera profile` output when
    given (`lookahead.cost_from_profile`), else `DEFAULT_COST`."""
    if prof is None:
        return DEFAULT_COST
    cost = lookahead.cost_from_profile(prof, max(1, num_layers))
    if cost.alpha <= 0 and cost.beta <= 0:
        return DEFAULT_COST  # a degenerate fit cannot rank chunks
    return cost
