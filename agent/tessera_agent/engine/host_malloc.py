"""Keeps an agent's freed step temporaries in its heap instead of handing them back to the
OS and faulting them in again on the next step (glibc `mallopt`).

A many-row eager step allocates multi-MB temporaries per layer (a 2048-row step: the
gate/up output alone is 11.5 MB). glibc serves blocks above its mmap threshold with fresh
`mmap`s and trims the heap top above its trim threshold, both adapting at run time; either
way, the pages come back zeroed and faulted on the next step: 25-180 k minor faults per
128-prompt prefill run on the default tiny model, 7-20 % of its CPU (docs/benchmarks-log.md,
"Issue 16 (prefill path)"). vLLM's CPU docs preload tcmalloc for the same reason. `tune`
fixes the mmap threshold at glibc's 64-bit ceiling (32 MB: larger blocks, the KV pool and
weights, stay mmap'd) and the trim threshold at `TRIM_BYTES`, which is the most free heap
the process keeps. Called once by the agent process at start (`server.serve`) with its
`EngineOptions.malloc_tune` (`TESSERA_MALLOC_TUNE=0` leaves glibc's defaults). A no-op
returning False off glibc.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers
MMAP_BYTES = 32 << 20  # glibc's largest mmap threshold on 64-bit
TRIM_BYTES = 256 << 20


def tune(on: bool = True) -> bool:
    """Set the thresholds (once per process is enough) when `on`; True when glibc took both."""
    if not on or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl, ...): leave the allocator alone
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES)
    )
    log.info("malloc thresholds: mmap %d, trim %d bytes (%s)", MMAP_BYTES, TRIM_BYTES, ok)
    return ok
