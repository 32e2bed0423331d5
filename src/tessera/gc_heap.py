"""Keeps the cycle collector's full passes off the serving path of Tessera's processes.

A warm agent tracks ~660,000 Python objects (torch, and the compiled decode's Inductor and
sympy state), and a full (generation 2) pass of the cycle collector walks all of them
while holding the GIL: 280-480 ms measured on the 2-core VM, idle. CPython starts one
whenever enough new objects have survived, so while serving, the agent's compute thread and
event loop, and the gateway, stopped for 0.1-1.2 s at unpredictable moments (seen inside
the anchor's measured runs: a 649 ms pass in the agent and a 367 ms one in `tessera up`
during one 3.8 s saturated run; docs/benchmarks-log.md, "Issue 16 (seventh stop)").

`settle` collects once and then freezes every survivor (`gc.freeze`), so later passes only
walk what was made since: it runs at moments that already pause (after a block is loaded
and its compiled decode warmed, after a block is unloaded, once a gateway serves), which
is what vLLM does after its engine and API server start. After an unload it first
unfreezes (`reclaim=True`), so that a dropped stage's cyclic garbage, which may hold its
weights and KV pool, is collected rather than kept frozen.

Only processes that own their heap settle it: `tessera agent`, `tessera gateway` and
`tessera up` read `TESSERA_GC_FREEZE` (`wanted`; `0` turns it off) and call `settle` only
when on (the agent passes it down to `hosting` as `LoadDefaults.gc_settle`); a library
caller such as a test process never calls it and keeps the collector as it is.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Mapping

from tessera import env_flags

ENV = "TESSERA_GC_FREEZE"
log = logging.getLogger(__name__)


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether an entry point's environment leaves settling on (`TESSERA_GC_FREEZE=0`: off)."""
    return environ.get(ENV, "").strip().lower() not in env_flags.OFF


def settle(reason: str, reclaim: bool = False) -> float:
    """Collect, then freeze the survivors; `reclaim` first unfreezes what earlier calls
    froze (after something was dropped). Returns the seconds it took."""
    start = time.perf_counter()
    if reclaim:
        gc.unfreeze()
    collected = gc.collect()
    gc.freeze()
    took = time.perf_counter() - start
    log.info(
        "gc settled (%s): %d collected, %d frozen, %.0f ms",
        reason,
        collected,
        gc.get_freeze_count(),
        took * 1e3,
    )
    return took
