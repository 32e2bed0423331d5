"""Control-plane loops of the simulator: the operator's pure policies, called as in
production, their actions applied to the simulated cluster after modelled delays.

Wired: KunServe overload handling (`policies.overload.assess` fires, `policies.drop_plan.
plan_drop` groups replicas into pipelines, `policies.kv_exchange.exchange_for_drop`
lists the KV that must move, whose bytes over the link give the delay before the merged
pipeline serves with the freed memory; `overload.assess_restore` splits a group back,
after the dropped parameters are copied back over the link). Limits: every member is taken
to have the same tp (the CLI passes the largest of a heterogeneous plan), members share a
node's link, and the step in flight when a merge lands is redone. Not wired yet (see
docs/simulation.md): switching (`policies.switching` / `switch_plan`), module scaling
(`policies.module_scaling`), the transition planner and drain (`policies.transition`,
`policies.drain`: not on this branch). Called by `tessera.sim.engine.Engine` every tick.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from tessera.cost.profile import CommSpec, Link, Profile
from tessera.policies.overload import drop_plan, kv_exchange
from tessera.policies.overload import monitor as overload
from tessera.policies.serving import batching
from tessera.sim import setup
from tessera.sim.engine import Engine
from tessera.sim.replica import SimReplica, adopt


@dataclass
class _Group:
    members: tuple[str, ...]
    stages: tuple[drop_plan.Stage, ...]
    base_pages: int  # the members' pools before the drop (pages)


@dataclass
class KunServe:
    """The overload loop: drop parameters into pipelines when KV demand overflows."""

    profile: Profile
    comm: CommSpec
    tp: int
    gpu_memory: int
    cfg: overload.OverloadConfig = field(
        default_factory=lambda: overload.OverloadConfig(enabled=True)
    )
    limits: batching.BatchLimits = field(default_factory=batching.BatchLimits)
    link: Link | None = None  # the members' link for the KV exchange; None: intra-node
    restore: bool = True
    _groups: dict[str, _Group] = field(default_factory=dict)
    _busy_until: float = 0.0
    drops: int = 0
    restores: int = 0

    def tick(self, now: float, engine: Engine) -> None:
        if now < self._busy_until:
            return
        reps = list(engine.replicas.values())
        snaps = [self._snapshot(r) for r in reps]
        decision = overload.assess(snaps, self.cfg)
        if decision.fire:
            self._drop(now, engine, decision.required_bytes)
            return
        if self.restore:
            for name, g in list(self._groups.items()):
                snap = next(s for s in snaps if s.name == name)
                base = g.base_pages * engine.replicas[name].page_bytes
                snap = overload.ReplicaKV(
                    snap.name, snap.pool_bytes, snap.running_bytes, snap.queued_bytes, base
                )
                if overload.assess_restore([snap], self.cfg).restore:
                    self._restore(now, engine, name)

    def _snapshot(self, r: SimReplica) -> overload.ReplicaKV:
        pb = r.page_bytes
        queued = tuple(
            overload.request_kv_bytes(
                q.prompt + q.generated, q.output - q.generated, r.page_size, pb
            )
            for q in r.waiting
        )
        return overload.ReplicaKV(r.name, r.kv_pool_bytes(), r.kv_used_bytes(), queued)

    def _layers_of(self, name: str) -> list[tuple[str, frozenset[int]]]:
        L = self.profile.model.num_layers
        g = self._groups.get(name)
        if g is None:
            return [(name, frozenset(range(L)))]
        return [
            (m, frozenset(i for s in g.stages if s.replica == m for i in range(s.start, s.end)))
            for m in g.members
        ]

    def _drop(self, now: float, engine: Engine, required: int) -> None:
        L = self.profile.model.num_layers
        units: list[drop_plan.Replica] = []
        groups: list[tuple[str, ...]] = []
        for name in sorted(engine.replicas):
            parts = self._layers_of(name)
            units += [drop_plan.Replica(m, layers) for m, layers in parts]
            groups.append(tuple(m for m, _ in parts))
        plan = drop_plan.plan_drop(
            drop_plan.DropInput(
                tuple(units), (self.profile.memory.layer_param_bytes,) * L, required, tuple(groups)
            )
        )
        if plan.fallback:
            engine.result.actions.append((now, f"drop fallback: {plan.reason}"))
            self._busy_until = now + 5.0
            return
        link = self.link or self.comm.intra_node
        held = {u.name: u.layers for u in units}
        owner = {m: g for g in groups for m in g}
        for g in plan.groups:
            if not g.changed:
                continue
            olds = sorted({self._name_of(owner[m]) for m in g.members})
            running = [
                kv_exchange.RunningRequest(str(q.rid), self._member_of(q, olds), q.computed)
                for o in olds
                for q in engine.replicas[o].running
            ]
            moves = kv_exchange.exchange_for_drop(
                g, held, running, self.profile.memory.kv_bytes_per_token, 1 << 30
            )
            per_target: dict[str, int] = {}
            for t in moves:
                per_target[t.target] = per_target.get(t.target, 0) + t.bytes
            delay = max((link.transfer_seconds(b) for b in per_target.values()), default=0.0)
            base = sum(self._base_pages(engine.replicas[o], o) for o in olds)
            self.drops += 1
            self._busy_until = now + delay + 1.0
            engine.at(
                now + delay,
                f"drop: {'+'.join(olds)} -> pipeline of {len(g.stages)}",
                functools.partial(self._merge, engine, g, olds, base),
            )

    def _name_of(self, group_members: tuple[str, ...]) -> str:
        for name, g in self._groups.items():
            if g.members == group_members:
                return name
        return group_members[0]

    def _member_of(self, q: object, olds: list[str]) -> str:
        rep = getattr(q, "replica", "")
        g = self._groups.get(rep)
        return g.stages[0].replica if g else rep

    def _base_pages(self, rep: SimReplica, name: str) -> int:
        g = self._groups.get(name)
        return g.base_pages if g else rep.alloc.num_pages

    def _merge(self, engine: Engine, g: drop_plan.Group, olds: list[str], base: int) -> None:
        reqs = []
        for o in olds:
            rep = engine.remove_replica(o)
            rep.settle(engine.now)
            self._groups.pop(o, None)
            reqs += rep.running + list(rep.waiting)
        name = "+".join(g.members)
        runs = [s.end - s.start for s in g.stages]
        k = len(g.members)  # one microbatch per member, each within a member's limits
        limits = batching.BatchLimits(
            self.limits.max_num_seqs * k, self.limits.max_batched_tokens * k
        )
        rep = setup.make_replica(
            name,
            self.profile,
            self.comm,
            self.tp,
            runs,
            [False] * len(runs),
            self.gpu_memory,
            limits,
        )
        self._groups[name] = _Group(g.members, g.stages, base)
        adopt(rep, reqs)
        for q in reqs:
            engine.requeue(q, rep)
        engine.add_replica(rep)
        engine.kick(rep)

    def _restore(self, now: float, engine: Engine, name: str) -> None:
        g = self._groups[name]
        L = self.profile.model.num_layers
        dropped = max(L - (s.end - s.start) for s in g.stages)
        link = self.link or self.comm.intra_node
        delay = link.transfer_seconds(dropped * self.profile.memory.layer_param_bytes)
        self.restores += 1
        self._busy_until = now + delay + 1.0
        engine.at(now + delay, f"restore: {name}", lambda: self._split(engine, name))

    def _split(self, engine: Engine, name: str) -> None:
        g = self._groups.pop(name, None)
        if g is None or name not in engine.replicas:
            return
        old = engine.remove_replica(name)
        old.settle(engine.now)
        L = self.profile.model.num_layers
        news = [
            setup.make_replica(
                m, self.profile, self.comm, self.tp, [L], [False], self.gpu_memory, self.limits
            )
            for m in g.members
        ]
        reqs = old.running + list(old.waiting)
        for i, new in enumerate(news):
            mine = reqs[i :: len(news)]
            adopt(new, mine)
            for q in mine:
                engine.requeue(q, new)
            engine.add_replica(new)
            engine.kick(new)
