"""Measures an agent's links: a short pull from each peer, a timed read of its storage.

`ProbeLinks` (issue 32) runs here on the agent that would receive a copy: it pulls
`nbytes` of filler from each peer's `ProbeSend` stream over gRPC (the transport every
block copy can fall back to; the data plane is at least as fast) and times it, and it
reads one decoder layer of a checkpoint through the agent's checkpoint reader
(`switch_fetch.read_checkpoint`, the declared storage bandwidth included) and times that.
The callers (`tessera.control.link_probe`) cache the rates per agent pair and build the
sourcing policy's link model from them. Called by the servicer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc

from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import switch_fetch
from tessera_agent.engine import config as config_mod
from tessera_agent.engine import errors, loader

DEFAULT_BYTES = 8 << 20
CHUNK_BYTES = 1 << 20


def filler(nbytes: int, chunk_bytes: int) -> Iterator[pb.TensorChunk]:
    """`nbytes` of zeros in chunks (what `ProbeSend` streams)."""
    chunk = max(64 << 10, min(chunk_bytes or CHUNK_BYTES, 4 << 20))  # a peer sets no tiny chunks
    data = bytes(chunk)
    sent = 0
    while sent < nbytes:
        n = min(chunk, nbytes - sent)
        yield pb.TensorChunk(name="probe", total_bytes=nbytes, offset=sent, data=data[:n])
        sent += n


async def pull(address: str, nbytes: int, tls: transport.TlsFiles | None) -> pb.LinkRate:
    """Bytes per second of a pull of `nbytes` from the agent at `address`."""
    channel = transport.channel(address, tls)
    try:
        stub = pb_grpc.AgentStub(channel)
        # one tiny call first: the connection's set-up is not the link's bandwidth
        async for _ in stub.ProbeSend(pb.ProbeSendRequest(nbytes=1), timeout=10.0):
            pass
        began = time.perf_counter()
        got = 0
        async for chunk in stub.ProbeSend(
            pb.ProbeSendRequest(nbytes=nbytes, chunk_bytes=CHUNK_BYTES), timeout=30.0
        ):
            got += len(chunk.data)
        took = max(time.perf_counter() - began, 1e-6)
        return pb.LinkRate(address=address, bytes_per_s=got / took)
    except grpc.aio.AioRpcError as exc:
        return pb.LinkRate(address=address, error=f"{exc.code().name}: {exc.details()}")
    finally:
        await channel.close()


def storage_rate(model_path: str, bytes_per_s: float) -> float:
    """Bytes per second of reading the checkpoint's middle decoder layer through the
    agent's checkpoint reader (0 bytes_per_s: unthrottled)."""
    path = Path(model_path)
    cfg = config_mod.ModelConfig.from_path(path)
    layer = cfg.num_layers // 2
    names = [n for n in loader.checkpoint_names(cfg, layer, layer + 1) if ".layers." in n]
    began = time.perf_counter()
    out = switch_fetch.read_checkpoint(path, names, bytes_per_s)
    nbytes = sum(t.numel() * t.element_size() for t in out.values())
    return nbytes / max(time.perf_counter() - began, 1e-6)


async def probe(
    request: pb.ProbeLinksRequest, storage_bytes_per_s: float, tls: transport.TlsFiles | None
) -> pb.ProbeLinksReply:
    nbytes = request.nbytes or DEFAULT_BYTES
    rates = [await pull(a, nbytes, tls) for a in request.peers]  # one at a time: no contention
    reply = pb.ProbeLinksReply(peers=rates)
    if request.model_path:
        try:
            reply.storage_bytes_per_s = await asyncio.get_running_loop().run_in_executor(
                None, storage_rate, request.model_path, storage_bytes_per_s
            )
        except (OSError, ValueError, KeyError, errors.EngineError) as exc:
            reply.storage_error = str(exc)
    return reply
