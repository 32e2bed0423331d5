"""Releases the OpenMP thread team of a helper thread (a loader, the thread that built a
stage) once its torch work is done, so the compute thread's team keeps spinning between
parallel regions.

GNU libgomp, which PyTorch's CPU wheels use, keeps a pool of worker threads for every
thread that ever ran a parallel region, for as long as that thread lives. Once the
process's OpenMP threads outnumber its CPUs, libgomp stops spinning between regions (its
"throttled" spin count, ~100 spins) and every region a step runs (hundreds per decode step)
wakes its workers through a futex instead. An agent with N threads loads on its loader
thread and computes on its compute thread: two teams of N. On the 2-core machine a batch-8
decode step ran 1.6-2x slower on the compute thread than the same step on the thread that
had loaded (docs/benchmarks-log.md, "Issue 16: OpenMP teams"); a 20 000-call loop of batch-8
linears took 2.9-3.2 s against 0.9-1.0 s once the loading thread's team was released.

`release()` frees the calling thread's team (`omp_pause_resource_all`, OpenMP 5.0; libgomp
frees the caller's pool); a later parallel region on that thread builds a new one. A thread
that exits frees its team itself. `TESSERA_OMP_RELEASE=0` keeps every team: the agent's
`EngineOptions.omp_release`, which its callers (`server.py`, `hosting.py`) pass on. A
no-op returning False where no libgomp is loaded (another OpenMP runtime, or none).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import logging
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

log = logging.getLogger(__name__)

_OMP_PAUSE_SOFT = 1
P = ParamSpec("P")
R = TypeVar("R")


@functools.cache
def _pause() -> Callable[[int], int] | None:
    """`omp_pause_resource_all` of the libgomp this process loaded (torch's), or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libgomp" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            fn = ctypes.CDLL(path).omp_pause_resource_all
        except (OSError, AttributeError):
            continue
        fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
        return fn
    log.debug("no libgomp loaded: OpenMP teams are left as they are")
    return None


def release() -> bool:
    """Free the calling thread's OpenMP team; True when libgomp did."""
    fn = _pause()
    return fn is not None and fn(_OMP_PAUSE_SOFT) == 0


def released(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn`, then release the calling thread's team (for jobs run on helper threads)."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        finally:
            release()

    return run


class ReleasingPool(concurrent.futures.ThreadPoolExecutor):
    """A thread pool whose threads release their team after every job (the agent's loader
    and its event loop's default executor); with `release` False, a plain pool."""

    def __init__(self, *args: Any, release: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.release = release

    def submit(
        self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> concurrent.futures.Future[R]:
        return super().submit(released(fn) if self.release else fn, *args, **kwargs)
