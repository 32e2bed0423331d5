"""KV move over the data plane: one stage's K/V pages sent to a peer through a 2-rank group.

The client of a KV move (`tessera.control.kv_move.move_prefix`) asks, for each run of layers, the
importing stage's agent (`ImportKV` whose header has a `data_plane`) and the exporting
stage's agent (`ExportKV` with the same `data_plane`) to meet in a fresh 2-rank group on the
importer's rendezvous store: the exporter is rank 0 (`push`), the importer rank 1
(`receive`). The exporter broadcasts a header (layers, dtype, shape) and sends K and V of
every layer in one tensor; the importer checks the shape against its own pool before it
receives and writes the pages. NCCL when both ends are CUDA devices, gloo otherwise; the
gRPC stream (`kv_transfer`) stays the fallback. Called by the servicer on a worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import kv_transfer
from tessera_agent.engine import dtypes, errors, stage
from tessera_agent.transfer import group

EXPORTER, IMPORTER = 0, 1
_DTYPES = dtypes.TORCH


def pair_spec(dp: pb.DataPlane, rank: int, own_store: str = "") -> group.GroupSpec:
    """The 2-rank group a KV move's `data_plane` names (InvalidArgumentError if unusable).
    An importer meets only on its own store (`own_store`, when given): a caller cannot
    point it at a rendezvous of its choosing."""
    if not dp.store_address or not dp.group:
        raise errors.InvalidArgumentError("data_plane: store_address and group needed")
    if rank == IMPORTER and own_store and dp.store_address != own_store:
        raise errors.InvalidArgumentError(
            f"data_plane.store_address: a KV import meets on this agent's own store "
            f"({own_store}), not {dp.store_address}"
        )
    timeout = dp.timeout_s or group.DEFAULT_TIMEOUT_S
    try:
        # A peer that failed its own checks never joins: wait no longer than one operation.
        return group.GroupSpec(
            dp.store_address, dp.group, rank, 2, dp.backend or "gloo", timeout, timeout
        )
    except ValueError as exc:
        raise errors.InvalidArgumentError(f"data_plane: {exc}") from exc


def _layers(st: stage.Stage, start: int, end: int) -> list[int]:
    if not start and not end:
        start, end = st.spec.start, st.spec.end
    if end <= start:
        raise errors.InvalidArgumentError(f"layers [{start}, {end}): empty range")
    return [kv_transfer.local_layer(st, layer) for layer in range(start, end)]


def push(
    st: stage.Stage, page_ids: Sequence[int], start: int, end: int, spec: group.GroupSpec
) -> int:
    """Exporter (rank 0): K and V of global layers [start, end) of the pages; returns the
    bytes sent. Everything is validated before the group is joined."""
    pages = kv_transfer.valid_pages(st, page_ids)
    locals_ = _layers(st, start, end)
    cache, layout = st.runner.cache, st.runner.cache.layout
    n = len(pages) * layout.page_size
    dev = cache.k[0].device
    kv = torch.empty(  # one tensor, one send: [layers, 2, tokens, kv_heads, head_dim]
        (len(locals_), 2, n, layout.kv_heads, layout.head_dim), dtype=layout.dtype, device=dev
    )
    slots = cache.slots(pages, n).to(dev)
    for i, local in enumerate(locals_):
        torch.index_select(cache.k[local], 0, slots, out=kv[i, 0])
        torch.index_select(cache.v[local], 0, slots, out=kv[i, 1])
    g = group.form(spec, kv.device)
    try:
        header = (start or st.spec.start, str(kv.dtype).removeprefix("torch."), tuple(kv.shape))
        g.broadcast_object(header)
        g.send(kv.to(g.device), dst=IMPORTER)
        return kv.numel() * kv.element_size()
    finally:
        g.close()


def receive(
    st: stage.Stage, page_ids: Sequence[int], start: int, end: int, spec: group.GroupSpec
) -> int:
    """Importer (rank 1): receive layers [start, end) and write them into the pages
    (reserved on the leader for this move); returns the layers written."""
    pages = kv_transfer.valid_pages(st, page_ids)
    locals_ = _layers(st, start, end)
    layout = st.runner.cache.layout
    want = (len(locals_), 2, len(pages) * layout.page_size, layout.kv_heads, layout.head_dim)
    g = group.form(spec, st.runner.cache.k[0].device)
    try:
        header = g.broadcast_object(None)
        if not (isinstance(header, tuple) and len(header) == 3):
            raise errors.InvalidArgumentError(f"KV from the exporter: bad header {header!r:.200}")
        first, dtype, shape = header
        if first != (start or st.spec.start) or shape != want or dtype not in _DTYPES:
            raise errors.InvalidArgumentError(
                f"KV from the exporter: layers from {first}, {dtype} {tuple(shape)}; this "
                f"stage expects layers from {start or st.spec.start}, shape {want}"
            )
        kv = g.recv(torch.empty(want, dtype=_DTYPES[dtype], device=g.device), src=EXPORTER)
    finally:
        g.close()
    for i, local in enumerate(locals_):
        st.runner.cache.import_sequence(local, pages, kv[i, 0], kv[i, 1])
    return len(locals_)
