"""The switching loop's default candidates: planner deployments as `spec.layout` replicas
(pure).

Input: the deployment (model shape, classes, SLO, `resources.gpus`), the agents as
observed (each reachable agent a node, its devices of the profile's kind its GPUs), a cost
profile (analytic for H100/A100 80GB, else a given measured one; otherwise no candidates)
and the gateway's arrival classes (matched by name to the spec's; none: ``default``).
Output: every exhaustive layout on those devices (`switching.planner.candidates`), named
by `Layout.label()`, as explicit replicas (``r<k>``, a stage per pipeline stage, its first
device, ``tp``, ``ranks`` when not consecutive), plus the spec's own layout as ``"spec"``
or, for `layout: auto`, the placed ``status.plan`` as ``"auto"``, so the current
deployment is always a candidate. ``max_tp`` stays 1, as for `auto`. `CandidateCache`
keeps priced planner candidates per planning problem, at most ``max_candidates``. Model
output. Caller: `tessera.control.switching.planner_candidates`; tests.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera import api, observed
from tessera.cost import capacity, model_shape
from tessera.cost.profile import Profile
from tessera.planner import auto, cluster, manifest, problem
from tessera.planner.capacity_table import CapacityTable, build_table
from tessera.planner.deployment import Deployment, GpuRef, ReplicaPlan, StagePlan
from tessera.planner.shapes import Shape
from tessera.policies.switching import current as switching_current
from tessera.policies.switching import planner as switching_planner

SPEC = "spec"  # the name of the spec's own explicit layout among the candidates
AUTO = switching_current.AUTO  # the auto planner's placement of an `auto` spec


class CandidateCache:
    """Planner candidates per planning problem, the ``size`` most recently used kept.
    Safe to share between threads (the operator builds candidates off its event loop);
    two threads missing the same problem at once both build it, the last one is kept."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._items: dict[Any, switching_planner.PlannedCandidates] = {}
        self._lock = threading.Lock()
        self.builds = 0  # how many times candidates were built (not found)

    def get(
        self, prob: problem.PlanningProblem, max_candidates: int
    ) -> switching_planner.PlannedCandidates:
        key: tuple[problem.PlanningProblem, int] | None = (prob, max_candidates)
        try:
            hash(key)
        except TypeError:  # a profile with unhashable parts: build, keep nothing
            key = None
        with self._lock:
            found = self._items.pop(key, None) if key is not None else None
            if found is not None:
                self._items[key] = found  # most recently used last
                return found
            self.builds += 1
        found = switching_planner.candidates(prob, build_table(prob), max_candidates=max_candidates)
        if key is not None:
            with self._lock:
                self._items[key] = found
                while len(self._items) > self.size:
                    del self._items[next(iter(self._items))]
        return found


@dataclass(frozen=True)
class Candidates:
    """Named explicit layouts (CRD form) and the planner's pricing of them."""

    layouts: dict[str, list[dict[str, Any]]]
    planned: switching_planner.PlannedCandidates


def profile_for(
    shape: model_shape.ModelShape, obs: observed.Observed, measured: Profile | None = None
) -> Profile | None:
    """The cost profile `layout: auto` would use (`auto.default_auto_planner`'s rule)."""
    types = {
        auto.gpu_type(d.name, d.capacity_bytes)
        for a in obs.agents
        if a.reachable
        for d in a.devices
        if d.kind == "cuda"
    }
    types.discard(None)
    if len(types) == 1:
        from tessera.cost import analytic

        (kind,) = types
        assert kind is not None
        return analytic.analytic_profile(shape, kind)
    return measured


def pool(obs: observed.Observed, profile: Profile) -> dict[str, list[observed.DeviceInfo]]:
    """Reachable agent -> its devices of the profile's kind, by id (none: left out); a
    device's index in its list is its GPU index in the planner's cluster."""
    kind = "cpu" if profile.device == "cpu" else "cuda"
    out: dict[str, list[observed.DeviceInfo]] = {}
    for a in sorted(obs.agents, key=lambda a: a.name):
        devs = sorted((d for d in a.devices if d.kind == kind), key=lambda d: d.id)
        if a.reachable and devs:
            out[a.name] = devs
    return out


def _ids(devices: Mapping[str, Sequence[observed.DeviceInfo]]) -> dict[str, list[str]]:
    return {a: [d.id for d in devs] for a, devs in devices.items()}


def _classes(dep: api.ServingDeployment, names: Sequence[str]) -> tuple[capacity.RequestClass, ...]:
    spec = {
        c.name: capacity.RequestClass(c.name, c.input_tokens, c.output_tokens, c.rate)
        for c in dep.spec.workload
    } or {auto.DEFAULT_CLASS.name: auto.DEFAULT_CLASS}
    if sorted(names) != sorted(spec):
        raise ValueError(
            f"the arrival classes {list(names)} are not the spec's workload classes {list(spec)}"
        )
    chosen = [spec[n] for n in names]
    if not any(c.rate > 0 for c in chosen):  # no expected rates: plan for an even mix
        chosen = [dataclasses.replace(c, rate=1.0) for c in chosen]
    return tuple(chosen)


def planning_problem(
    dep: api.ServingDeployment,
    shape: model_shape.ModelShape,
    devices: Mapping[str, Sequence[observed.DeviceInfo]],
    profile: Profile,
    names: Sequence[str],
    interconnect: cluster.Interconnect | None = None,
    max_tp: int = 1,
) -> problem.PlanningProblem:
    """The problem `planner.auto` builds, with classes in the arrivals' order (FieldError,
    a ValueError, when the profile is for another model shape)."""
    nodes = tuple(
        cluster.Node(a, len(devs), profile.device, min(d.capacity_bytes for d in devs))
        for a, devs in devices.items()
    )
    total = sum(n.gpus for n in nodes)
    res = dep.spec.resources
    gpus = min(res.gpus or total, total)
    slo = auto.DEFAULT_SLO
    if dep.spec.slo.ttft_p99_ms and dep.spec.slo.tpot_p99_ms:
        slo = capacity.Slo(dep.spec.slo.ttft_p99_ms / 1e3, dep.spec.slo.tpot_p99_ms / 1e3)
    inputs = manifest.PlannerInputs(
        name=dep.name,
        model=shape,
        gpus=gpus,
        max_gpus=max(res.max_gpus, gpus),
        gpu_memory_bytes=None,
        classes=_classes(dep, names),
        slo=slo,
        layout_mode="auto",
    )
    options = capacity.CapacityOptions(  # as planner.auto: Tessera's engine settings
        workspace_bytes=(64 << 20) if profile.device == "cpu" else 2 << 30, max_batch=64
    )
    prob = problem.build_problem(
        inputs,
        cluster.Cluster("agents", nodes, interconnect or cluster.Interconnect()),
        profile,
        capacity_options=options,
    )
    return dataclasses.replace(prob, max_tp=max_tp)


def replicas_json(
    deployment: Deployment, devices: Mapping[str, Sequence[str]]
) -> list[dict[str, Any]]:
    """A planner deployment as `spec.layout.replicas` (explicit mode)."""
    out: list[dict[str, Any]] = []
    for r in deployment.replicas:
        stages: list[dict[str, Any]] = []
        for s in r.stages:
            ids = [devices[node][i] for node, i in s.gpus]
            agent = s.gpus[0][0]
            stage: dict[str, Any] = {"agent": agent, "device": ids[0], "layers": list(s.layers)}
            if r.tp > 1:
                stage["tp"] = r.tp
                kind, _, first = ids[0].partition(":")
                consecutive = [f"{kind}:{int(first) + k}" for k in range(r.tp)]
                if not first.isdigit() or ids != consecutive:
                    stage["ranks"] = [{"agent": agent, "device": d} for d in ids[1:]]
            stages.append(stage)
        out.append({"name": r.name, "stages": stages})
    return out


def spec_json(layout: api.LayoutSpec) -> list[dict[str, Any]]:
    """The spec's explicit replicas back in CRD form."""
    out: list[dict[str, Any]] = []
    for r in layout.replicas:
        stages: list[dict[str, Any]] = []
        for s in r.stages:
            stage: dict[str, Any] = {"agent": s.agent, "device": s.device, "layers": list(s.layers)}
            if s.tp > 1:
                stage["tp"] = s.tp
            if s.ranks:
                stage["ranks"] = [{"agent": k.agent, "device": k.device} for k in s.ranks]
            stages.append(stage)
        out.append({"name": r.name, "stages": stages})
    return out


def spec_deployment(
    prob: problem.PlanningProblem,
    table: CapacityTable,
    layout: api.LayoutSpec,
    devices: Mapping[str, Sequence[str]],
) -> Deployment | None:
    """The spec's explicit layout as a planner deployment on the pool, for its price and
    switch times (None: a device outside the pool, or stages of unequal tp)."""
    replicas: list[ReplicaPlan] = []
    for r in layout.replicas:
        tps = {s.tp for s in r.stages}
        if len(tps) != 1 or not r.stages:
            return None
        stages: list[StagePlan] = []
        for s in r.stages:
            gpus: list[GpuRef] = []
            for rank in s.placements():
                ids = list(devices.get(rank.agent, ()))
                if rank.device not in ids:
                    return None
                gpus.append((rank.agent, ids.index(rank.device)))
            if len({a for a, _ in gpus}) != 1:
                return None  # a stage's ranks on several agents: not a planner shape
            stages.append(StagePlan(s.layers, tuple(gpus)))
        tp, pp = tps.pop(), len(stages)
        span = len({st.gpus[0][0] for st in stages})
        shp = Shape(tp, pp, span) if pp % span == 0 else None
        caps = (
            table.rates(shp)
            if shp is not None and shp in table.infos
            else (0.0,) * len(prob.classes)
        )
        gpus_all = tuple(g for st in stages for g in st.gpus)
        replicas.append(ReplicaPlan(r.name, tp, pp, gpus_all, tuple(stages), caps))
    if not replicas:
        return None
    n = len(replicas)
    return Deployment(
        model=prob.profile.model.name,
        device=prob.profile.device,
        profile_source=prob.profile.source,
        method="spec",
        classes=tuple(c.name for c in prob.classes),
        demand=prob.demand,
        replicas=tuple(replicas),
        shares=tuple((1.0 / n,) * len(prob.classes) for _ in replicas),
        utilization=(0.0,) * n,
        scale=0.0,
        objective=0.0,
    )


def build(
    dep: api.ServingDeployment,
    shape: model_shape.ModelShape,
    obs: observed.Observed,
    names: Sequence[str],
    measured: Profile | None = None,
    interconnect: cluster.Interconnect | None = None,
    max_tp: int = 1,
    placed: Sequence[Mapping[str, Any]] | None = None,
    cache: CandidateCache | None = None,
    max_candidates: int = switching_planner.MAX_CANDIDATES,
) -> Candidates:
    """The candidates of the module docstring; ValueError saying why there are none."""
    profile = profile_for(shape, obs, measured)
    if profile is None:
        raise ValueError(
            "no cost profile for the agents' devices (analytic: H100/A100 80GB only; "
            "give the operator a measured profile)"
        )
    devices = pool(obs, profile)
    if not devices:
        raise ValueError(f"no reachable agent has a {profile.device} device")
    prob = planning_problem(dep, shape, devices, profile, names, interconnect, max_tp)
    shared = (cache or CandidateCache(1)).get(prob, max_candidates)
    ids = _ids(devices)
    layouts = {n: replicas_json(d, ids) for n, d in shared.deployments.items()}
    extra: dict[str, Deployment] = {}
    if dep.spec.layout.mode == "explicit":
        own = spec_deployment(prob, shared.table, dep.spec.layout, ids)
        if own is not None:
            extra[SPEC] = own
            layouts[SPEC] = spec_json(dep.spec.layout)
    elif placed:
        spec = switching_current.layout_spec(placed)
        own = spec_deployment(prob, shared.table, spec, ids)
        if own is not None:
            extra[AUTO] = own
            layouts[AUTO] = [dict(r) for r in placed]
    return Candidates(layouts, shared.extended(extra) if extra else shared)
