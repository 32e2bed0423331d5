"""Generation RPCs of the agent: one request's chunks, and many requests over one stream.

Called by the servicer's `Generate` (one server-streaming call per request) and `GenerateMux`
(one bidirectional stream per replica, kept by the gateway). Both run a request through
`chunks`: the leader engine's `ReplicaEngine.generate_batches` (leaving the generator cancels
the request and frees its pages), the same validation and metrics. Failures are
`EngineError`s: `Generate` ends its call with their gRPC status; `GenerateMux` sends them as that
request's error entry (code name + message) and the stream goes on. `serve`: a reader task takes
`start` and `cancel` messages, a task per request runs `chunks`, and the single writer sends all
news ready at once in ONE `GenerateMuxReply` (one message per decode step for the batch). The
stream ends when the caller half-closed and its requests finished; cancelling it cancels them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import grpc

from tessera.observability import tracing
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import convert, grpc_status, hosted, metrics
from tessera_agent.engine import errors

log = logging.getLogger(__name__)

Hosting = Mapping[tuple[str, int], hosted.Hosted]


Wake = Callable[[str], Awaitable[None]]  # wakes a sleeping replica (sleep.Sleepers.awake)


async def chunks(
    blocks: Hosting, agent_id: str, gauges: metrics.AgentMetrics, request: pb.GenerateRequest
) -> AsyncIterator[pb.GenerateChunk]:
    """The request's chunks, one per batch of ready events; raises `EngineError`."""
    h = blocks.get((request.replica_id, 0))
    if h is None or h.leader is None:
        raise errors.NotFoundError(
            f"replica {request.replica_id!r} is not led by agent {agent_id} (no stage 0 here)"
        )
    prompt = list(request.prompt_token_ids)
    n = 0
    outcome = "cancelled"  # unless the stream reaches its end or fails
    span = first = tracing.NOOP  # tracing on: the request's span, its queue + prefill
    try:
        params = convert.sampling_from_proto(request.params)
        vocab = h.stage.cfg.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise errors.InvalidArgumentError(
                f"prompt_token_ids: {bad[0]} is outside the vocabulary [0, {vocab})"
            )
        rid = request.request_id or uuid.uuid4().hex
        span = tracing.open_span(
            "tessera.agent.generate", request.trace_parent, rid, replica=request.replica_id
        )
        first = span.child("tessera.agent.queue_prefill")
        gauges.prompt_tokens.labels(request.replica_id).inc(len(prompt))
        # One message per batch of ready events, not one per token.
        gen = h.leader.generate_batches(rid, prompt, params, request.variant)
        generated = gauges.generated_tokens.labels(request.replica_id)
        async for batch in gen:
            first.end()  # the first tokens came: queue and prefill are over (then a no-op)
            new = sum(ev.token is not None for ev in batch)
            n += new
            generated.inc(new)
            span.event("tokens", count=new, total=n)  # a step's tokens (tracing on)
            outcome = batch[-1].finish_reason or outcome
            yield convert.chunk_from_events(batch, len(prompt), n)
    except errors.EngineError as exc:
        outcome = grpc_status.code(exc).name.lower()
        raise
    finally:
        gauges.requests.labels(request.replica_id, outcome).inc()
        first.end()
        span.end(outcome=outcome, prompt_tokens=len(prompt), generated_tokens=n)


class _Stream:
    """One GenerateMux stream: its running requests and the news not sent yet."""

    def __init__(
        self, blocks: Hosting, agent_id: str, gauges: metrics.AgentMetrics, wake: Wake | None
    ) -> None:
        self._blocks, self._agent_id, self._gauges = blocks, agent_id, gauges
        self._wake = wake
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.pending: list[pb.GenerateMuxEntry] = []
        self.news = asyncio.Event()
        self.reading = True

    def post(self, entry: pb.GenerateMuxEntry) -> None:
        self.pending.append(entry)
        self.news.set()

    def fail(self, request_id: str, code: grpc.StatusCode, message: str) -> None:
        err = pb.GenerateMuxError(code=code.name, message=message)
        self.post(pb.GenerateMuxEntry(request_id=request_id, error=err))

    async def read(self, requests: AsyncIterator[pb.GenerateMuxRequest]) -> None:
        try:
            async for msg in requests:
                if msg.HasField("start"):
                    self.start(msg.start)
                elif msg.HasField("cancel"):
                    task = self.tasks.pop(msg.cancel.request_id, None)
                    if task is not None:
                        task.cancel()
        finally:
            self.reading = False
            self.news.set()

    def start(self, request: pb.GenerateRequest) -> None:
        rid = request.request_id
        if not rid:
            self.fail(rid, grpc.StatusCode.INVALID_ARGUMENT, "request_id: required on a stream")
        elif rid in self.tasks:
            self.fail(rid, grpc.StatusCode.ALREADY_EXISTS, f"request {rid!r} is running")
        else:
            self.tasks[rid] = asyncio.create_task(self._run(rid, request))

    async def _run(self, rid: str, request: pb.GenerateRequest) -> None:
        try:
            if self._wake is not None:
                await self._wake(request.replica_id)
            async for chunk in chunks(self._blocks, self._agent_id, self._gauges, request):
                self.post(pb.GenerateMuxEntry(request_id=rid, chunk=chunk))
        except errors.EngineError as exc:
            self.fail(rid, grpc_status.code(exc), str(exc))
        except Exception as exc:  # one request's bug must not end the others' stream
            log.exception("GenerateMux request %s failed", rid)
            self.fail(rid, grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        finally:
            if self.tasks.get(rid) is asyncio.current_task():
                del self.tasks[rid]
            self.news.set()

    async def close(self) -> None:
        tasks = list(self.tasks.values())
        self.tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def serve(
    blocks: Hosting,
    agent_id: str,
    gauges: metrics.AgentMetrics,
    requests: AsyncIterator[pb.GenerateMuxRequest],
    wake: Wake | None = None,
) -> AsyncIterator[pb.GenerateMuxReply]:
    """The GenerateMux stream (module docstring): one reply per batch of news; `wake`
    first wakes a request's replica when it sleeps."""
    stream = _Stream(blocks, agent_id, gauges, wake)
    reader = asyncio.create_task(stream.read(requests))
    try:
        while True:
            if stream.pending:
                entries, stream.pending = stream.pending, []
                yield pb.GenerateMuxReply(entries=entries)
                continue
            if not stream.reading and not stream.tasks:
                return
            stream.news.clear()
            await stream.news.wait()
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await stream.close()
