"""Transition planner: from what the agents hold to a desired plan, without losing a request.

`plan(world, target)` is pure. `world` is what can be observed (the agents' blocks,
devices and per-replica load, the routes last published to the gateway, the time), plus
the free memory per device and a link model; `target` is the desired blocks and replica
set of one plan generation. It returns a `Transition`: ordered `Step`s (each naming the
steps it waits for) in the action vocabulary of `policies.actions`.

Order of a transition:
1. replicas of this deployment that no route names are drained and unloaded first
   (leftovers of an interrupted or reverted transition);
2. **make-before-break**: missing blocks of the target are loaded while the old
   replicas keep serving, each from a peer holding its tensors when the link model says
   that beats storage, last stage first;
3. one `CutOver` publishes the target's replica set; the replicas it drops are leaving;
4. each leaving replica is drained (idle as observed, or its deadline plus a grace has
   passed) and only then unloaded.
When a device cannot hold the new blocks beside the old (**freeing order**), old
replicas are retired one at a time before the loads that need their memory: a `CutOver`
drops the replica while at least one other complete replica keeps serving, then it is
drained and unloaded. When even that cannot make room, the transition is `blocked` with
a condition reason and message, and its steps only clean up unrouted leftovers: the old
layout keeps serving.

Level-triggered: the plan depends only on the observation, so re-planning after any
prefix of the steps (or after an operator restart) continues where things stand, and a
converged system plans nothing. Called by the operator's executor
(`tessera_operator.actuate`) and by `tessera up`; `drained` and `complete_replicas`
are the observations the executor and status use.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from tessera import blocks, observed, routes_doc
from tessera.policies import actions, links

DevKey = tuple[str, str]  # (agent, device)
Where = tuple[str, tuple[str, int, int]]  # (agent, block key)


@dataclass(frozen=True)
class Placed:
    """A block on an agent."""

    agent: str
    address: str
    block: blocks.Block


@dataclass(frozen=True)
class Target:
    """The desired state of one plan generation: its blocks and the replicas to route."""

    generation: int
    blocks: tuple[Placed, ...]
    replicas: tuple[routes_doc.RouteReplica, ...]


@dataclass(frozen=True)
class DrainPolicy:
    # the deadline a cut-over publishes (drains use the one their routes document says)
    deadline_s: float = routes_doc.DEFAULT_DRAIN_DEADLINE_S
    grace_s: float = 5.0  # past the deadline: the gateway has given up on the replica
    settle_s: float = 2.0  # before an idle replica counts as drained: the gateway's reload

    def __post_init__(self) -> None:
        if min(self.deadline_s, self.grace_s, self.settle_s) < 0:
            raise ValueError("drain policy: durations must be >= 0")


@dataclass(frozen=True)
class World:
    """What the planner may look at."""

    observed: observed.Observed
    owner_prefix: str  # replica ids of this deployment start with it
    published: routes_doc.RoutesDoc | None = None  # routes the gateway was last given
    now: float = 0.0  # unix seconds
    memory: Mapping[DevKey, int] | None = None  # free bytes; None: the agents' free_bytes
    links: links.LinkModel = field(default_factory=links.LinkModel)
    drain: DrainPolicy = field(default_factory=DrainPolicy)
    checkpoint_readable: bool = True  # agents can read the weights from storage


@dataclass(frozen=True)
class Blocked:
    """Why a transition cannot be done; `reason` is a condition reason."""

    reason: str  # InsufficientMemory, AgentUnreachable, NoSource
    message: str


MODES = ("converged", "make-before-break", "freeing-order", "blocked")


@dataclass(frozen=True)
class Transition:
    generation: int
    steps: tuple[actions.Step, ...]
    mode: str  # one of MODES
    blocked: Blocked | None = None
    peak_bytes: int = 0  # this deployment's block bytes at the plan's peak (simulated)
    start_bytes: int = 0  # ... before its first step
    end_bytes: int = 0  # ... after its last step

    @property
    def converged(self) -> bool:
        return not self.steps and self.blocked is None


def complete_replicas(obs: observed.Observed, owner_prefix: str) -> set[str]:
    """Replicas of the deployment with every stage held on a reachable agent."""
    stages: dict[str, set[int]] = {}
    total: dict[str, int] = {}
    for a in obs.agents:
        if not a.reachable:
            continue
        for b in a.blocks:
            if b.replica_id.startswith(owner_prefix):
                stages.setdefault(b.replica_id, set()).add(b.stage_index)
                total[b.replica_id] = b.num_stages
    return {r for r, s in stages.items() if s == set(range(total[r]))}


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


class _Sim:
    """The simulated state the steps are written against: memory, blocks, routes."""

    def __init__(self, world: World, target: Target) -> None:
        self.world, self.target = world, target
        obs = world.observed
        self.reachable = {a.name: a for a in obs.agents if a.reachable}
        self.free: dict[DevKey, int] = {}
        for a in self.reachable.values():
            for d in a.devices:
                self.free[(a.name, d.id)] = d.free_bytes
        if world.memory is not None:
            self.free.update(world.memory)
        # every block held (any deployment: peers), with the step that loads it (None: held)
        self.present: dict[Where, tuple[Placed, int | None]] = {
            (a.name, b.key): (Placed(a.name, a.address, b), None)
            for a in self.reachable.values()
            for b in a.blocks
        }
        self.readers: dict[Where, list[int]] = {}  # loads copying from a block
        self.steps: list[actions.Step] = []
        self.unloads_on: dict[DevKey, list[int]] = {}
        self.routed: list[routes_doc.RouteReplica] = (
            list(world.published.replicas) if world.published is not None else []
        )
        self.route_steps: list[int] = []
        self.ours_bytes = sum(
            p.block.bytes for p, _ in self.present.values() if self.ours(p.block.replica_id)
        )
        self.start_bytes = self.peak_bytes = self.ours_bytes
        self.retired = 0

    def ours(self, rid: str) -> bool:
        return rid.startswith(self.world.owner_prefix)

    def add(self, action: actions.Action, after: Iterable[int] = ()) -> int:
        sid = len(self.steps)
        self.steps.append(actions.Step(sid, action, tuple(sorted(set(after)))))
        return sid

    # -- replicas and memory --------------------------------------------------------
    def held(self, rid: str) -> list[Placed]:
        return sorted(
            (p for p, _ in self.present.values() if p.block.replica_id == rid),
            key=lambda p: -p.block.stage_index,
        )

    def complete(self, rid: str) -> bool:
        held = self.held(rid)
        return bool(held) and {p.block.stage_index for p in held} == set(
            range(held[0].block.num_stages)
        )

    def deficit(self, need: Mapping[DevKey, int]) -> dict[DevKey, int]:
        return {k: n - self.free.get(k, 0) for k, n in need.items() if n > self.free.get(k, 0)}

    # -- actions ----------------------------------------------------------------------
    def retire(self, rid: str, after: list[int]) -> list[int]:
        """Drain a replica no route names, then unload its blocks; the unload step ids."""
        drain_deadline = (
            self.world.published.drain_deadline_s
            if self.world.published is not None
            else self.world.drain.deadline_s
        )
        drain = self.add(actions.Drain(rid, drain_deadline), after)
        out = []
        for p in self.held(rid):
            out.append(self.unload(p, [drain]))
        return out

    def unload(self, p: Placed, after: list[int]) -> int:
        where = (p.agent, p.block.key)
        _, loaded_by = self.present.pop(where)
        deps = list(after) + self.readers.pop(where, [])
        if loaded_by is not None:
            deps.append(loaded_by)
        sid = self.add(actions.UnloadBlock(p.agent, p.address, p.block), deps)
        dev = (p.agent, p.block.device)
        self.free[dev] = self.free.get(dev, 0) + p.block.bytes
        self.unloads_on.setdefault(dev, []).append(sid)
        self.ours_bytes -= p.block.bytes
        return sid

    def source(self, p: Placed) -> tuple[Placed, int | None] | None:
        """The fastest peer holding `p`'s tensors, when it beats reading storage."""
        links_, nbytes = self.world.links, p.block.param_bytes
        best: tuple[float, Placed, int | None] | None = None
        for have, step in self.present.values():
            if step is not None:
                continue  # only blocks held now: a copy never waits for another load
            if have.block.key == p.block.key and have.agent == p.agent:
                continue
            if have.block.holds(p.block):
                t = links_.copy_seconds(have.agent, p.agent, nbytes)
                if best is None or t < best[0]:
                    best = (t, have, step)
        store = links_.read_seconds(p.agent, nbytes) if self.world.checkpoint_readable else math.inf
        if best is not None and best[0] < store:
            return best[1], best[2]
        return None

    def load(self, p: Placed, after: list[int]) -> int | Blocked:
        src = self.source(p)
        if src is None and not self.world.checkpoint_readable:
            return Blocked(
                "NoSource",
                f"no agent holds the tensors of {p.block.describe()} and the checkpoint "
                "cannot be read from storage",
            )
        deps = list(after) + self.unloads_on.get((p.agent, p.block.device), [])
        peer = None
        if src is not None:
            have, loaded_by = src
            peer = actions.PeerSource(
                have.agent, have.address, have.block.replica_id, have.block.stage_index
            )
            if loaded_by is not None:
                deps.append(loaded_by)
        sid = self.add(actions.LoadBlock(p.agent, p.address, p.block, peer), deps)
        if src is not None:
            self.readers.setdefault((src[0].agent, src[0].block.key), []).append(sid)
        dev = (p.agent, p.block.device)
        # a load without a KV budget takes all the memory left on its device
        took = p.block.bytes if p.block.kv_bytes else max(self.free.get(dev, 0), p.block.bytes)
        self.free[dev] = self.free.get(dev, 0) - took
        self.present[(p.agent, p.block.key)] = (p, sid)
        self.ours_bytes += p.block.bytes
        self.peak_bytes = max(self.peak_bytes, self.ours_bytes)
        return sid

    def cut_over(self, replicas: list[routes_doc.RouteReplica], after: list[int]) -> int:
        keep = {r.id for r in replicas}
        gone = tuple(r.id for r in self.routed if r.id not in keep)
        sid = self.add(
            actions.CutOver(
                self.target.generation, tuple(replicas), gone, self.world.drain.deadline_s
            ),
            after + self.route_steps,
        )
        self.routed = list(replicas)
        self.route_steps = [sid]
        return sid


def _victim(sim: _Sim, need: Mapping[DevKey, int], target_ids: set[str]) -> str | None:
    """The routed old replica whose retirement frees most of the deficit, provided another
    complete replica keeps serving (or nothing was serving to begin with)."""
    short = sim.deficit(need)
    best: tuple[int, str] | None = None
    complete = [r.id for r in sim.routed if sim.complete(r.id)]
    for r in sim.routed:
        if r.id in target_ids or not sim.ours(r.id):
            continue
        if sim.world.published is not None and not [c for c in complete if c != r.id]:
            continue  # no other complete replica would serve
        freed = sum(
            min(p.block.bytes, short.get((p.agent, p.block.device), 0)) for p in sim.held(r.id)
        )
        if freed > 0 and (best is None or freed > best[0]):
            best = (freed, r.id)
    return best[1] if best is not None else None


def plan(world: World, target: Target) -> Transition:
    """The steps from `world` to `target` (see the module docstring)."""
    sim = _Sim(world, target)
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
    for where, p in want.items():
        held = sim.present.get(where)
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

    # 2. loads, retiring old replicas first where memory is short
    blocked: Blocked | None = None
    loads: list[int] = []
    done_new: list[routes_doc.RouteReplica] = []
    for r in (r for r in target.replicas if r.id in missing):
        blocked = _make_room(sim, r, missing[r.id], target_ids, loads, done_new)
        if blocked is not None:
            break
        prev: list[int] = []
        for p in sorted(missing[r.id], key=lambda p: -p.block.stage_index):
            got = sim.load(p, prev)
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
    if blocked is not None:
        # only the cleanup that cannot hurt serving: unrouted leftovers
        steps = _renumber([s for s in sim.steps if _is_cleanup(s, leftovers)])
        return Transition(
            target.generation, steps, "blocked", blocked, sim.peak_bytes, sim.start_bytes
        )

    # 3. cut the routes over to the target, 4. drain and free what leaves
    if cut_needed:
        leaving = [r.id for r in sim.routed if r.id not in target_ids and sim.ours(r.id)]
        cut = sim.cut_over(list(target.replicas), loads)
        for rid in leaving:
            sim.retire(rid, [cut])
    mode = "converged"
    if sim.steps:
        mode = "freeing-order" if sim.retired else "make-before-break"
    return Transition(
        target.generation,
        tuple(sim.steps),
        mode,
        None,
        sim.peak_bytes,
        sim.start_bytes,
        sim.ours_bytes,
    )


def _make_room(
    sim: _Sim,
    r: routes_doc.RouteReplica,
    todo: list[Placed],
    target_ids: set[str],
    loads: list[int],
    done_new: list[routes_doc.RouteReplica],
) -> Blocked | None:
    """Retire old replicas (cut-over, drain, unload) until `todo` fits; None when it does."""
    need: dict[DevKey, int] = {}
    for p in todo:
        k = (p.agent, p.block.device)
        need[k] = need.get(k, 0) + p.block.bytes
    while sim.deficit(need):
        victim = _victim(sim, need, target_ids)
        if victim is None:
            dev, short = next(iter(sim.deficit(need).items()))
            return Blocked(
                "InsufficientMemory",
                f"replica {r.id} needs {need[dev]} bytes on {dev[0]}/{dev[1]}, which has "
                f"{sim.free.get(dev, 0)} free ({short} short) even after freeing every old "
                "replica that can go while another keeps serving",
            )
        keep = [x for x in sim.routed if x.id != victim]
        keep += [x for x in done_new if x not in keep]
        cut = sim.cut_over(keep, loads)
        sim.retire(victim, [cut])
        sim.retired += 1
    return None


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
