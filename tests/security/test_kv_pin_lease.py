"""KV pins expire (issue 31): pages a KV move pinned or reserved on a replica leader are
freed when neither committed nor released within the lease, so a caller that dies or walks
away mid-move cannot hold them forever. The leader engine alone, over a stub stage."""

from __future__ import annotations

import asyncio
import concurrent.futures
from types import SimpleNamespace
from typing import Any

import pytest

from tessera_agent.engine import errors, kv_pins, replica, scheduler


def _engine(pages: int = 8) -> replica.ReplicaEngine:
    local: Any = SimpleNamespace(cache=SimpleNamespace(layout=SimpleNamespace(num_pages=pages)),
                                 page_size=16)  # fmt: skip
    pool = concurrent.futures.ThreadPoolExecutor(1)
    return replica.ReplicaEngine(local, pool, scheduler.SchedulerConfig())


def test_a_reserved_pin_is_freed_after_its_lease() -> None:
    async def run() -> None:
        engine = _engine()
        engine.pin_lease_s = 0.05
        pin = await engine.reserve_pages(3)
        kept = await engine.reserve_pages(2)
        alloc = engine._sched.alloc if engine._sched else None
        assert alloc is not None and alloc.free_pages == 3
        await engine.commit_prefix(kept.pin_id, [])  # finished in time: nothing to expire
        await asyncio.sleep(0.2)
        assert alloc.free_pages == 8 and engine.expired_pins == 1
        with pytest.raises(errors.NotFoundError, match=pin.pin_id):
            engine.release_pin(pin.pin_id)  # the caller's late release names the pin
        await engine.close()

    asyncio.run(run())


def test_the_default_lease_is_finite() -> None:
    assert 0 < kv_pins.PIN_LEASE_S <= 600
