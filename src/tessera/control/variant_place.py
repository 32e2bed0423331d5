"""Full fine-tunes' chain blocks in the converge pass (issue 35): the placement's inputs.

The shell of `tessera.policies.variants.variant_locality` (which decides). `place` gathers each
agent's room for the chains (`stitch_ops.agent_rooms`: its device's capacity less the
foundation's and other deployments' blocks, and where chain blocks are loaded), then lets
the policy keep each chain block beside the foundation stage it mirrors, or move it by
the locality-aware policy when that agent has no room. Called by `converge.converge`
(operator and `tessera up`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tessera import observed, variant_spec
from tessera.control import stitch_ops
from tessera.policies import placement
from tessera.policies.transition import model as transition_model
from tessera.policies.variants import plan as variant_plan
from tessera.policies.variants import variant_locality


def place(
    base: transition_model.Target,
    with_chains: transition_model.Target,
    chosen: Sequence[variant_spec.VariantSpec],
    model_path: str,
    facts: Callable[[str], placement.ModelBytes | None],
    obs: observed.Observed,
    prefix: str,
) -> variant_locality.ChainPlacement:
    """`with_chains` (`base` plus the mirrored full fine-tune chains), the chains placed."""
    ids = frozenset(
        variant_plan.variant_replica_id(r.id, v.name)
        for r in base.replicas
        for v in chosen
        if v.kind == "full"
    )
    if not ids:
        return variant_locality.ChainPlacement(with_chains, (), ())
    model = facts(model_path)
    models = {model_path: model} if model is not None else {}
    rooms, held = stitch_ops.agent_rooms(base, models, obs, prefix, ids)
    return variant_locality.place_full_chains(with_chains, ids, rooms, model, held)
