"""The gloo transport: a process group over TCP for CPU tensors (and the CPU fallback).

Called by `group.form` when a group's devices are not all CUDA devices. The backend object
is built directly over a prefixed store, so many groups live in one process without
touching torch.distributed's global state.
"""

from __future__ import annotations

import datetime

from torch._C import _distributed_c10d as c10d

NAME = "gloo"


def make(store: c10d.Store, rank: int, size: int, timeout_s: float) -> c10d.Backend:
    """A gloo group of `size` ranks; blocks until every rank has joined (store timeout)."""
    return c10d.ProcessGroupGloo(store, rank, size, datetime.timedelta(seconds=timeout_s))
