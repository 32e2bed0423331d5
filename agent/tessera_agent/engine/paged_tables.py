"""A step's chunks as paged-attention libraries take them: CSR page tables per group.

`step_tables` splits a step's chunks (in the flat batch's row order, as
`attention.build_metadata` lays them out) into the decode group (one query token each) and
the prefill group (the rest), each with the arrays FlashInfer's `plan` wants (`kv_indptr`,
`kv_indices`, `kv_last_page_len`, `qo_indptr`) and the lengths flex_attention's block masks
are built from; `assemble` puts the two groups' outputs back in row order. Pure Python
over small ints, plus one assembly on tensors. Used by `flex_paged.py` and
`flashinfer_paged.py`, whose backends `attention_backend.make` builds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tessera_agent.engine import attention


class BackendUnavailable(RuntimeError):
    """An attention backend was asked for where it cannot run (the message says why)."""


@dataclass(frozen=True)
class PagedGroup:
    """Chunks of one kind (decodes, or prefill chunks) as a paged-attention library wants
    them, in row order: CSR page lists and per-chunk lengths."""

    chunks: tuple[int, ...]  # index of each chunk in the step
    rows: tuple[int, ...]  # flat-batch rows of their query tokens, in order
    qo_indptr: tuple[int, ...]  # [n+1] query-token offsets of each chunk within `rows`
    kv_indptr: tuple[int, ...]  # [n+1] offsets of each chunk's pages within `kv_indices`
    kv_indices: tuple[int, ...]  # the pages covering each chunk's context, chunk by chunk
    kv_last_page_len: tuple[int, ...]  # [n] tokens used in each chunk's last page (1..ps)
    kv_lens: tuple[int, ...]  # [n] context length (cached tokens + this chunk's)
    q_starts: tuple[int, ...]  # [n] position of each chunk's first query token


@dataclass(frozen=True)
class StepTables:
    """A step's chunks split into the decode group (one query token each) and the
    prefill group (the rest), each with its page tables."""

    decode: PagedGroup
    prefill: PagedGroup
    num_tokens: int
    # With `fresh_apart`: runs of consecutive prompt chunks from position 0 of one length,
    # (first row, count, q_len), left out of `prefill` (attended over their own keys).
    fresh: tuple[tuple[int, int, int], ...] = ()

    @property
    def decode_leading(self) -> bool:
        """The decode rows are exactly rows [0, B)."""
        return self.decode.rows == tuple(range(len(self.decode.rows)))


def _group(
    chunks: Sequence[attention.Chunk], picked: list[int], rows0: list[int], ps: int
) -> PagedGroup:
    rows: list[int] = []
    qo, kvp = [0], [0]
    idx: list[int] = []
    last: list[int] = []
    lens: list[int] = []
    starts: list[int] = []
    for i in picked:
        c = chunks[i]
        ctx = c.start + c.num_tokens
        npages = -(-ctx // ps)
        if len(c.block_table) < npages:
            raise ValueError(f"chunk {i}: {len(c.block_table)} pages cannot hold {ctx} tokens")
        rows.extend(range(rows0[i], rows0[i] + c.num_tokens))
        qo.append(qo[-1] + c.num_tokens)
        idx.extend(c.block_table[:npages])
        kvp.append(len(idx))
        last.append(ctx - (npages - 1) * ps)
        lens.append(ctx)
        starts.append(c.start)
    return PagedGroup(
        tuple(picked), tuple(rows), tuple(qo), tuple(kvp), tuple(idx), tuple(last),
        tuple(lens), tuple(starts),
    )  # fmt: skip


def step_tables(
    chunks: Sequence[attention.Chunk], page_size: int, fresh_apart: bool = False
) -> StepTables:
    """The step's decode and prefill groups (`PagedGroup`), in the flat batch's row order
    (the order `attention.build_metadata` lays the tokens out); `fresh_apart`: prompt
    chunks from position 0 go to `fresh` runs instead of the prefill group."""
    rows0, row = [], 0
    for c in chunks:
        rows0.append(row)
        row += c.num_tokens
    dec = [i for i, c in enumerate(chunks) if c.num_tokens == 1]
    fresh_idx = [
        i for i, c in enumerate(chunks) if fresh_apart and c.num_tokens > 1 and c.start == 0
    ]
    pre = [i for i, c in enumerate(chunks) if c.num_tokens != 1 and i not in fresh_idx]
    runs: list[tuple[int, int, int]] = []
    for i in fresh_idx:
        r, n = rows0[i], chunks[i].num_tokens
        if runs and runs[-1][2] == n and runs[-1][0] + runs[-1][1] * n == r:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, n)
        else:
            runs.append((r, 1, n))
    return StepTables(
        _group(chunks, dec, rows0, page_size),
        _group(chunks, pre, rows0, page_size),
        row,
        tuple(runs),
    )


def logical_pages(tables: StepTables) -> dict[int, int] | None:
    """Each page of the step -> its index in the block tables that hold it; None when a
    page sits at two different indices (two sequences sharing it at different
    positions, which no prefix cache makes: such a step takes the native paths)."""
    at: dict[int, int] = {}
    for g in (tables.decode, tables.prefill):
        for n in range(len(g.chunks)):
            for j, p in enumerate(g.kv_indices[g.kv_indptr[n] : g.kv_indptr[n + 1]]):
                if at.setdefault(p, j) != j:
                    return None
    return at


def assemble(
    t: int,
    like: torch.Tensor,
    tables: StepTables,
    decode_rows: torch.Tensor | None,
    prefill_rows: torch.Tensor | None,
    od: torch.Tensor | None,
    op: torch.Tensor | None,
) -> torch.Tensor:
    """The step's [T, nh, hd] output from the decode group's and the prefill group's:
    no copy when the step is one group in row order."""
    if op is None and od is not None and tables.decode_leading and od.shape[0] == t:
        return od
    if od is None and op is not None and op.shape[0] == t:
        return op  # the prefill rows are every row, in order
    out = torch.empty(t, *like.shape[1:], dtype=like.dtype, device=like.device)
    if od is not None and decode_rows is not None:
        out.index_copy_(0, decode_rows, od)
    if op is not None and prefill_rows is not None:
        out.index_copy_(0, prefill_rows, op)
    return out
