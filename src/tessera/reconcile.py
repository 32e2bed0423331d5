"""Reconcile core: the actions that move the observed agents to the desired plan.

`reconcile(plan, observed, owner_prefix)` is a pure, level-triggered diff in the style of
sample-controller's `syncHandler`: blocks of this deployment that agents hold but the
plan does not want (or wants differently) are unloaded; wanted blocks that are missing
are loaded. Re-running it on a converged system yields no actions. KV budgets are not
part of a block's identity, so other deployments coming and going never reload ours.
Called by `tessera up` and the operator; the actuator (`tessera_operator.actuate`)
applies the actions over gRPC.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera import observed, plan


@dataclass(frozen=True)
class LoadBlock:
    agent: str
    address: str
    replica_id: str
    stage_index: int
    num_stages: int
    model_path: str
    start: int
    end: int
    device: str
    dtype: str
    kv_bytes: int
    next_address: str  # leader of the next stage; "" on the last stage

    def describe(self) -> str:
        return (
            f"load {self.replica_id} stage {self.stage_index} layers [{self.start}, "
            f"{self.end}) on {self.agent}/{self.device}"
        )


@dataclass(frozen=True)
class UnloadBlock:
    agent: str
    address: str
    replica_id: str
    stage_index: int

    def describe(self) -> str:
        return f"unload {self.replica_id} stage {self.stage_index} from {self.agent}"


Action = LoadBlock | UnloadBlock


def desired_blocks(p: plan.Plan, obs: observed.Observed) -> list[LoadBlock]:
    """Every block the plan wants, with addresses resolved; last stages first."""
    out: list[LoadBlock] = []
    for r in p.replicas:
        n = len(r.stages)
        for i in reversed(range(n)):
            s = r.stages[i]
            agent = obs.agent(s.agent)
            nxt = obs.agent(r.stages[i + 1].agent) if i + 1 < n else None
            out.append(
                LoadBlock(
                    agent=s.agent,
                    address=agent.address if agent else "",
                    replica_id=r.replica_id,
                    stage_index=i,
                    num_stages=n,
                    model_path=p.model_path,
                    start=s.start,
                    end=s.end,
                    device=s.device,
                    dtype=p.dtype,
                    kv_bytes=p.kv_bytes.get((r.replica_id, i), 0),
                    next_address=nxt.address if nxt else "",
                )
            )
    return out


def _matches(want: LoadBlock, have: observed.BlockInfo) -> bool:
    return (
        have.model_path,
        have.start,
        have.end,
        have.device,
        have.dtype,
        have.num_stages,
        have.next_address,
    ) == (
        want.model_path,
        want.start,
        want.end,
        want.device,
        want.dtype,
        want.num_stages,
        want.next_address,
    )


def reconcile(p: plan.Plan, obs: observed.Observed, owner_prefix: str) -> list[Action]:
    """Unloads first (they free memory), then loads, last stage of each replica first.

    Agents that are unreachable get no actions: their state is unknown until they return.
    """
    want = {(b.agent, b.replica_id, b.stage_index): b for b in desired_blocks(p, obs)}
    unloads: list[Action] = []
    present: set[tuple[str, str, int]] = set()
    for agent in obs.agents:
        if not agent.reachable:
            continue
        for have in agent.blocks:
            if not have.replica_id.startswith(owner_prefix):
                continue  # another deployment's block
            key = (agent.name, have.replica_id, have.stage_index)
            w = want.get(key)
            if w is not None and _matches(w, have):
                present.add(key)
            else:
                unloads.append(
                    UnloadBlock(agent.name, agent.address, have.replica_id, have.stage_index)
                )
    loads: list[Action] = []
    for key, w in want.items():
        target = obs.agent(w.agent)
        if key in present or target is None or not target.reachable:
            continue
        loads.append(w)
    return unloads + loads


def delete_actions(obs: observed.Observed, owner_prefix: str) -> list[Action]:
    """Unload every block of the deployment (finalizer)."""
    return [
        UnloadBlock(a.name, a.address, b.replica_id, b.stage_index)
        for a in obs.agents
        if a.reachable
        for b in a.blocks
        if b.replica_id.startswith(owner_prefix)
    ]
