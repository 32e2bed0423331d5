"""Module-scaling operations on the stages this agent hosts (`ScalingReplicate`,
`ScalingMigrate`, `ScalingEvict`) and what `Describe` reports about their runs.

Translates a `ScalingOpRequest` into an `engine.scaling_ops` call on the hosted stage:
the new holder is a `LocalHolder` on another device of this agent (no target address)
or a `run_client.RemoteHolder` loaded on the target agent, its weights copied from this
stage (or read from the checkpoint when the stage's copy migrated away). The replica
leader's page allocator tells a move which pages are live. Memory: a local replica is
booked on its device; a migration away releases the stage's share of the run. A
replication runs to its end even when its caller goes away, and is reported in flight
(`describe_pending`) until then. Called by the servicer; the agent's compute executor
orders every change between two steps.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from dataclasses import dataclass

from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import booking, hosted, hosting, run_client
from tessera_agent.engine import errors, run_holders, scaling_ops


@dataclass(frozen=True, order=True)
class Pending:
    """A replication in flight: what it will place."""

    replica_id: str
    stage_index: int
    start: int
    end: int
    target_address: str
    target_device: str


class ScalingControl:
    def __init__(
        self,
        agent_id: str,
        hosting_: hosting.Hosting,
        memory: booking.Booking,
        compute: concurrent.futures.Executor,
    ) -> None:
        self.agent_id, self.hosting, self.memory, self.compute = (
            agent_id,
            hosting_,
            memory,
            compute,
        )
        # replications accepted and not finished, by what they place (Describe reports
        # them, so a new operator neither repeats one nor takes its target for idle)
        self.pending: dict[Pending, asyncio.Task[pb.ScalingOpReply]] = {}

    def _origin(self, h: hosted.Hosted) -> str:
        return scaling_ops.origin_name(self.agent_id, h.stage.spec.device)

    def _factory(self, h: hosted.Hosted, req: pb.ScalingOpRequest) -> scaling_ops.HolderFactory:
        spec, runner = h.stage.spec, h.stage.runner
        start, end = req.layer_start, req.layer_end
        scaling_ops.check_range(runner, start, end)
        vacated = any(
            isinstance(runner.model.layers[i - spec.start], run_holders.VacatedLayer)
            for i in range(start, end)
        )
        if not req.target_address:
            dev = self.memory.device(req.target_device or next(iter(self.memory.devices)))
            name = f"{self.agent_id}/{dev.id}"

            async def local() -> run_holders.Holder:
                holder = await asyncio.get_running_loop().run_in_executor(
                    None,
                    scaling_ops.local_replica,
                    runner, start, end, dev.torch_device(), name, spec.model_path,
                )  # fmt: skip
                need = holder.param_bytes + holder.kv_bytes
                if need > dev.free_bytes:
                    holder.close()
                    raise errors.ResourceExhaustedError(
                        f"layers [{start}, {end}) need {need} bytes but {dev.id} has "
                        f"{dev.free_bytes} free"
                    )
                self.memory.book(dev.id, f"run:{spec.replica_id}/{start}-{end}/{name}", need)
                return holder

            return local
        load = pb.ScalingRunLoadRequest(
            run_id=f"{spec.replica_id}/{spec.stage_index}/L{start}-{end}/{uuid.uuid4().hex[:8]}",
            model_path=spec.model_path,
            layer_start=start,
            layer_end=end,
            device=req.target_device,
            dtype=spec.dtype,
            num_pages=runner.cache.layout.num_pages,
            page_size=runner.page_size,
        )
        if req.self_address and not vacated:
            load.source.CopyFrom(
                pb.BlockSource(
                    address=req.self_address,
                    replica_id=spec.replica_id,
                    stage_index=spec.stage_index,
                )
            )

        async def remote() -> run_holders.Holder:
            return await run_client.RemoteHolder.load(
                req.target_address, load, self.hosting.defaults.tls
            )

        return remote

    async def replicate(self, req: pb.ScalingOpRequest) -> pb.ScalingOpReply:
        """Add the replica; it runs to its end (the run present and serving, or, failing,
        absent) even when the caller goes away meanwhile: an operator killed in the middle
        leaves no half-made run, and finds the replication in `describe_pending` until then.
        The same replication asked again while in flight is refused."""
        h = self.hosting.get(req.replica_id, req.stage_index)
        key = Pending(
            req.replica_id, req.stage_index, req.layer_start, req.layer_end,
            req.target_address, req.target_device,
        )  # fmt: skip
        if key in self.pending:
            raise errors.FailedPreconditionError(
                f"layers [{req.layer_start}, {req.layer_end}) of {req.replica_id} are already "
                f"being replicated onto {req.target_address or self.agent_id}"
            )

        async def run() -> pb.ScalingOpReply:
            try:
                res = await scaling_ops.replicate(
                    h.stage.runner, self.compute, self._origin(h), req.layer_start,
                    req.layer_end, self._factory(h, req),
                    h.leader.live_pages if h.leader is not None else None,
                )  # fmt: skip
                return _reply(res)
            finally:
                self.pending.pop(key, None)

        task = self.pending[key] = asyncio.create_task(run())
        return await asyncio.shield(task)

    def describe_pending(self) -> list[pb.ScalingPending]:
        return [
            pb.ScalingPending(
                replica_id=k.replica_id,
                stage_index=k.stage_index,
                layer_start=k.start,
                layer_end=k.end,
                target_address=k.target_address,
                target_device=k.target_device,
            )
            for k in sorted(self.pending)
        ]

    async def migrate(self, req: pb.ScalingOpRequest) -> pb.ScalingOpReply:
        h = self.hosting.get(req.replica_id, req.stage_index)
        origin = self._origin(h)
        res = await scaling_ops.migrate(
            h.stage.runner, self.compute, req.layer_start, req.layer_end,
            req.holder or origin, self._factory(h, req), origin,
            h.leader.live_pages if h.leader is not None else None,
        )  # fmt: skip
        self._release(h, res.source, req.layer_start, req.layer_end)
        return _reply(res)

    async def evict(self, req: pb.ScalingOpRequest) -> pb.ScalingOpReply:
        h = self.hosting.get(req.replica_id, req.stage_index)
        if not req.holder:
            raise errors.InvalidArgumentError("holder: name the replica to evict")
        res = await scaling_ops.evict(
            h.stage.runner, self.compute, req.layer_start, req.layer_end, req.holder
        )
        self._release(h, res.source, req.layer_start, req.layer_end)
        return _reply(res)

    async def batch_limit(self, req: pb.ScalingBatchLimitRequest) -> pb.ScalingBatchLimitReply:
        """Algorithm 2's batch cut on the replica this agent leads (0 restores)."""
        if req.max_num_seqs < 0:
            raise errors.InvalidArgumentError(
                f"max_num_seqs: must be >= 1, or 0 for the loaded limit; got {req.max_num_seqs}"
            )
        leader = self.hosting.leader(req.replica_id)
        prev = leader.set_max_num_seqs(req.max_num_seqs)
        return pb.ScalingBatchLimitReply(
            previous=prev,
            max_num_seqs=leader.sched_cfg.max_num_seqs,
            loaded=leader.loaded_max_num_seqs,
            running=leader.stats().running,
        )

    def _release(self, h: hosted.Hosted, holder: str, start: int, end: int) -> None:
        """Give back the memory booked for `holder`'s copy on this agent."""
        spec = h.stage.spec
        for dev in self.memory.devices.values():
            dev.used.pop(f"run:{spec.replica_id}/{start}-{end}/{holder}", None)
        if holder == self._origin(h):  # the stage's own copy left: its weights and KV
            run = scaling_ops.find(h.stage.runner, start, end)
            if run is not None:
                key = h.holder
                own = self.memory.devices.get(spec.device)
                if own is not None and key in own.used:
                    share = (end - start) * (h.stage.param_bytes + h.stage.kv_bytes)
                    own.used[key] = max(0, own.used[key] - share // (spec.end - spec.start))

    def describe(self) -> list[pb.ScalingRunInfo]:
        out: list[pb.ScalingRunInfo] = []
        for (rid, idx), h in sorted(self.hosting.hosted.items()):
            for run in h.stage.runner.runs:
                counts = run.counts(set(h.stage.runner.block_tables))
                out.append(
                    pb.ScalingRunInfo(
                        replica_id=rid,
                        stage_index=idx,
                        layer_start=run.start,
                        layer_end=run.end,
                        origin=run.origin if run.origin in run.holders else "migrated",
                        holders=[
                            pb.ScalingHolderInfo(
                                name=name,
                                requests=counts.get(name, 0),
                                tokens_per_s=run.speeds.get(name, 0.0),
                                param_bytes=x.param_bytes,
                                kv_bytes=x.kv_bytes,
                                home=name == run.home,
                                placed=run.placed.get(name, 0),
                            )
                            for name, x in run.holders.items()
                        ],
                    )
                )
        return out


def _reply(r: scaling_ops.OpResult) -> pb.ScalingOpReply:
    return pb.ScalingOpReply(
        op=r.op,
        layer_start=r.start,
        layer_end=r.end,
        source=r.source,
        target=r.target,
        seconds=r.seconds,
        pause_s=r.pause_s,
        param_bytes=r.param_bytes,
        kv_bytes=r.kv_bytes,
        kv_pages=r.kv_pages,
        requests=r.requests,
    )
