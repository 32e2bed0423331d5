"""A simulated cluster for the transition planner's tests: agents, memory, routes, requests.

`Cluster` applies actions the way the agents and the gateway would (a load fails when the
device lacks the memory; an unload of a replica that is still routed or still has
requests counts as a lost request) and turns its state into the planner's `World`.
No servers, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tessera import blocks, observed, routes_doc
from tessera.policies import links
from tessera.policies.transition import actions
from tessera.policies.transition import copy_sources as switch_sources
from tessera.policies.transition import planner as transition

PREFIX = "default.demo."
MODEL = "/m"
PAGE_LAYER_BYTES = 20971.52  # one KV page of one layer: 16 MiB is 100 pages of 8 layers


def rid(name: str, gen: int) -> str:
    return blocks.replica_id("default", "demo", name, gen)


def block(
    name: str, gen: int, stage: int, n: int, layers: tuple[int, int], nbytes: int, nxt: str = ""
) -> blocks.Block:
    return blocks.Block(
        MODEL,
        layers[0],
        layers[1],
        replica_id=rid(name, gen),
        stage_index=stage,
        num_stages=n,
        next_address=nxt,
        generation=gen,
        param_bytes=nbytes,
        kv_bytes=nbytes // 4,
    )


@dataclass
class Agent:
    name: str
    capacity: int
    blocks: dict[tuple[str, int, int], blocks.Block] = field(default_factory=dict)
    reachable: bool = True

    @property
    def address(self) -> str:
        return f"{self.name}:1"

    @property
    def free(self) -> int:
        return self.capacity - sum(b.bytes for b in self.blocks.values())


@dataclass
class Cluster:
    agents: dict[str, Agent]
    published: routes_doc.RoutesDoc | None = None
    now: float = 1000.0
    running: dict[str, int] = field(default_factory=dict)  # requests in flight per replica
    lost: list[str] = field(default_factory=list)
    peak: int = 0
    links: links.LinkModel = field(default_factory=links.LinkModel)
    checkpoint_readable: bool = True
    sourcing: str = "block"  # transition_model.SOURCINGS
    pages: dict[str, int] = field(default_factory=dict)  # pool per replica (else its blocks')
    used: dict[str, int] = field(default_factory=dict)  # pages its requests hold
    resize_kv: bool = True

    def world(self) -> transition.World:
        obs = observed.Observed(
            tuple(
                observed.AgentInfo(
                    a.name,
                    a.address,
                    a.reachable,
                    (observed.DeviceInfo("cpu:0", "cpu", a.capacity, a.free),),
                    tuple(a.blocks.values()),
                    tuple(
                        observed.ReplicaLoad(
                            b.replica_id,
                            self.pages_of(b.replica_id),
                            self.used.get(b.replica_id, 0),
                            self.running.get(b.replica_id, 0),
                        )
                        for b in a.blocks.values()
                        if b.stage_index == 0
                    ),
                )
                for a in self.agents.values()
            )
        )
        return transition.World(
            obs,
            PREFIX,
            self.published,
            self.now,
            links=self.links,
            checkpoint_readable=self.checkpoint_readable,
            sourcing=self.sourcing,
            resize_kv=self.resize_kv,
        )

    def pages_of(self, rid: str) -> int:
        """The replica's allocator: the smallest of its stages' pools (as agents set it)."""
        if rid in self.pages:
            return self.pages[rid]
        held = [b for a in self.agents.values() for b in a.blocks.values() if b.replica_id == rid]
        return min(round(b.kv_bytes / (PAGE_LAYER_BYTES * (b.end - b.start))) for b in held)

    def ours(self) -> int:
        return sum(b.bytes for a in self.agents.values() for b in a.blocks.values())

    def serving(self) -> set[str]:
        """Routed replicas with every stage loaded."""
        if self.published is None:
            return set()
        done = transition.complete_replicas(self.world().observed, PREFIX)
        return {r for r in self.published.replica_ids if r in done}

    def apply(self, a: actions.Action) -> bool:
        """Apply one action; False for a drain that must still wait."""
        if isinstance(a, actions.LoadBlock):
            agent = self.agents[a.agent]
            assert agent.reachable
            assert a.block.bytes <= agent.free, f"{a.describe()}: out of memory"
            if a.source is not None:
                src = self.agents[a.source.agent].blocks[
                    (a.source.replica_id, a.source.stage_index, 0)
                ]
                assert src.holds(a.block)
            for part in a.parts:  # a switch plan's parts: each source holds its units now
                assert part.source is not None or self.checkpoint_readable
                if part.source is not None:
                    have = self.agents[part.source.agent].blocks[
                        (part.source.replica_id, part.source.stage_index, 0)
                    ]
                    u0, u1 = switch_sources.units_of(have, 8)
                    assert u0 <= part.units[0] and part.units[1] <= u1, a.describe()
            agent.blocks[a.block.key] = a.block
            self.peak = max(self.peak, self.ours())
        elif isinstance(a, actions.UnloadBlock):
            r = a.block.replica_id
            if self.published is not None and r in self.published.replica_ids:
                self.lost.append(f"{r} unloaded while routed")
            if self.running.get(r):
                self.lost.append(f"{r} unloaded with {self.running[r]} requests")
            del self.agents[a.agent].blocks[a.block.key]
        elif isinstance(a, actions.ResizeKV):
            self._resize(a)
        elif isinstance(a, actions.DropLayers):
            self._drop(a)
        elif isinstance(a, actions.Rewire):
            self.agents[a.agent].blocks[a.block.key] = a.block
        elif isinstance(a, actions.CutOver):
            self.published = routes_doc.RoutesDoc(
                a.replicas, a.version, a.drain_deadline_s, cut_over_at=self.now
            )
        elif isinstance(a, actions.Drain):
            if not transition.drained(self.world(), a.replica_id):
                return False
        return True

    def _resize(self, a: actions.ResizeKV) -> None:
        """A pool never shrinks below the pages its requests hold; a grow needs memory."""
        assert a.num_pages >= self.used.get(a.replica_id, 0), f"{a.describe()}: pages held"
        for st in a.stages:
            agent = self.agents[st.agent]
            have = agent.blocks[st.block.key]
            assert have.same_layout(st.block)
            assert st.block.kv_bytes - have.kv_bytes <= agent.free, f"{a.describe()}: memory"
            agent.blocks[st.block.key] = replace(have, kv_bytes=st.block.kv_bytes)
        self.peak = max(self.peak, self.ours())

    def _drop(self, a: actions.DropLayers) -> None:
        """KunServe's drop as the agents do it: each member keeps its stage's layers and
        becomes stage i of the head's replica; freed parameter bytes become KV in place.
        A donor still routed or with requests would lose them."""
        for d in a.donors:
            if self.published is not None and d in self.published.replica_ids:
                self.lost.append(f"{d} dropped while routed")
            if self.running.get(d):
                self.lost.append(f"{d} dropped with {self.running[d]} requests")
        k = len(a.stages)
        head = next(
            b for b in self.agents[a.stages[0].agent].blocks.values() if b.replica_id == a.head
        )
        for i, st in enumerate(a.stages):
            agent = self.agents[st.agent]
            old = agent.blocks.pop((st.replica_id, 0, 0))
            assert old.num_stages == 1 and old.start <= st.start and st.end <= old.end
            kept = old.param_bytes * (st.end - st.start) // (old.end - old.start)
            nxt = a.stages[i + 1].address if i + 1 < k else ""
            new = replace(
                old,
                start=st.start,
                end=st.end,
                replica_id=a.head,
                stage_index=i,
                num_stages=k,
                next_address=nxt,
                generation=head.generation,
                param_bytes=kept,
                kv_bytes=old.kv_bytes + old.param_bytes - kept,
            )
            agent.blocks[new.key] = new
        self.pages.pop(a.head, None)  # the allocator rises to the smallest grown pool

    def run(self, target: transition.Target, max_steps: int = 200, one: bool = False) -> int:
        """Plan and apply until converged, re-planning after every change (as a
        level-triggered executor may). A drain is a check: when it holds, the plan's next
        step follows; when not, time passes and the leaving replica's requests finish.
        Returns the changes applied."""
        n = 0
        for _ in range(4 * max_steps):
            t = transition.plan(self.world(), target)
            assert t.blocked is None, t.blocked
            if t.converged:
                return n
            assert not t.steps[0].after, "the first step waits for nothing"
            for step in t.steps:
                if not self.apply(step.action):
                    self.now += 3.0  # the gateway reloads; requests finish
                    self.running.clear()
                    break
                if not isinstance(step.action, actions.Drain):
                    n += 1
                    break
            if one and n:
                return n
        raise AssertionError("no convergence")


def two_agents(capacity: int) -> Cluster:
    return Cluster({n: Agent(n, capacity) for n in ("a", "b")})


def load_state(c: Cluster, placed: list[transition.Placed], routed: list[str], gen: int) -> None:
    for p in placed:
        c.agents[p.agent].blocks[p.block.key] = p.block
    c.published = routes_doc.RoutesDoc(
        tuple(routes_doc.RouteReplica(r, f"{_leader(placed, r)}:1") for r in routed), gen
    )


def _leader(placed: list[transition.Placed], r: str) -> str:
    return next(p.agent for p in placed if p.block.replica_id == r and p.block.stage_index == 0)


def target_of(placed: list[transition.Placed], gen: int) -> transition.Target:
    order: list[str] = []
    for p in placed:
        if p.block.replica_id not in order:
            order.append(p.block.replica_id)
    return transition.Target(
        gen,
        tuple(placed),
        tuple(routes_doc.RouteReplica(r, f"{_leader(placed, r)}:1") for r in order),
    )


def placed(agent: str, b: blocks.Block) -> transition.Placed:
    return transition.Placed(agent, f"{agent}:1", b)


def with_next(p: transition.Placed, nxt: str) -> transition.Placed:
    return replace(p, block=replace(p.block, next_address=nxt))
