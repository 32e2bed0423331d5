"""K/V pages of one stage out to a peer and back in (the stage side of a KV move).

Called by the servicer's `ExportKV` and `ImportKV`. Layers travel by global index, so the
source and target replicas may split the model into different stages; each target stage
takes exactly the layers it holds. Pages are validated against the stage's pool and
layers against its range, with errors that name the cause. The leader side (holding the
pages, registering them in the prefix cache) is `engine.replica.ReplicaEngine`'s pins.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import convert
from tessera_agent.engine import errors, stage


def valid_pages(st: stage.Stage, page_ids: Sequence[int]) -> list[int]:
    """The page ids as ints, each inside the stage's pool (InvalidArgumentError if not)."""
    pages = [int(p) for p in page_ids]
    if not pages:
        raise errors.InvalidArgumentError("page_ids: at least one page is required")
    bad = [p for p in pages if not 0 <= p < st.num_pages]
    if bad:
        raise errors.InvalidArgumentError(
            f"page_ids: {bad[0]} is outside this stage's pool of {st.num_pages} pages"
        )
    return pages


def local_layer(st: stage.Stage, layer: int) -> int:
    """The stage-local index of global `layer` (InvalidArgumentError if not held here)."""
    if not st.spec.start <= layer < st.spec.end:
        raise errors.InvalidArgumentError(
            f"layer {layer} is not held by this stage (layers [{st.spec.start}, {st.spec.end}))"
        )
    return layer - st.spec.start


def export_layers(
    st: stage.Stage, page_ids: Sequence[int], start: int = 0, end: int = 0
) -> Iterator[pb.KVLayer]:
    """K and V of the pages for global layers [start, end) (all of the stage's if both 0)."""
    pages = valid_pages(st, page_ids)
    if not start and not end:
        start, end = st.spec.start, st.spec.end
    locals_ = [local_layer(st, layer) for layer in range(start, end)]  # validate before streaming
    cache = st.runner.cache
    n = len(pages) * cache.layout.page_size
    for layer, local in zip(range(start, end), locals_, strict=True):
        k, v = cache.export_sequence(local, pages, n)
        yield pb.KVLayer(layer=layer, k=convert.tensor_to_proto(k), v=convert.tensor_to_proto(v))


def _tensor(layer: int, name: str, msg: pb.Tensor, want: tuple[int, ...]) -> torch.Tensor:
    where = f"layer {layer} {name}"
    if tuple(msg.shape) != want:
        raise errors.InvalidArgumentError(f"{where}: shape {tuple(msg.shape)}, expected {want}")
    try:
        return convert.tensor_from_proto(msg)
    except (AttributeError, RuntimeError, TypeError, ValueError) as exc:
        raise errors.InvalidArgumentError(f"{where}: not a {msg.dtype!r} tensor: {exc}") from exc


def import_layer(st: stage.Stage, page_ids: list[int], msg: pb.KVLayer) -> None:
    """Write one layer's K and V into the pages (validated by `valid_pages`; reserved on the
    leader for this move)."""
    local = local_layer(st, msg.layer)
    cache = st.runner.cache
    layout = cache.layout
    want = (len(page_ids) * layout.page_size, layout.kv_heads, layout.head_dim)
    k, v = _tensor(msg.layer, "k", msg.k, want), _tensor(msg.layer, "v", msg.v, want)
    cache.import_sequence(local, page_ids, k, v)
