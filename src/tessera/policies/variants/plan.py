"""Variants of a deployment as blocks, adapter sets, routes and status: pure decisions.

A deployment serves its foundation plus variants (`tessera.variant_spec`). A full fine-tune gets
one chain per foundation replica, on the same agents and stage split (`with_full_chains` adds
them to the transition target); the zoo shares identical (or accepted equivalent) layers, so
its planned `param_bytes` are its own layers' (`variant_memory`), or 0 when unknown. Removing it
drops its chains, drained like any leaving replica. A LoRA adapter is attached to every stage
of every foundation replica (`adapter_steps`: the ordered `VariantAdapters` calls; on removal
the leader first, on adding the followers first). `routes` lists variants for the gateway (a
full fine-tune always, a LoRA one once attached everywhere); `status` says where each is
loaded and why it is not ready. Called by the converge pass (`tessera.control.variants`),
which the operator and `tessera up` run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tessera import blocks, routes_doc, variant_routes, variant_spec
from tessera.policies import placement
from tessera.policies.transition import model as transition_model
from tessera.policies.variants import memory as variant_memory

DEFAULT_CHAIN_KV_BYTES = 16 << 20  # KV pool of a variant chain whose foundation asks "all"


def variant_replica_id(foundation_rid: str, variant: str) -> str:
    """The id of a full fine-tune's chain beside foundation replica `foundation_rid`."""
    r = blocks.parse_replica_id(foundation_rid)
    if not r.deployment:
        return f"{foundation_rid}-{variant}"
    ns, dep = r.deployment.split(".", 1)
    return blocks.replica_id(ns, dep, f"{r.name}-{variant}", r.generation)


def with_full_chains(
    target: transition_model.Target,
    variants: Sequence[variant_spec.VariantSpec],
    kv_bytes: int = DEFAULT_CHAIN_KV_BYTES,
    sharing: Mapping[str, variant_memory.ChainSharing] | None = None,
    model: placement.ModelBytes | None = None,
) -> transition_model.Target:
    """`target` plus one chain per (foundation replica, full fine-tune).

    A chain's planned `param_bytes` are its own units' bytes (`variant_memory`) when its
    `sharing` and the `model`'s bytes are known, else 0 (the agent books what it holds)."""
    full = [v for v in variants if v.kind == "full"]
    if not full:
        return target
    extra_blocks: list[transition_model.Placed] = []
    extra_routes: list[routes_doc.RouteReplica] = []
    for rep in target.replicas:
        mine = [p for p in target.blocks if p.block.replica_id == rep.id]
        for v in full:
            rid = variant_replica_id(rep.id, v.name)
            for p in mine:
                b = dataclasses.replace(
                    p.block,
                    model_path=v.path,
                    replica_id=rid,
                    param_bytes=_planned(p.block, sharing, model, v.name),
                    kv_bytes=p.block.kv_bytes or kv_bytes,
                    # the opt-in: the agent serves equivalent layers from the foundation's
                    share_from=p.block.model_path if v.share_equivalent else "",
                    share_threshold=v.threshold if v.share_equivalent else 0.0,
                )
                dp = p.data_plane
                if dp is not None:
                    dp = dataclasses.replace(dp, group=rid)
                extra_blocks.append(dataclasses.replace(p, block=b, data_plane=dp))
            extra_routes.append(routes_doc.RouteReplica(rid, rep.address))
    return dataclasses.replace(
        target,
        blocks=target.blocks + tuple(extra_blocks),
        replicas=target.replicas + tuple(extra_routes),
    )


def _planned(
    b: blocks.Block,
    sharing: Mapping[str, variant_memory.ChainSharing] | None,
    model: placement.ModelBytes | None,
    name: str,
) -> int:
    s = (sharing or {}).get(name)
    if s is None or model is None:
        return 0
    return int(variant_memory.chain_block_bytes(model, b.start, b.end, b.tp_size, s))


@dataclass(frozen=True)
class HeldStage:
    """A foundation stage as its agent reports it: the adapters attached."""

    agent: str
    address: str
    replica_id: str
    stage_index: int
    num_stages: int
    adapters: frozenset[str]


@dataclass(frozen=True)
class AdapterStep:
    """Set the LoRA adapters of one stage (`VariantAdapters`): exactly `names`."""

    agent: str
    address: str
    replica_id: str
    stage_index: int
    names: tuple[str, ...]

    def describe(self) -> str:
        return (
            f"set adapters {list(self.names)} on {self.replica_id} stage {self.stage_index} "
            f"({self.agent})"
        )


def adapter_steps(held: Sequence[HeldStage], wanted: Sequence[str]) -> list[AdapterStep]:
    """The calls that bring every foundation stage to exactly `wanted`, in a safe order
    (module docstring): removals leader-first, then additions leader-last."""
    want = frozenset(wanted)
    by_rep: dict[str, list[HeldStage]] = {}
    for h in held:
        by_rep.setdefault(h.replica_id, []).append(h)
    steps: list[AdapterStep] = []
    for rid in sorted(by_rep):
        stages = sorted(by_rep[rid], key=lambda h: h.stage_index)
        current = {h.stage_index: h.adapters for h in stages}
        for h in stages:  # removals: leader (stage 0) first
            keep = current[h.stage_index] & want
            if keep != current[h.stage_index]:
                steps.append(
                    AdapterStep(h.agent, h.address, rid, h.stage_index, tuple(sorted(keep)))
                )
                current[h.stage_index] = keep
        for h in reversed(stages):  # additions: the leader last
            if current[h.stage_index] != want:
                steps.append(
                    AdapterStep(h.agent, h.address, rid, h.stage_index, tuple(sorted(want)))
                )
    return steps


def routes(
    variants: Sequence[variant_spec.VariantSpec],
    foundation_replicas: Sequence[str],
    lora_ready: frozenset[str],
) -> tuple[variant_routes.RouteVariant, ...]:
    """The routes document's `variants`: every full fine-tune (with its chains); LoRA
    variants attached on every foundation stage."""
    out = []
    for v in variants:
        if v.kind in ("full", "stitch", "speculate"):  # stitched, speculated: replicas of own
            reps = tuple(variant_replica_id(r, v.name) for r in foundation_replicas)
            out.append(variant_routes.RouteVariant(v.name, "full", reps))
        elif v.name in lora_ready:
            out.append(variant_routes.RouteVariant(v.name, "lora"))
    return tuple(out)


@dataclass(frozen=True)
class VariantStatus:
    """One variant's state for `status.variants`."""

    name: str
    kind: str
    ready: bool
    loaded_on: tuple[str, ...]  # "<agent>/<replica>/<stage>"
    reason: str  # "Ready", or why not
    message: str = ""
    # shareEquivalent: the agents' report (`equivalence_summary` of it), None otherwise
    equivalence: Mapping[str, object] | None = None
    # stitch (issue 35): the point, the quality measured there, where the blocks are
    stitch: Mapping[str, object] | None = None
    # speculate (issue 35): the bottleneck, the surrogate, hits and misses, where it runs
    speculate: Mapping[str, object] | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "name": self.name,
            "kind": self.kind,
            "ready": self.ready,
            "loadedOn": list(self.loaded_on),
            "reason": self.reason,
            "message": self.message,
        }
        if self.equivalence is not None:
            out["equivalence"] = dict(self.equivalence)
        if self.stitch is not None:
            out["stitch"] = dict(self.stitch)
        if self.speculate is not None:
            out["speculate"] = dict(self.speculate)
        return out


def equivalence_summary(report: Mapping[str, object]) -> str:
    """One line of a shareEquivalent report (JSON as in `status.variants[].equivalence`):
    which layers are shared beyond identity, and the quality measured."""
    layers = report.get("layers")
    rows = [r for r in layers if isinstance(r, Mapping)] if isinstance(layers, list) else []
    equivalent = [str(r.get("layer")) for r in rows if r.get("shared") and not r.get("identical")]
    own = [str(r.get("layer")) for r in rows if not r.get("shared")]
    return (
        f"equivalent layers shared [{', '.join(equivalent)}], own [{', '.join(own)}] "
        f"(cosine >= {report.get('threshold')}); measured vs the fine-tune alone: "
        f"top-1 agreement {report.get('top1Agreement')}, cosine {report.get('finalCosine')} "
        f"on {report.get('calibrationTokens')} calibration tokens"
    )


def stitch_summary(report: Mapping[str, object]) -> str:
    """One line of a stitched chain's status (`status.variants[].stitch`): its point, the
    quality the zoo measured there, and which agent holds which block."""
    where = report.get("placement")
    placed = "; ".join(str(x) for x in where) if isinstance(where, list) else ""
    quality = (
        f"measured vs the model alone: top-1 agreement {report['top1Agreement']}, "
        f"cosine {report['cosine']}"
        if "cosine" in report
        else "quality not reported yet"
    )
    return f"stitched at {report.get('point')}; {quality}; {placed}".rstrip("; ")


def speculate_summary(report: Mapping[str, object]) -> str:
    """One line of a speculated chain's status (`status.variants[].speculate`): the block,
    the surrogate, the hit rate so far, and where the stages run."""
    where = report.get("placement")
    placed = "; ".join(str(x) for x in where) if isinstance(where, list) else ""
    sur = report.get("surrogate")
    kind = sur.get("kind") if isinstance(sur, Mapping) else None
    seen = (
        f"surrogate {kind}; hit rate {report.get('hitRate')} ({report.get('hits')} hits, "
        f"{report.get('misses')} misses over {report.get('speculatedSteps')} speculated steps)"
        if kind
        else "surrogate not reported yet"
    )
    return f"speculating on layers {report.get('layers')}; {seen}; {placed}".rstrip("; ")


def status(
    variants: Sequence[variant_spec.VariantSpec],
    held: Sequence[HeldStage],
    chains: Mapping[str, Sequence[str]],
    complete: frozenset[str],
    errors: Mapping[str, str],
    equivalence: Mapping[str, Mapping[str, object]] | None = None,
    stitch: Mapping[str, Mapping[str, object]] | None = None,
    speculate: Mapping[str, Mapping[str, object]] | None = None,
) -> list[VariantStatus]:
    """Per variant: LoRA is ready when attached on every foundation stage held; a full
    fine-tune when each of its chains holds every block. `chains[v]` are a full variant's
    chain ids, `complete` the replicas holding every block, `errors[v]` the last error,
    `equivalence[v]` the report a shareEquivalent chain's agents gave, `stitch[v]` a
    stitched chain's (its point, quality and placement), `speculate[v]` a speculated
    chain's (its block, surrogate, hits and misses, placement)."""
    reports = equivalence or {}
    stitched = stitch or {}
    spec = speculate or {}
    out = []
    for v in variants:
        err = errors.get(v.name, "")
        if v.kind == "lora":
            on = tuple(
                f"{h.agent}/{h.replica_id}/{h.stage_index}" for h in held if v.name in h.adapters
            )
            ready = bool(held) and len(on) == len(held)
            why = "Ready" if ready else ("InvalidAdapter" if err else "Attaching")
            msg = err or f"attached on {len(on)}/{len(held)} foundation stages"
        else:
            ids = list(chains.get(v.name, ()))
            done = [r for r in ids if r in complete]
            on = tuple(done)
            ready = bool(ids) and len(done) == len(ids)
            why = "Ready" if ready else ("LoadFailed" if err else "Loading")
            msg = err or f"{len(done)}/{len(ids)} chains hold every block"
            rep = reports.get(v.name)
            if rep is not None and not err:
                msg = f"{msg}; {equivalence_summary(rep)}"
            st = stitched.get(v.name)
            if st is not None and not err:
                msg = f"{msg}; {stitch_summary(st)}"
            sp = spec.get(v.name)
            if sp is not None and not err:
                msg = f"{msg}; {speculate_summary(sp)}"
        out.append(
            VariantStatus(
                v.name,
                v.kind,
                ready,
                on,
                why,
                msg,
                reports.get(v.name),
                stitched.get(v.name),
                spec.get(v.name),
            )
        )
    return out
