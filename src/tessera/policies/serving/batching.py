"""Continuous-batching policy: which sequences run in the next step, with how many tokens.

Pure and torch-free (the cluster simulator imports it). The agent's scheduler
(`tessera_agent.engine.scheduler`) applies it: it owns the sequences and the page
allocator, offers running sequences a place in `running_order`, asks `chunk_size` how many tokens
each (and then each waiting sequence, FCFS) gets, and `preemption_victim` whom to evict when the KV
pool is full. `plan_batch` composes the same rules over plain views for a simulator or a
test that has no page allocator.

The rules, in the spirit of vLLM's and nano-vllm's schedulers:
- running sequences first, oldest first, so decodes are never starved by new prompts
  (a steady time per output token);
- then waiting sequences in arrival order (FCFS), each given the rest of its prompt up to
  the remaining token budget (chunked prefill: a long prompt spans steps and mixes with
  decodes);
- a step is bounded by `max_num_seqs` sequences and `max_batched_tokens` tokens. A token
  budget well above the number of running sequences is what keeps the time to first token
  low at saturation: many queued prompts are admitted in one step instead of one per step;
- under memory pressure the newest idle running sequence is preempted (recomputed later),
  which protects the oldest requests' latency.
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
