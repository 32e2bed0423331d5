"""A decode group's gather table and additive mask: which KV slots each decode row reads.

`build` turns the decode rows' page tables and context lengths into the [B, Lmax] slot
table (slot 0 past a row's context) and the [B, 1, 1, Lmax] additive mask (0 inside, -inf
past it) that decode attention reads. A small group (rows x longest context <=
`SMALL_SLOTS`) is built in Python with two `torch.tensor` calls, a large one with tensor
ops: a decode step's eager ops between compiled graphs cost several times their isolated
time (the graph streams the weights through the caches), and the ~12 ops of the tensor path
were most of a small step's (docs/benchmarks-log.md, issue 29). Called by
`attention.build_metadata`.
"""

from __future__ import annotations

import torch

SMALL_SLOTS = 1024  # rows x longest context built in Python


def build(
    tables: list[tuple[int, ...]], lens: list[int], ps: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(gather [B, Lmax] long, mask [B, 1, 1, Lmax] float32) of the decode rows with these
    page tables and context lengths, pages of `ps` slots."""
    lmax = max(lens)
    if len(lens) * lmax <= SMALL_SLOTS:
        return _small(tables, lens, ps, lmax, device)
    npages = -(-lmax // ps)
    padded = torch.tensor(
        [list(t[:npages]) + [0] * (npages - len(t[:npages])) for t in tables], dtype=torch.long
    )
    gather = (padded[:, :, None] * ps + torch.arange(ps)[None, None, :]).reshape(len(lens), -1)[
        :, :lmax
    ]
    inside = (torch.arange(lmax)[None, :] < torch.tensor(lens)[:, None])[:, None, None, :]
    # Positions past a sequence's context read slot 0, masked: one cached row instead
    # of stale slots of its last page or page 0's (the padding of a step's shorter
    # contexts was a fifth of the KV read at contexts 64-96).
    gather = gather.masked_fill(~inside[:, 0, 0, :], 0)
    # Additive float mask built once per step (a bool mask is converted per layer).
    mask = torch.zeros(inside.shape).masked_fill_(~inside, float("-inf"))
    return gather.to(device), mask.to(device)


def _small(
    tables: list[tuple[int, ...]], lens: list[int], ps: int, lmax: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    offsets = range(ps)
    gather: list[list[int]] = []
    mask: list[list[float]] = []
    inf = float("-inf")
    for bt, n in zip(tables, lens, strict=True):
        row = [page * ps + o for page in bt[: -(-n // ps)] for o in offsets][:n]
        gather.append(row + [0] * (lmax - n))
        mask.append([0.0] * n + [inf] * (lmax - n))
    g = torch.tensor(gather, dtype=torch.long, device=device)
    m = torch.tensor(mask, dtype=torch.float32, device=device).view(len(lens), 1, 1, lmax)
    return g, m
