"""Runs one generation on a replica over gRPC, retrying elsewhere before the first token.

Called by `text_stream.py` per completion request. Each attempt asks `kv_affinity` for a ready
replica, streams the leader's tokens (its `GenerateMux` stream, `mux.py`, or one `Generate`
call) and yields token chunks. Errors, as `tessera.policies.routing.retry` decides:
INVALID_ARGUMENT → 400; RESOURCE_EXHAUSTED (larger than that replica's KV pool) → other
replicas, 400 if none fits; anything else marks the replica failed and moves the request:
before the first token it starts over, after it continues (prompt + tokens so far, the
remaining `max_tokens`; greedy output unchanged, a seeded sampler continues with seed + tokens
so far). `ReplicaLost` when no replica is left to continue on, 503 when all failed before the
first token. A cut-over may redirect an attempt (`inflight.InFlightTable`) without a failure.
Limits (`limits.Limits`): no chunk within `first_token_timeout_s` or `token_timeout_s` counts
as a crash; past `request_timeout_s` the request ends with 504. Leaving the generator early
cancels the call (the agent frees the pages); tickets and in-flight records are always released.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tessera.gateway import errors, inflight, kv_affinity, limits, metrics, replicas, router
from tessera.observability import tracing
from tessera.policies.routing import closed, retry
from tessera.rpc import sampling as rpc_sampling
from tessera.rpc.v1 import agent_pb2 as pb


def seed_plus(seed: int, k: int) -> int:
    """`seed + k` wrapped into int64 (the agent's seed type)."""
    return (seed + k + 2**63) % 2**64 - 2**63


@dataclass(frozen=True)
class Job:
    """One generation as sent to an agent."""

    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: rpc_sampling.Sampling  # `max_tokens` resolved, stop strings' token ids filled
    received_at: float  # monotonic time the HTTP request arrived (for TTFT)
    variant: str = ""  # LoRA adapter the agent applies (issue 14); "" = none
    allowed: Callable[[str], bool] | None = None  # replicas serving the model; None = all

    def __post_init__(self) -> None:
        if self.sampling.max_tokens is None:
            raise ValueError("Job: sampling.max_tokens must be resolved")

    @property
    def max_tokens(self) -> int:
        assert self.sampling.max_tokens is not None  # __post_init__
        return self.sampling.max_tokens

    @property
    def seed(self) -> int | None:
        return self.sampling.seed

    def reseeded(self, k: int) -> rpc_sampling.Sampling:
        """The settings with seed + `k` (unchanged when unseeded)."""
        seed = self.sampling.seed
        return (
            self.sampling
            if seed is None
            else dataclasses.replace(self.sampling, seed=seed_plus(seed, k))
        )

    def request(self, replica_id: str, attempt: int) -> pb.GenerateRequest:
        return pb.GenerateRequest(
            replica_id=replica_id,
            request_id=self.request_id if attempt == 0 else f"{self.request_id}.r{attempt}",
            prompt_token_ids=list(self.prompt_ids),
            params=rpc_sampling.to_proto(self.sampling),
            variant=self.variant,
        )


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability and the top alternatives (id, logprob)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Chunk:
    """Tokens streamed by the replica; `finish_reason` ("stop"/"length") on the last."""

    token_ids: tuple[int, ...]
    finish_reason: str | None
    replica_id: str
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token, when the job asked


class ReplicaLost(Exception):
    """The replica failed after tokens were yielded."""

    def __init__(self, replica_id: str, message: str) -> None:
        super().__init__(f"replica {replica_id} failed mid-generation: {message}")
        self.replica_id = replica_id


class _AttemptFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Redirected(Exception):
    """The cut-over moved the request: continue it on `target`."""

    def __init__(self, target: str) -> None:
        super().__init__(f"redirected to {target}")
        self.target = target


class Dispatcher:
    """Routes, calls and accounts generations."""

    def __init__(
        self,
        replica_set: replicas.ReplicaSet,
        route: router.Router,
        gauges: metrics.GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
        table: inflight.InFlightTable | None = None,
        affinity: kv_affinity.KvAffinity | None = None,
        timeouts: limits.Limits | None = None,
    ) -> None:
        self._limits = timeouts or limits.Limits()
        self._affinity = affinity  # KV-owner-first choice (issue 14); None: the router's
        self._replicas = replica_set
        self._router = route
        self._metrics = gauges
        self._clock = clock
        self.inflight = table if table is not None else inflight.InFlightTable()

    async def generate(
        self, job: Job, exclude: frozenset[str] = frozenset()
    ) -> AsyncGenerator[Chunk, None]:
        """Yield the job's token chunks; raises ApiError or ReplicaLost (module docstring)."""
        tried = set(exclude)
        failures: list[retry.Failure] = []
        attempt = 0
        generated: list[int] = []  # tokens already yielded (they survive a lost replica)
        current = job
        lost: ReplicaLost | None = None
        redirect: str | None = None  # where the cut-over moved the request's KV
        polled = False  # a cut-over's new replicas are polled at most once for this job
        while True:
            ready = [r for r in self._replicas.ready_ids() if r not in tried]
            if job.allowed is not None:  # a variant's replicas only
                ready = [r for r in ready if job.allowed(r)]
            if redirect not in ready:  # an overload drop's head: other replicas first
                ready = closed.open_first(ready, self._replicas.closed, self._replicas.room_ids())
            if redirect in ready:
                route: router.Route | None = router.Route(redirect, "cutover")
            elif self._affinity is not None:
                route = self._affinity.choose(
                    ready, current.prompt_ids, current.max_tokens, current.variant
                )
            else:
                route = self._router.choose(
                    ready,
                    len(current.prompt_ids),
                    current.max_tokens,
                    current.prompt_ids,
                    current.variant,
                )
            redirect = None
            if route is None and not polled and self._replicas.unpolled():
                # a cut-over just named replicas the poller has not seen yet (a switch of
                # a one-replica deployment routes only those): poll them, then route
                polled = True
                await self._replicas.poll_once()
                continue
            if route is None:
                if lost is not None:
                    raise lost
                raise _api_error(retry.give_up(failures))
            rid = route.replica_id
            tried.add(rid)
            self._metrics.routed.labels(rid, route.policy).inc()
            try:
                async with contextlib.aclosing(
                    self._attempt(current, rid, attempt, resumed=bool(generated))
                ) as chunks:
                    async for chunk in chunks:
                        generated.extend(chunk.token_ids)
                        yield chunk
                return
            except _Redirected as exc:
                redirect = exc.target
                tried.discard(rid)  # not a failure: it may serve the request again
                current = _continuation(job, generated)
            except _AttemptFailed as exc:
                failures.append(retry.Failure(rid, exc.code, str(exc)))
                self._metrics.retries.labels(rid, exc.code).inc()
                if generated:
                    lost = ReplicaLost(rid, str(exc))
                    current = _continuation(job, generated)
            attempt += 1

    def _wait_s(self, job: Job, opening: bool) -> tuple[float | None, bool]:
        """How long to wait for the next chunk, and whether that is the request's deadline
        (not the replica's gap)."""
        lim = self._limits
        gap = lim.first_token_timeout_s if opening else lim.token_timeout_s
        if not lim.request_timeout_s:
            return (gap or None), False
        left = job.received_at + lim.request_timeout_s - self._clock()
        if gap and gap < left:
            return gap, False
        return max(left, 0.0), True

    def _failed(self, rid: str, code: str, details: str, variant: str, note: str) -> _AttemptFailed:
        """The retry of a failed attempt, the replica marked failed (`note`) when the
        policy says so."""
        if retry.on_error(code, details, variant).mark_failed:
            self._replicas.mark_failed(rid, note)
        return _AttemptFailed(code, details)

    async def _attempt(
        self, job: Job, rid: str, attempt: int, resumed: bool = False
    ) -> AsyncGenerator[Chunk, None]:
        request = job.request(rid, attempt)  # before any accounting: it may raise
        ticket = self._router.admit(rid, len(job.prompt_ids), job.max_tokens)
        outstanding = self._metrics.outstanding.labels(rid)  # looked up once, set per chunk
        call: Any = None
        record: inflight.Attempt | None = None
        span = tracing.open_span("tessera.gateway.attempt", replica=rid, attempt=attempt)
        first_at: float | None = None  # when this attempt's first token came
        try:
            outstanding.set(self._router.outstanding(rid))
            call = self._replicas.generate(rid, span.stamp(request))
            last, first = self._clock(), not resumed  # a resumed request had its first token
            opening = True  # this attempt's first chunk (its prefill)
            record = inflight.Attempt(job.request_id, rid, job.prompt_ids, job.max_tokens, last)
            record.call = call
            record.trace_parent = span.traceparent()
            self.inflight.add(record)
            stream = call.__aiter__()
            while True:
                wait, is_deadline = self._wait_s(job, opening)
                try:
                    async with asyncio.timeout(wait):
                        msg = await anext(stream)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    if is_deadline:
                        limit = self._limits.request_timeout_s
                        raise errors.ApiError(
                            504, f"the request did not finish within {limit:g}s", code="timeout"
                        ) from None
                    raise self._failed(
                        rid,
                        retry.DEADLINE_EXCEEDED,
                        f"the replica sent no token for {wait:g}s",
                        job.variant,
                        f"no token for {wait:g}s",
                    ) from None
                ids = tuple(msg.token_ids)
                reason = msg.finish_reason or None
                if reason not in (None, "stop", "length"):
                    raise self._failed(
                        rid,
                        retry.ABORTED,
                        f"the replica ended the request: {reason}",
                        job.variant,
                        f"finish_reason {reason}",
                    )
                if ids:
                    now = self._clock()
                    if first:
                        self._metrics.first_token(job.variant, now - job.received_at)
                        first, first_at = False, now
                        span.event("first_token", tokens=len(ids))
                    else:
                        self._metrics.itl.observe((now - last) / len(ids))
                    last = now
                    if self._affinity is not None:
                        self._affinity.observe(rid, len(ids), now, opening)
                    opening = False
                    record.observe(ids, now)
                    self._metrics.generation_tokens.inc(len(ids))
                    self._router.progress(ticket, len(ids))
                    outstanding.set(self._router.outstanding(rid))
                if reason is not None:
                    self._metrics.finished(job.variant, first_at, last, len(record.generated))
                if reason is not None and self._affinity is not None:
                    self._affinity.finished(rid, record.tokens, job.variant)
                lps = _logprobs(ids, msg.logprobs) if msg.logprobs else ()
                yield Chunk(ids, reason, rid, lps)
                if reason is not None:
                    return
            raise self._failed(
                rid,
                retry.ABORTED,
                "the replica ended the stream without finishing",
                job.variant,
                "stream ended without a finish reason",
            )
        except asyncio.CancelledError:
            task = asyncio.current_task()
            target = record.target if record is not None else None
            if target is not None and (task is None or not task.cancelling()):
                raise _Redirected(target) from None  # the cut-over cancelled the call
            raise
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code().name, exc.details() or ""
            if not retry.on_error(code, details, job.variant).retry:
                raise errors.bad_request(details) from exc
            raise self._failed(rid, code, details, job.variant, f"{code}: {details}") from exc
        finally:
            if record is not None:
                self.inflight.remove(record)
            if call is not None:
                call.cancel()  # no-op once the call ended; frees the agent's pages otherwise
            self._router.release(ticket)
            outstanding.set(self._router.outstanding(rid))
            span.end(tokens=len(record.generated) if record is not None else 0)


def _logprobs(ids: tuple[int, ...], msgs: Sequence[pb.TokenLogprobs]) -> tuple[TokenLogprob, ...]:
    return tuple(
        TokenLogprob(t, m.logprob, tuple(zip(m.top_ids, m.top_logprobs, strict=True)))
        for t, m in zip(ids, msgs, strict=False)
    )


def _continuation(job: Job, generated: list[int]) -> Job:
    """The rest of `job` after `generated` tokens: same request, longer prompt."""
    left = dataclasses.replace(
        job.reseeded(len(generated)), max_tokens=job.max_tokens - len(generated)
    )
    return dataclasses.replace(job, prompt_ids=job.prompt_ids + tuple(generated), sampling=left)


def _api_error(end: retry.GiveUp) -> errors.ApiError:
    return errors.ApiError(end.status, end.message, param=end.param, code=end.code)
