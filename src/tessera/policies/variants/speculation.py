"""Which blocks to speculate on, and when a surrogate's guess counts as right (BlockLLM §5.2).

`pick` applies the paper's two rules to the top-k bottleneck blocks of a chain: never the
last block (its output goes back to the scheduler and cannot be corrected) and never two
consecutive blocks (errors and wasted work would pile up); a block is worth it only when
its surrogate is faster than the block itself. `agrees` is the verification: the block's
real output must match the guess within `Tolerance` (max absolute difference against
`atol + rtol * max|real|`), else the downstream work started from the guess is thrown away
and redone. Pure; called by `tessera_agent.speculate` and `tessera bench speculate`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tessera import fields


@dataclass(frozen=True)
class Tolerance:
    """How close the guess must be. Tight by default: downstream work kept from a guess
    must give the tokens the real output gives, so the guess must be (almost) exact."""

    rtol: float = 1e-6
    atol: float = 0.0

    def __post_init__(self) -> None:
        if self.rtol < 0 or self.atol < 0:
            raise fields.FieldError("tolerance", "rtol and atol must be >= 0")


def agrees(max_abs_diff: float, real_scale: float, tol: Tolerance) -> bool:
    """Whether a guess off by `max_abs_diff` from an output of magnitude `real_scale` is kept."""
    return max_abs_diff <= tol.atol + tol.rtol * real_scale


def pick(
    block_seconds: Sequence[float], surrogate_seconds: Mapping[int, float], k: int
) -> tuple[int, ...]:
    """Up to `k` blocks to speculate on, slowest first (module docstring), sorted."""
    if k < 0:
        raise fields.FieldError("k", "must be >= 0")
    last = len(block_seconds) - 1
    chosen: list[int] = []
    for i in sorted(range(len(block_seconds)), key=lambda i: (-block_seconds[i], i)):
        if len(chosen) == k:
            break
        if i == last or i not in surrogate_seconds:
            continue
        if surrogate_seconds[i] >= block_seconds[i]:
            continue
        if i - 1 in chosen or i + 1 in chosen:
            continue
        chosen.append(i)
    return tuple(sorted(chosen))
