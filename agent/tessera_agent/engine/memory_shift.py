"""Shift device memory between a running block's parameters and its KV pool (issue 13).

On an agent's device the parameters and the KV pool of a block share one budget. When a
KunServe drop plan (`tessera.policies.drop_plan`) tells a block to keep fewer layers,
`drop_layers` releases the dropped layers' weights (and the embedding or LM head when
the block no longer starts or ends the model) and their K/V, and spends every freed byte
on new KV pages for the layers it keeps: the pool grows in place, existing pages keep
their ids and contents, so running requests keep their block tables. `grow_pool` spends
bytes freed elsewhere on the device (a co-located block that dropped layers). The replica
leader then raises its page allocator with `PageAllocator.add_pages` to the smallest pool
among its stages (`allocator_target`).

Callers run these on the stage's compute thread between steps (they change the tensors a
step reads). The KV of running requests for the layers a block drops must have been
copied to the peer that keeps them first (`PagedKVCache.export_sequence` /
`import_sequence`; the coordinated exchange of the live executor). How this maps to GPUs
(CUDA virtual-memory remapping, or several page arenas) is in docs/overload.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import nn

from tessera_agent.engine import block_tensors, kv_cache, stage


@dataclass(frozen=True)
class Shift:
    """What one shift did to a block's memory, for status and for the accounting test."""

    layers_before: tuple[int, int]
    layers_after: tuple[int, int]
    freed_param_bytes: int
    kv_bytes_before: int
    kv_bytes_after: int
    pages_before: int
    pages_after: int


def drop_layers(st: stage.Stage, start: int, end: int) -> Shift:
    """Keep layers [start, end) of a running block; freed bytes become KV pages."""
    old_start, old_end = st.spec.start, st.spec.end
    if not old_start <= start < end <= old_end:
        raise ValueError(
            f"drop_layers: [{start}, {end}) is not within the block's [{old_start}, {old_end})"
        )
    r, cfg = st.runner, st.cfg
    dtype = stage.torch_dtype(st.spec.dtype)
    pages_before, kv_before = r.cache.layout.num_pages, r.cache.layout.total_bytes
    freed = block_tensors.nbytes(cfg, old_start, old_end, dtype) - block_tensors.nbytes(
        cfg, start, end, dtype
    )
    model = r.model
    model.layers = nn.ModuleList(list(model.layers)[start - old_start : end - old_start])
    model.start, model.end = start, end
    if start > 0:
        model.embed_tokens, model.is_first = None, False
    if end < cfg.num_layers:
        model.norm, model.lm_head, model.is_last = None, None, False
        r.sampler = None
    r.cache.keep_layers(start - old_start, end - old_start)
    _spend(st, kv_before + freed)
    st.param_bytes -= freed
    st.spec = dataclasses.replace(st.spec, start=start, end=end, kv_bytes=st.kv_bytes)
    st.__dict__.pop("_held", None)  # the cached set of tensor names it holds
    return Shift(
        (old_start, old_end),
        (start, end),
        freed,
        kv_before,
        st.kv_bytes,
        pages_before,
        st.num_pages,
    )


def grow_pool(st: stage.Stage, extra_bytes: int) -> int:
    """Spend `extra_bytes` more of the device on this block's KV pool; returns pages added."""
    before = st.num_pages
    _spend(st, st.kv_bytes + extra_bytes)
    st.spec = dataclasses.replace(st.spec, kv_bytes=st.kv_bytes)
    return st.num_pages - before


def _spend(st: stage.Stage, kv_budget: int) -> None:
    layout = st.runner.cache.layout
    pages = kv_cache.pages_for_budget(
        kv_budget,
        layout.num_layers,
        layout.page_size,
        layout.kv_heads,
        layout.head_dim,
        layout.dtype,
    )
    st.runner.cache.grow(max(0, pages - layout.num_pages))


def allocator_target(stages: list[stage.Stage]) -> int:
    """Pages the replica's allocator may hand out: the smallest pool among its stages."""
    return min(s.num_pages for s in stages)
