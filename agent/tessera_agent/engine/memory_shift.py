"""Shift device memory between a running block's parameters and its KV pool (KunServe).

Parameters and KV pool share one device budget. When a drop plan
(`policies.overload.drop_plan`) tells a block to keep fewer layers, `drop_layers` frees the
dropped layers' weights (and embedding or head if no longer needed) and K/V and spends the bytes
on new KV pages: the pool grows in place, pages keep their ids and contents, running requests
keep their block tables. `grow_pool` spends bytes freed elsewhere on the device. The leader
then raises its allocator to the smallest pool among its stages (`allocator_target`).
Restore is the inverse: `PageAllocator.compact` (`restored_pages`), `move_pages`, then
`restore_layers` shrinks the pool and reloads the layers. Callers run these on the compute
thread between steps, after the dropped layers' live KV went to the peer that keeps them
(`PagedKVCache.export_sequence` / `import_sequence`). GPU mapping: docs/overload.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tessera_agent.engine import block_tensors, kv_cache, loader, sampling, stage


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
    dtype = st.dtype
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
    budget = kv_budget(st) + freed
    _spend(st, budget)
    st.param_bytes -= freed
    st.spec = dataclasses.replace(st.spec, start=start, end=end, kv_bytes=budget)
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
    budget = kv_budget(st) + extra_bytes
    _spend(st, budget)
    st.spec = dataclasses.replace(st.spec, kv_bytes=budget)
    return st.num_pages - before


def kv_budget(st: stage.Stage) -> int:
    """Bytes of the device the block may spend on KV: the spec's budget (kept exact across
    shifts, so page rounding never leaks bytes), else the pool it has."""
    return st.spec.kv_bytes or st.kv_bytes


def _spend(st: stage.Stage, budget: int) -> None:
    layout = st.runner.cache.layout
    pages = kv_cache.pages_for_budget(
        budget,
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


# -- restore: take layers back, give KV pages back -----------------------------------------
def restored_pages(st: stage.Stage, start: int, end: int) -> int:
    """KV pages the block keeps once it holds [start, end) again, in the same budget
    (its parameters plus its KV budget). Compact the allocator to at most this first."""
    dtype = st.dtype
    budget = st.param_bytes + kv_budget(st) - block_tensors.nbytes(st.cfg, start, end, dtype)
    layout = st.runner.cache.layout
    return kv_cache.pages_for_budget(
        budget, end - start, layout.page_size, layout.kv_heads, layout.head_dim, layout.dtype
    )


def move_pages(st: stage.Stage, moves: dict[int, int]) -> None:
    """Copy K/V of pages the allocator moved (`PageAllocator.compact`), every layer."""
    if not moves:
        return
    cache = st.runner.cache
    old = cache.slots(list(moves), len(moves) * cache.layout.page_size)
    new = cache.slots(list(moves.values()), len(moves) * cache.layout.page_size)
    for t in (*cache.k, *cache.v):
        t[new.to(t.device)] = t[old.to(t.device)]


def resize_pool(st: stage.Stage, moves: dict[int, int], num_pages: int) -> None:
    """Copy the pages the allocator moved, then shrink or grow the pool to `num_pages`
    (a transition on a full device, issue 34); the stage's KV budget follows."""
    move_pages(st, moves)
    cache = st.runner.cache
    if num_pages < cache.layout.num_pages:
        cache.shrink(num_pages)
    elif num_pages > cache.layout.num_pages:
        cache.grow(num_pages - cache.layout.num_pages)
    st.spec = dataclasses.replace(st.spec, kv_bytes=cache.layout.total_bytes)


def restore_layers(
    st: stage.Stage, start: int, end: int, tensors: dict[str, torch.Tensor] | None = None
) -> Shift:
    """Hold [start, end) again (a superset of the block's layers): the pool shrinks to
    `restored_pages` first, then the missing layers are loaded from `tensors` (checkpoint
    names, pulled from the peer that kept them) or from the checkpoint, with empty K/V
    pools the caller fills with the running requests' KV from that peer."""
    old_start, old_end = st.spec.start, st.spec.end
    cfg = st.cfg
    if not 0 <= start <= old_start < old_end <= end <= cfg.num_layers:
        raise ValueError(
            f"restore_layers: [{start}, {end}) must contain the block's [{old_start}, {old_end})"
        )
    r = st.runner
    pages_before, kv_before = r.cache.layout.num_pages, r.cache.layout.total_bytes
    pages = restored_pages(st, start, end)
    if pages < 1:
        raise ValueError(f"restore_layers: no KV page would be left for [{start}, {end})")
    r.cache.shrink(min(pages, pages_before))
    dtype = st.dtype
    path = Path(st.spec.model_path)
    model = r.model
    pre = (
        loader.load_stage(path, cfg, start, old_start, dtype, r.device, tensors)
        if start < old_start
        else None
    )
    post = (
        loader.load_stage(path, cfg, old_end, end, dtype, r.device, tensors)
        if old_end < end
        else None
    )
    layers = list(model.layers)
    if pre is not None:
        layers = list(pre.layers) + layers
        model.embed_tokens, model.is_first = pre.embed_tokens, pre.is_first
    if post is not None:
        layers = layers + list(post.layers)
        model.norm, model.lm_head, model.is_last = post.norm, post.lm_head, post.is_last
        if model.is_last and r.sampler is None:
            r.sampler = sampling.Sampler()
    if cfg.tie_embeddings and model.embed_tokens is not None and model.lm_head is not None:
        model.lm_head.weight = model.embed_tokens.weight  # one copy, as the loader does
    model.layers = nn.ModuleList(layers)
    model.start, model.end = start, end
    r.cache.add_layers(old_start - start, end - old_end)
    added = block_tensors.nbytes(cfg, start, end, dtype) - block_tensors.nbytes(
        cfg, old_start, old_end, dtype
    )
    budget = kv_budget(st) - added
    st.param_bytes += added
    st.spec = dataclasses.replace(st.spec, start=start, end=end, kv_bytes=budget)
    st.__dict__.pop("_held", None)
    return Shift(
        (old_start, old_end),
        (start, end),
        -added,
        kv_before,
        st.kv_bytes,
        pages_before,
        st.num_pages,
    )
