"""Paged KV cache storage of one stage: fixed-size pages of K and V per layer.

The pool is one flat tensor per layer, `[num_pages * page_size, kv_heads, head_dim]`, so a
token's slot is `page * page_size + offset`. Which pages belong to which sequence is
decided by the replica leader's `PageAllocator` and arrives with each step as a block
table; this module only stores. `export_sequence` / `import_sequence` copy one sequence's
K/V for one layer out of and into the pool (KV migration builds on them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVLayout:
    """Geometry of a KV pool."""

    num_layers: int
    num_pages: int
    page_size: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float32

    @property
    def bytes_per_page(self) -> int:
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.page_size * self.kv_heads * self.head_dim * elem

    @property
    def total_bytes(self) -> int:
        return self.num_pages * self.bytes_per_page


def pages_for_budget(
    budget_bytes: int,
    num_layers: int,
    page_size: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
) -> int:
    """How many pages a byte budget buys for a stage of `num_layers` layers."""
    per_page = KVLayout(num_layers, 1, page_size, kv_heads, head_dim, dtype).bytes_per_page
    return max(0, budget_bytes // per_page)


class PagedKVCache:
    """K/V page pool for the layers of one stage."""

    def __init__(self, layout: KVLayout, device: torch.device) -> None:
        self.layout = layout
        slots = layout.num_pages * layout.page_size
        shape = (slots, layout.kv_heads, layout.head_dim)
        self.k = [
            torch.zeros(shape, dtype=layout.dtype, device=device) for _ in range(layout.num_layers)
        ]
        self.v = [
            torch.zeros(shape, dtype=layout.dtype, device=device) for _ in range(layout.num_layers)
        ]

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(zip(self.k, self.v, strict=True))

    def slots(self, block_table: list[int], length: int) -> torch.Tensor:
        """Flat slot indices of positions [0, length) of a sequence."""
        ps = self.layout.page_size
        pages = torch.tensor(block_table, dtype=torch.long)
        idx = (pages[:, None] * ps + torch.arange(ps)[None, :]).reshape(-1)
        return idx[:length]

    def export_sequence(
        self, layer: int, block_table: list[int], length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy out K and V of positions [0, length) of one sequence in one local layer."""
        s = self.slots(block_table, length).to(self.k[layer].device)
        return self.k[layer][s].clone(), self.v[layer][s].clone()

    def import_sequence(
        self, layer: int, block_table: list[int], k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Write K and V (`[length, kv_heads, head_dim]`) of one sequence into its pages."""
        dev = self.k[layer].device
        s = self.slots(block_table, k.shape[0]).to(dev)
        self.k[layer].index_copy_(0, s, k.to(dev, self.layout.dtype))
        self.v[layer].index_copy_(0, s, v.to(dev, self.layout.dtype))

    # -- shifting memory between parameters and KV (engine/memory_shift.py) ---------------
    def grow(self, extra_pages: int) -> None:
        """Append `extra_pages` zeroed pages to every layer's pool. Existing pages keep
        their ids and contents, so block tables stay valid (`resize_` keeps the tensors,
        appending slots at the end; on CPU the storage is reallocated once)."""
        if extra_pages < 0:
            raise ValueError(f"extra_pages: must be >= 0, got {extra_pages}")
        old = self.layout.num_pages * self.layout.page_size
        new = old + extra_pages * self.layout.page_size
        for t in (*self.k, *self.v):
            t.resize_((new, *t.shape[1:]))
            t[old:].zero_()
        self.layout = dataclasses.replace(
            self.layout, num_pages=self.layout.num_pages + extra_pages
        )

    def keep_layers(self, first: int, last: int) -> None:
        """Keep only local layers [first, last); the others' K/V are released."""
        if not 0 <= first < last <= self.layout.num_layers:
            raise ValueError(f"keep_layers: [{first}, {last}) is not within the pool's layers")
        self.k, self.v = self.k[first:last], self.v[first:last]
        self.layout = dataclasses.replace(self.layout, num_layers=last - first)

    def shrink(self, num_pages: int) -> None:
        """Keep pages [0, num_pages) (the allocator compacted held pages below it) and
        release the rest (new, smaller tensors: `resize_` would keep the storage)."""
        if not 1 <= num_pages <= self.layout.num_pages:
            raise ValueError(f"shrink: {num_pages} is not in [1, {self.layout.num_pages}]")
        slots = num_pages * self.layout.page_size
        self.k = [t[:slots].clone() for t in self.k]
        self.v = [t[:slots].clone() for t in self.v]
        self.layout = dataclasses.replace(self.layout, num_pages=num_pages)

    def add_layers(self, before: int, after: int) -> None:
        """Add empty pools for `before` layers in front and `after` layers behind."""
        shape = tuple(self.k[0].shape)
        dev, dt = self.k[0].device, self.layout.dtype

        def zeros(n: int) -> list[torch.Tensor]:
            return [torch.zeros(shape, dtype=dt, device=dev) for _ in range(n)]

        self.k = zeros(before) + self.k + zeros(after)
        self.v = zeros(before) + self.v + zeros(after)
        self.layout = dataclasses.replace(
            self.layout, num_layers=self.layout.num_layers + before + after
        )
