"""Drop-style transitions: whole replicas drop replicated layers into one
pipeline, so the incoming layout finds room where even shrunk KV pools leave none.

KunServe's drop frees parameter memory while every request keeps running: whole replicas of
one model merge into one pipeline keeping the head's id, scheduler and requests; the freed
bytes become KV pool, which a following `ResizeKV` gives to the incoming layout. `plan(world,
target, replan)`, called by `policies.transition.plan` when blocked `InsufficientMemory` and
`World.drop_layers`: the head is the first routed whole replica the target does not keep; the
donors (already unrouted ones first) are merged one at a time until the planner, rerun
(`replan`) on the observation after the drop (`after_drop`), is no longer blocked. Steps: a
`CutOver` without the routed donors, a `Drain` per donor, one `DropLayers` (mode
`drop-layers`); the next pass plans the rest. Stages are cut by `drop_plan.balanced_cuts`.
Pure; docs/transitions.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tessera import observed, routes_doc
from tessera.policies.overload import drop_plan
from tessera.policies.transition import actions, model
from tessera.policies.transition import steps as transition_steps

Replan = Callable[[model.World, model.Target], model.Transition]


@dataclass(frozen=True)
class Whole:
    """A whole replica (one stage holding every layer, one TP rank) and whether routed."""

    placed: model.Placed
    routed: bool

    @property
    def replica_id(self) -> str:
        return self.placed.block.replica_id


Member = tuple[Whole, int, int]  # a member and the layers [start, end) it keeps


def wholes(world: model.World, target: model.Target) -> list[Whole]:
    """Whole replicas of this deployment the target does not keep: routed first (in the
    routes' order), then the unrouted."""
    routed = list(world.published.replica_ids) if world.published is not None else []
    keep = {r.id for r in target.replicas}
    held: dict[str, list[model.Placed]] = {}
    for a in world.observed.agents:
        if a.reachable:
            for b in a.blocks:
                if b.replica_id.startswith(world.owner_prefix) and b.replica_id not in keep:
                    held.setdefault(b.replica_id, []).append(model.Placed(a.name, a.address, b))
    out = [
        Whole(ps[0], rid in routed)
        for rid, ps in held.items()
        if len(ps) == 1
        and ps[0].block.num_stages == 1
        and ps[0].block.tp_size == 1
        and ps[0].block.start == 0
    ]
    order = {r: i for i, r in enumerate(routed)}
    out.sort(key=lambda w: (not w.routed, order.get(w.replica_id, 0), w.replica_id))
    return out


def _load(obs: observed.Observed, rid: str) -> observed.ReplicaLoad | None:
    for a in obs.agents:
        if a.reachable:
            for k in a.kv:
                if k.replica_id == rid:
                    return k
    return None


def dropped_blocks(members: Sequence[Member]) -> list[model.Placed]:
    """The members' blocks after the drop, as their agents would report them: stage i of
    the head's replica, its layers only, the freed parameter bytes turned into KV (the
    parameters taken as even per layer: the next observation has the real ones)."""
    head = members[0][0].placed.block
    out = []
    for i, (w, start, end) in enumerate(members):
        b = w.placed.block
        kept = b.param_bytes * (end - start) // max(1, b.end - b.start)
        nxt = members[i + 1][0].placed.address if i + 1 < len(members) else ""
        nb = replace(
            b,
            start=start,
            end=end,
            replica_id=head.replica_id,
            stage_index=i,
            num_stages=len(members),
            next_address=nxt,
            generation=head.generation,
            param_bytes=kept,
            kv_bytes=b.kv_bytes + b.param_bytes - kept,
            kv_pages=0,
        )
        out.append(replace(w.placed, block=nb))
    return out


def after_drop(world: model.World, members: Sequence[Member]) -> model.World:
    """The observation the drop would leave: the donors gone from the routes and from the
    leaders' reports, the members as the head's stages (memory free unchanged: the
    freed parameters are KV pool now), the head's allocator at its smallest stage pool."""
    head = members[0][0]
    hb = head.placed.block
    load = _load(world.observed, head.replica_id)
    layers = hb.end - hb.start
    per_page_layer = (
        hb.kv_bytes / load.pages_total / layers if load and load.pages_total and layers else 0.0
    )
    new = dropped_blocks(members)
    gone = {(w.placed.agent, w.placed.block.key) for w, _, _ in members}
    donors = {w.replica_id for w, _, _ in members[1:]}
    pages = load.pages_total if load is not None else 0
    if per_page_layer > 0:
        pages = min(
            int(p.block.kv_bytes / (per_page_layer * (p.block.end - p.block.start))) for p in new
        )
    agents = []
    for a in world.observed.agents:
        bs = tuple(b for b in a.blocks if (a.name, b.key) not in gone)
        bs += tuple(p.block for p in new if p.agent == a.name)
        kv = tuple(
            replace(k, pages_total=pages) if k.replica_id == head.replica_id else k
            for k in a.kv
            if k.replica_id not in donors
        )
        agents.append(replace(a, blocks=bs, kv=kv))
    pub = world.published
    if pub is not None:
        pub = replace(
            pub,
            replicas=tuple(r for r in pub.replicas if r.id not in donors),
            cut_over_at=world.now,
        )
    return replace(world, observed=replace(world.observed, agents=tuple(agents)), published=pub)


def plan(world: model.World, target: model.Target, replan: Replan) -> model.Transition | None:
    """A drop-style transition that lets `replan` through, or None (module docstring)."""
    if not world.drop_layers or world.published is None:
        return None
    found = wholes(world, target)
    heads = [w for w in found if w.routed]
    if not heads:
        return None  # nothing serves: no request to keep, the other modes apply
    head = heads[0]
    hb = head.placed.block
    donors = [
        w
        for w in found
        if w is not head
        and w.placed.block.model_path == hb.model_path
        and w.placed.block.end == hb.end
    ]
    donors.sort(key=lambda w: w.routed)  # those already cut out of the routes first
    layers = hb.end - hb.start
    for k in range(2, min(len(donors) + 1, layers) + 1):
        cuts = drop_plan.balanced_cuts([1.0] * layers, k)
        members = [(w, s, e) for w, (s, e) in zip([head, *donors[: k - 1]], cuts, strict=True)]
        then = replan(replace(after_drop(world, members), drop_layers=False), target)
        if then.blocked is None:
            return _steps(world, target, members)
    return None


def _steps(world: model.World, target: model.Target, members: Sequence[Member]) -> model.Transition:
    sim = transition_steps.StepBuilder(world, target)
    donors = [w for w, _, _ in members[1:]]
    after: list[int] = []
    routed_out = {w.replica_id for w in donors if w.routed}
    if routed_out:
        keep: list[routes_doc.RouteReplica] = [r for r in sim.routed if r.id not in routed_out]
        after = [sim.cut_over(keep, [])]
    deadline = (
        world.published.drain_deadline_s if world.published is not None else world.drain.deadline_s
    )
    drains = [sim.add(actions.Drain(w.replica_id, deadline), after) for w in donors]
    stages = tuple(
        actions.DropStage(w.replica_id, w.placed.agent, w.placed.address, s, e)
        for w, s, e in members
    )
    sim.add(actions.DropLayers(stages), drains)
    return model.Transition(
        target.generation,
        tuple(sim.steps),
        "drop-layers",
        None,
        sim.start_bytes,  # a drop loads nothing: the memory stays where it was
        sim.start_bytes,
        sim.start_bytes,
    )
