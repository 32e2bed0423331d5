"""CoCoServe module-level scaling: Algorithm 1 (scale up) and Algorithm 2 (scale down).

Input: a replica's `speedup.Placement`, the devices (`speedup.Device`: capacity, link, free
memory, idle share), the workload shape and a `ScalingConfig` (`spec.policies.scaling`). Output:
plans of typed actions (`Replicate`, `Migrate`, `Evict`, `ReduceBatch`) plus the modelled
result. Scale up: devices idler than `up_idle_fraction`, most idle first, take replicas of
layers ordered by continuity, each added only if the modelled speedup (Eq. 3) rises: speedup
never decreases, memory is never overcommitted (property-tested). Scale down, when violations
exceed `down_violation_rate` and the source's modelled step misses the TPOT budget: migrate the
heaviest modules off it (at most `max_migrations`), evict its hosted replicas (least speedup
lost first), cut the batch by `batch_step`; each phase stops once the model says it is
resolved. Defaults and the pseudocode's errata: docs/module-scaling.md. Called by
`control/scaling_driver.py` (via `run_plan.py`) and `tessera bench scaling`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from tessera.policies.scaling import speedup as sp
from tessera.policy_config import DEFAULT_BATCH_STEP as DEFAULT_BATCH_STEP
from tessera.policy_config import DEFAULT_DOWN_VIOLATION_RATE as DEFAULT_DOWN_VIOLATION_RATE
from tessera.policy_config import DEFAULT_MAX_MIGRATIONS as DEFAULT_MAX_MIGRATIONS
from tessera.policy_config import DEFAULT_UP_IDLE_FRACTION as DEFAULT_UP_IDLE_FRACTION
from tessera.policy_config import ScalingConfig as ScalingConfig


@dataclass(frozen=True)
class Replicate:
    layer: int
    device: str
    speedup: float  # modelled S after this action


@dataclass(frozen=True)
class Migrate:
    module: str
    source: str
    target: str
    bytes: int


@dataclass(frozen=True)
class Evict:
    owner: str  # the replica whose layer replica is evicted
    layer: int
    device: str
    speedup_lost: float


@dataclass(frozen=True)
class ReduceBatch:
    before: int
    after: int


Action = Replicate | Migrate | Evict | ReduceBatch


@dataclass(frozen=True)
class ScaleUpPlan:
    state: sp.Placement
    speedup_before: float
    speedup_after: float
    actions: tuple[Replicate, ...]


def candidates_by_continuity(state: sp.Placement, device: str, limit: int) -> list[int]:
    """SortCandidatesByContinuity: layers not yet on `device`, those extending a run it
    holds first, then longer runs first, then by index; the first `limit`."""
    held = set(state.on(device))
    free = [i for i in range(state.num_layers) if i not in held]
    runs: list[list[int]] = []
    for i in free:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])

    def extends(run: list[int]) -> bool:
        return run[0] - 1 in held or run[-1] + 1 in held

    runs.sort(key=lambda r: (not extends(r), -len(r), r[0]))
    out: list[int] = []
    for run in runs:
        if extends(run) and run[-1] + 1 in held and run[0] - 1 not in held:
            run = run[::-1]  # grow the held run downward from its start
        out.extend(run)
    return out[: max(0, limit)]


def scale_up(
    state: sp.Placement,
    devices: Mapping[str, sp.Device],
    wl: sp.Workload,
    replica_bytes: int,
    cfg: ScalingConfig,
) -> ScaleUpPlan:
    """Algorithm 1. `replica_bytes`: one layer's parameters plus the KV its share of the
    batch needs on the replica (the paper's replica size r)."""
    if replica_bytes < 1:
        raise ValueError("replica_bytes: must be >= 1")
    best = first = sp.speedup(state, devices, wl)
    actions: list[Replicate] = []
    eligible = sorted(
        (
            d
            for d in devices.values()
            if d.name != state.origin and d.idle_fraction > cfg.up_idle_fraction
        ),
        key=lambda d: (-d.idle_fraction, d.name),
    )
    for dst in eligible:
        room = dst.free_bytes // replica_bytes
        for layer in candidates_by_continuity(state, dst.name, room):
            trial = state.add(layer, dst.name)
            s = sp.speedup(trial, devices, wl)
            if s > best:
                state, best = trial, s
                actions.append(Replicate(layer, dst.name, s))
    return ScaleUpPlan(state, first, best, tuple(actions))


@dataclass(frozen=True)
class Module:
    """A module on the overloaded source (a decoder layer, or part of one, with its KV)."""

    name: str
    bytes: int
    step_seconds: float  # its share of the source's per-step time


@dataclass(frozen=True)
class Hosted:
    """A layer replica of `owner` placed on the source device."""

    owner: str
    layer: int
    step_seconds: float  # compute it takes on the source per step


@dataclass(frozen=True)
class ScaleDownInput:
    source: str  # the device whose requests violate their SLO
    violation_rate: float  # observed share of requests over their SLO
    step_seconds: float  # modelled per-step seconds of everything on the source
    step_budget_s: float  # per-step seconds the SLO allows (TPOT target)
    modules: tuple[Module, ...]  # candidates to migrate (FilterModules' input)
    hosted: tuple[Hosted, ...] = ()  # replicas on the source that can be evicted
    # each hosted replica's owner: its placement and workload (to price an eviction)
    owners: Mapping[str, tuple[sp.Placement, sp.Workload]] = field(default_factory=dict)
    batch_size: int = 1
    fixed_seconds: float = 0.0  # part of step_seconds that does not shrink with the batch


@dataclass(frozen=True)
class ScaleDownPlan:
    actions: tuple[Action, ...]
    phase: str  # "none" | "migrate" | "evict" | "reduce": the last phase used
    resolved: bool  # the model says the source fits its step budget
    step_seconds: float  # modelled after the actions
    batch_size: int
    reason: str


def scale_down(
    inp: ScaleDownInput, devices: Mapping[str, sp.Device], cfg: ScalingConfig
) -> ScaleDownPlan:
    """Algorithm 2: migrate, then evict, then reduce the batch (see the module docstring)."""
    if inp.violation_rate <= cfg.down_violation_rate:
        why = f"violation rate {inp.violation_rate:.1%} is within the threshold"
        return ScaleDownPlan((), "none", True, inp.step_seconds, inp.batch_size, why)
    load = inp.step_seconds
    actions: list[Action] = []
    src = devices[inp.source]
    pool = {n: d for n, d in devices.items() if n != inp.source}

    def fits() -> bool:
        return load <= inp.step_budget_s

    # Phase 1: migrate the heaviest modules to the most idle device with room.
    for m in sorted(inp.modules, key=lambda m: -m.step_seconds)[: cfg.max_migrations]:
        if fits():
            break
        dst = _destination(pool, m, src, inp.step_budget_s)
        if dst is None:
            continue
        used = m.step_seconds * src.capacity / dst.capacity / inp.step_budget_s
        pool[dst.name] = replace(
            dst,
            free_bytes=dst.free_bytes - m.bytes,
            idle_fraction=max(0.0, dst.idle_fraction - used),
        )
        load -= m.step_seconds
        actions.append(Migrate(m.name, inp.source, dst.name, m.bytes))
    if fits():
        return _done(
            actions, "migrate" if actions else "none", load, inp.batch_size, inp.step_budget_s
        )
    # Phase 2: evict hosted replicas, least speedup lost first.
    owners = inp.owners
    losses = sorted(
        ((_loss(owners, h, inp.source, devices), h) for h in inp.hosted),
        key=lambda t: (t[0], t[1].owner, t[1].layer),
    )
    for lost, h in losses:
        if fits():
            break
        load -= h.step_seconds
        actions.append(Evict(h.owner, h.layer, inp.source, lost))
    if fits():
        return _done(actions, "evict", load, inp.batch_size, inp.step_budget_s)
    # Phase 3: reduce the batch size (offloading is left to the executor).
    bs = inp.batch_size
    per_seq = (load - inp.fixed_seconds) / bs if bs else 0.0
    while not fits() and bs > 1:
        nxt = max(1, bs - cfg.batch_step)
        actions.append(ReduceBatch(bs, nxt))
        bs = nxt
        load = inp.fixed_seconds + per_seq * bs
    return _done(actions, "reduce", load, bs, inp.step_budget_s)


def _done(actions: list[Action], phase: str, load: float, bs: int, budget: float) -> ScaleDownPlan:
    ok = load <= budget
    why = f"modelled step {load * 1e3:.1f} ms vs budget {budget * 1e3:.1f} ms after {phase}"
    return ScaleDownPlan(
        tuple(actions), phase, ok, load, bs, ("resolved: " if ok else "still violating: ") + why
    )


def _destination(
    pool: Mapping[str, sp.Device], m: Module, src: sp.Device, budget: float
) -> sp.Device | None:
    """FindOptimalDestination: the most idle device with memory for the module and idle
    compute for its work (scaled by relative capacity)."""
    fit = [
        d
        for d in pool.values()
        if d.free_bytes >= m.bytes
        and m.step_seconds * src.capacity / d.capacity <= d.idle_fraction * budget
    ]
    return max(fit, key=lambda d: (d.idle_fraction, d.free_bytes, d.name), default=None)


def _loss(
    owners: Mapping[str, tuple[sp.Placement, sp.Workload]],
    h: Hosted,
    device: str,
    devices: Mapping[str, sp.Device],
) -> float:
    if h.owner not in owners:
        return 0.0
    state, wl = owners[h.owner]
    before = sp.speedup(state, devices, wl)
    return before - sp.speedup(state.remove(h.layer, device), devices, wl)


def batch_split_counts(speeds: Sequence[float], batch: int) -> list[int]:
    """Sequences per holder for a batch split in proportion to speed (largest remainder);
    CoCoServe §3.1's 15 requests on two equal holders give 8 and 7."""
    total = sum(speeds)
    if batch < 0 or not speeds or total <= 0:
        raise ValueError("need a batch >= 0 and positive speeds")
    exact = [batch * s / total for s in speeds]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(speeds)), key=lambda i: (-(exact[i] - counts[i]), i))[
        : batch - sum(counts)
    ]:
        counts[i] += 1
    return counts
