"""Page allocator of a replica: which KV pages each sequence owns.

Owned by the replica leader's scheduler. Every stage of the replica has a pool of at
least `num_pages` pages of the same page size, so one allocator's block tables are valid
on every stage (as in vLLM's pipeline-parallel design); stages just follow them.
"""

from __future__ import annotations

from collections import deque


class PageAllocator:
    """Free list of page ids plus each sequence's ordered block table."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 1:
            raise ValueError("num_pages: the KV pool has no page; give the device more memory")
        self.num_pages, self.page_size = num_pages, page_size
        self._free: deque[int] = deque(range(num_pages))
        self._tables: dict[str, list[int]] = {}

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def used_pages(self) -> int:
        return self.num_pages - len(self._free)

    def pages_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def block_table(self, seq_id: str) -> list[int]:
        return self._tables.get(seq_id, [])

    def can_grow(self, seq_id: str, num_tokens: int) -> bool:
        """Whether the sequence can hold `num_tokens` tokens after allocating."""
        have = len(self._tables.get(seq_id, ()))
        return self.pages_needed(num_tokens) - have <= len(self._free)

    def grow(self, seq_id: str, num_tokens: int) -> bool:
        """Allocate pages so the sequence holds `num_tokens` tokens; False if the pool is short."""
        if not self.can_grow(seq_id, num_tokens):
            return False
        table = self._tables.setdefault(seq_id, [])
        while len(table) < self.pages_needed(num_tokens):
            table.append(self._free.popleft())
        return True

    def free(self, seq_id: str) -> None:
        """Return all pages of the sequence to the pool (finish, cancel or preemption)."""
        for page in self._tables.pop(seq_id, ()):
            self._free.append(page)
