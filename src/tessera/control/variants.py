"""Applies a deployment's LoRA variants to its foundation stages and reports every variant.

The shell of `tessera.policies.variants.plan` (which decides): after the converge pass has
run its transition (full fine-tunes are chains in the target, loaded and drained like
replicas), `apply_adapters` observes the foundation's stages (`ListBlocks`: each block's
attached adapters), runs the ordered `VariantAdapters` calls, and returns each variant's
status. An adapter an agent refuses (INVALID_ARGUMENT / NOT_FOUND naming it) is left out
and reported with the agent's reason; the others still attach. The foundation's blocks
are never reloaded. Called by `converge.converge` (operator and `tessera up`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from tessera import blocks, observed, variant_spec
from tessera.policies.transition import model as transition_model
from tessera.policies.variants import memory as variant_memory
from tessera.policies.variants import plan as variant_plan
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

_NAMED = re.compile(r"variant '([^']+)'")
DRAIN_TIMEOUT_S = 60.0


@dataclass
class Applied:
    """What `apply_adapters` saw and did."""

    held: list[variant_plan.HeldStage] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # variant -> why it is not served
    steps: list[variant_plan.AdapterStep] = field(default_factory=list)

    def lora_ready(self, wanted: Sequence[str]) -> frozenset[str]:
        if not self.held:
            return frozenset()
        return frozenset(n for n in wanted if all(n in h.adapters for h in self.held))


def resolve(
    variants: Sequence[variant_spec.VariantSpec], model_path: str
) -> list[variant_spec.VariantSpec]:
    """Relative variant paths resolve against the folder holding the model checkpoint."""
    base = Path(model_path).parent
    out = []
    for v in variants:
        p = Path(v.path)
        v = v if p.is_absolute() else dataclasses.replace(v, path=str(base / p))
        if v.zoo and not Path(v.zoo).is_absolute():  # a stitched or speculated chain's zoo folder
            v = dataclasses.replace(v, zoo=str(base / v.zoo))
        out.append(v)
    return out


async def observe(
    placed: Sequence[tuple[str, str, str, int, int]], tls: transport.TlsFiles | None
) -> list[variant_plan.HeldStage]:
    """The adapters attached to each (agent, address, replica, stage, stages) held."""
    by_addr: dict[str, dict[tuple[str, int], pb.BlockInfo]] = {}
    out = []
    for agent, address, rid, idx, n in placed:
        if address not in by_addr:
            by_addr[address] = await _list(address, tls)
        b = by_addr[address].get((rid, idx))
        if b is not None:
            out.append(variant_plan.HeldStage(agent, address, rid, idx, n, frozenset(b.variants)))
    return out


async def observe_equivalence(
    placed: Sequence[tuple[str, str, str, int, int]],
    variant_of: dict[str, str],
    tls: transport.TlsFiles | None,
) -> dict[str, dict[str, object]]:
    """{variant: its shareEquivalent report as status JSON}, from the first block of its
    chains (`placed`) that reports one (every stage carries the whole report)."""
    by_addr: dict[str, dict[tuple[str, int], pb.BlockInfo]] = {}
    out: dict[str, dict[str, object]] = {}
    for _, address, rid, idx, _ in placed:
        name = variant_of.get(rid)
        if name is None or name in out:
            continue
        if address not in by_addr:
            by_addr[address] = await _list(address, tls)
        b = by_addr[address].get((rid, idx))
        if b is not None and b.HasField("equivalence"):
            out[name] = equivalence_json(b.equivalence)
    return out


async def observed_sharing(
    variants: Sequence[variant_spec.VariantSpec],
    obs: observed.Observed,
    tls: transport.TlsFiles | None,
) -> dict[str, variant_memory.ChainSharing]:
    """What each opted-in full fine-tune holds of its own, from the report its loaded
    chain's agents gave (none before its first load): the planner prices its chains by it."""
    paths = {v.path: v.name for v in variants if v.kind == "full" and v.share_equivalent}
    placed = [
        (a.name, a.address, b.replica_id, b.stage_index, b.num_stages)
        for a in obs.agents
        if a.reachable
        for b in a.blocks
        if b.share_from and b.model_path in paths and b.tp_rank == 0
    ]
    if not placed:
        return {}
    of = {
        b.replica_id: paths[b.model_path]
        for a in obs.agents
        for b in a.blocks
        if b.model_path in paths
    }
    reports = await observe_equivalence(placed, of, tls)
    return {name: variant_memory.from_report(name, rep) for name, rep in reports.items()}


def equivalence_json(m: pb.VariantEquivalence) -> dict[str, object]:
    """`status.variants[].equivalence`: the agent's report (one conversion, here)."""
    return {
        "threshold": m.threshold,
        "layers": [
            {
                "layer": x.layer,
                "cosine": round(x.cosine, 6),
                "identical": x.identical,
                "shared": x.shared,
            }
            for x in m.layers
        ],
        "finalCosine": round(m.final_cosine, 6),
        "top1Agreement": round(m.top1_agreement, 6),
        "calibration": m.calibration,
        "calibrationTokens": m.calibration_tokens,
    }


async def list_blocks(
    address: str, tls: transport.TlsFiles | None
) -> dict[tuple[str, int], pb.BlockInfo]:
    """The agent's blocks (rank 0 of each stage), by (replica, stage); {} if unreachable."""
    return await _list(address, tls)


async def _list(
    address: str, tls: transport.TlsFiles | None
) -> dict[tuple[str, int], pb.BlockInfo]:
    channel = transport.channel(address, tls)
    try:
        reply = await pb_grpc.AgentStub(channel).ListBlocks(pb.ListBlocksRequest(), timeout=5.0)
        return {(b.replica_id, b.stage_index): b for b in reply.blocks if b.tp_rank == 0}
    except grpc.aio.AioRpcError as exc:
        log.warning("variants: cannot list blocks of %s: %s", address, exc.details())
        return {}
    finally:
        await channel.close()


async def _set(
    step: variant_plan.AdapterStep,
    paths: dict[str, str],
    drain_s: float,
    tls: transport.TlsFiles | None,
) -> None:
    channel = transport.channel(step.address, tls)
    try:
        req = pb.VariantAdaptersRequest(
            replica_id=step.replica_id,
            stage_index=step.stage_index,
            adapters=[pb.VariantAdapter(name=n, path=paths[n]) for n in step.names],
            drain_timeout_s=drain_s,
        )
        await pb_grpc.AgentStub(channel).VariantAdapters(req, timeout=drain_s + 30.0)
    finally:
        await channel.close()


async def apply_adapters(
    variants: Sequence[variant_spec.VariantSpec],
    placed: Sequence[tuple[str, str, str, int, int]],
    drain_timeout_s: float = DRAIN_TIMEOUT_S,
    apply: bool = True,
    *,
    tls: transport.TlsFiles | None,
) -> Applied:
    """Bring every foundation stage in `placed` to the deployment's LoRA adapters."""
    lora = [v for v in variants if v.kind == "lora"]
    paths = {v.name: v.path for v in lora}
    out = Applied(held=await observe(placed, tls))
    wanted = [v.name for v in lora]
    for _ in range(len(wanted) + 1):
        steps = variant_plan.adapter_steps(out.held, wanted)
        if not apply or not steps:
            break
        failed = False
        for step in steps:
            try:
                await _set(step, paths, drain_timeout_s, tls)
                out.steps.append(step)
            except grpc.aio.AioRpcError as exc:
                details = exc.details() or exc.code().name
                named = _NAMED.search(details)
                who = named.group(1) if named and named.group(1) in wanted else None
                log.warning("variants: %s: %s", step.describe(), details)
                if who is None:  # not an adapter's fault (agent down, drain timeout)
                    for n in set(step.names) - set().union(*(h.adapters for h in out.held)):
                        out.errors.setdefault(n, f"{exc.code().name}: {details}")
                    failed = True
                    break
                out.errors[who] = f"{exc.code().name}: {details}"
                wanted = [n for n in wanted if n != who]
                failed = True
                break
        out.held = await observe(placed, tls)
        if not failed:
            break
    return out


async def variant_blocks(
    target: transition_model.Target,
    variant_of: Mapping[str, str],
    wanted: Callable[[str, blocks.Block], bool],
    tls: transport.TlsFiles | None,
) -> AsyncIterator[tuple[str, blocks.Block, pb.BlockInfo]]:
    """(variant, block, its agent's `BlockInfo`) for each target block of a variant that
    `wanted(variant, block)` keeps and its agent lists; each agent is asked once."""
    listed: dict[str, dict[tuple[str, int], pb.BlockInfo]] = {}
    for p in target.blocks:
        b = p.block
        name = variant_of.get(b.replica_id)
        if name is None or not wanted(name, b):
            continue
        if p.address not in listed:
            listed[p.address] = await list_blocks(p.address, tls)
        info = listed[p.address].get((b.replica_id, b.stage_index))
        if info is not None:
            yield name, b, info
