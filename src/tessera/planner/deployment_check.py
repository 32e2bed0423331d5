"""Independent check that a deployment respects every placement and memory constraint.

Used by tests (the search must never break a constraint) and by ``tessera plan`` as a
last guard before printing. Checks: GPUs exist in the pool and are used once; each stage
holds tp GPUs of one node; tp divides the attention and KV heads; stages cover the layers
contiguously; every GPU fits its weights, the workspace and the KV cache of one sequence
of the longest class; each served class's shares sum to one.
"""

from __future__ import annotations

from tessera.cost import latency
from tessera.planner.deployment import Deployment
from tessera.planner.problem import PlanningProblem


def violations(plan: Deployment, problem: PlanningProblem) -> list[str]:
    """Return human-readable constraint violations (empty when the plan is valid)."""
    out: list[str] = []
    model = problem.profile.model
    pool = {(n.name, g) for n in problem.nodes for g in n.gpus}
    used: set[tuple[str, int]] = set()
    opts = problem.capacity_options
    longest = max(c.input_tokens + c.output_tokens for c in problem.classes)
    usable = problem.gpu_memory_bytes * opts.memory_utilization - opts.workspace_bytes
    for replica in plan.replicas:
        name = replica.name
        if model.num_heads % replica.tp or model.num_kv_heads % replica.tp:
            out.append(f"{name}: tp={replica.tp} does not divide the head counts")
        for gpu in replica.gpus:
            if gpu not in pool:
                out.append(f"{name}: GPU {gpu} is not in the pool")
            if gpu in used:
                out.append(f"{name}: GPU {gpu} is used twice")
            used.add(gpu)
        expected = 0
        for s, stage in enumerate(replica.stages):
            if stage.layers[0] != expected:
                out.append(f"{name}: stage {s} starts at layer {stage.layers[0]}, not {expected}")
            expected = stage.layers[1]
            if len({node for node, _ in stage.gpus}) != 1:
                out.append(f"{name}: stage {s} spans nodes (TP must stay within a node)")
            spec = latency.StageSpec(
                layers=stage.layers[1] - stage.layers[0],
                first=s == 0,
                last=s == replica.pp - 1,
                hop=None if s == replica.pp - 1 else problem.comm.intra_node,
            )
            weights = latency.stage_param_bytes(problem.profile, spec) / replica.tp
            kv = problem.profile.memory.kv_bytes_per_token * spec.layers * longest / replica.tp
            if weights + kv > usable:
                out.append(
                    f"{name}: stage {s} needs {(weights + kv) / 2**30:.1f} GiB per GPU, "
                    f"{usable / 2**30:.1f} GiB usable"
                )
        if expected != model.num_layers:
            out.append(f"{name}: stages end at layer {expected}, not {model.num_layers}")
    for j, cls in enumerate(plan.classes):
        total = sum(row[j] for row in plan.shares)
        if cls not in plan.unservable and plan.replicas and abs(total - 1.0) > 1e-6:
            out.append(f"class {cls}: shares sum to {total:.6f}, not 1")
    if len(used) > problem.total_gpus:
        out.append(f"uses {len(used)} GPUs, the budget is {problem.total_gpus}")
    return out
