"""Attention over the paged KV cache, and the per-step metadata every layer shares.

`build_metadata` turns a step's chunks into tensors once per step (positions, KV slots, the
decode gather table and mask, prefill segments); `paged_attention` is called by every layer's
`Attention.forward` with it. Three paths: decode rows attended in one batched call over their
gathered pages (sliced, not gathered, when they lead the step; in the compiled decode graph,
slot-indexed reductions `_decode_fused` reading the pool in place, unless
`TESSERA_DECODE_ATTN=gather`); fresh same-length prompt chunks from position 0 in one batched
causal call over their own keys; other prefill chunks read their context from the cache, one
call each, with an explicit causal mask. A step planned by a kernel library
(`attention_backend.py`) carries its `StepKernel` and every layer attends through it.
Called by `runner.py` (metadata) and `model.py` (attention).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from tessera_agent.engine import decode_tables


class Chunk(Protocol):
    """What attention needs of one chunk of a step (`step.SeqChunk` has it)."""

    @property
    def start(self) -> int: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def block_table(self) -> tuple[int, ...]: ...


class PackedRows(Protocol):
    """What a step carries of its stage's prepacked projections (`packed_linear.StagePacks`
    has it): declared here, where the metadata carries them, so that attention imports
    none of the modules above it (`tests/test_import_cycles.py`)."""

    @property
    def graph(self) -> PromptRows | None: ...

    def get(self, mod: nn.Module) -> torch.Tensor | None: ...


class PromptRows(Protocol):
    """The compiled many-row layer parts the packs carry (`prompt_graph.PromptGraph`).
    `layers` are the stage's `model.DecoderLayer`s (`Any`: this module imports no model)."""

    def forward(
        self,
        layers: list[Any],
        x: torch.Tensor,
        md: AttentionMetadata,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        packs: PackedRows,
    ) -> torch.Tensor | None: ...


class StepKernel(Protocol):
    """A library's attention for one step, planned once (`attention_backend.Backend.plan`)
    and run by every layer after this step's keys and values are in the pool: q [T, nh,
    hd] in (k, v [T, nkv, hd]: the step's own, which a fresh prompt may attend over
    directly), [T, nh, hd] out, reading the pool's pages in place."""

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class ChunkGeometry:
    """A bare `Chunk` (tests, profiling)."""

    start: int  # tokens of the sequence already in the cache
    num_tokens: int  # query tokens in this step
    block_table: tuple[int, ...]  # KV pages covering start + num_tokens


@dataclass
class PrefillSegment:
    """A chunk of `q_len` query tokens at rows [row, row+q_len) whose context is `slots`."""

    row: int
    q_len: int
    slots: torch.Tensor  # [ctx_len] KV slots of positions 0..ctx_len-1 (chunk included)
    mask: torch.Tensor | None  # [q_len, ctx_len] bool, None when plain causal from 0


@dataclass(frozen=True)
class FreshGroup:
    """`count` consecutive prompt chunks of `q_len` tokens each, starting at position 0,
    at rows [row, row + count * q_len): attended together over their own keys."""

    row: int
    count: int
    q_len: int


@dataclass
class AttentionMetadata:
    """Per-step tensors shared by every layer of a stage (built once by the runner).

    Tokens of all sequences in the step are flattened into one [T, ...] batch.
    """

    positions: torch.Tensor  # [T] absolute position of each token
    slot_mapping: torch.Tensor  # [T] flat KV slot (page * page_size + offset) to write
    # Decode group: sequences contributing exactly one query token, attended in one batch.
    decode_rows: torch.Tensor  # [B] row of each decode token in the flat batch
    decode_gather: torch.Tensor  # [B, Lmax] KV slots to read (padded with slot 0)
    decode_mask: torch.Tensor  # [B, 1, 1, Lmax] additive: 0 inside the context, -inf past it
    # Prefill chunks that read the cache: one entry per chunk.
    prefill: list[PrefillSegment]
    decode_leading: bool = False  # the decode rows are exactly rows [0, B)
    fresh: list[FreshGroup] = field(default_factory=list)  # batched prompt chunks from 0
    max_position: int = 0  # largest position in the step (sizes the RoPE table)
    cos: torch.Tensor | None = None  # [T, head_dim], filled by StageModel.forward
    sin: torch.Tensor | None = None  # [T, head_dim], sin with its first half negated
    # Eager steps gather every layer's decode K/V into two buffers made once per step (a
    # fresh multi-MB tensor per layer cost 20 % of a 48-decode step in page faults);
    # the compiled decode graph leaves this off and allocates inside its own code.
    reuse_gather: bool = False
    gather_out: tuple[torch.Tensor, torch.Tensor] | None = None
    # The stage's prepacked projection weights for an eager step's many rows
    # (`packed_linear.py`; set by the runner, None in the compiled graph and by default).
    packed: PackedRows | None = None
    # Decode attention as slot-indexed reductions (`_decode_fused`) instead of gather +
    # SDPA: set by the compiled decode graph only (`EngineOptions.fused_decode_attn`),
    # where Inductor fuses the indexed loads into its kernel; eager, it would materialise
    # the gather.
    decode_fused: bool = False
    # A kernel library's plan for this step (`attention_backend.py`; set by the runner's
    # eager steps when the stage's backend is not native): every layer attends through it.
    kernel: StepKernel | None = None


def configure(device: torch.device) -> None:
    """Per-process attention settings for a stage on `device`. On CUDA, SDPA's cuDNN
    backend is turned off: it builds an execution plan for every new shape, and eager
    steps change shape every step (a decode's context grows by one). Measured on an H200
    (torch 2.11, docs/gpu.md): eager decode steps of a 4-layer 1B-shape stage took about
    40 ms at batch 1 and mixed steps up to 1 s with it; a step whose shapes had been seen
    before took 5.6 ms, under the profiler. Flash, memory-efficient or math kernels take
    any shape without a plan."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def slots_of(block_table: Sequence[int], length: int, page_size: int) -> torch.Tensor:
    """Flat slot indices of positions [0, length) of a sequence."""
    pages = torch.tensor(block_table, dtype=torch.long)
    idx = (pages[:, None] * page_size + torch.arange(page_size)[None, :]).reshape(-1)
    return idx[:length]


def build_metadata(
    chunks: Sequence[Chunk], page_size: int, device: torch.device
) -> AttentionMetadata:
    """The step's metadata; per-chunk work is plain Python over small ints, tensors are
    made once per step (one `torch.tensor` per field)."""
    ps = page_size
    positions: list[int] = []
    slot_map: list[int] = []
    decode_rows: list[int] = []
    decode_pages: list[tuple[int, ...]] = []
    decode_lens: list[int] = []
    prefill: list[PrefillSegment] = []
    fresh: list[FreshGroup] = []
    row = 0
    for c in chunks:
        bt, start, n = c.block_table, c.start, c.num_tokens
        if n == 1:
            positions.append(start)
            slot_map.append(bt[start // ps] * ps + start % ps)
            decode_rows.append(row)
            decode_pages.append(bt)
            decode_lens.append(start + 1)
            row += 1
            continue
        positions.extend(range(start, start + n))
        for p in range(start // ps, (start + n - 1) // ps + 1):
            lo, hi = max(start, p * ps), min(start + n, (p + 1) * ps)
            base = bt[p] * ps - p * ps
            slot_map.extend(range(base + lo, base + hi))
        if start == 0:
            last = fresh[-1] if fresh else None
            if last is not None and last.q_len == n and last.row + last.count * n == row:
                fresh[-1] = FreshGroup(last.row, last.count + 1, n)
            else:
                fresh.append(FreshGroup(row, 1, n))
        else:
            ctx = start + n
            slots = slots_of(bt, ctx, ps).to(device)
            q = torch.arange(n)[:, None] + start
            mask = (torch.arange(ctx)[None, :] <= q).to(device)
            prefill.append(PrefillSegment(row, n, slots, mask))
        row += n
    if decode_rows:
        gather, mask = decode_tables.build(decode_pages, decode_lens, ps, device)
    else:
        gather = torch.empty(0, 0, dtype=torch.long, device=device)
        mask = torch.empty(0, 1, 1, 0, device=device)
    return AttentionMetadata(
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        slot_mapping=torch.tensor(slot_map, dtype=torch.long, device=device),
        decode_rows=torch.tensor(decode_rows, dtype=torch.long, device=device),
        decode_gather=gather,
        decode_mask=mask,
        prefill=prefill,
        decode_leading=decode_rows == list(range(len(decode_rows))),
        fresh=fresh,
        max_position=max((c.start + c.num_tokens - 1 for c in chunks), default=0),
        reuse_gather=True,
    )


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    md: AttentionMetadata,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q: [T, nh, hd], k/v: [T, nkv, hd] (this step's, after RoPE); k_cache/v_cache:
    [num_slots, nkv, hd]. Writes this step's keys/values into the cache and returns the
    attention output [T, nh, hd]."""
    t, nh, hd = q.shape
    nkv = k.shape[1]
    k_cache.index_copy_(0, md.slot_mapping, k)
    v_cache.index_copy_(0, md.slot_mapping, v)
    if md.kernel is not None:
        return md.kernel.attend(q, k, v, k_cache, v_cache)
    b = md.decode_rows.numel()
    if md.decode_leading and b == t:
        return _decode(q, md, k_cache, v_cache, scale, nkv)  # a pure decode step
    out = torch.empty(t, nh, hd, dtype=q.dtype, device=q.device)
    if b:
        qd = q[:b] if md.decode_leading else q.index_select(0, md.decode_rows)
        od = _decode(qd, md, k_cache, v_cache, scale, nkv)
        if md.decode_leading:
            out[:b] = od
        else:
            out.index_copy_(0, md.decode_rows, od)
    for g in md.fresh:
        rows = slice(g.row, g.row + g.count * g.q_len)
        qs = q[rows].view(g.count, g.q_len, nh, hd).transpose(1, 2)
        ks = k[rows].view(g.count, g.q_len, nkv, hd).transpose(1, 2)
        vs = v[rows].view(g.count, g.q_len, nkv, hd).transpose(1, 2)
        os_ = F.scaled_dot_product_attention(
            qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True
        )
        out[rows] = os_.transpose(1, 2).reshape(g.count * g.q_len, nh, hd)
    for seg in md.prefill:
        qs = q[seg.row : seg.row + seg.q_len].transpose(0, 1)  # [nh, q, hd]
        ks = k_cache.index_select(0, seg.slots).transpose(0, 1)  # [nkv, ctx, hd]
        vs = v_cache.index_select(0, seg.slots).transpose(0, 1)
        os_ = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=seg.mask, scale=scale, enable_gqa=True
        )
        out[seg.row : seg.row + seg.q_len] = os_.transpose(0, 1)
    return out


def _decode(
    qd: torch.Tensor,
    md: AttentionMetadata,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: float,
    nkv: int,
) -> torch.Tensor:
    """One query token per sequence over its gathered pages: [B, nh, hd]."""
    # Batch 1 is a graph of its own (Dynamo specializes size 1): it keeps gather + SDPA,
    # which measured no slower there with 2 threads (the fused kernel's OpenMP region
    # costs more than one sequence's attention).
    if md.decode_fused and qd.shape[0] > 1:
        return _decode_fused(qd, md, k_cache, v_cache, scale, nkv)
    b, lmax = md.decode_gather.shape
    hd = qd.shape[-1]
    flat = md.decode_gather.reshape(-1)  # index_select beats advanced indexing
    if md.reuse_gather:
        out = md.gather_out
        if out is None or out[0].dtype != k_cache.dtype or out[0].shape[1:] != (nkv, hd):
            make = functools.partial(
                torch.empty, flat.numel(), nkv, hd, dtype=k_cache.dtype, device=k_cache.device
            )
            out = md.gather_out = (make(), make())
        kg = torch.index_select(k_cache, 0, flat, out=out[0])
        vg = torch.index_select(v_cache, 0, flat, out=out[1])
    else:
        kg, vg = k_cache.index_select(0, flat), v_cache.index_select(0, flat)
    kd = kg.view(b, lmax, nkv, hd).transpose(1, 2)
    vd = vg.view(b, lmax, nkv, hd).transpose(1, 2)
    if qd.is_cuda:
        return decode_grouped(qd, kd, vd, md.decode_mask, scale)
    od = F.scaled_dot_product_attention(
        qd.unsqueeze(2), kd, vd, attn_mask=md.decode_mask, scale=scale, enable_gqa=True
    )
    return od.squeeze(2)


def decode_grouped(
    qd: torch.Tensor, kd: torch.Tensor, vd: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """One decode query per sequence, the query heads sharing a KV head taken as that
    head's query rows: [B, nkv, g, hd] against [B, nkv, L, hd]. The same attention as
    GQA with one query, as a plain multi-head call: CUDA's memory-efficient kernel takes
    it with the mask in one launch, where `enable_gqa` with a mask runs the math path
    (K/V repeated per query head, five kernels more). CUDA only: the CPU keeps the path
    its float32 tokens were proven on."""
    b, nh, hd = qd.shape
    nkv = kd.shape[1]
    qg = qd.view(b, nkv, nh // nkv, hd)
    og = F.scaled_dot_product_attention(qg, kd, vd, attn_mask=mask, scale=scale)
    return og.reshape(b, nh, hd)


def _decode_fused(
    qd: torch.Tensor,
    md: AttentionMetadata,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: float,
    nkv: int,
) -> torch.Tensor:
    """`_decode` written for Inductor: scores as a reduction over the head dimension of
    slot-indexed cache rows, a masked softmax over the context, and P.V as a reduction
    over the context of slot-indexed rows. Traced, the three become one generated C++
    kernel that reads each K/V row from the pool in place (no [B*Lmax, nkv, hd] copies,
    one pass over the KV instead of three). Eager, `k_cache[gather]` would materialise:
    only the compiled decode graph sets `md.decode_fused`."""
    b, lmax = md.decode_gather.shape
    nh, hd = qd.shape[1], qd.shape[2]
    g = nh // nkv
    kg = k_cache[md.decode_gather]  # [B, L, nkv, hd]: indexed loads once traced
    vg = v_cache[md.decode_gather]
    # The scaled queries as a buffer of their own: left a pointwise expression, Inductor
    # inlines their RoPE into the score loop and recomputes it for every context token.
    qs = (qd * scale).reshape(b, 1, nkv, g, hd).contiguous()
    # The op is registered by Inductor's module: imported here, so an eager call (a test, or
    # a process where nothing compiled yet) finds it too.
    import torch._inductor.inductor_prims

    qs = torch.ops.prims.inductor_force_stride_order(qs, qs.stride())
    s = (qs * kg.unsqueeze(3)).sum(-1) + md.decode_mask.view(b, lmax, 1, 1)
    p = torch.softmax(s, dim=1)  # [B, L, nkv, g]
    o = (p.unsqueeze(-1) * vg.unsqueeze(3)).sum(1)  # [B, nkv, g, hd]
    return o.reshape(b, nh, hd)
