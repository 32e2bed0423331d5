"""The control plane's one agent client: discovery (static list), observation, kept channels.

`observe()` asks every agent for `Describe` concurrently and turns the replies into the
core's `observed.Observed`; an agent that does not answer is marked unreachable with the
reason, never dropped silently (`observe_replies` also returns the replies themselves, for
the loops that read fields `Observed` does not carry). `Channels` keeps one channel per
agent address (async, and a blocking one for the loops that run in a thread) and makes
every stub a loop actuates through (`stub`, `sync_stub`). Called by the operator's
handlers and ticks, by `tessera up` and by the loops in `tessera.control`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import grpc

from tessera import observed
from tessera.rpc import blocks as rpc_blocks
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class AgentRef:
    name: str
    address: str  # host:port


def static_agents(items: Sequence[str]) -> list[AgentRef]:
    """Parse `name=host:port` (or bare `host:port`, named agent-<i>) entries."""
    out = []
    for i, item in enumerate(items):
        name, sep, address = item.partition("=")
        if not sep:
            name, address = f"agent-{i}", item
        if ":" not in address:
            raise ValueError(f"agent {item!r}: expected name=host:port")
        out.append(AgentRef(name.strip(), address.strip()))
    return out


def from_describe(ref: AgentRef, d: pb.DescribeReply) -> observed.AgentInfo:
    return observed.AgentInfo(
        name=ref.name,
        address=ref.address,
        reachable=True,
        devices=tuple(
            observed.DeviceInfo(x.id, x.kind, x.capacity_bytes, x.free_bytes, x.name)
            for x in d.devices
        ),
        blocks=tuple(rpc_blocks.from_proto(b) for b in d.blocks),
        kv=tuple(
            observed.ReplicaLoad(
                k.replica_id,
                k.pages_total,
                k.pages_used,
                k.running,
                k.waiting,
                k.prefix_hit_tokens,
                k.cached_pages,
            )
            for k in d.kv
        ),
        store_address=d.store_address,
        layer_runs=runs_from_describe(d),
        host_cache=tuple(
            observed.CachedPiece(c.model_path, c.piece, c.dtype, c.nbytes)
            for c in d.host_cache.pieces
        ),
        loads=tuple(
            observed.BlockLoad(
                b.replica_id,
                b.stage_index,
                b.tp_rank,
                b.load.peer_bytes,
                b.load.host_bytes,
                b.load.storage_bytes,
                b.load.seconds,
            )
            for b in d.blocks
            if b.HasField("load")
        ),
    )


def runs_from_describe(d: pb.DescribeReply) -> tuple[observed.LayerRun, ...]:
    return tuple(
        observed.LayerRun(
            r.replica_id,
            r.stage_index,
            r.layer_start,
            r.layer_end,
            r.origin == "migrated",
            tuple(
                observed.LayerRunHolder(h.name, h.requests, h.tokens_per_s, h.home)
                for h in r.holders
            ),
        )
        for r in d.scaling_runs
    )


StubFor = Callable[[str], pb_grpc.AgentStub]  # address -> a stub over a kept channel
Replies = Mapping[str, pb.DescribeReply]  # address -> its Describe reply (answered only)


class Channels:
    """One kept channel per agent address: the stubs the control loops observe and act
    through (a loop ticking many times a second must not open a channel per call)."""

    def __init__(self, tls: transport.TlsFiles | None) -> None:
        self.tls = tls  # the process's TLS files (None: plaintext), for every channel
        self._async: dict[str, grpc.aio.Channel] = {}
        self._sync: dict[str, grpc.Channel] = {}

    def stub(self, address: str) -> pb_grpc.AgentStub:
        """An asyncio stub of the agent at `address` (its channel kept until `close`)."""
        if address not in self._async:
            self._async[address] = transport.channel(address, self.tls)
        return pb_grpc.AgentStub(self._async[address])

    def sync_stub(self, address: str) -> pb_grpc.AgentStub:
        """A blocking stub, for a loop that runs in a thread (module scaling)."""
        if address not in self._sync:
            self._sync[address] = transport.sync_channel(address, self.tls)
        return pb_grpc.AgentStub(self._sync[address])

    async def close(self) -> None:
        chans, self._async = self._async, {}
        syncs, self._sync = self._sync, {}
        for ch in chans.values():
            await ch.close()
        for sc in syncs.values():
            sc.close()


async def _describe(
    ref: AgentRef, timeout: float, stub_for: StubFor | None, tls: transport.TlsFiles | None
) -> tuple[observed.AgentInfo, pb.DescribeReply | None]:
    channel = transport.channel(ref.address, tls) if stub_for is None else None
    stub = pb_grpc.AgentStub(channel) if stub_for is None else stub_for(ref.address)
    try:
        reply = await stub.Describe(pb.DescribeRequest(), timeout=timeout)
        return from_describe(ref, reply), reply
    except grpc.aio.AioRpcError as exc:
        info = observed.AgentInfo(
            ref.name, ref.address, reachable=False, error=f"{exc.code().name}: {exc.details()}"
        )
        return info, None
    finally:
        if channel is not None:
            await channel.close()


async def describe(
    ref: AgentRef,
    timeout: float = 5.0,
    stub_for: StubFor | None = None,
    *,
    tls: transport.TlsFiles | None,
) -> observed.AgentInfo:
    """`Describe` of one agent, over `stub_for`'s channel when given (a loop ticking many
    times a second keeps its channels), else a channel opened for this call with `tls`."""
    return (await _describe(ref, timeout, stub_for, tls))[0]


async def observe_replies(
    refs: Sequence[AgentRef],
    timeout: float = 5.0,
    stub_for: StubFor | None = None,
    *,
    tls: transport.TlsFiles | None,
) -> tuple[observed.Observed, dict[str, pb.DescribeReply]]:
    """`observe`, and the replies of the agents that answered, by address."""
    got = await asyncio.gather(*(_describe(r, timeout, stub_for, tls) for r in refs))
    replies = {
        r.address: reply for r, (_, reply) in zip(refs, got, strict=True) if reply is not None
    }
    return observed.Observed(tuple(info for info, _ in got)), replies


async def observe(
    refs: Sequence[AgentRef],
    timeout: float = 5.0,
    stub_for: StubFor | None = None,
    *,
    tls: transport.TlsFiles | None,
) -> observed.Observed:
    return (await observe_replies(refs, timeout, stub_for, tls=tls))[0]
