"""Server side of the stage stream: one later stage of a replica, fed by the stage before it.

Called by the servicer's `StageStream`. The first message is a hello naming the replica,
the expected stage index, start layer and model: a mismatch is FAILED_PRECONDITION
("stage mismatch"). The reply tells the upstream stage the smallest KV pool from here to
the last stage. Then each step runs on the agent's compute thread, is forwarded to the
next stage when there is one, and the sampled tokens travel back in order: steps are
pumped concurrently so this stage computes step n+1 while step n is downstream.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc
import torch

from tessera.observability import tracing
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import convert, grpc_status, hosted, speculate_serve, stage_client, stitch_serve
from tessera_agent.engine import dtypes, errors, replica, step

Hosting = Mapping[tuple[str, int], hosted.Hosted]


def check_hello(blocks: Hosting, agent_id: str, hello: pb.StageHello) -> hosted.Hosted:
    h = blocks.get((hello.replica_id, hello.stage_index))
    if h is None:
        have = ", ".join(x.holder for x in blocks.values()) or "none"
        raise errors.FailedPreconditionError(
            f"stage mismatch: replica {hello.replica_id} has no stage {hello.stage_index} "
            f"on agent {agent_id} (loaded: {have})"
        )
    s = h.stage.spec
    if s.start != hello.layer_start:
        raise errors.FailedPreconditionError(
            f"stage mismatch: replica {hello.replica_id} stage {hello.stage_index} starts "
            f"at layer {s.start} but the previous stage ends at layer {hello.layer_start}"
        )
    if s.model_path != hello.model_path:
        raise errors.FailedPreconditionError(
            f"stage mismatch: replica {hello.replica_id} stage {hello.stage_index} serves "
            f"{s.model_path}, the previous stage {hello.model_path}"
        )
    return h


async def _step(
    compute: concurrent.futures.Executor,
    h: hosted.Hosted,
    msg: pb.StageMessage,
    downstream: replica.Downstream | None,
) -> pb.StageResult:
    with tracing.step(msg.step, h.stage.spec.replica_id, h.stage.spec.stage_index):
        return await _traced_step(compute, h, msg, downstream)


async def _traced_step(
    compute: concurrent.futures.Executor,
    h: hosted.Hosted,
    msg: pb.StageMessage,
    downstream: replica.Downstream | None,
) -> pb.StageResult:
    inp = convert.step_from_proto(msg.step)
    if msg.step.hidden_on_link:  # posted first: receives are issued in stream order
        link = h.link_up
        if link is not None and link.group is None:
            await link.settled()
        if link is None or not link.ready:
            raise errors.UnavailableError("the stage link the previous stage used is gone")
        n = sum(c.num_tokens for c in inp.chunks)
        dtype = dtypes.torch_dtype(msg.step.hidden_dtype or "float32")
        inp.hidden = await link.receive((n, h.stage.cfg.hidden_size), dtype, inp.step_id)
    st = h.stage
    if st.speculate is not None and downstream is not None:  # issue 35: the guess goes ahead
        out = await speculate_serve.run_step(
            compute, st.runner, inp, downstream, st.speculate, st.slow_s
        )
        return convert.result_to_proto(out)
    out = await speculate_serve.compute(compute, st.runner, inp, st.slow_s)
    if downstream is not None:
        out = await downstream.submit(step.next_stage_input(inp, out))
    elif inp.result_on_link and out.sampled and not out.logprobs:
        out = await _tokens_back(h, inp, out)
    return convert.result_to_proto(out)


async def _tokens_back(
    h: hosted.Hosted, inp: step.StepInput, out: step.StepOutput
) -> step.StepOutput:
    """Last stage: send the sampled tokens to the leader over the return link, in chunk
    order; the gRPC result becomes an acknowledgement. Without the link they stay on it."""
    link = h.result_out
    if link is not None and link.group is None:
        await link.settled()
    if link is None or not link.ready:
        return out
    ids = [c.seq_id for c in inp.chunks if c.sample]
    tokens = torch.tensor([out.sampled[i] for i in ids], dtype=torch.long)
    try:
        await link.send(tokens, inp.step_id)
    except Exception:  # the leader still listens: the tokens go on gRPC, it stops listening
        return out
    return step.StepOutput(out.step_id, tokens_on_link=True)


async def serve(
    blocks: Hosting,
    agent_id: str,
    compute: concurrent.futures.Executor,
    request_iterator: AsyncIterator[pb.StageMessage],
    context: grpc.aio.ServicerContext[Any, Any],
    tls: transport.TlsFiles | None,  # the agent's mTLS files, for the next stage's link
) -> AsyncIterator[pb.StageResult]:
    first = await anext(aiter(request_iterator), None)
    if first is None or not first.HasField("hello"):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "StageStream must open with a hello")
        return
    hello = first.hello
    try:
        h = check_hello(blocks, agent_id, hello)
        downstream: replica.Downstream | None = None
        pages = h.stage.num_pages
        if h.stage.spec.stage_index < h.num_stages - 1:
            remote = await stage_client.RemoteDownstream.connect(
                h.next_address, stitch_serve.hello(h.stage.spec, h.stage.stitch), tls
            )
            pages = min(pages, remote.num_pages)
            remote.link = h.link_down
            downstream = remote
            if h.stage.stitch is not None:  # a stitched chain's front ends here (issue 35)
                downstream = stitch_serve.Stitched(remote, h.stage.stitch, compute)
    except errors.EngineError as exc:
        await grpc_status.abort(context, exc)
    yield pb.StageResult(
        hello=pb.StageHelloReply(num_pages=pages, page_size=h.stage.spec.page_size)
    )
    results: asyncio.Queue[asyncio.Future[pb.StageResult] | None] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for msg in request_iterator:
                results.put_nowait(asyncio.ensure_future(_step(compute, h, msg, downstream)))
        finally:
            results.put_nowait(None)

    pump_task = asyncio.create_task(pump())
    try:
        while (fut := await results.get()) is not None:
            try:
                yield await fut
            except errors.EngineError as exc:
                await grpc_status.abort(context, exc)
    finally:
        pump_task.cancel()
        with contextlib.suppress(BaseException):
            await pump_task
        if downstream is not None:
            await downstream.close()
