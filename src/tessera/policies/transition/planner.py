"""Transition planner: from what the agents hold to a desired plan, without losing a request.

`plan(world, target)` is pure. `world`: the agents' blocks, devices and per-replica load, the
routes last published, the time, free memory per device and a link model; `target`: the desired
blocks and replica set of one plan generation. Returns a `Transition` of ordered `Step`s in the
`policies.actions` vocabulary: unrouted leftovers drained and unloaded first; missing blocks
loaded while the old replicas serve (make-before-break, peer or storage by the link model, last
stage first); one `CutOver`; leaving replicas drained, then unloaded. When a device lacks room,
in turn: shrink-pools (`transition_shrink`), the freeing order (retire old replicas one at a
time while another serves), drop-layers (`transition_drop`); else `blocked` with a reason, the
old layout serving (docs/transitions.md). Level-triggered: re-planning after any prefix of the
steps continues where things stand; a converged system plans nothing. Called by
`tessera.control.actuate` and `tessera up`; types in `transition_model`, steps built in
`transition_steps`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tessera import blocks, observed, routes_doc
from tessera.policies.transition import actions
from tessera.policies.transition import drop as transition_drop
from tessera.policies.transition import model as transition_model
from tessera.policies.transition import shrink as transition_shrink
from tessera.policies.transition import steps as transition_steps

# the planner's data types, named from here by its callers
DevKey = transition_model.DevKey
Placed = transition_model.Placed
Target = transition_model.Target
DrainPolicy = transition_model.DrainPolicy
World = transition_model.World
Blocked = transition_model.Blocked
Transition = transition_model.Transition
MODES = transition_model.MODES


def complete_replicas(obs: observed.Observed, owner_prefix: str) -> set[str]:
    """Replicas of the deployment with every stage (every TP rank of it) held on a
    reachable agent and no tensor-parallel group failed."""
    ranks: dict[str, set[tuple[int, int]]] = {}
    total: dict[str, set[tuple[int, int]]] = {}
    failed: set[str] = set()
    for a in obs.agents:
        if not a.reachable:
            continue
        for b in a.blocks:
            if b.replica_id.startswith(owner_prefix):
                ranks.setdefault(b.replica_id, set()).add((b.stage_index, b.tp_rank))
                total.setdefault(b.replica_id, set()).update(
                    (b.stage_index, k) for k in range(b.tp_size)
                )
                total[b.replica_id].update((i, 0) for i in range(b.num_stages))
                if b.group_state == "failed":
                    failed.add(b.replica_id)
    return {r for r, s in ranks.items() if s == total[r] and r not in failed}


def _broken_tp_stages(
    present: Mapping[Any, tuple[Placed, int | None]], want: Mapping[Any, Placed]
) -> set[tuple[str, int]]:
    """Tensor-parallel stages to load again as a whole: a rank reports its group failed,
    or some ranks are held while others are missing (a new group needs all of them)."""
    held: dict[tuple[str, int], list[bool]] = {}
    failed: set[tuple[str, int]] = set()
    for where, p in want.items():
        if p.block.tp_size == 1:
            continue
        key = (p.block.replica_id, p.block.stage_index)
        have = present.get(where)
        held.setdefault(key, []).append(have is not None)
        if have is not None and have[0].block.group_state == "failed":
            failed.add(key)
    return failed | {k for k, got in held.items() if any(got) and not all(got)}


def replica_load(obs: observed.Observed, replica_id: str) -> observed.ReplicaLoad | None:
    for a in obs.agents:
        if a.reachable:
            for k in a.kv:
                if k.replica_id == replica_id:
                    return k
    return None


def drained(world: World, replica_id: str) -> bool:
    """A replica may be freed: no route names it and it is idle as its leader reports
    (once the gateway had time to reload), or its drain deadline plus grace has passed."""
    pub = world.published
    if pub is not None and replica_id in pub.replica_ids:
        return False
    since = pub.cut_over_at if pub is not None else 0.0
    deadline = pub.drain_deadline_s if pub is not None else world.drain.deadline_s
    if world.now >= since + deadline + world.drain.grace_s:
        return True
    if world.now < since + world.drain.settle_s:
        return False
    load = replica_load(world.observed, replica_id)
    return load is None or (load.running == 0 and load.waiting == 0)


def _rewire_only(want: blocks.Block, have: blocks.Block) -> bool:
    return want.next_address != have.next_address and want.same_layout(
        replace(have, next_address=want.next_address)
    )


def plan(world: World, target: Target) -> Transition:
    """The steps from `world` to `target` (see the module docstring)."""
    sim = transition_steps.StepBuilder(world, target)
    target_ids = {r.id for r in target.replicas}
    want = {(p.agent, p.block.key): p for p in target.blocks}
    down = sorted({p.agent for p in target.blocks if p.agent not in sim.reachable})

    # 1. unrouted leftovers of this deployment, and blocks that must be reloaded in place
    routed_ids = {r.id for r in sim.routed}
    leftovers = sorted(
        {
            p.block.replica_id
            for p, _ in sim.present.values()
            if sim.ours(p.block.replica_id)
            and p.block.replica_id not in target_ids
            and p.block.replica_id not in routed_ids
        }
    )
    for rid in leftovers:
        sim.retire(rid, [])
    rewire: list[Placed] = []
    missing: dict[str, list[Placed]] = {}
    broken = _broken_tp_stages(sim.present, want)
    regroup: dict[tuple[str, int], list[int]] = {}  # a new group forms after the old closed
    for where, p in want.items():
        held = sim.present.get(where)
        stage_key = (p.block.replica_id, p.block.stage_index)
        if held is not None and stage_key in broken:  # its group failed: reload every rank
            regroup.setdefault(stage_key, []).append(sim.unload(held[0], []))
            held = None
        if held is not None and held[0].block.same_layout(p.block):
            continue
        if held is not None and _rewire_only(p.block, held[0].block):
            rewire.append(p)
            continue
        if held is not None:  # same name, other layout: no way but to reload it
            sim.unload(held[0], [])
        if p.agent in sim.reachable:
            missing.setdefault(p.block.replica_id, []).append(p)
    for where, (p, _) in list(sim.present.items()):
        if p.block.replica_id in target_ids and where not in want:
            sim.unload(p, [])  # a stage the target replica no longer has

    # 2. loads, retiring old replicas first where memory is short (with switch sourcing,
    # each load's parts come from one switch plan over what is held now)
    sim.plan_switch([p for r in target.replicas for p in missing.get(r.id, [])])
    blocked: Blocked | None = None
    loads: list[int] = []
    # target replicas complete but not yet routed (an interrupted transition loaded them)
    # can serve once cut over, so the freeing order may retire an old replica for them
    done_new: list[routes_doc.RouteReplica] = [
        r
        for r in target.replicas
        if r.id not in missing and r.id not in routed_ids and sim.complete(r.id)
    ]
    for r in (r for r in target.replicas if r.id in missing):
        todo = missing[r.id]
        blocked = None
        shrunk = False
        if world.resize_kv and sim.deficit(transition_shrink.full_need(todo)):
            # short of memory: shrinking the old pools keeps every replica serving, so it
            # comes before the freeing order (which routes everything to the survivors)
            trial = copy.deepcopy(sim)
            budgets, why = transition_shrink.make_room(trial, r.id, todo, target_ids)
            if why is None:
                sim, todo, shrunk = trial, budgets, True
        if not shrunk:
            blocked = transition_steps.make_room(sim, r, todo, target_ids, loads, done_new)
        if blocked is not None and world.resize_kv:  # still short: shrink what is left
            todo, blocked = transition_shrink.make_room(sim, r.id, todo, target_ids)
        if blocked is not None:
            break
        prev: list[int] = []
        for p in sorted(todo, key=lambda p: -p.block.stage_index):
            got = sim.load(p, prev + regroup.get((r.id, p.block.stage_index), []))
            if isinstance(got, Blocked):
                blocked = got
                break
            loads.append(got)
            prev = [got]
        if blocked is not None:
            break
        done_new.append(r)
    for p in rewire:  # after the next stage it points at is loaded
        was = sim.present[(p.agent, p.block.key)][0]
        sim.present[(p.agent, p.block.key)] = (replace(was, block=p.block), None)
        loads.append(sim.add(actions.Rewire(p.agent, p.address, p.block), loads))

    cut_needed = list(sim.routed) != list(target.replicas) or (
        not sim.route_steps and not _routes_match(world, target)
    )
    if blocked is None and down and cut_needed:
        blocked = Blocked(
            "AgentUnreachable",
            f"agents {', '.join(down)} of the new layout are unreachable; the old layout "
            "keeps serving",
        )
    if blocked is not None and blocked.reason == "InsufficientMemory":
        dropped = transition_drop.plan(world, target, plan)
        if dropped is not None:
            return dropped
    if blocked is not None:
        # only the cleanup that cannot hurt serving: unrouted leftovers
        steps = _renumber([s for s in sim.steps if _is_cleanup(s, leftovers)])
        return Transition(
            target.generation, steps, "blocked", blocked, sim.peak_bytes, sim.start_bytes
        )

    # 3. cut the routes over to the target, 4. drain and free what leaves
    freed: list[int] = []
    if cut_needed:
        leaving = [r.id for r in sim.routed if r.id not in target_ids and sim.ours(r.id)]
        cut = sim.cut_over(list(target.replicas), loads)
        for rid in leaving:
            freed += sim.retire(rid, [cut])
        freed.append(cut)
    # 5. pools loaded with a cut KV budget grow to the target's once the old are freed
    transition_shrink.grow(sim, target, freed)
    mode = "converged"
    if sim.steps:
        mode = "freeing-order" if sim.retired else "make-before-break"
        mode = "shrink-pools" if sim.shrunk else mode
    return Transition(
        target.generation,
        tuple(sim.steps),
        mode,
        None,
        sim.peak_bytes,
        sim.start_bytes,
        sim.ours_bytes,
    )


def _routes_match(world: World, target: Target) -> bool:
    pub = world.published
    return (
        pub is not None
        and pub.version == target.generation
        and list(pub.replicas) == list(target.replicas)
    )


def _is_cleanup(step: actions.Step, leftovers: list[str]) -> bool:
    a = step.action
    if isinstance(a, actions.Drain):
        return a.replica_id in leftovers
    if isinstance(a, actions.UnloadBlock):
        return a.block.replica_id in leftovers
    return False


def _renumber(steps: list[actions.Step]) -> tuple[actions.Step, ...]:
    ids = {s.id: i for i, s in enumerate(steps)}
    return tuple(
        actions.Step(ids[s.id], s.action, tuple(ids[a] for a in s.after if a in ids)) for s in steps
    )
