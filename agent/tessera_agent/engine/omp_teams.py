"""Releases the OpenMP thread team of a helper thread (a loader, the thread that built a
stage) once its torch work is done, so the compute thread's team keeps spinning between
parallel regions.

GNU libgomp (PyTorch's CPU wheels) keeps a worker pool for every thread that ever ran a
parallel region; once the process's OpenMP threads outnumber its CPUs it stops spinning
between regions and every region of a step wakes its workers through a futex (the cost
measured: docs/benchmarks-log.md, "Issue 16: OpenMP teams"). `release()` frees the
calling thread's team (`omp_pause_resource_all`); `released` and `ReleasingPool` do it
after each job. The agent's `EngineOptions.omp_release` (`TESSERA_OMP_RELEASE=0`: keep
every team) decides whether its callers (`server.py`, `hosting.py`) use them. A no-op
returning False where no libgomp is loaded.
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
