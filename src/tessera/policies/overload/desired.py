"""What reconcile should consider desired while an overload drop is active.

The overload loop turns a whole replica (the head) and donor replicas into one pipeline: the
head keeps layers [0, k) as stage 0, each donor's block becomes a later stage of the head's
replica, and donors leave the routes. A level-triggered reconcile would see that as drift and
undo it. `desired(target, observed, enabled)` rewrites the plan's `transition.Target` so that,
while `spec.policies.overload.enabled`, the held blocks of every dropped group are kept
verbatim, the head's planned whole block and the donors' blocks are left out, and donors are
not routed. Derived from observation only (a restart sees the same): a dropped group is a
target whole replica held as several stages; a donor is a whole target replica held nowhere
whose planned (agent, device) holds a later stage of a group; half-applied steps are kept the
same way. Disabled, the target is returned unchanged. Pure; called by `tessera.control.converge`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from tessera import blocks, observed
from tessera.policies.transition import model as transition_model


@dataclass(frozen=True)
class DroppedGroup:
    head: str  # the replica the group serves as (its leader is stage 0)
    donors: tuple[str, ...]  # whole replicas whose blocks became its later stages
    stages: tuple[transition_model.Placed, ...]  # held blocks, by stage index

    @property
    def complete(self) -> bool:
        """Every stage 0..n-1 is held, covering the layers contiguously from 0."""
        n = self.stages[0].block.num_stages if self.stages else 0
        idx = [p.block.stage_index for p in self.stages]
        if idx != list(range(n)) or self.stages[0].block.start != 0:
            return False
        return all(
            a.block.end == b.block.start for a, b in zip(self.stages, self.stages[1:], strict=False)
        )

    @property
    def members(self) -> tuple[str, ...]:
        return (self.head, *self.donors)


@dataclass(frozen=True)
class Desired:
    """The target reconcile should reach, and the dropped groups it kept."""

    target: transition_model.Target
    groups: tuple[DroppedGroup, ...] = ()

    @property
    def members(self) -> set[str]:
        """Replicas serving inside a complete dropped group (ready, though rearranged)."""
        return {m for g in self.groups if g.complete for m in g.members}


def _whole(target: transition_model.Target) -> dict[str, transition_model.Placed]:
    """Target replicas planned as one block (one stage, no TP): their block."""
    per: dict[str, list[transition_model.Placed]] = {}
    for p in target.blocks:
        per.setdefault(p.block.replica_id, []).append(p)
    return {
        rid: ps[0]
        for rid, ps in per.items()
        if len(ps) == 1 and ps[0].block.num_stages == 1 and ps[0].block.tp_size == 1
    }


def dropped_groups(
    target: transition_model.Target, obs: observed.Observed
) -> tuple[DroppedGroup, ...]:
    """The dropped groups agents hold (see the module docstring), sorted by head."""
    whole = _whole(target)
    held_ids: set[str] = set()
    stages: dict[str, list[transition_model.Placed]] = {}
    for a in obs.agents:
        if not a.reachable:
            continue
        for b in a.blocks:
            held_ids.add(b.replica_id)
            if b.replica_id in whole and _pipelined(b):
                stages.setdefault(b.replica_id, []).append(
                    transition_model.Placed(a.name, a.address, b)
                )
    taken: set[str] = set()
    out: list[DroppedGroup] = []
    for head in sorted(stages):
        found = sorted(stages[head], key=lambda p: p.block.stage_index)
        donors: list[str] = []
        for p in found:
            if p.block.stage_index == 0:
                continue
            for rid in sorted(whole):
                w = whole[rid]
                if (
                    rid != head
                    and rid not in held_ids
                    and rid not in taken
                    and (w.agent, w.block.device) == (p.agent, p.block.device)
                ):
                    donors.append(rid)
                    taken.add(rid)
                    break
        out.append(DroppedGroup(head, tuple(donors), tuple(found)))
    return tuple(out)


def _pipelined(b: blocks.Block) -> bool:
    """A block of an overload group: more than one stage, or a later stage."""
    return b.tp_size == 1 and (b.num_stages > 1 or b.stage_index > 0)


def desired(target: transition_model.Target, obs: observed.Observed, enabled: bool) -> Desired:
    """`target` with the dropped groups kept as they are held (module docstring)."""
    if not enabled:
        return Desired(target)
    groups = dropped_groups(target, obs)
    if not groups:
        return Desired(target)
    donors = {d for g in groups for d in g.donors}
    # a head still held whole (mid-restore, a later stage not yet restored) keeps its block
    heads = {g.head for g in groups if any(p.block.stage_index == 0 for p in g.stages)}
    kept = tuple(
        p
        for p in target.blocks
        if p.block.replica_id not in donors
        and not (p.block.replica_id in heads and _held_differently(p, groups))
    )
    extra = tuple(
        p for g in groups for p in g.stages if p.block.key not in {k.block.key for k in kept}
    )
    return Desired(
        transition_model.Target(
            target.generation,
            kept + extra,
            tuple(r for r in target.replicas if r.id not in donors),
        ),
        groups,
    )


def _held_differently(p: transition_model.Placed, groups: tuple[DroppedGroup, ...]) -> bool:
    """The planned whole block of a head whose stage 0 is held as a pipeline stage."""
    for g in groups:
        for s in g.stages:
            if s.block.key == p.block.key and not s.block.same_layout(p.block):
                return True
    return False


def generation_view(
    deployment: str, whole: Mapping[str, tuple[str, str, int]], obs: observed.Observed
) -> observed.Observed:
    """`obs` as the plan's generation assignment should see it while drops are active:
    each dropped group's blocks shown as the whole replicas they were (the head's stage 0
    as its whole block, each later stage as the planned whole replica whose agent and
    device hold it, with the block's own generation), so that a drop never makes a new
    layout generation. `deployment` is "<namespace>.<name>"; `whole` maps each replica
    the plan has whole (one stage, no TP) to its (agent, device, end layer). Called by
    `tessera.plan.make_plan` when `spec.policies.overload.enabled`."""
    held_names = {
        blocks.parse_replica_id(b.replica_id).name
        for a in obs.agents
        for b in a.blocks
        if blocks.parse_replica_id(b.replica_id).deployment == deployment
    }
    ns, _, dep_name = deployment.partition(".")
    agents = []
    for a in obs.agents:
        shown: list[blocks.Block] = []
        for b in a.blocks:
            rn = blocks.parse_replica_id(b.replica_id)
            if rn.deployment != deployment or not _pipelined(b) or rn.name not in whole:
                shown.append(b)
                continue
            end = whole[rn.name][2]
            if b.stage_index == 0:
                shown.append(replace(b, num_stages=1, start=0, end=end, next_address=""))
                continue
            donor = next(
                (
                    n
                    for n, (agent, device, _) in sorted(whole.items())
                    if n not in held_names and (agent, device) == (a.name, b.device)
                ),
                None,
            )
            if donor is not None:
                rid = blocks.replica_id(ns, dep_name, donor, b.generation)
                shown.append(
                    replace(
                        b,
                        replica_id=rid,
                        stage_index=0,
                        num_stages=1,
                        start=0,
                        end=whole[donor][2],
                        next_address="",
                    )
                )
        agents.append(replace(a, blocks=tuple(shown)))
    return replace(obs, agents=tuple(agents))
