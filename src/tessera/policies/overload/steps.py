"""The ordered steps that apply a KunServe drop or restore to live replicas.

Pure: `drop_steps(group, members)` and `restore_steps(group, members)` turn one drop-plan group
and where each member runs (`Member`: replica id, agent address) into the steps the driver
performs over the agents' `OverloadShift`, `ExportKV` and `ImportKV` RPCs and the routes. The
member keeping layer 0 is the head (its replica becomes the pipeline); the others are donors
(their blocks become its later stages in place). Drop: routes without the donors and the
head closed (new requests go elsewhere while another replica is routable), donors drain,
pause the head, each donor drops to its stage's layers as stage i, the head's K/V for each
donor stage moves there (page ids unchanged, chunks of about one stage step), the head drops
to stage 0, resume at the smallest grown pool, reopen the head. Restore, the inverse: pause,
compact the head's pages (donors copy the moves), pull dropped layers and running K/V back
to the head, resume whole, donors reload their layers, routes with the donors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tessera.policies.overload import drop_plan


@dataclass(frozen=True)
class Member:
    """Where a member replica runs (whole, before the drop): its id and its agent."""

    replica_id: str
    address: str


@dataclass(frozen=True)
class BlockRef:
    """A hosted block: agent, replica, stage."""

    address: str
    replica_id: str
    stage_index: int


@dataclass(frozen=True)
class Routes:
    """Take replicas out of the gateway's routable set, or put them back; close replicas
    (no new requests while another is routable, the queued ones stay), or open them."""

    remove: tuple[str, ...] = ()
    add: tuple[str, ...] = ()
    close: tuple[str, ...] = ()
    reopen: tuple[str, ...] = ()


@dataclass(frozen=True)
class Drain:
    """Wait until the replica has no request (the gateway sends it none any more)."""

    block: BlockRef


@dataclass(frozen=True)
class Pause:
    block: BlockRef  # a leader: no step is scheduled until Resume; its held pages are noted


@dataclass(frozen=True)
class Resume:
    block: BlockRef
    grow_to: tuple[BlockRef, ...] = ()  # raise the allocator to the smallest of these pools
    num_pages: int = 0  # or to this many pages (the pools as observed, not shifted now)


@dataclass(frozen=True)
class Shift:
    """Drop to, or restore, layers [start, end) and take the identity `becomes`."""

    op: str  # "drop" | "restore"
    block: BlockRef
    start: int
    end: int
    becomes: BlockRef
    num_stages: int
    next_address: str = ""
    sources: tuple[tuple[BlockRef, int, int], ...] = ()  # restore: (block, start, end)


@dataclass(frozen=True)
class ExchangeKV:
    """Copy the held pages' K/V of layers [start, end) from one stage to another."""

    source: BlockRef
    target: BlockRef
    start: int
    end: int


@dataclass(frozen=True)
class Compact:
    block: BlockRef  # the head's leader: held pages move below its whole-model pool


@dataclass(frozen=True)
class MovePages:
    block: BlockRef  # a stage copies the page moves of the last Compact


Step = Routes | Drain | Pause | Resume | Shift | ExchangeKV | Compact | MovePages


def _ordered(group: drop_plan.Group) -> tuple[drop_plan.Stage, ...]:
    stages = tuple(sorted(group.stages, key=lambda s: s.start))
    if not stages or stages[0].start != 0:
        raise ValueError(f"group {group.members}: no stage starts at layer 0")
    if len({s.replica for s in stages}) != len(stages):
        raise ValueError(f"group {group.members}: one stage per member is supported")
    return stages


def drop_steps(group: drop_plan.Group, members: Mapping[str, Member]) -> tuple[Step, ...]:
    """Steps that turn the group's whole replicas into one pipeline (module docstring)."""
    stages = _ordered(group)
    if len(stages) < 2:
        return ()
    head = members[stages[0].replica]
    k = len(stages)
    whole = {s.replica: BlockRef(members[s.replica].address, s.replica, 0) for s in stages}
    as_stage = [
        BlockRef(members[s.replica].address, head.replica_id, i) for i, s in enumerate(stages)
    ]
    donors = [s.replica for s in stages[1:]]
    # the head is closed while its donors drain: an arrival sent there would wait for the
    # grown pool, one sent to another replica (a dropped pipeline) need not
    out: list[Step] = [Routes(remove=tuple(donors), close=(head.replica_id,))]
    out += [Drain(whole[d]) for d in donors]
    out.append(Pause(whole[head.replica_id]))
    for i, s in enumerate(stages[1:], start=1):
        nxt = as_stage[i + 1].address if i + 1 < k else ""
        out.append(Shift("drop", whole[s.replica], s.start, s.end, as_stage[i], k, nxt))
    for i, s in enumerate(stages[1:], start=1):
        out.append(ExchangeKV(as_stage[0], as_stage[i], s.start, s.end))
    s0 = stages[0]
    out.append(Shift("drop", as_stage[0], s0.start, s0.end, as_stage[0], k, as_stage[1].address))
    out.append(Resume(as_stage[0], grow_to=tuple(as_stage)))
    out.append(Routes(reopen=(head.replica_id,)))
    return tuple(out)


def restore_steps(
    group: drop_plan.Group, members: Mapping[str, Member], num_layers: int
) -> tuple[Step, ...]:
    """Steps that return a dropped group to whole replicas (module docstring)."""
    stages = _ordered(group)
    if len(stages) < 2:
        return ()
    head = members[stages[0].replica]
    as_stage = [
        BlockRef(members[s.replica].address, head.replica_id, i) for i, s in enumerate(stages)
    ]
    h = as_stage[0]
    out: list[Step] = [Pause(h), Compact(h)]
    out += [MovePages(b) for b in as_stage[1:]]
    sources = tuple((as_stage[i], s.start, s.end) for i, s in enumerate(stages) if i)
    out.append(Shift("restore", h, 0, num_layers, h, 1, "", sources))
    for i, s in enumerate(stages[1:], start=1):
        out.append(ExchangeKV(as_stage[i], h, s.start, s.end))
    out.append(Resume(h))
    donors = []
    for i, s in enumerate(stages[1:], start=1):
        m = members[s.replica]
        back = BlockRef(m.address, m.replica_id, 0)
        out.append(Shift("restore", as_stage[i], 0, num_layers, back, 1, "", ((h, 0, num_layers),)))
        donors.append(m.replica_id)
    out.append(Routes(add=tuple(donors)))
    return tuple(out)
