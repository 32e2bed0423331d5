"""Speculated chains of a deployment (BlockLLM §5.2, issue 35): their blocks and agents.

A `speculate` variant (`tessera.variant_spec`) serves the deployment's own model with its
bottleneck block `[a, b)` speculated on. Per foundation replica it is one chain of its own
(replica id `variant_plan.variant_replica_id`), cut at the foundation's stage boundaries
and at `a` and `b`, so the bottleneck is one stage (`Block.speculate_zoo`: the agent
loads its surrogate, `tessera_agent.speculate_serve`) with a stage before it and after it.
Each chain block goes where the foundation's stage holding its first layer is (same
agent and device): its layers are the foundation's pieces in that agent's block zoo, so
the chain costs its KV pools, and the stage after the bottleneck sits on another agent
exactly when the foundation's does, which is where speculation hides a hop. Pure; called
by the converge pass (`tessera up` and the operator); `lines()` is what the variant's
status shows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from tessera import blocks, routes_doc, variant_spec
from tessera.policies.transition import model as transition_model
from tessera.policies.variants import plan as variant_plan


@dataclass(frozen=True)
class ChainCut:
    """One speculated chain: its blocks' layers and agents, the bottleneck's stage."""

    variant: str
    replica_id: str
    stages: tuple[tuple[int, int, str], ...]  # (start, end, agent) per stage
    bottleneck: int  # the stage index of the speculated block

    def line(self) -> str:
        parts = []
        for i, (s, e, agent) in enumerate(self.stages):
            mark = " (speculated)" if i == self.bottleneck else ""
            parts.append(f"[{s}, {e}){mark} on {agent}")
        nxt = self.stages[self.bottleneck + 1][2]
        hop = "another agent" if nxt != self.stages[self.bottleneck][2] else "the same agent"
        return f"{self.replica_id}: {' -> '.join(parts)}; the stage after it on {hop}"


@dataclass(frozen=True)
class SpeculatePlacement:
    target: transition_model.Target
    chains: tuple[ChainCut, ...]

    def lines(self, variant: str) -> list[str]:
        return [c.line() for c in self.chains if c.variant == variant]


def cuts(bounds: Sequence[int], layers: tuple[int, int]) -> list[int]:
    """The chain's stage boundaries: the foundation's (`bounds`, from 0 to L) outside the
    bottleneck, and its own two ends."""
    a, b = layers
    return sorted({x for x in bounds if not a < x < b} | {a, b})


def with_speculate_chains(
    target: transition_model.Target,
    variants: Sequence[variant_spec.VariantSpec],
    kv_bytes: int = variant_plan.DEFAULT_CHAIN_KV_BYTES,
) -> SpeculatePlacement:
    """`target` plus one speculated chain per (foundation replica, speculate variant)."""
    wanted = [v for v in variants if v.kind == "speculate"]
    if not wanted:
        return SpeculatePlacement(target, ())
    placed: list[transition_model.Placed] = []
    routes: list[routes_doc.RouteReplica] = []
    out: list[ChainCut] = []
    for rep in target.replicas:
        mine = sorted(
            (p for p in target.blocks if p.block.replica_id == rep.id and p.block.tp_rank == 0),
            key=lambda p: p.block.stage_index,
        )
        if not mine:
            continue
        num_layers = mine[-1].block.end
        bounds = [p.block.start for p in mine] + [num_layers]
        for v in wanted:
            a, b = v.layers
            if not 1 <= a < b < num_layers:
                continue
            edges = cuts(bounds, (a, b))
            rid = variant_plan.variant_replica_id(rep.id, v.name)
            homes = [next(p for p in reversed(mine) if p.block.start <= s) for s in edges[:-1]]
            n = len(homes)
            chain: list[transition_model.Placed] = []
            for i, (s, e, home) in enumerate(zip(edges[:-1], edges[1:], homes, strict=True)):
                base = home.block
                blk = blocks.Block(
                    base.model_path,
                    s,
                    e,
                    replica_id=rid,
                    stage_index=i,
                    device=base.device,
                    dtype=base.dtype,
                    kv_bytes=base.kv_bytes or kv_bytes,
                    page_size=base.page_size,
                    num_stages=n,
                    next_address=homes[i + 1].address if i + 1 < n else "",
                    generation=base.generation,
                    speculate_zoo=v.zoo if (s, e) == (a, b) else "",
                )
                chain.append(transition_model.Placed(home.agent, home.address, blk))
            placed += chain
            routes.append(routes_doc.RouteReplica(rid, homes[0].address))
            out.append(
                ChainCut(
                    v.name,
                    rid,
                    tuple((p.block.start, p.block.end, p.agent) for p in chain),
                    edges.index(a),
                )
            )
    target = dataclasses.replace(
        target, blocks=target.blocks + tuple(placed), replicas=target.replicas + tuple(routes)
    )
    return SpeculatePlacement(target, tuple(out))
