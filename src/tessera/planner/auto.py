"""`layout: auto` through the planner: observed agents become a cluster, the search's
deployment becomes replicas on agents and devices.

`auto_planner(profile)` returns the hook `tessera.plan.make_plan` calls for auto layouts.
Each agent is a node; its devices of the profile's kind (CUDA devices for a GPU profile,
declared CPU devices for a measured CPU profile) are the node's GPUs. When no agent has
such a device the hook returns None and `make_plan` falls back to the simple plan. The
per-class shares of the assignment go into the plan for the gateway's routing hook.
Pure: it reads only the plain data it is given.
"""

from __future__ import annotations

import dataclasses

from tessera import api, observed, plan
from tessera.cost import capacity, model_shape
from tessera.cost.profile import Profile
from tessera.planner import cluster, manifest, problem, search

DEFAULT_CLASS = capacity.RequestClass("default", 512, 128, 1.0)
DEFAULT_SLO = capacity.Slo(ttft_s=10.0, tpot_s=1.0)


def _devices(agent: observed.AgentInfo, profile: Profile) -> list[observed.DeviceInfo]:
    kind = "cpu" if profile.device == "cpu" else "cuda"
    return sorted((d for d in agent.devices if d.kind == kind), key=lambda d: d.id)


def auto_planner(
    profile: Profile,
    interconnect: cluster.Interconnect | None = None,
    seed: int = 0,
    max_tp: int = 1,
) -> plan.AutoPlanner:
    """The planner as `make_plan`'s auto hook; `max_tp` is what the engine implements."""

    def run(
        dep: api.ServingDeployment, shape: model_shape.ModelShape, obs: observed.Observed
    ) -> plan.AutoResult | None:
        agents = [
            a
            for a in sorted(obs.agents, key=lambda a: a.name)
            if a.reachable and _devices(a, profile)
        ]
        if not agents:
            return None
        nodes = tuple(
            cluster.Node(
                a.name,
                len(_devices(a, profile)),
                profile.device,
                min(d.capacity_bytes for d in _devices(a, profile)),
            )
            for a in agents
        )
        total = sum(n.gpus for n in nodes)
        res = dep.spec.resources
        gpus = min(res.gpus or total, total)
        classes = tuple(
            capacity.RequestClass(c.name, c.input_tokens, c.output_tokens, c.rate)
            for c in dep.spec.workload
        ) or (DEFAULT_CLASS,)
        slo = DEFAULT_SLO
        if dep.spec.slo.ttft_p99_ms and dep.spec.slo.tpot_p99_ms:
            slo = capacity.Slo(dep.spec.slo.ttft_p99_ms / 1e3, dep.spec.slo.tpot_p99_ms / 1e3)
        inputs = manifest.PlannerInputs(
            name=dep.name,
            model=profile.model,
            gpus=gpus,
            max_gpus=max(res.max_gpus, gpus),
            gpu_memory_bytes=None,
            classes=classes,
            slo=slo,
            layout_mode="auto",
        )
        # Engine settings: Tessera's scheduler admits 64 sequences; a CPU device needs no
        # GPU workspace (activations are small next to the declared budget).
        options = capacity.CapacityOptions(
            workspace_bytes=(64 << 20) if profile.device == "cpu" else 2 << 30, max_batch=64
        )
        prob = problem.build_problem(
            inputs,
            cluster.Cluster("agents", nodes, interconnect or cluster.Interconnect()),
            profile,
            capacity_options=options,
        )
        prob = dataclasses.replace(prob, max_tp=max_tp)
        deployment = search.plan(prob, search.SearchOptions(method="heuristic", seed=seed))
        by_name = {a.name: _devices(a, profile) for a in agents}
        prefix = plan.owner_prefix(dep)
        replicas = []
        ids = {}
        for r in deployment.replicas:
            stages = tuple(
                plan.PlannedStage(
                    s.gpus[0][0],
                    by_name[s.gpus[0][0]][s.gpus[0][1]].id,
                    s.layers[0],
                    s.layers[1],
                    len(s.gpus),
                    # ranks 1..tp-1 on the node's other GPUs: one agent, one device per rank
                    tuple((node, by_name[node][g].id) for node, g in s.gpus[1:]),
                )
                for s in r.stages
            )
            ids[r.name] = prefix + r.name
            replicas.append(plan.PlannedReplica(prefix + r.name, r.name, stages))
        shares = {
            c.name: {ids[k]: v for k, v in deployment.class_shares(c.name).items()} for c in classes
        }
        return plan.AutoResult(
            tuple(replicas),
            shares,
            f"planned with the {profile.source} {profile.device} profile: {len(replicas)} replicas",
        )

    return run


def gpu_type(device_name: str, capacity_bytes: int) -> str | None:
    """The analytic profile type of an NVML device name, e.g. "NVIDIA H100 80GB HBM3"."""
    name = device_name.upper()
    big = capacity_bytes >= 70 << 30
    if "H100" in name and big:
        return "h100-80gb"
    if "A100" in name and big:
        return "a100-80gb"
    return None


def default_auto_planner(measured: Profile | None = None) -> plan.AutoPlanner:
    """Pick the profile from what the agents report: the analytic profile of their GPU type
    (H100/A100 80GB), else a measured profile (e.g. `tessera profile` on CPU) when given and
    of the agents' kind; with neither, `make_plan` falls back to the simple plan."""

    def run(
        dep: api.ServingDeployment, shape: model_shape.ModelShape, obs: observed.Observed
    ) -> plan.AutoResult | None:
        types = {
            gpu_type(d.name, d.capacity_bytes)
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
            return auto_planner(analytic.analytic_profile(shape, kind))(dep, shape, obs)
        if measured is not None:
            return auto_planner(measured)(dep, shape, obs)
        return None

    return run
