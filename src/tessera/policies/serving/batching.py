"""Continuous-batching policy: which sequences run in the next step, with how many tokens.

Pure and torch-free (the simulator imports it). Applied by the agent's scheduler
(`tessera_agent.engine.scheduler`, which owns sequences and the page allocator) through
`running_order`, `chunk_size` and `preemption_victim`; `plan_batch` composes the same rules over
plain views for simulators and tests. Rules (as vLLM and nano-vllm): running sequences first,
oldest first (decodes are never starved); then waiting ones FCFS, each given the rest of its
prompt up to the token budget (chunked prefill); at most `max_num_seqs` sequences and
`max_batched_tokens` tokens per step (a budget well above the running count keeps TTFT low at
saturation); under memory pressure the newest idle running sequence is preempted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchLimits:
    """Bounds of one step."""

    max_num_seqs: int = 256  # sequences per step
    max_batched_tokens: int = 2048  # query tokens per step (prefill chunks + decodes)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs: must be >= 1")
        if self.max_batched_tokens < 1:
            raise ValueError("max_batched_tokens: must be >= 1")


@dataclass(frozen=True)
class Budget:
    """What is left of a step while it is being filled."""

    tokens: int
    seqs: int

    @property
    def exhausted(self) -> bool:
        return self.tokens <= 0 or self.seqs <= 0

    def take(self, num_tokens: int) -> Budget:
        return Budget(self.tokens - num_tokens, self.seqs - 1)


@dataclass(frozen=True)
class SeqView:
    """What the policy needs to know of one sequence."""

    seq_id: str
    arrival: int  # admission order: lower is older
    pending: int  # tokens not yet in the KV cache (prompt remainder, or 1 when decoding)


@dataclass(frozen=True)
class Pick:
    """Run `num_tokens` tokens of `seq_id` in this step."""

    seq_id: str
    num_tokens: int


@dataclass(frozen=True)
class BatchPlan:
    """A step: running sequences continued, then waiting sequences admitted."""

    running: tuple[Pick, ...]
    admitted: tuple[Pick, ...]

    @property
    def num_tokens(self) -> int:
        return sum(p.num_tokens for p in self.running + self.admitted)


def start_budget(
    limits: BatchLimits, max_seqs: int | None = None, max_tokens: int | None = None
) -> Budget:
    """The budget of an empty step; `max_seqs` / `max_tokens` narrow it (a pipeline's
    microbatch: `tessera.policies.overload.microbatch`)."""
    seqs = limits.max_num_seqs if max_seqs is None else min(max_seqs, limits.max_num_seqs)
    tokens = limits.max_batched_tokens
    if max_tokens is not None:
        tokens = max(1, min(max_tokens, tokens))
    return Budget(tokens, seqs)


def running_order(running: Sequence[SeqView]) -> list[SeqView]:
    """The order in which running sequences are offered a place: oldest first."""
    return sorted(running, key=lambda v: v.arrival)


def chunk_size(pending: int, budget: Budget) -> int:
    """Tokens a sequence with `pending` uncomputed tokens gets now; 0: none this step."""
    if budget.exhausted or pending <= 0:
        return 0
    return min(pending, budget.tokens)


def plan_running(running: Sequence[SeqView], budget: Budget) -> list[Pick]:
    """Running sequences that continue, oldest first, each chunked to the budget left."""
    picks: list[Pick] = []
    for view in running_order(running):
        n = chunk_size(view.pending, budget)
        if budget.exhausted:
            break
        if n:
            picks.append(Pick(view.seq_id, n))
            budget = budget.take(n)
    return picks


def preemption_victim(idle: Sequence[SeqView]) -> str | None:
    """The sequence to evict when the KV pool is full: the newest idle one (LIFO), so the
    oldest requests keep their pages; None when there is none."""
    if not idle:
        return None
    return max(idle, key=lambda v: v.arrival).seq_id


def plan_batch(
    running: Sequence[SeqView],
    waiting: Sequence[SeqView],
    limits: BatchLimits,
    max_seqs: int | None = None,
) -> BatchPlan:
    """The whole step when memory is not the bound (a simulator's view of the scheduler)."""
    budget = start_budget(limits, max_seqs)
    cont = plan_running(running, budget)
    for p in cont:
        budget = budget.take(p.num_tokens)
    admitted: list[Pick] = []
    for view in waiting:
        n = chunk_size(view.pending, budget)
        if n == 0:
            break
        admitted.append(Pick(view.seq_id, n))
        budget = budget.take(n)
    return BatchPlan(tuple(cont), tuple(admitted))
