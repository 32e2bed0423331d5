"""Continuous-batching scheduler of a replica leader: which tokens run in the next step.

`schedule()` picks running sequences first, then admits waiting ones, under a token
budget (chunked prefill: a long prompt is split across steps and mixes with decodes).
Pages come from the replica's `PageAllocator`; when the pool is full, a running sequence
is preempted (its pages freed, recomputed later from its tokens) or new requests wait —
nothing crashes and no sequence's pages are written by another. A sequence admitted with a
prompt prefix already in the allocator's prefix cache starts computing after it.
`postprocess()` applies the sampled tokens and stop conditions and returns plain
`TokenEvent`s.
The policy (who runs next, how many tokens, whom to preempt) is the pure, torch-free
`tessera.policies.serving.batching`; this module applies it to sequences and pages.
Called by `replica.py`; returns plain data, does no I/O.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from dataclasses import dataclass, field

from tessera.policies.overload import lookahead, microbatch
from tessera.policies.serving import batching
from tessera_agent.engine import errors, page_allocator, sampling, step


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    """One request's tokens and progress."""

    seq_id: str
    tokens: list[int]  # prompt followed by generated tokens
    prompt_len: int
    params: sampling.SamplingParams
    arrival: int
    num_computed: int = 0  # tokens whose K/V are in the cache
    status: Status = Status.WAITING
    in_flight: bool = False
    cancelled: bool = False
    preemptions: int = 0
    variant: str = ""  # LoRA adapter of the request ("" = the foundation)

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len :]


@dataclass(frozen=True)
class TokenEvent:
    """A new token for a sequence, or its end."""

    seq_id: str
    token: int | None
    finish_reason: str | None = None  # "stop", "length", "cancelled", "error" or None
    error: str | None = None  # why, when finish_reason is "error"
    logprobs: sampling.TokenLogprobs | None = None  # of `token`, when the request asked


@dataclass(frozen=True)
class SchedulerConfig:
    # Defaults are the policy's (`batching.BatchLimits`): a token budget well above the
    # number of decodes admits queued prompts quickly (low TTFT at saturation).
    max_num_seqs: int = batching.BatchLimits.max_num_seqs
    max_batched_tokens: int = batching.BatchLimits.max_batched_tokens
    max_model_len: int = 1024
    eos_token_ids: tuple[int, ...] = ()
    prefix_caching: bool = True


@dataclass
class ScheduledStep:
    """A step ready for the first stage, and the sequences it advances."""

    input: step.StepInput
    seqs: list[Sequence] = field(default_factory=list)


def _view(seq: Sequence) -> batching.SeqView:
    return batching.SeqView(seq.seq_id, seq.arrival, len(seq.tokens) - seq.num_computed)


class Scheduler:
    def __init__(self, allocator: page_allocator.PageAllocator, cfg: SchedulerConfig) -> None:
        self.alloc, self.cfg = allocator, cfg
        self.limits = batching.BatchLimits(cfg.max_num_seqs, cfg.max_batched_tokens)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.seqs: dict[str, Sequence] = {}
        self._arrivals = itertools.count()
        self._steps = itertools.count()
        self._finished_ids: list[str] = []
        self.preemptions = 0
        self.prefix_hit_tokens = 0  # prompt tokens whose K/V came from the prefix cache

    # -- requests ---------------------------------------------------------------------
    def add(
        self, seq_id: str, prompt: list[int], params: sampling.SamplingParams, variant: str = ""
    ) -> Sequence:
        if seq_id in self.seqs:
            raise errors.InvalidArgumentError(f"request id {seq_id!r} is already running")
        if not prompt:
            raise errors.InvalidArgumentError("prompt: must contain at least one token")
        total = len(prompt) + params.max_tokens
        if len(prompt) >= self.cfg.max_model_len:
            raise errors.InvalidArgumentError(
                f"prompt: {len(prompt)} tokens do not fit the context of "
                f"{self.cfg.max_model_len} tokens"
            )
        pool_tokens = self.alloc.num_pages * self.alloc.page_size
        if min(total, self.cfg.max_model_len) > pool_tokens:
            raise errors.ResourceExhaustedError(
                f"request needs {total} tokens of KV cache but the whole pool holds {pool_tokens}"
            )
        seq = Sequence(
            seq_id, list(prompt), len(prompt), params, next(self._arrivals), variant=variant
        )
        self.seqs[seq_id] = seq
        self.waiting.append(seq)
        return seq

    def cancel(self, seq_id: str) -> list[TokenEvent]:
        """Cancel a request; its pages are freed now, or when its in-flight step returns."""
        seq = self.seqs.get(seq_id)
        if seq is None or seq.status is Status.FINISHED:
            return []
        seq.cancelled = True
        if seq.in_flight:
            return []
        return [self._finish(seq, "cancelled")]

    def has_work(self) -> bool:
        return bool(self.waiting) or any(not s.in_flight for s in self.running)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # -- scheduling -------------------------------------------------------------------
    def pending_chunks(self, max_tokens: int) -> list[lookahead.Chunk]:
        """The work `schedule` would offer places to, in its order (idle running sequences
        oldest first, then waiting ones), up to `max_tokens` tokens: the leader's
        microbatch policy (`tessera.policies.overload.microbatch`) splits it."""
        out: list[lookahead.Chunk] = []
        left = max_tokens
        idle = {s.seq_id: s for s in self.running if not s.in_flight}
        views = batching.running_order([_view(s) for s in idle.values()])
        seqs = [idle[v.seq_id] for v in views] + list(self.waiting)
        for seq in seqs:
            if left <= 0:
                break
            n = len(seq.tokens) - seq.num_computed
            if n > 0:
                out.append(lookahead.Chunk(seq.seq_id, seq.num_computed, n))
                left -= n
        return out

    def window(self, max_inflight: int, dropped: bool) -> microbatch.Window:
        """What a pipelined leader's microbatch policy looks at: one round of work."""
        limit = max_inflight * self.limits.max_batched_tokens
        return microbatch.Window(
            tuple(self.pending_chunks(limit)),
            self.num_unfinished,
            max_inflight,
            self.limits.max_batched_tokens,
            dropped,
        )

    def schedule(
        self, max_seqs: int | None = None, max_tokens: int | None = None
    ) -> ScheduledStep | None:
        """Choose the next step among sequences not already in flight; None if none.
        `max_seqs` / `max_tokens` cap it (a pipeline's microbatch).

        What runs is decided by `tessera.policies.serving.batching`; this applies it to pages."""
        budget = batching.start_budget(self.limits, max_seqs, max_tokens)
        chosen: list[tuple[Sequence, int]] = []
        idle = [s for s in self.running if not s.in_flight]
        for view in batching.running_order([_view(s) for s in idle]):
            if budget.exhausted:
                break
            seq = self.seqs[view.seq_id]
            if seq.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            n = batching.chunk_size(len(seq.tokens) - seq.num_computed, budget)
            if n and self._reserve(seq, n, chosen):
                chosen.append((seq, n))
                budget = budget.take(n)
        while self.waiting and not budget.exhausted:
            seq = self.waiting[0]
            cached = (
                self.alloc.share_prefix(seq.seq_id, seq.tokens, seq.variant)
                if not seq.num_computed
                else 0
            )
            seq.num_computed += cached
            n = batching.chunk_size(len(seq.tokens) - seq.num_computed, budget)
            if not self.alloc.grow(seq.seq_id, seq.num_computed + n):
                if cached:  # let the shared pages go while it waits
                    self.alloc.free(seq.seq_id)
                    seq.num_computed = 0
                break  # pool full: wait (FCFS) until pages are freed
            self.prefix_hit_tokens += cached
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            chosen.append((seq, n))
            budget = budget.take(n)
        if not chosen:
            return None
        chunks, token_ids = [], []
        for seq, n in chosen:
            seq.in_flight = True
            start = seq.num_computed
            token_ids.extend(seq.tokens[start : start + n])
            chunks.append(
                step.SeqChunk(
                    seq_id=seq.seq_id,
                    start=start,
                    num_tokens=n,
                    block_table=tuple(self.alloc.block_table(seq.seq_id)),
                    sample=start + n == len(seq.tokens),
                    params=seq.params,
                    variant=seq.variant,
                )
            )
        finished, self._finished_ids = self._finished_ids, []
        inp = step.StepInput(
            step_id=next(self._steps), chunks=chunks, token_ids=token_ids, finished=finished
        )
        return ScheduledStep(inp, [s for s, _ in chosen])

    def _reserve(self, seq: Sequence, n: int, chosen: list[tuple[Sequence, int]]) -> bool:
        """Grow `seq` by n tokens, preempting the newest idle sequences if the pool is full."""
        while not self.alloc.grow(seq.seq_id, seq.num_computed + n):
            taken = {s.seq_id for s, _ in chosen}
            idle = [_view(s) for s in self.running if not s.in_flight and s.seq_id not in taken]
            victim_id = batching.preemption_victim(idle)
            if victim_id is None:
                return False  # everyone else is in flight: wait for their steps
            victim = self.seqs[victim_id]
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.alloc.free(seq.seq_id)
        seq.num_computed = 0
        seq.status = Status.WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self.running.remove(seq)
        self.waiting.appendleft(seq)

    # -- results ----------------------------------------------------------------------
    def postprocess(
        self,
        sched: ScheduledStep,
        sampled: dict[str, int],
        logprobs: dict[str, sampling.TokenLogprobs] | None = None,
    ) -> list[TokenEvent]:
        events: list[TokenEvent] = []
        for seq, chunk in zip(sched.seqs, sched.input.chunks, strict=True):
            seq.in_flight = False
            if seq.cancelled:
                events.append(self._finish(seq, "cancelled"))
                continue
            seq.num_computed = chunk.start + chunk.num_tokens
            self.alloc.register(seq.seq_id, seq.tokens, seq.num_computed, seq.variant)
            if not chunk.sample:
                continue
            token = sampled[seq.seq_id]
            seq.tokens.append(token)
            reason = self._stop_reason(seq, token)
            lp = logprobs.get(seq.seq_id) if logprobs else None
            events.append(TokenEvent(seq.seq_id, token, None, logprobs=lp))
            if reason is not None:
                events.append(self._finish(seq, reason))
        return events

    def fail(self, sched: ScheduledStep, error: str) -> list[TokenEvent]:
        """A step was lost (a peer stage failed): end its sequences with an error."""
        events = []
        for seq in sched.seqs:
            seq.in_flight = False
            if seq.status is not Status.FINISHED:
                events.append(self._finish(seq, "error", error))
        return events

    def fail_all(self, error: str) -> list[TokenEvent]:
        """End every unfinished sequence with an error (the replica lost a stage)."""
        events = []
        for seq in list(self.waiting) + [s for s in self.running if not s.in_flight]:
            events.append(self._finish(seq, "error", error))
        return events

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if (token in self.cfg.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
            return "stop"
        if len(seq.tokens) - seq.prompt_len >= p.max_tokens:
            return "length"
        if len(seq.tokens) >= self.cfg.max_model_len:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str, error: str | None = None) -> TokenEvent:
        self.alloc.free(seq.seq_id)
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
        del self.seqs[seq.seq_id]
        self._finished_ids.append(seq.seq_id)
        return TokenEvent(seq.seq_id, None, reason, error)
