"""Semantic checks of a parsed ServingDeployment spec against its model and agents.

`check_semantics()` checks a spec that `tessera.api.parse` accepted against the model's
shape (`tessera.model_facts.served_shape`) and the known agents and returns every
problem, each naming its field, e.g.
`spec.layout.replicas[1].stages[0].layers: end 12 exceeds the model's 8 layers`.
Called by `tessera validate` and the operator's converge step. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera import fields, variant_spec
from tessera.api import DeploymentSpec
from tessera.cost import model_shape


def check_semantics(
    spec: DeploymentSpec,
    model: model_shape.ModelShape | None,
    agents: Sequence[str] | None = None,
    max_tp: int = 0,
) -> list[fields.FieldError]:
    """Every problem of `spec` against the model and (if known) the agents, by field.

    `max_tp` caps the tensor-parallel degree (0: any degree the heads allow)."""
    errs: list[fields.FieldError] = []
    if model is None:
        errs.append(fields.FieldError("spec.model.path", "model not readable: no config.json"))
        return errs
    for i, rep in enumerate(spec.layout.replicas):
        rpath = f"spec.layout.replicas[{i}]"
        expect = 0
        for j, st in enumerate(rep.stages):
            spath = f"{rpath}.stages[{j}]"
            start, end = st.layers
            if end > model.num_layers:
                errs.append(
                    fields.FieldError(
                        f"{spath}.layers",
                        f"end {end} exceeds the model's {model.num_layers} layers",
                    )
                )
            if start != expect:
                errs.append(
                    fields.FieldError(
                        f"{spath}.layers",
                        f"starts at layer {start} but the previous stage ends at {expect}",
                    )
                )
            expect = end
            if st.tp > 1 and (model.num_heads % st.tp or model.num_kv_heads % st.tp):
                errs.append(
                    fields.FieldError(
                        f"{spath}.tp",
                        f"{st.tp} does not divide the model's {model.num_heads} "
                        f"attention and {model.num_kv_heads} KV heads",
                    )
                )
            if max_tp and st.tp > max_tp:
                errs.append(
                    fields.FieldError(
                        f"{spath}.tp",
                        f"tensor parallelism {st.tp} is not supported by the "
                        f"engine yet (max {max_tp})",
                    )
                )
            if agents is not None and st.agent not in agents:
                errs.append(
                    fields.FieldError(
                        f"{spath}.agent",
                        f"unknown agent {st.agent!r} (known: {', '.join(agents) or 'none'})",
                    )
                )
            for k, rank in enumerate(st.ranks):
                if agents is not None and rank.agent not in agents:
                    errs.append(
                        fields.FieldError(
                            f"{spath}.ranks[{k}].agent",
                            f"unknown agent {rank.agent!r} (known: {', '.join(agents) or 'none'})",
                        )
                    )
            places = [(p.agent, p.device) for p in st.placements()]
            if len(set(places)) != len(places):
                errs.append(
                    fields.FieldError(
                        f"{spath}.ranks",
                        f"the {st.tp} tensor-parallel ranks need {st.tp} different devices "
                        "(one device per rank; an agent may hold several ranks on its "
                        "devices); list them in `ranks`",
                    )
                )
        if rep.stages and expect != model.num_layers and expect <= model.num_layers:
            errs.append(
                fields.FieldError(
                    f"{rpath}.stages",
                    f"cover layers up to {expect}, not all {model.num_layers} layers of the model",
                )
            )
    errs += variant_spec.refusals(spec.variants, model.num_layers)  # issue 35: speculate
    return errs
