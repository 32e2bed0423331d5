"""Variants on an agent: set a stage's LoRA adapters at run time; report adapters and the zoo.

`set_adapters` is the agent side of the `VariantAdapters` RPC (the servicer only
delegates). It is level-triggered: the request names every adapter the stage serves from
now on. Each one is read and validated against the foundation (`lora.read_adapter`) before
anything changes, so a misfit is refused with its reason and the stage keeps serving what
it served. On a replica leader, adapters being removed stop taking new requests at once and
the call waits until their requests in flight have finished; the new set is then attached
on the agent's compute thread, between two steps, so no step ever sees half of it.
The foundation's weights are never touched: its replicas keep serving throughout.

`annotate` adds the variant fields (issue 14) to a block's `BlockInfo`, `zoo_to_proto`
the agent's `VariantZoo`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Sequence
from pathlib import Path

from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import equivalence_share, hosted, speculate_serve, stitch_serve
from tessera_agent.engine import block_zoo, errors, lora, stage

DEFAULT_DRAIN_TIMEOUT_S = 60.0
POLL_S = 0.05


def read_all(st: stage.Stage, adapters: Sequence[tuple[str, str]]) -> list[lora.Adapter]:
    """Read and validate every adapter for the stage's layers; InvalidArgumentError naming
    the adapter and its misfit."""
    names = [n for n, _ in adapters]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise errors.InvalidArgumentError(f"adapters: duplicate names {dup}")
    out = []
    for name, path in adapters:
        if not name:
            raise errors.InvalidArgumentError("adapters: every adapter needs a name")
        try:
            out.append(lora.read_adapter(Path(path), name, st.cfg, st.spec.start, st.spec.end))
        except lora.AdapterError as exc:
            raise errors.InvalidArgumentError(f"variant {name!r}: {exc}") from exc
        except OSError as exc:
            raise errors.NotFoundError(f"variant {name!r}: {path}: {exc}") from exc
    return out


async def set_adapters(
    h: hosted.Hosted,
    adapters: Sequence[tuple[str, str]],
    loader: concurrent.futures.Executor,
    compute: concurrent.futures.Executor,
    drain_timeout_s: float = 0.0,
) -> tuple[list[str], int]:
    """Serve exactly `adapters` ((name, PEFT directory) pairs) on the stage; returns the
    attached names and their matrices' bytes (module docstring)."""
    loop = asyncio.get_running_loop()
    read = await loop.run_in_executor(loader, read_all, h.stage, adapters)
    runner = h.stage.runner
    keep = {a.name for a in read}
    removed = frozenset(a.name for a in runner.adapters if a.name not in keep)
    if h.leader is not None and removed:
        leader = h.leader
        before = leader.refused_variants
        leader.refused_variants = before | removed
        deadline = time.monotonic() + (drain_timeout_s or DEFAULT_DRAIN_TIMEOUT_S)
        while (n := leader.variant_requests(removed)) > 0:
            if time.monotonic() > deadline:
                leader.refused_variants = before
                raise errors.FailedPreconditionError(
                    f"variants {sorted(removed)} still have {n} requests in flight after "
                    f"{drain_timeout_s or DEFAULT_DRAIN_TIMEOUT_S:g} s; they stay loaded"
                )
            await asyncio.sleep(POLL_S)
    await loop.run_in_executor(compute, runner.attach_adapters, read)
    if h.leader is not None:
        h.leader.refused_variants = h.leader.refused_variants - removed - keep
    return [a.name for a in read], sum(a.nbytes for a in read)


def annotate(msg: pb.BlockInfo, st: stage.Stage) -> pb.BlockInfo:
    """The block's variant fields: attached adapters, bytes shared through the zoo."""
    msg.variants.extend(a.name for a in st.runner.adapters)
    if st.pieces is not None:
        msg.shared_param_bytes = st.pieces.adopted.shared_bytes
    if st.equivalence is not None:
        msg.equivalence.CopyFrom(equivalence_share.to_proto(st.equivalence))
    if st.stitch is not None:  # issue 35: the stitch as loaded, with its measured quality
        msg.stitch.CopyFrom(stitch_serve.to_proto(st.spec, st.stitch))
    if st.speculate is not None:  # issue 35: the surrogate as loaded, and its hit counts
        msg.speculate.CopyFrom(speculate_serve.to_proto(st.spec, st.speculate))
    return msg


def zoo_to_proto(zoo: block_zoo.BlockZoo) -> pb.VariantZoo:
    return pb.VariantZoo(
        param_bytes=zoo.param_bytes, pieces=zoo.num_pieces, shared_pieces=zoo.shared()
    )
