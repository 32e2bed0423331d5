"""Residual add + RMSNorm as one function: `add_rms_norm(x, delta, norm)` returns
(x + delta, norm(x + delta)).

Every decoder layer calls it between attention and MLP (`model.DecoderLayer`). On CUDA
the two are one kernel: the add and `F.rms_norm` compiled together by Inductor (Triton,
dynamic shapes, compiled once per process at the first call; the CUDA-graph capture's
warm-up runs come before any capture). On CPU, and wherever that compile fails (logged
once, then eager for the process), it is the eager add followed by `model.RMSNorm`,
exactly today's ops: the CPU path's speed and the float32 oracle are unchanged.
Called by `model.py`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

Pair = tuple[torch.Tensor, torch.Tensor]
Fused = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], Pair]


class Norm(Protocol):
    """`model.RMSNorm`'s face."""

    @property
    def weight(self) -> torch.Tensor: ...

    @property
    def eps(self) -> float: ...

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


def _add_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> Pair:
    h = x + delta
    return h, F.rms_norm(h, weight.shape, weight, eps)


class _Compiled:
    """The CUDA kernel, built at first use; `broken` once a compile failed."""

    def __init__(self) -> None:
        self.fn: Fused | None = None
        self.broken = ""

    def __call__(
        self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> Pair | None:
        if self.broken:
            return None
        if self.fn is None:
            self.fn = torch.compile(_add_norm, dynamic=True, fullgraph=True)
        try:
            return self.fn(x, delta, weight, eps)
        except Exception as exc:  # no Triton, an unsupported GPU: eager from now on
            self.broken = repr(exc)
            log.warning("fused residual + RMSNorm: compile failed, eager from now on: %r", exc)
            return None


@functools.cache
def _compiled() -> _Compiled:
    return _Compiled()


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, norm: Norm) -> Pair:
    """(x + delta, norm(x + delta)): fused on CUDA, today's two eager steps elsewhere."""
    if x.is_cuda and not torch.compiler.is_compiling():
        both = _compiled()(x, delta, norm.weight, norm.eps)
        if both is not None:
            return both
    h = x + delta
    return h, norm(h)
