"""Perform the steps of a KunServe drop or restore on live agents (issue 13): the thin driver.

Input: the steps `tessera.policies.overload.steps` decided (pure), the agents' gRPC
addresses in them, and a callback that changes the gateway's routable replica set.
Caller: `tessera.control.overload.OverloadLoop` (the loop the operator, `tessera up` and
`tessera bench overload` tick), and the acceptance test. Each step is one RPC or a short
poll; the driver keeps only what the steps hand on (the paused head's pages, a
compaction's page moves, each block's pool after a shift). The exchange copies K/V with
`ExportKV` -> `ImportKV` in chunks of `chunk_pages` pages, ids unchanged, the head paused.
Several groups' steps may run at once, their routes steps one at a time; the report times
each kind of step (`step_s`). Details: `docs/overload.md`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import grpc

from tessera.control import agents
from tessera.policies.overload import steps as steps_mod
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

SetRoutes = Callable[[steps_mod.Routes], Awaitable[None]]
AfterStep = Callable[[steps_mod.Step], Awaitable[None]]


class DriveError(Exception):
    """A step failed; the message names the step and the agent's status."""


@dataclass
class Report:
    """What one run of steps did, for events, status and the bench."""

    paused_s: float = 0.0  # the head scheduled no step this long
    exchange_s: float = 0.0  # of which K/V exchange
    exchanged_pages: int = 0
    exchange_chunks: int = 0
    pools: dict[steps_mod.BlockRef, int] = field(default_factory=dict)  # pages after shifts
    replies: list[pb.OverloadShiftReply] = field(default_factory=list)
    step_s: dict[str, float] = field(default_factory=dict)  # seconds per step kind ("Drain")


async def _no_routes(_: steps_mod.Routes) -> None:
    return None


class Driver:
    def __init__(
        self,
        set_routes: SetRoutes = _no_routes,
        chunk_pages: int = 4,
        timeout_s: float = 120.0,
        drain_poll_s: float = 0.05,
        after_step: AfterStep | None = None,
        channels: agents.Channels | None = None,
        *,
        tls: transport.TlsFiles | None,
    ) -> None:
        self.set_routes, self.chunk_pages = set_routes, max(1, chunk_pages)
        self.after_step = after_step  # tests: stop the operator between two steps
        self.timeout_s, self.drain_poll_s = timeout_s, drain_poll_s
        # the control plane's kept channels (`agents.Channels`: the operator's per
        # deployment ones), or the driver's own, closed by `close`
        self.channels = channels if channels is not None else agents.Channels(tls)
        self._own_channels = channels is None
        # drops of disjoint groups run at once; their routes changes go one at a time
        # (the operator's is a read-modify-write of the routes document)
        self._routes_lock = asyncio.Lock()

    def stub(self, address: str) -> pb_grpc.AgentStub:
        """The agent at `address` over the one kept channel to it."""
        return self._stub(address)

    def _stub(self, address: str) -> pb_grpc.AgentStub:
        return self.channels.stub(address)

    async def close(self) -> None:
        if self._own_channels:
            await self.channels.close()

    async def run(self, steps: Sequence[steps_mod.Step]) -> Report:
        rep = Report()
        held: list[int] = []
        moves: tuple[list[int], list[int]] = ([], [])
        paused_at = 0.0
        for st in steps:
            began = time.monotonic()
            try:
                if isinstance(st, steps_mod.Routes):
                    async with self._routes_lock:
                        await self.set_routes(st)
                elif isinstance(st, steps_mod.Drain):
                    await self._drain(st.block)
                elif isinstance(st, steps_mod.Pause):
                    paused_at = time.monotonic()
                    held = list((await self._shift(st.block, "pause")).held_pages)
                elif isinstance(st, steps_mod.Compact):
                    r = await self._shift(st.block, "compact")
                    held, moves = list(r.held_pages), (list(r.moves_from), list(r.moves_to))
                elif isinstance(st, steps_mod.MovePages):
                    await self._shift(
                        st.block, "move_pages", moves_from=moves[0], moves_to=moves[1]
                    )
                elif isinstance(st, steps_mod.Shift):
                    r = await self._apply_shift(st)
                    rep.pools[st.becomes] = r.kv_pages
                    rep.replies.append(r)
                elif isinstance(st, steps_mod.ExchangeKV):
                    t0 = time.monotonic()
                    await self._exchange(st, held, rep)
                    rep.exchange_s += time.monotonic() - t0
                elif isinstance(st, steps_mod.Resume):
                    pages = st.num_pages or min((rep.pools[b] for b in st.grow_to), default=0)
                    await self._shift(st.block, "resume", num_pages=pages)
                    rep.paused_s += time.monotonic() - paused_at
            except grpc.aio.AioRpcError as exc:
                raise DriveError(f"{st}: {exc.code().name}: {exc.details()}") from exc
            kind = type(st).__name__
            rep.step_s[kind] = rep.step_s.get(kind, 0.0) + time.monotonic() - began
            if self.after_step is not None:
                await self.after_step(st)
        return rep

    async def _shift(
        self, b: steps_mod.BlockRef, op: str, **fields: object
    ) -> pb.OverloadShiftReply:
        req = pb.OverloadShiftRequest(
            replica_id=b.replica_id,
            stage_index=b.stage_index,
            op=op,
            **fields,  # type: ignore[arg-type]
        )
        reply: pb.OverloadShiftReply = await self._stub(b.address).OverloadShift(
            req, timeout=self.timeout_s
        )
        return reply

    async def _apply_shift(self, st: steps_mod.Shift) -> pb.OverloadShiftReply:
        sources = [
            pb.OverloadSource(
                address=b.address,
                replica_id=b.replica_id,
                stage_index=b.stage_index,
                layer_start=s,
                layer_end=e,
            )
            for b, s, e in st.sources
        ]
        return await self._shift(
            st.block,
            st.op,
            layer_start=st.start,
            layer_end=st.end,
            new_replica_id=st.becomes.replica_id,
            new_stage_index=st.becomes.stage_index,
            num_stages=st.num_stages,
            next_address=st.next_address,
            sources=sources,
        )

    async def _drain(self, b: steps_mod.BlockRef) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            desc = await self._stub(b.address).Describe(pb.DescribeRequest(), timeout=10)
            kv = [k for k in desc.kv if k.replica_id == b.replica_id]
            if not kv or (kv[0].running == 0 and kv[0].waiting == 0):
                return
            if time.monotonic() > deadline:
                raise DriveError(f"drain {b.replica_id}: requests still running after the deadline")
            await asyncio.sleep(self.drain_poll_s)

    async def _exchange(self, st: steps_mod.ExchangeKV, held: list[int], rep: Report) -> None:
        for i in range(0, len(held), self.chunk_pages):
            chunk = held[i : i + self.chunk_pages]

            async def messages(chunk: list[int] = chunk) -> AsyncIterator[pb.KVImportMessage]:
                yield pb.KVImportMessage(
                    header=pb.KVImportHeader(
                        replica_id=st.target.replica_id,
                        stage_index=st.target.stage_index,
                        page_ids=chunk,
                    )
                )
                export = self._stub(st.source.address).ExportKV(
                    pb.ExportKVRequest(
                        replica_id=st.source.replica_id,
                        stage_index=st.source.stage_index,
                        page_ids=chunk,
                        layer_start=st.start,
                        layer_end=st.end,
                    ),
                    timeout=self.timeout_s,
                )
                async for kv in export:
                    yield pb.KVImportMessage(layer=kv)

            await self._stub(st.target.address).ImportKV(messages(), timeout=self.timeout_s)
            rep.exchanged_pages += len(chunk)
            rep.exchange_chunks += 1
