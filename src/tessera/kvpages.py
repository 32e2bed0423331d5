"""Page allocator of a replica: which KV pages each sequence owns, and a prefix cache.

Torch-free accounting, owned by the replica leader's scheduler (via
`tessera_agent.engine.page_allocator`) and by `tessera.sim`'s replicas. Every stage has a pool
of at least `num_pages` pages of one page size, so one allocator's block tables are valid on
every stage. Prefix caching, per page: a page computed by every stage is registered under the
content id of the page before it plus its own tokens. Ids are never reused and keys compared
exactly, so different prefixes never share a page; each chain starts from its namespace's root
id (0 for the foundation, one per LoRA variant), so K/V never cross adapters. Shared pages are
only read: a sequence writes beyond its cached prefix, into its own pages. Unheld pages stay
cached: fresh pages are taken first, then the least recently released cached page is evicted.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Sequence

Key = tuple[int, tuple[int, ...]]  # (content id of the previous page, 0 at the start; tokens)


class PageAllocator:
    """Free pages, each sequence's ordered block table, and the cached full pages."""

    def __init__(self, num_pages: int, page_size: int, prefix_caching: bool = True) -> None:
        if num_pages < 1:
            raise ValueError("num_pages: the KV pool has no page; give the device more memory")
        self.num_pages, self.page_size = num_pages, page_size
        self.prefix_caching = prefix_caching
        self._free: deque[int] = deque(range(num_pages))  # never cached, or evicted
        self._tables: dict[str, list[int]] = {}
        self._refs: dict[int, int] = {}  # pages held by sequences -> how many hold them
        self._key_of: dict[int, Key] = {}  # registered page -> its prefix key
        self._page_of: dict[Key, int] = {}  # prefix key -> registered page
        self._content: dict[int, int] = {}  # registered page -> content id (never reused)
        self._ids = itertools.count(1)
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # registered, unheld (LRU)
        self._chains: dict[str, list[int]] = {}  # per sequence: content ids of its full pages
        self._roots: dict[str, int] = {}  # namespace (LoRA variant) -> root id (< 0)

    @property
    def free_pages(self) -> int:
        """Pages a new sequence can get (fresh ones plus evictable cached ones)."""
        return len(self._free) + len(self._cached_free)

    @property
    def used_pages(self) -> int:
        return self.num_pages - self.free_pages

    @property
    def cached_pages(self) -> int:
        return len(self._page_of)

    def content_pages(self) -> list[int]:
        """Pages whose K/V may be read again: held by a sequence or a pin, or registered in
        the prefix cache (an overload shift copies all of them to the stages that change)."""
        return sorted(set(self._refs) | set(self._key_of))

    def pages_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def live_pages(self) -> set[int]:
        """Pages whose contents matter: held by a sequence or pin, or registered in the
        prefix cache (a layer-run move copies exactly these)."""
        return set(self._refs) | set(self._key_of)

    def block_table(self, seq_id: str) -> list[int]:
        return self._tables.get(seq_id, [])

    # -- prefix cache -------------------------------------------------------------------
    def _root(self, namespace: str) -> int:
        if not namespace:
            return 0
        return self._roots.setdefault(namespace, -(len(self._roots) + 1))

    def share_prefix(self, seq_id: str, tokens: Sequence[int], namespace: str = "") -> int:
        """Give a sequence with no pages yet the cached pages its tokens start with;
        returns the number of tokens they hold (always fewer than `len(tokens)`, so the
        last token is computed and sampled from)."""
        if not self.prefix_caching or self._tables.get(seq_id):
            return 0
        ps = self.page_size
        pages: list[int] = []
        chain: list[int] = []
        for i in range((len(tokens) - 1) // ps):
            page = self._page_of.get(
                (
                    chain[-1] if chain else self._root(namespace),
                    tuple(tokens[i * ps : (i + 1) * ps]),
                )
            )
            if page is None:
                break
            pages.append(page)
            chain.append(self._content[page])
        if not pages:
            return 0
        for page in pages:
            self._hold(page)
        self._tables[seq_id] = pages
        self._chains[seq_id] = chain
        return len(pages) * ps

    def register(
        self, seq_id: str, tokens: Sequence[int], num_computed: int, namespace: str = ""
    ) -> None:
        """Register the sequence's full pages among its first `num_computed` tokens
        (their K/V are written on every stage)."""
        if not self.prefix_caching:
            return
        ps = self.page_size
        table = self._tables.get(seq_id, [])
        chain = self._chains.setdefault(seq_id, [])
        for i in range(len(chain), min(num_computed // ps, len(table))):
            key = (
                chain[-1] if chain else self._root(namespace),
                tuple(tokens[i * ps : (i + 1) * ps]),
            )
            owner = self._page_of.get(key)
            if owner is None:  # first to compute this content: its own (fresh) page holds it
                owner = table[i]
                self._page_of[key], self._key_of[owner] = owner, key
                self._content[owner] = next(self._ids)
            chain.append(self._content[owner])

    # -- allocation ---------------------------------------------------------------------
    def can_grow(self, seq_id: str, num_tokens: int) -> bool:
        """Whether the sequence can hold `num_tokens` tokens after allocating."""
        have = len(self._tables.get(seq_id, ()))
        return self.pages_needed(num_tokens) - have <= self.free_pages

    def grow(self, seq_id: str, num_tokens: int) -> bool:
        """Allocate pages so the sequence holds `num_tokens` tokens; False if the pool is short."""
        if not self.can_grow(seq_id, num_tokens):
            return False
        table = self._tables.setdefault(seq_id, [])
        while len(table) < self.pages_needed(num_tokens):
            page = self._take()
            self._hold(page)
            table.append(page)
        return True

    def add_pages(self, extra: int) -> None:
        """Grow the pool by `extra` fresh pages, ids after the existing ones (every stage's
        KV pool grew first: engine/memory_shift.py); pages held now are untouched."""
        if extra < 0:
            raise ValueError(f"extra: must be >= 0, got {extra}")
        self._free.extend(range(self.num_pages, self.num_pages + extra))
        self.num_pages += extra

    def compact(self, limit: int) -> dict[int, int]:
        """Shrink the pool to pages [0, limit): held pages at or above `limit` move to
        free ids below it (returned as {old: new}, for the stages to copy their K/V),
        unheld cached pages there are evicted. ValueError when more pages are held."""
        if limit > self.num_pages:
            raise ValueError(f"cannot shrink {self.num_pages} pages to {limit}: use add_pages")
        held = sorted(self._refs)
        if len(held) > limit:
            raise ValueError(f"cannot shrink to {limit} pages: {len(held)} are held")
        for page in [p for p in self._cached_free if p >= limit]:
            del self._cached_free[page]
            del self._page_of[self._key_of.pop(page)]
            del self._content[page]
        self._free = deque(p for p in self._free if p < limit)
        moves: dict[int, int] = {}
        for page in (p for p in held if p >= limit):
            new = self._take()
            moves[page] = new
            self._refs[new] = self._refs.pop(page)
            if page in self._key_of:
                key = self._key_of.pop(page)
                self._key_of[new], self._page_of[key] = key, new
                self._content[new] = self._content.pop(page)
        for table in self._tables.values():
            table[:] = [moves.get(p, p) for p in table]
        self.num_pages = limit
        return moves

    @property
    def held_pages(self) -> int:
        """Pages sequences or pins hold: the smallest pool `resize` can shrink to."""
        return len(self._refs)

    def resize(self, num_pages: int) -> dict[int, int]:
        """Grow (`add_pages`) or shrink (`compact`) the pool to `num_pages`; the page moves
        a shrink made, for every stage to copy before releasing the top of its pool
        (issue 34: a full device makes room for a new layout). ValueError below the held
        pages, or below one page."""
        if num_pages < 1:
            raise ValueError(f"num_pages: must be >= 1, got {num_pages}")
        if num_pages >= self.num_pages:
            self.add_pages(num_pages - self.num_pages)
            return {}
        return self.compact(num_pages)

    def free(self, seq_id: str) -> None:
        """Release the sequence's pages (finish, cancel or preemption); registered pages
        nobody holds any more stay cached, the others return to the free list."""
        self._chains.pop(seq_id, None)
        for page in self._tables.pop(seq_id, ()):
            self._refs[page] -= 1
            if self._refs[page]:
                continue
            del self._refs[page]
            if page in self._key_of:
                self._cached_free[page] = None
            else:
                self._free.append(page)

    def _take(self) -> int:
        if self._free:
            return self._free.popleft()
        page, _ = self._cached_free.popitem(last=False)  # evict the least recently released
        del self._page_of[self._key_of.pop(page)]
        del self._content[page]
        return page

    def _hold(self, page: int) -> None:
        self._refs[page] = self._refs.get(page, 0) + 1
        self._cached_free.pop(page, None)
