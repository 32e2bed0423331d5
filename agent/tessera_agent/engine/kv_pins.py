"""KV pins of a replica leader: pages held outside any request while a peer moves K/V.

`pin_prefix` holds prefix-cache pages a peer copies, `reserve_pages` holds fresh pages a
peer imports into, `commit_prefix` registers them in the prefix cache, `release_pin` lets
them go; a pin neither committed nor released within its lease is freed. `KVPins` is a
mixin of `replica.ReplicaEngine`, which owns the scheduler, the wake event and the pin
set; called by the agent's KV RPCs (`kv_rpc`) and `kv_transfer`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass

from tessera_agent.engine import errors, page_allocator, scheduler

log = logging.getLogger(__name__)

# A KV pin (`pin_prefix`, `reserve_pages`) neither committed nor released by then is freed:
# a caller that dies or walks away mid-move cannot hold a replica's pages forever (issue 31).
# Long enough for a move of a whole context over gRPC; a move that takes longer gets
# NOT_FOUND on its commit and the request is recomputed.
PIN_LEASE_S = 120.0


@dataclass(frozen=True)
class Pin:
    """KV pages held on this leader for a KV move (see `pin_prefix`, `reserve_pages`)."""

    pin_id: str  # "" when nothing is held
    page_ids: tuple[int, ...]
    num_tokens: int  # tokens the pages hold (0 for reserved pages not yet written)
    page_size: int


class KVPins:
    """The pin half of `replica.ReplicaEngine` (which sets these attributes)."""

    _sched: scheduler.Scheduler | None
    _wake: asyncio.Event
    _pins: set[str]
    pin_lease_s: float
    expired_pins: int

    async def _ensure_ready(self) -> scheduler.Scheduler:
        raise NotImplementedError  # the engine's: the scheduler, made on first use

    async def pin_prefix(self, tokens: list[int]) -> Pin:
        """Hold the prefix-cache pages that `tokens` start with (so they are not evicted
        while a peer copies them); an empty pin when none are cached."""
        alloc = (await self._ensure_ready()).alloc
        pin_id = f"pin-{uuid.uuid4().hex}"
        n = alloc.share_prefix(pin_id, tokens)
        if not n:
            return Pin("", (), 0, alloc.page_size)
        self._lease(pin_id)
        return Pin(pin_id, tuple(alloc.block_table(pin_id)), n, alloc.page_size)

    async def reserve_pages(self, num_pages: int) -> Pin:
        """Hold `num_pages` fresh pages for K/V a peer will import."""
        alloc = (await self._ensure_ready()).alloc
        if num_pages < 1:
            raise errors.InvalidArgumentError("num_pages: must be >= 1")
        pin_id = f"pin-{uuid.uuid4().hex}"
        if not alloc.grow(pin_id, num_pages * alloc.page_size):
            raise errors.ResourceExhaustedError(
                f"cannot reserve {num_pages} KV pages: {alloc.free_pages} of "
                f"{alloc.num_pages} are free"
            )
        self._lease(pin_id)
        return Pin(pin_id, tuple(alloc.block_table(pin_id)), 0, alloc.page_size)

    async def commit_prefix(self, pin_id: str, tokens: list[int]) -> int:
        """Register a reserved pin's pages in the prefix cache as holding `tokens` (full
        pages only) and let the pin go; returns the pages registered."""
        alloc = self._pinned(pin_id)
        pages = min(len(alloc.block_table(pin_id)), len(tokens) // alloc.page_size)
        before = alloc.cached_pages
        alloc.register(pin_id, tokens, pages * alloc.page_size)
        registered = alloc.cached_pages - before
        self.release_pin(pin_id)
        return registered

    def release_pin(self, pin_id: str) -> None:
        alloc = self._pinned(pin_id)
        alloc.free(pin_id)
        self._pins.discard(pin_id)

    def _lease(self, pin_id: str) -> None:
        self._pins.add(pin_id)
        asyncio.get_running_loop().call_later(self.pin_lease_s, self._expire, pin_id)

    def _expire(self, pin_id: str) -> None:
        if pin_id not in self._pins or self._sched is None:
            return  # committed or released in time
        log.warning("KV pin %s expired after %.0f s; its pages are freed", pin_id, self.pin_lease_s)
        self.release_pin(pin_id)
        self.expired_pins += 1
        self._wake.set()  # queued requests may fit in the freed pages

    def _pinned(self, pin_id: str) -> page_allocator.PageAllocator:
        if pin_id not in self._pins or self._sched is None:
            raise errors.NotFoundError(f"no KV pin {pin_id!r} on this replica")
        return self._sched.alloc
