"""The overload loop (KunServe), level-triggered: observe, decide, actuate, report.

One `tick` per period for a deployment whose spec enables `spec.policies.overload`. Nothing
is carried between ticks but channels, the groups taken over, and since when each group's
demand has been low enough to restore (lost on a restart, which only delays a restore):
an operator restarted mid-drop or mid-restore converges from what the agents report.
Inputs: the planned whole replicas, the agents' report of this pass (`observed.Observed`),
the calls on each replica as the gateway sees them (`gateway_load.Calls`), the policy.
Decision, pure (`policies/overload/`): `held.read`, `assess_restore` + `hold_restore` per
group, `assess` + `drop_plan.merge_order` (busy heads, idle donors) + `plan_drop`, `steps`
(a plan's groups share no member and drop at once). Actuation: `overload_driver.Driver`
(its routes steps call `set_routes`). Report: a `Tick` with events, whether the agents
changed and how long the drops' steps took (the operator writes status and events).
Caller: `tessera_operator.overload_loop` and `tessera up` (every 0.5 s); docs/overload.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tessera import blocks, observed, routes_doc
from tessera.control import gateway_load, overload_driver
from tessera.observability import control
from tessera.policies.overload import drop_plan
from tessera.policies.overload import held as overload_held
from tessera.policies.overload import monitor as overload
from tessera.policies.overload import steps as overload_steps


@dataclass(frozen=True)
class Event:
    kind: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Tick:
    """What one tick did."""

    acted: bool = False  # the agents' blocks changed (a drop, a restore, a convergence)
    events: list[Event] = field(default_factory=list)
    drops: int = 0
    restores: int = 0
    converged: int = 0
    exchange_s: float = 0.0
    paused_s: float = 0.0
    drop_step_s: dict[str, float] = field(default_factory=dict)  # per step kind, over the drops


@dataclass(frozen=True)
class Sizes:
    """Bytes of the model as the agents report them: one whole-model KV page, one layer."""

    page_bytes: int
    layer_bytes: int


def sizes(held: overload_held.Held, obs: observed.Observed, num_layers: int) -> Sizes | None:
    """From any block of a member (whole or a group's stage); None when none reports."""
    want = set(held.whole) | {g.head for g in held.groups}
    for a in obs.agents:
        for b in a.blocks:
            if b.replica_id in want and b.kv_pages and b.end > b.start:
                span = b.end - b.start
                page = b.kv_bytes // b.kv_pages * num_layers // span
                return Sizes(page, b.param_bytes // span)
    return None


def _load(obs: observed.Observed) -> dict[str, observed.ReplicaLoad]:
    return {k.replica_id: k for a in obs.agents for k in a.kv}


def _started(calls: Sequence[gateway_load.Call], load: observed.ReplicaLoad) -> int:
    """Requests a donor would drain: those with a token at the gateway (one with none
    moves elsewhere), or the agent's running ones when the gateway lists none."""
    return sum(c.started for c in calls) if calls else load.running


class OverloadLoop:
    """The loop of one deployment; `tick` once per period."""

    def __init__(
        self, driver: overload_driver.Driver, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.driver, self.clock = driver, clock
        self.taken_over = False
        self.below_since: dict[str, float] = {}  # head -> when its demand fell low enough
        self.runs = 0  # step lists handed to the driver (the agents may have changed)

    async def close(self) -> None:
        await self.driver.close()

    async def _run(
        self, steps: Sequence[overload_steps.Step], action: str = "", head: str = ""
    ) -> overload_driver.Report:
        """Drive `steps`; a drop or a restore (`action`) is a recorded control action
        (`overload/drop`, `overload/restore`: counted, timed, traced; docs/observability.md)."""
        if steps:
            self.runs += 1
        if not action:
            return await self.driver.run(steps)
        with control.action("overload", action, head=head):
            return await self.driver.run(steps)

    async def _try(
        self, steps: Sequence[overload_steps.Step], action: str = "", head: str = ""
    ) -> overload_driver.Report | overload_driver.DriveError:
        try:
            return await self._run(steps, action, head)
        except overload_driver.DriveError as exc:
            return exc

    async def tick(
        self,
        members: Sequence[overload_held.Member],
        cfg: overload.OverloadConfig,
        num_layers: int,
        obs: observed.Observed,
        calls: gateway_load.Calls,
    ) -> Tick:
        out = Tick()
        held = overload_held.read(members, obs, num_layers)
        # 1. a drop or a restore cut short: whole replicas again first
        for stray in held.strays:
            try:
                await self._run(overload_held.stray_steps(stray, num_layers))
            except overload_driver.DriveError as exc:
                out.events.append(
                    Event("Warning", "OverloadConvergeFailed", f"{stray.head}: {exc}")
                )
                continue
            out.acted, out.converged = True, out.converged + 1
            donors = ", ".join(s.member for s in stray.stages)
            out.events.append(
                Event(
                    "Normal",
                    "OverloadConverged",
                    f"{stray.head}: a drop or restore was cut short; {donors} whole again",
                )
            )
        if held.strays:
            return out  # decide from the next observation
        # 2. a new loop takes over the groups it finds: their heads may be paused
        if not self.taken_over:
            try:
                await self._run(overload_held.takeover_steps(held, members))
            except overload_driver.DriveError as exc:
                out.events.append(Event("Warning", "OverloadTakeoverFailed", str(exc)))
                return out
            self.taken_over = True
        size = sizes(held, obs, num_layers)
        if size is None or not size.page_bytes:
            return out
        load = _load(obs)
        steps_members = overload_held.step_members(members)

        def kv(rid: str, pre: int = 0) -> overload.ReplicaKV:
            k = load.get(rid)
            total, used = (k.pages_total, k.pages_used) if k is not None else (0, 0)
            waiting = gateway_load.queued(calls.get(rid, ()), k.waiting if k is not None else 0)
            q = tuple(
                overload.request_kv_bytes(
                    c.prompt_tokens, c.max_tokens, blocks.DEFAULT_PAGE_SIZE, size.page_bytes
                )
                for c in waiting
            )
            return overload.ReplicaKV(rid, total * size.page_bytes, used * size.page_bytes, q, pre)

        # 3. restore the groups whose demand fell (and stayed low for the hold)
        now = self.clock()
        heads = {g.head for g in held.groups}
        self.below_since = {h: t for h, t in self.below_since.items() if h in heads}
        for g in held.groups:
            if g.head not in load:
                continue
            look = overload.assess_restore([kv(g.head, g.pre_drop_kv_bytes)], cfg)
            hold = overload.hold_restore(look, self.below_since.get(g.head), now, cfg)
            if hold.below_since is None:
                self.below_since.pop(g.head, None)
            else:
                self.below_since[g.head] = hold.below_since
            if not hold.decision.restore:
                continue
            self.below_since.pop(g.head, None)
            try:
                rep = await self._run(
                    overload_steps.restore_steps(g.group, steps_members, num_layers),
                    "restore",
                    g.head,
                )
            except overload_driver.DriveError as exc:
                out.events.append(Event("Warning", "OverloadRestoreFailed", f"{g.head}: {exc}"))
                self.taken_over = False  # the head may be left paused: the next tick resumes it
                continue
            out.acted, out.restores = True, out.restores + 1
            out.paused_s += rep.paused_s
            out.exchange_s += rep.exchange_s
        # 4. drop over the whole replicas when one fires
        whole = [r for r in held.whole if r in load]
        dec = overload.assess([kv(r) for r in whole], cfg)
        if not dec.fire:
            return out
        firing = {v.name for v in dec.replicas if v.fires}
        order = drop_plan.merge_order(
            [
                drop_plan.Candidate(n, n in firing, _started(calls.get(n, ()), load[n]))
                for n in whole
            ]
        )
        plan = drop_plan.plan_drop(
            drop_plan.DropInput(
                tuple(drop_plan.Replica(n, frozenset(range(num_layers))) for n in order),
                (size.layer_bytes,) * num_layers,
                dec.required_bytes,
            )
        )
        if plan.fallback:
            out.events.append(Event("Warning", plan.reason, plan.message))
            return out
        # The groups share no member: drop them at once, so that a request queued on one
        # group's head waits for its own group's drain, not for every group's in turn.
        changed = [g for g in plan.groups if g.changed]
        runs = await asyncio.gather(
            *(
                self._try(overload_steps.drop_steps(g, steps_members), "drop", g.stages[0].replica)
                for g in changed
            )
        )
        for group, got in zip(changed, runs, strict=True):
            if isinstance(got, overload_driver.DriveError):
                out.events.append(Event("Warning", "OverloadDropFailed", f"{group.members}: {got}"))
                out.acted = True  # some steps may have run: the next tick converges
                self.taken_over = False  # and resumes a head left paused
                continue
            out.acted, out.drops = True, out.drops + 1
            out.paused_s += got.paused_s
            out.exchange_s += got.exchange_s
            for kind, took in got.step_s.items():
                out.drop_step_s[kind] = out.drop_step_s.get(kind, 0.0) + took
        return out


def shifted_message(out: Tick) -> str:
    """The `OverloadShifted` event's text: what the tick did and how long the drops' waits
    took (`drop routes`: until the gateway routed none of the donors; `drop drain`: until
    the donors finished their requests)."""
    text = (
        f"{out.drops} drops, {out.restores} restores: exchange "
        f"{out.exchange_s * 1e3:.1f} ms, paused {out.paused_s * 1e3:.1f} ms"
    )
    if out.drops:
        routes, drain = out.drop_step_s.get("Routes", 0.0), out.drop_step_s.get("Drain", 0.0)
        text += f", drop routes {routes * 1e3:.1f} ms, drop drain {drain * 1e3:.1f} ms"
    return text


def routes_change(
    doc: routes_doc.RoutesDoc,
    change: overload_steps.Routes,
    addresses: Mapping[str, str],
) -> routes_doc.RoutesDoc:
    """`doc` less the replicas `change` removes, plus those it adds at their leader
    (`addresses`: replica id -> leader address), those it closes closed and those it
    reopens open; same version: the gateway drains the removed ones."""
    keep = [r for r in doc.replicas if r.id not in change.remove]
    have = {r.id for r in keep}
    keep += [
        routes_doc.RouteReplica(rid, addresses[rid])
        for rid in change.add
        if rid not in have and addresses.get(rid)
    ]
    keep = [
        dataclasses.replace(r, closed=r.id in change.close)
        if r.id in change.close or r.id in change.reopen
        else r
        for r in keep
    ]
    return dataclasses.replace(doc, replicas=tuple(keep))
