"""Keeps the cycle collector's full passes off the serving path of Tessera's processes.

A warm agent tracks hundreds of thousands of Python objects (torch, Inductor, sympy), and
a full (generation 2) collector pass walks all of them holding the GIL: hundreds of ms
at unpredictable moments (measured: docs/benchmarks-log.md, "Issue 16 (seventh stop)").
`settle` collects once and freezes every survivor (`gc.freeze`), so later passes walk
only what was made since; it runs at moments that already pause (a block loaded and its
compiled decode warmed, a block unloaded, a gateway serving), as vLLM does after start-up.
`reclaim=True` first unfreezes, so a dropped stage's cyclic garbage is collected.
Only processes that own their heap settle it: `tessera agent`, `tessera gateway` and
`tessera up` read `TESSERA_GC_FREEZE` (`wanted`; `0` turns it off) and call `settle` only
when on (the agent passes it to `hosting` as `LoadDefaults.gc_settle`).
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
    return env_flags.on(environ, ENV)


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
