"""Deployment changes in the simulator go through the transition planner.

Input: the simulated cluster serving one layout (`oserve.Built`, generation g) and the
layout to move to (g + 1). It builds the world the operator would observe: one agent per
node whose one device is the node's usable HBM, a block per pipeline stage (parameters
from `MemorySpec`, KV the stage's share of the pool, which takes all memory left), each
replica's load from its queues, the routes last published. `policies.transition.plan` turns
it into steps; `Executor` applies them with modelled delays: `LoadBlock` the link model's
time; `CutOver` re-points the router's class shares; `Drain` waits for
`transition.drained` (past the deadline, what runs is recomputed on a new replica,
`cut_at_deadline`); `UnloadBlock` frees memory; `ResizeKV` resizes the page allocator at
once (`PageAllocator.resize`). A `blocked` transition changes nothing. Simplifications: a
node's GPUs are one device, ready steps run concurrently, no re-planning between steps.
Called by `oserve_switcher.Switcher`; docs/simulation.md, "The model".
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tessera import blocks, observed, routes_doc
from tessera.cost.profile import Profile
from tessera.policies import links, placement
from tessera.policies.transition import actions
from tessera.policies.transition import planner as transition
from tessera.sim import engine, setup
from tessera.sim.replica import SimReplica, adopt

MODEL_PATH = "/sim/model"
NAMESPACE, DEPLOYMENT = "sim", "relayout"
POLL_S = 1.0  # drains are re-checked this often


def rid(name: str, gen: int) -> str:
    return blocks.replica_id(NAMESPACE, DEPLOYMENT, name, gen)


@dataclass
class Layout:
    """One generation as the transition planner sees it: the sim replicas by id, their
    class shares, and their blocks."""

    generation: int
    replicas: dict[str, SimReplica]  # replica id -> sim replica
    shares: dict[str, dict[str, float]]  # class -> sim replica name -> share
    placed: list[transition.Placed]
    leaders: dict[str, str]  # replica id -> its leader's address


def layout_of(
    profile: Profile,
    gen: int,
    reps: list[SimReplica],
    placements: list[Any],
    shares: dict[str, dict[str, float]],
) -> Layout:
    """Blocks of a layout: `placements[i]` (`placement.ReplicaPlacement`) places
    `reps[i]`."""
    mem = profile.memory
    L = profile.model.num_layers
    out: list[transition.Placed] = []
    by_id: dict[str, SimReplica] = {}
    leaders: dict[str, str] = {}
    for rep, rp in zip(reps, placements, strict=True):
        r = rid(rep.name, gen)
        by_id[r] = rep
        pool = rep.alloc.num_pages * rep.page_size * mem.kv_bytes_per_token
        nodes = [s.devices[0][0] for s in rp.stages]
        leaders[r] = f"{nodes[0]}:1"
        for i, st in enumerate(rp.stages):
            start, end = st.layers
            params = (end - start) * mem.layer_param_bytes
            params += mem.embedding_param_bytes if start == 0 else 0
            params += mem.lm_head_param_bytes if end == L else 0
            block = blocks.Block(
                MODEL_PATH,
                start,
                end,
                replica_id=r,
                stage_index=i,
                device="hbm",
                num_stages=len(rp.stages),
                next_address=f"{nodes[i + 1]}:1" if i + 1 < len(nodes) else "",
                generation=gen,
                param_bytes=params,
                kv_bytes=pool * (end - start),
            )
            out.append(transition.Placed(nodes[i], f"{nodes[i]}:1", block))
    return Layout(gen, by_id, shares, out, leaders)


@dataclass
class Executor:
    """Plans one transition and applies its steps to the engine (module docstring)."""

    old: Layout
    new: Layout
    nodes: dict[str, int]  # node -> usable HBM bytes
    link_model: links.LinkModel
    classify: Callable[[int, int], str | None]
    on_done: Callable[[bool], None] = lambda ok: None
    held: dict[str, list[blocks.Block]] = field(default_factory=dict)  # node -> blocks
    published: routes_doc.RoutesDoc | None = None
    plan: transition.Transition | None = None
    done: set[int] = field(default_factory=set)
    started: set[int] = field(default_factory=set)
    loaded: set[tuple[str, int]] = field(default_factory=set)
    cut_at_deadline: int = 0
    finished_at: float | None = None
    # parameter bytes per unit: loads take their parts from several peers by the OServe
    # switch plan (`World.sourcing == "switch"`, the operator's default); None: one peer
    model: placement.ModelBytes | None = None
    full_pages: dict[str, int] = field(default_factory=dict)  # new replica id -> planned pool

    def __post_init__(self) -> None:
        self.full_pages = {r: rep.alloc.num_pages for r, rep in self.new.replicas.items()}
        for p in self.old.placed:
            self.held.setdefault(p.agent, []).append(p.block)
        self.published = routes_doc.RoutesDoc(
            tuple(
                routes_doc.RouteReplica(r, self.old.leaders[r]) for r in sorted(self.old.replicas)
            ),
            self.old.generation,
        )

    # -- the world the operator would observe ---------------------------------------------
    def world(self, eng: engine.Engine) -> transition.World:
        agents = []
        every = {**self.old.replicas, **self.new.replicas}
        for node, capacity in sorted(self.nodes.items()):
            held = tuple(self.held.get(node, []))
            loads = tuple(
                observed.ReplicaLoad(
                    b.replica_id,
                    every[b.replica_id].alloc.num_pages,
                    every[b.replica_id].alloc.used_pages,
                    len(every[b.replica_id].running),
                    len(every[b.replica_id].waiting),
                )
                for b in held
                if b.stage_index == 0
            )
            free = capacity - sum(b.bytes for b in held)
            agents.append(
                observed.AgentInfo(
                    node,
                    f"{node}:1",
                    True,
                    (observed.DeviceInfo("hbm", "cuda", capacity, max(0, free)),),
                    held,
                    loads,
                )
            )
        return transition.World(
            observed.Observed(tuple(agents)),
            f"{NAMESPACE}.{DEPLOYMENT}.",
            self.published,
            eng.now,
            links=self.link_model,
            sourcing="switch" if self.model is not None else "block",
            model=self.model,
            drop_layers=False,  # a drop (KunServe's) is not modelled here: plan without it
        )

    def target(self) -> transition.Target:
        return transition.Target(
            self.new.generation,
            tuple(self.new.placed),
            tuple(
                routes_doc.RouteReplica(r, self.new.leaders[r]) for r in sorted(self.new.replicas)
            ),
        )

    # -- running the plan -------------------------------------------------------------------
    def start(self, eng: engine.Engine) -> transition.Transition:
        self.plan = transition.plan(self.world(eng), self.target())
        if self.plan.blocked is not None:
            eng.result.actions.append((eng.now, f"transition blocked: {self.plan.blocked.reason}"))
            self.on_done(False)
            return self.plan
        eng.result.actions.append(
            (eng.now, f"transition {self.plan.mode}: {len(self.plan.steps)} steps")
        )
        self._advance(eng)
        return self.plan

    def _advance(self, eng: engine.Engine) -> None:
        assert self.plan is not None
        for step in self.plan.steps:
            if step.id in self.started or not set(step.after) <= self.done:
                continue
            self.started.add(step.id)
            self._begin(eng, step)
        if len(self.done) == len(self.plan.steps) and self.finished_at is None:
            self.finished_at = eng.now
            self.on_done(True)

    def _finish(self, eng: engine.Engine, step: actions.Step) -> None:
        self.done.add(step.id)
        self._advance(eng)

    def _begin(self, eng: engine.Engine, step: actions.Step) -> None:
        a = step.action
        if isinstance(a, actions.LoadBlock):
            secs = self._load_seconds(a)
            eng.at(
                eng.now + secs,
                f"load {a.block.replica_id} stage {a.block.stage_index}",
                functools.partial(self._loaded, eng, step),
            )
        elif isinstance(a, actions.CutOver):
            self._cut_over(eng, a)
            self._finish(eng, step)
        elif isinstance(a, actions.Drain):
            self._poll_drain(eng, step)
        elif isinstance(a, actions.UnloadBlock):
            blocks_ = self.held.get(a.agent, [])
            self.held[a.agent] = [b for b in blocks_ if b.key != a.block.key]
            self._finish(eng, step)
        elif isinstance(a, actions.ResizeKV):
            self._resize(eng, a)
            self._finish(eng, step)
        else:  # Rewire and anything else: no time in this model
            self._finish(eng, step)

    def _load_seconds(self, a: actions.LoadBlock) -> float:
        """A load's time: its parts arrive at once, so the slowest source's bytes over
        its link (storage for parts no peer holds); else one peer or one read."""
        if a.parts and self.model is not None:
            m = self.model
            by_source: dict[str | None, float] = {}
            for part in a.parts:
                u0, u1 = part.units
                nbytes = sum(
                    m.embedding_bytes
                    if u == 0
                    else m.lm_head_bytes
                    if u > m.num_layers
                    else m.layer_bytes
                    for u in range(u0, u1)
                )
                key = part.source.agent if part.source is not None else None
                by_source[key] = by_source.get(key, 0.0) + nbytes
            return max(
                self.link_model.read_seconds(a.agent, int(n))
                if src is None
                else self.link_model.copy_seconds(src, a.agent, int(n))
                for src, n in by_source.items()
            )
        if a.source is not None:
            return self.link_model.copy_seconds(a.source.agent, a.agent, a.block.param_bytes)
        return self.link_model.read_seconds(a.agent, a.block.param_bytes)

    def _loaded(self, eng: engine.Engine, step: actions.Step) -> None:
        a = step.action
        assert isinstance(a, actions.LoadBlock)
        self.held.setdefault(a.agent, []).append(a.block)
        rep = self.new.replicas.get(a.block.replica_id)
        planned = self._planned(a.block)
        if rep is not None and planned is not None and a.block.kv_bytes < planned.kv_bytes:
            # loaded with a cut KV budget (shrink-pools): its pool holds what its most cut
            # stage's budget holds (a share of the planned pool, not of the pool now)
            pages = self._pages_of(a.block.replica_id, a.block)
            rep.alloc.resize(max(1, min(pages, rep.alloc.num_pages)))
        self._finish(eng, step)

    def _planned(self, b: blocks.Block) -> blocks.Block | None:
        for p in self.new.placed:
            if p.block.key == b.key:
                return p.block
        return None

    def _pages_of(self, replica_id: str, b: blocks.Block) -> int:
        """The pages a new replica's pool holds with stage block `b`'s KV budget: its
        planned pool in the ratio of `b`'s budget to the planned stage's."""
        planned = self._planned(b)
        full = self.full_pages.get(replica_id)
        if planned is None or full is None or not planned.kv_bytes:
            return 0
        return full * b.kv_bytes // planned.kv_bytes

    def _resize(self, eng: engine.Engine, a: actions.ResizeKV) -> None:
        rep = self.old.replicas.get(a.replica_id) or self.new.replicas.get(a.replica_id)
        if rep is None:
            return
        pages = a.num_pages
        for st in a.stages:
            for node, held in self.held.items():
                for i, b in enumerate(held):
                    if b.key == st.block.key and node == st.agent:
                        if not a.num_pages and b.kv_bytes:  # grow to the stages' budgets
                            # a new replica: its planned pool in the stages' budgets'
                            # ratio (every stage counts, not the one cut most); else
                            # the pool now scaled by this stage's change
                            n = self._pages_of(a.replica_id, st.block) or (
                                rep.alloc.num_pages * st.block.kv_bytes // b.kv_bytes
                            )
                            pages = n if not pages else min(pages, n)
                        held[i] = st.block
        pages = max(pages, rep.alloc.held_pages, 1)
        rep.alloc.resize(pages)
        eng.result.actions.append((eng.now, f"{a.describe()} (applied: {pages})"))
        if rep.name in eng.replicas:
            eng.kick(rep)

    def _cut_over(self, eng: engine.Engine, a: actions.CutOver) -> None:
        routed = {r.id for r in a.replicas}
        self.published = routes_doc.RoutesDoc(
            a.replicas, a.version, a.drain_deadline_s, cut_over_at=eng.now
        )
        for r, rep in self.new.replicas.items():
            if r in routed and rep.name not in eng.replicas:
                eng.add_replica(rep)
        for r, rep in self.old.replicas.items():
            if r not in routed and rep.name in eng.replicas:
                rep.accepting = False
        shares: dict[str, dict[str, float]] = {}
        for lay in (self.old, self.new):
            names = {lay.replicas[r].name for r in routed if r in lay.replicas}
            for cls, per in lay.shares.items():
                for name, w in per.items():
                    if name in names:
                        shares.setdefault(cls, {})[name] = w
        eng.router.set_class_shares(shares, self.classify)
        eng.refresh_ready()
        for rep in eng.replicas.values():
            eng.kick(rep)

    def _poll_drain(self, eng: engine.Engine, step: actions.Step) -> None:
        a = step.action
        assert isinstance(a, actions.Drain)
        if not transition.drained(self.world(eng), a.replica_id):
            eng.at(eng.now + POLL_S, "", functools.partial(self._poll_drain, eng, step))
            return
        rep = self.old.replicas.get(a.replica_id) or self.new.replicas.get(a.replica_id)
        if rep is not None and rep.name in eng.replicas:
            left = eng.remove_replica(rep.name)
            left.settle(eng.now)
            self._hand_over(eng, left.running + list(left.waiting))
        self._finish(eng, step)

    def _hand_over(self, eng: engine.Engine, reqs: list[Any]) -> None:
        """Requests still on a replica past its drain deadline restart on a routed one."""
        ready = eng.ready() or sorted(eng.replicas)
        for q in reqs:
            route = eng.router.choose(ready, q.prompt, q.output)
            if route is None:
                continue
            target = eng.replicas[route.replica_id]
            q.is_running = False
            adopt(target, [q])
            eng.requeue(q, target)
            self.cut_at_deadline += 1
            eng.kick(target)


def node_memory(gpus_per_node: int, nodes: list[str], gpu_memory: int) -> dict[str, int]:
    """Usable HBM per node (the engine's utilization share of every GPU)."""
    return {n: int(gpus_per_node * gpu_memory * setup.MEMORY_UTILIZATION) for n in nodes}
