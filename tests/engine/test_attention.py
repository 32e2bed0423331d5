"""The paged-attention paths (engine/attention.py) against plain attention per sequence.

One step mixes every path: a decode that is not in the leading rows, two fresh prompt
chunks of equal length (batched together), a fresh chunk of another length, and a chunk
that continues a sequence whose first tokens are already in the cache.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tessera_agent.engine import attention, decode_tables

PS, NH, NKV, HD = 4, 4, 2, 8


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """q: [n, NH, HD] at positions start..start+n-1; k/v: [start+n, NKV, HD]."""
    rep = NH // NKV
    kk, vv = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, kk) / math.sqrt(HD)
    pos_q = torch.arange(start, start + q.shape[0])[:, None]
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > pos_q, float("-inf"))
    return torch.einsum("hqk,khd->qhd", F.softmax(scores, dim=-1), vv)


def test_mixed_step_matches_plain_attention() -> None:
    g = torch.Generator().manual_seed(0)
    # (start, num_tokens, block_table): a continued chunk, a decode, fresh 5, fresh 5,
    # fresh 3, another decode.
    chunks = [
        attention.ChunkGeometry(3, 4, (7, 2)),
        attention.ChunkGeometry(9, 1, (0, 5, 9)),
        attention.ChunkGeometry(0, 5, (1, 3)),
        attention.ChunkGeometry(0, 5, (4, 6)),
        attention.ChunkGeometry(0, 3, (8,)),
        attention.ChunkGeometry(5, 1, (10, 11)),
    ]
    k_cache = torch.zeros(12 * PS, NKV, HD)
    v_cache = torch.zeros(12 * PS, NKV, HD)
    # Full K/V of every sequence; the part before `start` is already in the cache.
    full_k = [torch.randn(c.start + c.num_tokens, NKV, HD, generator=g) for c in chunks]
    full_v = [torch.randn(c.start + c.num_tokens, NKV, HD, generator=g) for c in chunks]
    for c, fk, fv in zip(chunks, full_k, full_v, strict=True):
        if c.start:
            slots = attention.slots_of(c.block_table, c.start, PS)
            k_cache[slots], v_cache[slots] = fk[: c.start], fv[: c.start]
    md = attention.build_metadata(chunks, PS, torch.device("cpu"))
    assert not md.decode_leading and len(md.prefill) == 1
    assert [(f.count, f.q_len) for f in md.fresh] == [(2, 5), (1, 3)]
    t = sum(c.num_tokens for c in chunks)
    q = torch.randn(t, NH, HD, generator=g)
    k = torch.cat([fk[c.start :] for c, fk in zip(chunks, full_k, strict=True)])
    v = torch.cat([fv[c.start :] for c, fv in zip(chunks, full_v, strict=True)])
    out = attention.paged_attention(q, k, v, md, k_cache, v_cache, 1 / math.sqrt(HD))
    row = 0
    for c, fk, fv in zip(chunks, full_k, full_v, strict=True):
        want = _reference(q[row : row + c.num_tokens], fk, fv, c.start)
        torch.testing.assert_close(out[row : row + c.num_tokens], want, atol=1e-5, rtol=1e-5)
        row += c.num_tokens
    # This step's keys were written into the cache at each sequence's slots.
    for c, fk in zip(chunks, full_k, strict=True):
        slots = attention.slots_of(c.block_table, c.start + c.num_tokens, PS)
        torch.testing.assert_close(k_cache[slots], fk)


def test_pure_decode_step_uses_leading_rows() -> None:
    chunks = [attention.ChunkGeometry(s, 1, (i, i + 3)) for i, s in enumerate((2, 6, 4))]
    md = attention.build_metadata(chunks, PS, torch.device("cpu"))
    assert md.decode_leading and not md.fresh and not md.prefill
    assert md.positions.tolist() == [2, 6, 4] and md.max_position == 6
    assert md.slot_mapping.tolist() == [0 * PS + 2, 4 * PS + 2, 5 * PS + 0]


def test_grouped_decode_equals_gqa_decode() -> None:
    """`decode_grouped` (CUDA's decode path) computes the GQA attention of one query."""
    g = torch.Generator().manual_seed(0)
    b, nh, nkv, hd, length = 3, 8, 2, 16, 37
    q = torch.randn(b, nh, hd, generator=g)
    k = torch.randn(b, nkv, length, hd, generator=g)
    v = torch.randn(b, nkv, length, hd, generator=g)
    lens = torch.tensor([37, 5, 20])
    mask = torch.zeros(b, 1, 1, length).masked_fill_(
        (torch.arange(length)[None, :] >= lens[:, None])[:, None, None, :], float("-inf")
    )
    want = torch.nn.functional.scaled_dot_product_attention(
        q.unsqueeze(2), k, v, attn_mask=mask, scale=0.25, enable_gqa=True
    ).squeeze(2)
    got = attention.decode_grouped(q, k, v, mask, 0.25)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_small_decode_tables_equal_the_tensor_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python-built gather table and mask of a small decode group are the tensor path's."""
    g = torch.Generator().manual_seed(3)
    ps = 16
    for trial in range(20):
        chunks: list[attention.ChunkGeometry] = []
        for i in range(int(torch.randint(1, 9, (1,), generator=g))):
            start = int(torch.randint(0, 100, (1,), generator=g))
            n = 1 if trial % 3 or i % 2 else int(torch.randint(2, 20, (1,), generator=g))
            pages = -(-(start + n) // ps) + int(torch.randint(0, 2, (1,), generator=g))
            table = tuple(int(p) for p in torch.randperm(64, generator=g)[:pages] + 1)
            chunks.append(attention.ChunkGeometry(start, n, table))
        small = attention.build_metadata(chunks, ps, torch.device("cpu"))
        monkeypatch.setattr(decode_tables, "SMALL_SLOTS", -1)
        big = attention.build_metadata(chunks, ps, torch.device("cpu"))
        monkeypatch.undo()
        for name in ("decode_gather", "decode_mask", "positions", "slot_mapping", "decode_rows"):
            a, b = getattr(small, name), getattr(big, name)
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), name
