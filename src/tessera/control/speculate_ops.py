"""Speculated chains in the converge pass (issue 35): their blocks and their status.

The shell of `tessera.policies.variants.speculate_chains` (which decides). `place` adds every
`speculate` variant's chains to the target (beside the foundation's stages, whose pieces
they share). `observe` reads each chain's bottleneck block (`ListBlocks`:
`BlockInfo.speculate`, the surrogate as loaded and its hits and misses so far) and sums
them per variant for `status.variants[].speculate`. Called by `converge.converge`
(operator and `tessera up`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tessera import variant_spec
from tessera.control import variants as variant_ops
from tessera.policies.transition import model as transition_model
from tessera.policies.variants import speculate_chains
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb


def place(
    target: transition_model.Target, chosen: Sequence[variant_spec.VariantSpec]
) -> speculate_chains.SpeculatePlacement:
    """`target` with every speculate variant's chains in (module docstring)."""
    return speculate_chains.with_speculate_chains(target, chosen)


def lines(target: transition_model.Target, variant: str, chain_ids: Sequence[str]) -> list[str]:
    """Which agent holds which stage of the variant's chains (from the target)."""
    out = []
    for rid in chain_ids:
        got = sorted(
            (p for p in target.blocks if p.block.replica_id == rid and p.block.tp_rank == 0),
            key=lambda p: p.block.stage_index,
        )
        spec = [i for i, p in enumerate(got) if p.block.speculate_zoo]
        if not got or not spec:
            out.append(f"{rid}: not planned (no foundation stage to sit beside)")
            continue
        stages = tuple((p.block.start, p.block.end, p.agent) for p in got)
        out.append(speculate_chains.ChainCut(variant, rid, stages, spec[0]).line())
    return out


async def observe(
    target: transition_model.Target, variant_of: Mapping[str, str], tls: transport.TlsFiles | None
) -> dict[str, dict[str, object]]:
    """{variant: `status.variants[].speculate`}, summed over its chains' bottlenecks."""
    out: dict[str, dict[str, object]] = {}
    async for name, b, info in variant_ops.variant_blocks(
        target, variant_of, lambda _, b: bool(b.speculate_zoo), tls
    ):
        if info.HasField("speculate"):
            out[name] = add(out.get(name), info.speculate, (b.start, b.end))
    return out


def add(
    into: Mapping[str, object] | None, m: pb.BlockSpeculate, layers: tuple[int, int]
) -> dict[str, object]:
    """`status.variants[].speculate`: one chain's report added (one conversion, here)."""
    counts = ("speculatedSteps", "plainSteps", "hits", "misses", "mixedSteps")
    got = (m.speculated_steps, m.plain_steps, m.hits, m.misses, m.mixed_steps)
    prev = dict(into or {})
    out: dict[str, object] = {
        "layers": list(layers),
        "surrogate": {"kind": m.kind, "rank": m.rank, "cosine": round(m.cosine, 4)},
        "folder": m.folder,
    }
    for k, v in zip(counts, got, strict=True):
        before = prev.get(k, 0)
        out[k] = (before if isinstance(before, int) else 0) + int(v)
    hits, misses = out["hits"], out["misses"]
    assert isinstance(hits, int) and isinstance(misses, int)
    out["hitRate"] = round(hits / (hits + misses), 4) if hits + misses else None
    chains = prev.get("chains", 0)
    out["chains"] = (chains if isinstance(chains, int) else 0) + 1
    return out
