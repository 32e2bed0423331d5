"""The overload loop of `tessera bench overload`'s replay path: the same decisions as the
product loop (`control/overload.py`), driven beside the bench's own in-process router.

Each `tick` reads every member leader's KV (`Describe`) and the queued requests' KV needs
(a callback: the router knows the prompts waiting on each replica), then, with the pure
decisions of `policies/overload/`: dropped groups whose demand stayed under the restore
threshold for the hold get `restore_steps`; otherwise `assess` over the whole replicas and,
when it fires, `drop_plan.plan_drop` and `drop_steps` (a plan's groups at once), or a
fallback (preempt and recompute) with an event advising scale-out. `overload_driver.Driver`
performs the steps; a failed step ends its drop or restore with a Warning event
(`OverloadDropFailed`, `OverloadRestoreFailed`), steps done stay done. Units: bytes of
whole-model KV pages. Caller: `tessera.cli.bench_overload_replay`; docs/overload.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tessera.control import overload_driver
from tessera.observability import control
from tessera.policies.overload import drop_plan
from tessera.policies.overload import monitor as overload
from tessera.policies.overload import steps as overload_steps
from tessera.rpc.v1 import agent_pb2 as pb

QueuedBytes = Callable[[str], Sequence[int]]
OnEvent = Callable[[str, str, str], None]  # (kind: Normal|Warning, reason, message)


@dataclass(frozen=True)
class Event:
    at: float
    kind: str
    reason: str
    message: str


@dataclass
class Dropped:
    """A group the loop dropped, until it restores."""

    group: drop_plan.Group
    pre_drop_pool_bytes: int
    report: overload_driver.Report


@dataclass
class LoopStats:
    drops: int = 0
    restores: int = 0
    fallbacks: int = 0
    exchange_s: float = 0.0
    paused_s: float = 0.0
    events: list[Event] = field(default_factory=list)


class OverloadLoop:
    def __init__(
        self,
        members: Mapping[str, overload_steps.Member],
        cfg: overload.OverloadConfig,
        layer_bytes: Sequence[int],
        page_bytes: int,
        queued_bytes: QueuedBytes,
        driver: overload_driver.Driver,
        describe: Callable[[str], object],
        on_event: OnEvent | None = None,
    ) -> None:
        self.members, self.cfg = dict(members), cfg
        self.layer_bytes, self.page_bytes = tuple(layer_bytes), page_bytes
        self.queued_bytes, self.driver, self.describe = queued_bytes, driver, describe
        self.on_event = on_event
        self.dropped: dict[str, Dropped] = {}  # by head replica
        self.below_since: dict[str, float] = {}  # head -> when its demand fell low enough
        self.stats = LoopStats()

    def _event(self, kind: str, reason: str, message: str) -> None:
        self.stats.events.append(Event(time.monotonic(), kind, reason, message))
        if self.on_event is not None:
            self.on_event(kind, reason, message)

    def grouped(self) -> set[str]:
        return {m for d in self.dropped.values() for m in d.group.members}

    async def _kv(self) -> dict[str, pb.ReplicaKV]:
        out: dict[str, pb.ReplicaKV] = {}
        for addr in sorted({m.address for m in self.members.values()}):
            desc = await self.describe(addr)  # type: ignore[misc]
            for k in desc.kv:
                out[k.replica_id] = k
        return out

    def _replica_kv(self, name: str, k: pb.ReplicaKV, pre: int = 0) -> overload.ReplicaKV:
        return overload.ReplicaKV(
            name,
            int(k.pages_total) * self.page_bytes,
            int(k.pages_used) * self.page_bytes,
            tuple(self.queued_bytes(name)),
            pre,
        )

    async def tick(self) -> None:
        kv = await self._kv()
        for head, d in list(self.dropped.items()):
            if head not in kv:
                continue
            look = overload.assess_restore(
                [self._replica_kv(head, kv[head], d.pre_drop_pool_bytes)], self.cfg
            )
            hold = overload.hold_restore(
                look, self.below_since.pop(head, None), time.monotonic(), self.cfg
            )
            if hold.below_since is not None:
                self.below_since[head] = hold.below_since
            back = hold.decision
            if back.restore:
                self.below_since.pop(head, None)
                num_layers = len(self.layer_bytes)
                steps = overload_steps.restore_steps(d.group, self.members, num_layers)
                try:
                    with control.action("overload", "restore", replica=head):
                        rep = await self.driver.run(steps)
                except overload_driver.DriveError as exc:
                    self._event("Warning", "OverloadRestoreFailed", f"{d.group.members}: {exc}")
                    continue
                del self.dropped[head]
                self.stats.restores += 1
                self.stats.paused_s += rep.paused_s
                self.stats.exchange_s += rep.exchange_s
                self._event("Normal", "OverloadRestored", f"{d.group.members}: {back.message}")
        whole = [n for n in self.members if n not in self.grouped() and n in kv]
        replicas = [self._replica_kv(n, kv[n]) for n in whole]
        dec = overload.assess(replicas, self.cfg)
        if not dec.fire:
            return
        # Firing replicas first: plan_drop's heap breaks ties between equal groups by
        # order, so the replicas whose queue needs the memory are merged first.
        firing = {v.name for v in dec.replicas if v.fires}
        whole.sort(key=lambda n: (n not in firing, n))
        plan = drop_plan.plan_drop(
            drop_plan.DropInput(
                tuple(drop_plan.Replica(n, frozenset(range(len(self.layer_bytes)))) for n in whole),
                self.layer_bytes,
                dec.required_bytes,
            )
        )
        if plan.fallback:
            self.stats.fallbacks += 1
            self._event("Warning", plan.reason, plan.message)
            return
        # The groups share no member: drop them at once, so that a request queued on one
        # group's head waits for its own group's drain, not for every group's in turn.
        changed = [g for g in plan.groups if g.changed]
        runs = await asyncio.gather(*(self._drop(g) for g in changed))
        for g, got in zip(changed, runs, strict=True):
            if isinstance(got, overload_driver.DriveError):  # the loop survives; the event says why
                self._event("Warning", "OverloadDropFailed", f"{g.members}: {got}")
                continue
            head = sorted(g.stages, key=lambda s: s.start)[0].replica
            pre = sum(int(kv[m].pages_total) * self.page_bytes for m in g.members)
            self.dropped[head] = Dropped(g, pre, got)
            self.stats.drops += 1
            self.stats.paused_s += got.paused_s
            self.stats.exchange_s += got.exchange_s
            layers = ", ".join(f"{s.replica} [{s.start}, {s.end})" for s in g.stages)
            self._event(
                "Normal",
                "OverloadDropped",
                f"{dec.message}; {layers}; exchange {got.exchange_s * 1e3:.1f} ms",
            )

    async def _drop(
        self, g: drop_plan.Group
    ) -> overload_driver.Report | overload_driver.DriveError:
        try:
            with control.action("overload", "drop", replicas=",".join(g.members)):
                return await self.driver.run(overload_steps.drop_steps(g, self.members))
        except overload_driver.DriveError as exc:
            return exc
