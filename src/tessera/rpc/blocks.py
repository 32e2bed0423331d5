"""The one conversion between `tessera.blocks.Block` and the agent proto.

`to_proto`/`from_proto` for `BlockInfo` (what an agent reports) and
`load_request`/`from_load_request` for `LoadBlockRequest` (what the operator asks).
Used by the agent servicer (requests in, inventory out), the operator's observation and
executor, and the local launchers; nowhere else marshals a block by hand.
"""

from __future__ import annotations

import dataclasses

from tessera import blocks, dtypes
from tessera.policies.transition import actions
from tessera.rpc.v1 import agent_pb2 as pb


def to_proto(b: blocks.Block, kv_pages: int = 0, num_tensors: int = 0) -> pb.BlockInfo:
    return pb.BlockInfo(
        replica_id=b.replica_id,
        stage_index=b.stage_index,
        num_stages=b.num_stages,
        model_path=b.model_path,
        layer_start=b.start,
        layer_end=b.end,
        device=b.device,
        param_bytes=b.param_bytes,
        kv_bytes=b.kv_bytes,
        kv_pages=kv_pages or b.kv_pages,
        page_size=b.page_size,
        dtype=b.dtype,
        num_tensors=num_tensors,
        next_stage_address=b.next_address,
        generation=b.generation,
        tp_size=b.tp_size,
        tp_rank=b.tp_rank,
        transport=b.transport,
        group_state=b.group_state,
        group_reason=b.group_reason,
        activations=b.activations,
        results=b.results,
        compile=b.compile,
        share=share(b),
        stitch=stitch(b),
        speculate=speculate(b),
    )


def speculate(b: blocks.Block) -> pb.BlockSpeculate | None:
    """The block's speculation opt-in (issue 35), or None when it has none."""
    return pb.BlockSpeculate(zoo=b.speculate_zoo) if b.speculate_zoo else None


def stitch(b: blocks.Block) -> pb.BlockStitch | None:
    """The block's stitch to the next stage (issue 35), or None when it has none."""
    if not b.stitch_zoo:
        return None
    return pb.BlockStitch(
        zoo=b.stitch_zoo, next_model_path=b.stitch_to, next_layer_start=b.stitch_at
    )


def share(b: blocks.Block) -> pb.VariantShare | None:
    """The block's equivalence opt-in (issue 14), or None when off."""
    if not b.share_from:
        return None
    return pb.VariantShare(foundation_path=b.share_from, threshold=b.share_threshold)


def from_proto(m: pb.BlockInfo) -> blocks.Block:
    """The block an agent reports, with what it observed of it (transport, group, counts)."""
    return dataclasses.replace(
        _block(m, dtypes.AUTO, blocks.DEFAULT_PAGE_SIZE),
        param_bytes=m.param_bytes,
        transport=m.transport,
        group_state=m.group_state,
        group_reason=m.group_reason,
        activations=m.activations,
        kv_pages=m.kv_pages,
        results=m.results,
        compile=m.compile,
    )


def load_request(
    b: blocks.Block,
    source: actions.PeerSource | None = None,
    max_num_seqs: int = 0,
    max_batched_tokens: int = 0,
    data_plane: actions.DataPlane | None = None,
    parts: tuple[actions.SwitchPart, ...] = (),
) -> pb.LoadBlockRequest:
    """The request that loads `b` (its `kv_bytes` is the budget asked; 0 = all left)."""
    req = pb.LoadBlockRequest(
        model_path=b.model_path,
        layer_start=b.start,
        layer_end=b.end,
        device=b.device,
        replica_id=b.replica_id,
        stage_index=b.stage_index,
        num_stages=b.num_stages,
        next_stage_address=b.next_address,
        dtype=b.dtype,
        kv_bytes=b.kv_bytes,
        page_size=b.page_size,
        max_num_seqs=max_num_seqs,
        max_batched_tokens=max_batched_tokens,
        generation=b.generation,
        tp_size=b.tp_size,
        tp_rank=b.tp_rank,
        share=share(b),
        stitch=stitch(b),
        speculate=speculate(b),
    )
    if data_plane is not None:
        req.data_plane.CopyFrom(
            pb.DataPlane(
                store_address=data_plane.store_address,
                group=data_plane.group,
                timeout_s=data_plane.timeout_s,
            )
        )
    if source is not None:
        req.source.CopyFrom(block_source(source))
    for part in parts:
        req.switch_sources.append(
            pb.SwitchSource(
                source=block_source(part.source) if part.source is not None else None,
                unit_start=part.units[0],
                unit_end=part.units[1],
            )
        )
    return req


def block_source(source: actions.PeerSource) -> pb.BlockSource:
    return pb.BlockSource(
        address=source.address,
        replica_id=source.replica_id,
        stage_index=source.stage_index,
        transport=source.transport,
    )


def from_load_request(
    req: pb.LoadBlockRequest,
    dtype: str = dtypes.AUTO,
    page_size: int = blocks.DEFAULT_PAGE_SIZE,
) -> blocks.Block:
    """The block a request asks for, `dtype` and `page_size` filling what it leaves unset
    (and one stage, tensor-parallel size 1). ValueError for an invalid shard."""
    return _block(req, dtype, page_size)


def _block(m: pb.BlockInfo | pb.LoadBlockRequest, dtype: str, page_size: int) -> blocks.Block:
    """The fields a load request and a report share; `dtype`, `page_size` where unset."""
    return blocks.Block(
        model_path=m.model_path,
        start=m.layer_start,
        end=m.layer_end,
        replica_id=m.replica_id,
        stage_index=m.stage_index,
        device=m.device,
        dtype=m.dtype or dtype,
        kv_bytes=m.kv_bytes,
        page_size=m.page_size or page_size,
        num_stages=m.num_stages or 1,
        next_address=m.next_stage_address,
        generation=m.generation,
        tp_size=m.tp_size or 1,
        tp_rank=m.tp_rank,
        share_from=m.share.foundation_path,
        share_threshold=m.share.threshold if m.share.foundation_path else 0.0,
        stitch_zoo=m.stitch.zoo,
        stitch_to=m.stitch.next_model_path,
        stitch_at=m.stitch.next_layer_start,
        speculate_zoo=m.speculate.zoo,
    )
