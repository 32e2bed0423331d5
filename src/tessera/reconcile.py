"""Reconcile core: a `Plan` as the blocks and routes a transition must reach.

`target(plan, observed)` resolves the plan's stages to `blocks.Block`s on agents (with
each stage's next-stage address, parameter bytes and KV budget) and its replicas to
routes, as a `policies.transition.Target`; `policies.transition.plan` then orders the
steps that reach it from what the agents hold. `delete_actions` unloads a deployment
(finalizer). Pure; called by the operator's converge pass and by `tessera up`.
"""

from __future__ import annotations

from tessera import blocks, observed, plan, routes_doc
from tessera.policies.transition import actions
from tessera.policies.transition import planner as transition


def desired_blocks(p: plan.Plan, obs: observed.Observed) -> list[transition.Placed]:
    """Every block the plan wants, one per tensor-parallel rank, with addresses resolved;
    last stages first. TP ranks meet on the replica leader's rendezvous store."""
    out: list[transition.Placed] = []
    for r in p.replicas:
        n = len(r.stages)
        lead = obs.agent(r.stages[0].agent)
        dp = None
        if n > 1 or any(s.tp > 1 for s in r.stages):  # TP groups, stage links
            dp = actions.DataPlane(lead.store_address if lead else "", r.replica_id)
        for i in reversed(range(n)):
            s = r.stages[i]
            nxt = obs.agent(r.stages[i + 1].agent) if i + 1 < n else None
            for rank, (name, device) in enumerate(s.placements()):
                agent = obs.agent(name)
                block = blocks.Block(
                    model_path=p.model_path,
                    start=s.start,
                    end=s.end,
                    replica_id=r.replica_id,
                    stage_index=i,
                    device=device,
                    dtype=p.dtype,
                    kv_bytes=p.kv_bytes.get((r.replica_id, i), 0),
                    num_stages=n,
                    next_address=nxt.address if nxt and rank == 0 else "",
                    generation=r.generation,
                    tp_size=s.tp,
                    tp_rank=rank,
                    param_bytes=p.param_bytes.get((r.replica_id, i), 0) // s.tp,
                )
                placed = transition.Placed(name, agent.address if agent else "", block, dp)
                out.append(placed)
    return out


def target(p: plan.Plan, obs: observed.Observed) -> transition.Target:
    """The blocks and routes of plan `p` (routes through each replica's leader agent)."""
    leaders = {r.replica_id: obs.agent(r.stages[0].agent) for r in p.replicas}
    return transition.Target(
        generation=p.generation,
        blocks=tuple(desired_blocks(p, obs)),
        replicas=tuple(
            routes_doc.RouteReplica(rid, a.address if a is not None else "")
            for rid, a in leaders.items()
        ),
    )


def delete_actions(obs: observed.Observed, owner_prefix: str) -> list[actions.UnloadBlock]:
    """Unload every block of the deployment (finalizer)."""
    return [
        actions.UnloadBlock(a.name, a.address, b)
        for a in obs.agents
        if a.reachable
        for b in a.blocks
        if b.replica_id.startswith(owner_prefix)
    ]
