"""Dropped groups as the agents hold them, and the steps that finish a shift cut short.

Pure; the level the overload loop acts from: nothing is remembered between ticks, so an
operator restarted mid-drop or mid-restore converges from what the agents report. Input: the
planned whole replicas (`Member`: replica id, agent name, address) and the agents' blocks
(`observed.Observed`). `read` sorts each member: whole (holds [0, L) as one stage); head of a
dropped group (`HeldGroup`: stage 0 holds [0, e), later stages on donors' agents cover [e, L));
stray (`Stray`: the head holds [0, L) while stages of its replica sit elsewhere; `stray_steps`
gives them back to their donors and resumes the head). `takeover_steps` is a starting loop's
first act: a shift cut short between pause and resume leaves a head paused (no RPC reports
it), so each head is paused and resumed at its smallest stage pool and each whole member
resumed. Caller: `tessera.control.overload`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tessera import blocks as blk
from tessera import observed
from tessera.policies.overload import drop_plan
from tessera.policies.overload import steps as overload_steps


@dataclass(frozen=True)
class Member:
    """A replica the plan has whole: its id, its agent and that agent's address."""

    replica_id: str
    agent: str
    address: str


@dataclass(frozen=True)
class HeldStage:
    """Stage `index` of a head's replica as an agent holds it; `member`: who keeps it."""

    member: str
    index: int
    agent: str
    address: str
    start: int
    end: int
    kv_pages: int
    kv_bytes: int
    param_bytes: int


@dataclass(frozen=True)
class HeldGroup:
    head: str
    stages: tuple[HeldStage, ...]  # in stage order; stages[0] is the head's

    @property
    def group(self) -> drop_plan.Group:
        """The group as `overload_steps.restore_steps` takes it."""
        members = tuple(s.member for s in self.stages)
        stages = tuple(drop_plan.Stage(s.member, s.start, s.end) for s in self.stages)
        return drop_plan.Group(members, stages, 0, False)

    @property
    def pre_drop_kv_bytes(self) -> int:
        """The members' KV pools before the drop, in bytes: the drop turned k-1 copies of
        the parameters (each stage's parameters summed once) into KV."""
        params = sum(s.param_bytes for s in self.stages)
        kv = sum(s.kv_bytes for s in self.stages)
        return max(0, kv - (len(self.stages) - 1) * params)


@dataclass(frozen=True)
class Stray:
    head: str
    address: str  # the head's agent
    stages: tuple[HeldStage, ...]  # the head replica's later stages still on other agents


@dataclass(frozen=True)
class Held:
    whole: tuple[str, ...] = ()
    groups: tuple[HeldGroup, ...] = ()
    strays: tuple[Stray, ...] = ()
    unknown: tuple[str, ...] = ()  # members held in no shape above (loading, lost, ...)


def _stage(member: str, agent: observed.AgentInfo, b: blk.Block) -> HeldStage:
    return HeldStage(
        member,
        b.stage_index,
        agent.name,
        agent.address,
        b.start,
        b.end,
        b.kv_pages,
        b.kv_bytes,
        b.param_bytes,
    )


def read(members: Sequence[Member], obs: observed.Observed, num_layers: int) -> Held:
    """Sort the members by what the agents hold (module docstring)."""
    ids = {m.replica_id for m in members}
    held: dict[str, list[HeldStage]] = {}
    for a in obs.agents:
        for b in a.blocks:
            if b.replica_id in ids and b.tp_rank == 0:
                held.setdefault(b.replica_id, []).append(_stage(b.replica_id, a, b))
    whole, heads, unknown = [], [], []
    for m in sorted(members, key=lambda m: m.replica_id):
        stages = sorted(held.get(m.replica_id, []), key=lambda s: s.index)
        if not stages:
            continue  # a donor inside a group, or not loaded: decided below
        first = stages[0]
        if first.index != 0:
            unknown.append(m.replica_id)
        elif len(stages) == 1 and (first.start, first.end) == (0, num_layers):
            whole.append(m.replica_id)
        else:
            heads.append((m, stages))
    # donors: members holding nothing of their own, matched to stages by agent
    free: dict[str, list[str]] = {}
    for m in sorted(members, key=lambda m: m.replica_id):
        if m.replica_id not in held:
            free.setdefault(m.agent, []).append(m.replica_id)
    groups, strays = [], []
    for m, stages in heads:
        named: list[HeldStage] = [stages[0]]
        for s in stages[1:]:
            pool = free.get(s.agent) or []
            if not pool:
                break
            named.append(_renamed(s, pool.pop(0)))
        if len(named) != len(stages):
            unknown.append(m.replica_id)
            continue
        if (stages[0].start, stages[0].end) == (0, num_layers):
            strays.append(Stray(m.replica_id, m.address, tuple(named[1:])))
        elif _covers(named, num_layers):
            groups.append(HeldGroup(m.replica_id, tuple(named)))
        else:
            unknown.append(m.replica_id)
    claimed = {s.member for g in groups for s in g.stages} | {
        s.member for st in strays for s in st.stages
    }
    unknown += [r for rs in free.values() for r in rs if r not in claimed]
    return Held(tuple(whole), tuple(groups), tuple(strays), tuple(sorted(unknown)))


def _renamed(s: HeldStage, member: str) -> HeldStage:
    return HeldStage(
        member, s.index, s.agent, s.address, s.start, s.end, s.kv_pages, s.kv_bytes, s.param_bytes
    )


def _covers(stages: Sequence[HeldStage], num_layers: int) -> bool:
    if [s.index for s in stages] != list(range(len(stages))):
        return False
    edge = 0
    for s in stages:
        if s.start != edge or s.end <= s.start:
            return False
        edge = s.end
    return edge == num_layers


def stray_steps(stray: Stray, num_layers: int) -> tuple[overload_steps.Step, ...]:
    """Whole replicas again: resume the head, give each stage back to its donor (which
    restores [0, L) from the head), route the donors again and open the head."""
    h = overload_steps.BlockRef(stray.address, stray.head, 0)
    out: list[overload_steps.Step] = [overload_steps.Resume(h)]
    for s in stray.stages:
        block = overload_steps.BlockRef(s.address, stray.head, s.index)
        back = overload_steps.BlockRef(s.address, s.member, 0)
        out.append(
            overload_steps.Shift(
                "restore", block, 0, num_layers, back, 1, "", ((h, 0, num_layers),)
            )
        )
    out.append(
        overload_steps.Routes(add=tuple(s.member for s in stray.stages), reopen=(stray.head,))
    )
    return tuple(out)


def takeover_steps(held: Held, members: Sequence[Member]) -> tuple[overload_steps.Step, ...]:
    """Resume every whole member; pause and resume every group's head, its allocator at
    the smallest stage pool (module docstring)."""
    address = {m.replica_id: m.address for m in members}
    out: list[overload_steps.Step] = [
        overload_steps.Resume(overload_steps.BlockRef(address[r], r, 0)) for r in held.whole
    ]
    for g in held.groups:
        h = g.stages[0]
        ref = overload_steps.BlockRef(h.address, g.head, 0)
        pages = min(s.kv_pages for s in g.stages)
        out += [overload_steps.Pause(ref), overload_steps.Resume(ref, num_pages=pages)]
    return tuple(out)


def step_members(members: Sequence[Member]) -> Mapping[str, overload_steps.Member]:
    """The members as `overload_steps` takes them."""
    return {m.replica_id: overload_steps.Member(m.replica_id, m.address) for m in members}
