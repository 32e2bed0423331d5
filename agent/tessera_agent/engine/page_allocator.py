"""The replica's KV page allocator, re-exported from `tessera.kvpages` (torch-free, so the
cluster simulator runs the same accounting)."""

from tessera.kvpages import Key, PageAllocator

__all__ = ["Key", "PageAllocator"]
