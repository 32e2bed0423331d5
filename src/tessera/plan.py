"""The desired deployment of a ServingDeployment: replicas, stages on agents/devices, layers.

`make_plan()` turns a parsed spec plus the observed agents into a `Plan`. An explicit
layout is taken as written (names resolved to replica ids). `layout: auto` uses the
planner when a cost profile is available for the devices (`auto_planner`, injected by
the caller), else the simplest valid plan that fits: one full-model replica per device
that can hold it, or, when no single device can, one pipeline packed over consecutive
devices. Raises `PlanError` with a condition reason when nothing fits. Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tessera import api, blocks, fields, observed
from tessera.cost import model_shape
from tessera.policies.overload import desired as overload_desired
from tessera.policies.transition import generation as generation_policy

KV_HEADROOM = 0.9  # share of the memory left after parameters given to KV pools


class PlanError(Exception):
    """No valid plan: `reason` is a condition reason (InvalidSpec, InsufficientCapacity...)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


@dataclass(frozen=True)
class PlannedStage:
    agent: str
    device: str
    start: int
    end: int
    tp: int = 1
    ranks: tuple[tuple[str, str], ...] = ()  # (agent, device) of TP ranks 1..tp-1

    def placements(self) -> tuple[tuple[str, str], ...]:
        """(agent, device) of every TP rank, rank 0 (this stage's agent) first."""
        return ((self.agent, self.device), *self.ranks)


@dataclass(frozen=True)
class PlannedReplica:
    # "<namespace>.<deployment>.<replica>.g<generation>" (`blocks.replica_id`) once
    # `make_plan` assigned generations; unique across the cluster
    replica_id: str
    name: str
    stages: tuple[PlannedStage, ...]
    generation: int = 0  # layout generation that introduced this replica's layout


@dataclass(frozen=True)
class Plan:
    model_path: str
    dtype: str
    replicas: tuple[PlannedReplica, ...]
    kv_bytes: dict[tuple[str, int], int] = field(default_factory=dict)  # (replica, stage)
    source: str = "explicit"  # "explicit", "auto:simple" or "auto:planner"
    message: str = ""
    class_shares: dict[str, dict[str, float]] = field(default_factory=dict)
    generation: int = 0  # plan (layout) generation: the routes version
    param_bytes: dict[tuple[str, int], int] = field(default_factory=dict)  # (replica, stage)

    def to_status(self) -> list[dict[str, object]]:
        """The plan as written into status (CRD `status.plan.replicas`)."""
        return [
            {
                "name": r.name,
                "replicaId": r.replica_id,
                "generation": r.generation,
                "stages": [
                    {"agent": s.agent, "device": s.device, "layers": [s.start, s.end], "tp": s.tp}
                    for s in r.stages
                ],
            }
            for r in self.replicas
        ]


@dataclass(frozen=True)
class AutoResult:
    """What an auto planner decides: replicas, per-class routing shares, a note."""

    replicas: tuple[PlannedReplica, ...]
    class_shares: dict[str, dict[str, float]]
    message: str


AutoPlanner = Callable[
    [api.ServingDeployment, model_shape.ModelShape, observed.Observed], "AutoResult | None"
]


def owner_prefix(dep: api.ServingDeployment) -> str:
    """Replica ids of this deployment start with this prefix (names hold no dots)."""
    return replica_prefix(dep.namespace, dep.name)


def replica_prefix(namespace: str, name: str) -> str:
    """`owner_prefix` from the object's identity alone (a finalizer may face a bad spec)."""
    return f"{namespace}.{name}."


def _free_for(
    dep: api.ServingDeployment, agent: observed.AgentInfo, dev: observed.DeviceInfo
) -> int:
    """Device memory available to this deployment: capacity minus other deployments' blocks."""
    prefix = owner_prefix(dep)
    others = sum(
        b.param_bytes + b.kv_bytes
        for b in agent.blocks
        if b.device == dev.id and not b.replica_id.startswith(prefix)
    )
    return dev.capacity_bytes - others


def stage_param_bytes(shape: model_shape.ModelShape, start: int, end: int) -> int:
    """Parameter bytes a stage holds (a tied head shares the embedding on a full replica)."""
    if start == 0 and end == shape.num_layers:
        return shape.total_params * shape.dtype_bytes
    total = (end - start) * shape.layer_params
    if start == 0:
        total += shape.embedding_params
    if end == shape.num_layers:
        total += shape.lm_head_params  # final norm + head (a tied head needs its own copy)
    return total * shape.dtype_bytes


def _kv_split(
    dep: api.ServingDeployment,
    shape: model_shape.ModelShape,
    replicas: list[PlannedReplica],
    obs: observed.Observed,
) -> dict[tuple[str, int], int]:
    """KV budget per stage: the explicit one, else an even share of what each device has
    left after the parameters planned on it."""
    out: dict[tuple[str, int], int] = {}
    per_device: dict[tuple[str, str], list[tuple[str, int, int]]] = {}
    for r in replicas:
        for i, s in enumerate(r.stages):
            per_device.setdefault((s.agent, s.device), []).append(
                (r.replica_id, i, stage_param_bytes(shape, s.start, s.end))
            )
    for (agent_name, dev_id), stages in per_device.items():
        agent = obs.agent(agent_name)
        dev = next((d for d in agent.devices if d.id == dev_id), None) if agent else None
        if dep.spec.layout.kv_cache_bytes:
            share = dep.spec.layout.kv_cache_bytes
        elif agent is None or dev is None:
            share = 0
        else:
            left = _free_for(dep, agent, dev) - sum(p for _, _, p in stages)
            share = int(max(0, left) * KV_HEADROOM) // len(stages)
        for rid, i, _ in stages:
            out[(rid, i)] = share
    return out


def _explicit(dep: api.ServingDeployment) -> list[PlannedReplica]:
    prefix = owner_prefix(dep)
    return [
        PlannedReplica(
            prefix + r.name,
            r.name,
            tuple(
                PlannedStage(
                    s.agent,
                    s.device,
                    s.layers[0],
                    s.layers[1],
                    s.tp,
                    tuple((p.agent, p.device) for p in s.placements()[1:]),
                )
                for s in r.stages
            ),
        )
        for r in dep.spec.layout.replicas
    ]


def _simple_auto(
    dep: api.ServingDeployment, shape: model_shape.ModelShape, obs: observed.Observed
) -> list[PlannedReplica]:
    prefix = owner_prefix(dep)
    devices = [
        (a, d, _free_for(dep, a, d))
        for a in sorted(obs.agents, key=lambda a: a.name)
        if a.reachable
        for d in a.devices
    ]
    if not devices:
        raise PlanError("AgentUnreachable", "no reachable agent offers a device")
    full = stage_param_bytes(shape, 0, shape.num_layers)
    # Leave room for at least one sequence of full context in KV.
    fits = [(a, d) for a, d, free in devices if free * KV_HEADROOM > full * 1.1]
    if fits:
        return [
            PlannedReplica(
                f"{prefix}r{i}", f"r{i}", (PlannedStage(a.name, d.id, 0, shape.num_layers),)
            )
            for i, (a, d) in enumerate(fits)
        ]
    # No device holds the whole model: pack consecutive layers into devices in order.
    stages: list[PlannedStage] = []
    start = 0
    for a, d, free in devices:
        budget = free * 0.6  # keep 40% of each device for its KV pool
        end = start
        while end < shape.num_layers and stage_param_bytes(shape, start, end + 1) <= budget:
            end += 1
        if end > start:
            stages.append(PlannedStage(a.name, d.id, start, end))
            start = end
        if start == shape.num_layers:
            return [PlannedReplica(f"{prefix}r0", "r0", tuple(stages))]
    raise PlanError(
        "InsufficientCapacity",
        f"the model needs {full} bytes of parameters; the agents' devices "
        f"({', '.join(f'{a.name}/{d.id}' for a, d, _ in devices)}) cannot hold it "
        "even as a pipeline",
    )


def make_plan(
    dep: api.ServingDeployment,
    shape: model_shape.ModelShape,
    obs: observed.Observed,
    model_path: str,
    auto_planner: AutoPlanner | None = None,
    floor: int = 0,
    replicas_cap: int | None = None,
) -> Plan:
    """The desired plan for `dep` given the observed agents. Replica ids carry their
    layout generation (`policies.generation`); `floor` is the routes version already
    published, below which the plan generation never goes. `replicas_cap` (the
    autoscaler's `status.autoscaling.desiredReplicas`, docs/scaling.md) keeps the first
    that many replicas of an auto layout (at least one); an explicit layout ignores it."""
    shares: dict[str, dict[str, float]] = {}
    if dep.spec.layout.mode == "explicit":
        replicas = _explicit(dep)
        for r in replicas:
            for s in r.stages:
                for name, device in s.placements():
                    agent = obs.agent(name)
                    if (
                        agent is not None
                        and agent.reachable
                        and device not in {d.id for d in agent.devices}
                    ):
                        raise PlanError(
                            "InvalidSpec",
                            f"agent {name} has no device {device} "
                            f"(devices: {', '.join(d.id for d in agent.devices)})",
                        )
        source, message = "explicit", ""
    else:
        try:
            planned = auto_planner(dep, shape, obs) if auto_planner is not None else None
        except fields.FieldError as exc:  # the planner found no feasible deployment
            raise PlanError("InsufficientCapacity", f"planner: {exc}") from exc
        if planned is not None:
            replicas = list(planned.replicas)
            source, message, shares = "auto:planner", planned.message, planned.class_shares
        else:
            replicas = _simple_auto(dep, shape, obs)
            source = "auto:simple"
            message = (
                "no cost profile for these devices: one full-model replica per device "
                "that fits, else one pipeline"
            )
        if replicas_cap is not None and len(replicas) > max(1, replicas_cap):
            replicas = replicas[: max(1, replicas_cap)]
            message = f"{message}; the first {len(replicas)} (autoscaler)".lstrip("; ")
            kept = {r.replica_id for r in replicas}
            shares = {c: {k: v for k, v in per.items() if k in kept} for c, per in shares.items()}
    for r in replicas:
        for s in r.stages:
            agent = obs.agent(s.agent)
            if agent is None or not agent.reachable:
                continue
            dev = next((d for d in agent.devices if d.id == s.device), None)
            need = stage_param_bytes(shape, s.start, s.end)
            if dev is not None and need > _free_for(dep, agent, dev):
                raise PlanError(
                    "InsufficientCapacity",
                    f"replica {r.name} layers [{s.start}, {s.end}) need {need} bytes "
                    f"but {s.agent}/{s.device} has {_free_for(dep, agent, dev)}",
                )
    layouts = [
        (r.name, [(s.agent, s.device, s.start, s.end, s.ranks) for s in r.stages]) for r in replicas
    ]
    gen_obs = obs
    if dep.spec.policies.overload.enabled:  # an active drop is no new layout (issue 13)
        whole = {
            r.name: (r.stages[0].agent, r.stages[0].device, r.stages[0].end)
            for r in replicas
            if len(r.stages) == 1 and r.stages[0].tp == 1
        }
        gen_obs = overload_desired.generation_view(f"{dep.namespace}.{dep.name}", whole, obs)
    gens = generation_policy.assign(
        f"{dep.namespace}.{dep.name}",
        layouts,
        gen_obs,
        (model_path, dep.spec.model.dtype),
        floor,
    )
    renamed = {
        r.replica_id: blocks.replica_id(dep.namespace, dep.name, r.name, gens.per_replica[r.name])
        for r in replicas
    }
    replicas = [
        PlannedReplica(renamed[r.replica_id], r.name, r.stages, gens.per_replica[r.name])
        for r in replicas
    ]
    shares = {c: {renamed.get(k, k): v for k, v in per.items()} for c, per in shares.items()}
    return Plan(
        model_path,
        dep.spec.model.dtype,
        tuple(replicas),
        _kv_split(dep, shape, replicas, obs),
        source,
        message,
        shares,
        gens.plan,
        {
            (r.replica_id, i): stage_param_bytes(shape, s.start, s.end)
            for r in replicas
            for i, s in enumerate(r.stages)
        },
    )
