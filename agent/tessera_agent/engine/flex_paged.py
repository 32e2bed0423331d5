"""Paged attention with PyTorch's `flex_attention`: the pool read in place, pages as data.

The layer's pool `[num_slots, nkv, hd]` is viewed without a copy as one key sequence whose
KV blocks are the pages; a step's block mask lists, per query block, the physical pages it
reads. Decode: one batch row per sequence (full pages unmasked, the last page masked).
Prefill chunks that read the cache: blocks of 128 queries over their chunks' pages; fresh
prompts use SDPA over their own keys, as the native path does. The mask function is exact
on its own, so the CPU's unfused reference can be checked against native. Compiled on
CUDA; eager on CPU (tests only). Made by `attention_backend.make`; planned per step by the
runner; run by every layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from tessera_agent.engine import attention, paged_tables

Q_BLOCK = 128  # query rows per block of a prefill mask (flex's default block size)


def available() -> str | None:
    """None when this torch has the flex_attention API the backend uses, else why not."""
    try:
        from torch.nn.attention import flex_attention as fa
    except ImportError as exc:
        return f"torch {torch.__version__} has no flex_attention ({exc})"
    if not hasattr(fa.BlockMask, "from_kv_blocks"):
        return f"torch {torch.__version__}: BlockMask.from_kv_blocks is missing"
    return None


def _pad(rows: list[list[int]], width: int, fill: int) -> list[list[int]]:
    return [r + [fill] * (width - len(r)) for r in rows]


def _width(n: int) -> int:
    """A table width of at least n, rounded up to a power of two (fewer shapes to compile)."""
    return 1 << max(n - 1, 0).bit_length()


class FlexKernel:
    """One step's block masks and tables; `attend` is run by every layer."""

    def __init__(
        self,
        backend: FlexBackend,
        tables: paged_tables.StepTables,
        decode: tuple[Any, torch.Tensor] | None,
        prefill: tuple[Any, torch.Tensor] | None,
    ) -> None:
        self.b, self.tables, self.dec, self.pre = backend, tables, decode, prefill

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        t, nh, hd = q.shape
        nkv = k_cache.shape[1]
        kp = k_cache.view(1, -1, nkv, hd).transpose(1, 2)  # [1, nkv, slots, hd], no copy
        vp = v_cache.view(1, -1, nkv, hd).transpose(1, 2)
        scale, tables = self.b.scale, self.tables
        od = None
        if self.dec is not None:
            mask, rows = self.dec
            qd = q if tables.decode_leading and rows.numel() == t else q[rows]
            od = self.b.flex(qd.unsqueeze(2), kp, vp, block_mask=mask, scale=scale, enable_gqa=True)
            od = od.squeeze(2)
            if rows.numel() == t and tables.decode_leading:
                assert isinstance(od, torch.Tensor)
                return od  # a pure decode step
        out = torch.empty_like(q)
        if od is not None and self.dec is not None:
            out.index_copy_(0, self.dec[1], od)
        if self.pre is not None:
            mask, rows = self.pre
            op = self.b.flex(
                q[rows].transpose(0, 1).unsqueeze(0),
                kp,
                vp,
                block_mask=mask,
                scale=scale,
                enable_gqa=True,
                kernel_options=self.b.prefill_options,
            )
            out.index_copy_(0, rows, op.squeeze(0).transpose(0, 1))
        for row, count, n in tables.fresh:  # over their own keys: SDPA (flash on CUDA)
            span = slice(row, row + count * n)
            qs = q[span].view(count, n, nh, hd).transpose(1, 2)
            ks = k[span].view(count, n, nkv, hd).transpose(1, 2)
            vs = v[span].view(count, n, nkv, hd).transpose(1, 2)
            os_ = F.scaled_dot_product_attention(
                qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True
            )
            out[span] = os_.transpose(1, 2).reshape(count * n, nh, hd)
        return out


class FlexBackend:
    """A stage's flex_attention backend: the compiled function and the page -> block-table
    index map it keeps on the device (`logical`), resized with the pool."""

    name = "flex"

    def __init__(
        self, device: torch.device, page_size: int, heads: tuple[int, int, int], scale: float
    ) -> None:
        why = available()
        if why is not None:
            raise paged_tables.BackendUnavailable(why)
        from torch.nn.attention import flex_attention as fa

        self.fa = fa
        self.device, self.ps, self.heads, self.scale = device, page_size, heads, scale
        self.compiled = device.type != "cpu"
        self.flex: Callable[..., Any] = fa.flex_attention
        if self.compiled:
            self.flex = torch.compile(fa.flex_attention)
        self.logical = torch.zeros(0, dtype=torch.long, device=device)
        # The many-query kernel's tiles must divide the mask's blocks: its KV tile (64 or
        # more in Inductor's configs) is cut to the page when pages are smaller (the decode
        # kernel does that itself).
        self.prefill_options: dict[str, Any] | None = (
            {"BLOCK_M": 64, "BLOCK_N": page_size} if page_size % 64 else None
        )

    def _mask(
        self,
        num_blocks: list[int],
        indices: list[list[int]],
        full_blocks: list[int] | None,
        full_indices: list[list[int]] | None,
        q_block: int,
        q_len: int,
        num_pages: int,
        mask_mod: Callable[..., torch.Tensor],
    ) -> Any:
        """A BlockMask with one row per batch entry (decode) or per query block (prefill),
        from page lists (kv_indices padded to one width; the CPU compiler wants the pool's)."""
        n = len(num_blocks)
        widest = max([len(r) for r in indices] + [len(r) for r in full_indices or []] + [1])
        w = num_pages if self.device.type == "cpu" else min(_width(widest), num_pages)
        dev, i32 = self.device, torch.int32

        def t(x: list[Any]) -> torch.Tensor:
            return torch.tensor(x, dtype=i32, device=dev)

        decode = q_len == 1
        shape_n, shape_i = ((n, 1, 1), (n, 1, 1, w)) if decode else ((1, 1, n), (1, 1, n, w))
        fn = fi = None
        if full_blocks is not None and full_indices is not None:
            fn = t(full_blocks).view(shape_n)
            fi = t(_pad(full_indices, w, 0)).view(shape_i)
        return self.fa.BlockMask.from_kv_blocks(
            t(num_blocks).view(shape_n),
            t(_pad(indices, w, 0)).view(shape_i),
            fn,
            fi,
            BLOCK_SIZE=(q_block, self.ps),
            mask_mod=mask_mod,
            seq_lengths=(q_len, num_pages * self.ps),
            compute_q_blocks=False,
        )

    def plan(
        self, chunks: Sequence[attention.Chunk], num_pages: int
    ) -> attention.StepKernel | None:
        tables = paged_tables.step_tables(chunks, self.ps, fresh_apart=True)
        at = paged_tables.logical_pages(tables)
        if at is None:
            return None
        if self.logical.numel() != num_pages:
            self.logical = torch.zeros(num_pages, dtype=torch.long, device=self.device)
        if at:
            pages = torch.tensor(list(at), dtype=torch.long)
            self.logical[pages.to(self.device)] = torch.tensor(list(at.values())).to(self.device)
        dec = self._decode(tables.decode, num_pages) if tables.decode.chunks else None
        pre = self._prefill(tables.prefill, num_pages) if tables.prefill.chunks else None
        return FlexKernel(self, tables, dec, pre)

    def _group_tables(self, g: paged_tables.PagedGroup) -> torch.Tensor:
        pages = [
            list(g.kv_indices[g.kv_indptr[i] : g.kv_indptr[i + 1]]) for i in range(len(g.chunks))
        ]
        width = _width(max(len(p) for p in pages))  # fewer shapes for the compiler
        return torch.tensor(_pad(pages, width, -1), dtype=torch.long, device=self.device)

    def _decode(self, g: paged_tables.PagedGroup, num_pages: int) -> tuple[Any, torch.Tensor]:
        ps = self.ps
        table = self._group_tables(g)
        last = torch.tensor([n - 1 for n in g.kv_lens], dtype=torch.long, device=self.device)
        logical = self.logical

        def mask_mod(
            b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor
        ) -> torch.Tensor:
            page = kv // ps
            j = logical[page].clamp(0, table.shape[1] - 1)
            return (table[b, j] == page) & (j * ps + kv % ps <= last[b])

        full, part, nfull, npart = [], [], [], []
        for i in range(len(g.chunks)):
            pages = list(g.kv_indices[g.kv_indptr[i] : g.kv_indptr[i + 1]])
            k = g.kv_lens[i] // ps  # pages every slot of which is visible
            full.append(pages[:k])
            part.append(pages[k:])
            nfull.append(k)
            npart.append(len(pages) - k)
        mask = self._mask(npart, part, nfull, full, Q_BLOCK, 1, num_pages, mask_mod)
        return mask, torch.tensor(g.rows, dtype=torch.long, device=self.device)

    def _prefill(self, g: paged_tables.PagedGroup, num_pages: int) -> tuple[Any, torch.Tensor]:
        ps = self.ps
        table = self._group_tables(g)
        q_chunk: list[int] = []
        q_pos: list[int] = []
        for i in range(len(g.chunks)):
            n = g.qo_indptr[i + 1] - g.qo_indptr[i]
            q_chunk.extend([i] * n)
            q_pos.extend(range(g.q_starts[i], g.q_starts[i] + n))
        qc = torch.tensor(q_chunk, dtype=torch.long, device=self.device)
        qp = torch.tensor(q_pos, dtype=torch.long, device=self.device)
        logical = self.logical

        def mask_mod(
            b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor
        ) -> torch.Tensor:
            page = kv // ps
            j = logical[page].clamp(0, table.shape[1] - 1)
            c = qc[q]
            return (table[c, j] == page) & (j * ps + kv % ps <= qp[q])

        tp = len(q_chunk)
        blocks: list[list[int]] = []
        for lo in range(0, tp, Q_BLOCK):
            seen: dict[int, None] = {}
            for c in sorted(set(q_chunk[lo : lo + Q_BLOCK])):
                # the pages up to the block's last query of this chunk
                last = max(q_pos[r] for r in range(lo, min(lo + Q_BLOCK, tp)) if q_chunk[r] == c)
                pages = g.kv_indices[g.kv_indptr[c] : g.kv_indptr[c + 1]]
                seen.update(dict.fromkeys(pages[: last // ps + 1]))
            blocks.append(list(seen))
        mask = self._mask(
            [len(b) for b in blocks], blocks, None, None, Q_BLOCK, tp, num_pages, mask_mod
        )
        return mask, torch.tensor(g.rows, dtype=torch.long, device=self.device)
