"""The variants' part of a converge pass: LoRA adapters, the variants' routes and status.

`apply` attaches the chosen LoRA adapters onto the foundation's stages (`variants`),
republishes the routes when the names served change, and observes equivalence, stitched
and speculated chains to fill `Outcome.variants`. Inputs: the pass's `Outcome`, the
chosen variants, the transition target and which replicas are foundation or chains.
Called by `converge.converge` once the transition's steps ran.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tessera import plan, variant_spec
from tessera.control import outcome, speculate_ops, stitch_ops
from tessera.control import variants as variant_ops
from tessera.policies.transition import planner as transition
from tessera.policies.variants import plan as variant_plan
from tessera.rpc import transport


async def apply(
    out: outcome.Outcome,
    chosen: Sequence[variant_spec.VariantSpec],
    target: transition.Target,
    foundation: list[str],
    chains: set[str],
    prefix: str,
    apply: bool,
    publish: outcome.Publish | None,
    desired: plan.Plan,
    tls: transport.TlsFiles | None,
) -> None:
    """LoRA adapters onto the foundation's stages, the variants' routes and status."""
    placed = [
        (p.agent, p.address, p.block.replica_id, p.block.stage_index, p.block.num_stages)
        for p in target.blocks
        if p.block.replica_id in foundation and p.block.tp_rank == 0
    ]
    applied = await variant_ops.apply_adapters(chosen, placed, apply=apply, tls=tls)
    lora = applied.lora_ready([v.name for v in chosen if v.kind == "lora"])
    if out.routes is not None:
        fids = [r for r in out.routes.replica_ids if r not in chains]
        want = variant_plan.routes(chosen, fids, lora)
        if want != out.routes.variants and apply:
            doc = dataclasses.replace(out.routes, variants=want)
            if publish is not None:
                await publish(doc, desired)
            out.routes = doc
    if out.observed is not None:
        complete = frozenset(transition.complete_replicas(out.observed, prefix))
        per = {
            v.name: [variant_plan.variant_replica_id(f, v.name) for f in foundation] for v in chosen
        }
        eq = await variant_ops.observe_equivalence(
            [
                (p.agent, p.address, p.block.replica_id, p.block.stage_index, p.block.num_stages)
                for p in target.blocks
                if p.block.share_from and p.block.tp_rank == 0
            ],
            {rid: name for name, rids in per.items() for rid in rids},
            tls,
        )
        of = {rid: name for name, rids in per.items() for rid in rids}
        st = await stitch_ops.observe(target, of, tls)
        for v in chosen:
            if v.kind == "stitch":
                where = stitch_ops.lines(target, v.name, per[v.name])
                st[v.name] = {**st.get(v.name, {"point": list(v.point)}), "placement": where}
        sp = await speculate_ops.observe(target, of, tls)
        for v in chosen:
            if v.kind == "speculate":
                where = speculate_ops.lines(target, v.name, per[v.name])
                sp[v.name] = {**sp.get(v.name, {"layers": list(v.layers)}), "placement": where}
        out.variants = variant_plan.status(
            chosen, applied.held, per, complete, applied.errors, eq, st, sp
        )
