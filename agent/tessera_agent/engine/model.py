"""Llama-family model code for one stage: a contiguous range of decoder layers.

Flat and visible in the gpt-fast style: RMSNorm, RoPE, GQA attention over a paged KV
cache, SwiGLU MLP, and a `StageModel` whose `forward` is a plain loop over its layers —
the natural place to cut a model into pipeline stages. The embedding exists only on the
stage that starts at layer 0 and the final norm + LM head only on the stage that ends at
the last layer. Called by `runner.py`; weights are filled in by `loader.py`.

q/k/v and gate/up projections are fused into one matmul each (fewer kernel launches);
`checkpoint_tensors()` maps them back to the checkpoint's tensor names so that blocks stay
addressable by name for copying and migration.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tessera_agent.engine import config as config_mod
from tessera_agent.engine import tp as tp_mod

# Sums a row-parallel projection's partial outputs across the stage's TP ranks (in place).
AllReduce = Callable[[torch.Tensor], torch.Tensor]


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
    # Prefill chunks: one entry per sequence with more than one query token.
    prefill: list[PrefillSegment]
    cos: torch.Tensor | None = None  # [T, head_dim], filled by StageModel.forward
    sin: torch.Tensor | None = None


@dataclass
class PrefillSegment:
    """A chunk of `q_len` query tokens at rows [row, row+q_len) whose context is `slots`."""

    row: int
    q_len: int
    slots: torch.Tensor  # [ctx_len] KV slots of positions 0..ctx_len-1 (chunk included)
    mask: torch.Tensor | None  # [q_len, ctx_len] bool, None when plain causal from 0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(head_dim: int, rope: config_mod.RopeConfig) -> torch.Tensor:
    """Inverse frequencies for RoPE, with llama3 frequency scaling when configured."""
    inv = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.rope_type != "llama3":
        return inv
    low_wavelen = rope.original_max_positions / rope.low_freq_factor
    high_wavelen = rope.original_max_positions / rope.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
    smooth = (rope.original_max_positions / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos/sin: [T, head_dim]."""
    return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]


class Attention(nn.Module):
    """GQA attention over the paged cache; with TP, this rank's q and KV heads only
    (qkv column-parallel, o row-parallel, partial outputs summed by `all_reduce`)."""

    def __init__(self, cfg: config_mod.ModelConfig, shard: tp_mod.TPShard = tp_mod.SINGLE) -> None:
        super().__init__()
        self.nh, self.nkv, _ = tp_mod.local_sizes(cfg, shard)
        self.hd = cfg.head_dim
        self.all_reduce: AllReduce | None = None
        self.q_size, self.kv_size = self.nh * self.hd, self.nkv * self.hd
        self.qkv_proj = nn.Linear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias
        )
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.scale = 1.0 / math.sqrt(self.hd)

    def forward(
        self, x: torch.Tensor, md: AttentionMetadata, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.nh, self.hd)
        k = k.view(t, self.nkv, self.hd)
        v = v.view(t, self.nkv, self.hd)
        assert md.cos is not None and md.sin is not None
        q = apply_rope(q, md.cos, md.sin)
        k = apply_rope(k, md.cos, md.sin)
        # k_cache/v_cache: [num_slots, nkv, hd]; write this step's keys/values first.
        k_cache.index_copy_(0, md.slot_mapping, k)
        v_cache.index_copy_(0, md.slot_mapping, v)
        out = torch.empty(t, self.nh, self.hd, dtype=x.dtype, device=x.device)
        if md.decode_rows.numel():
            qd = q.index_select(0, md.decode_rows).unsqueeze(2)  # [B, nh, 1, hd]
            b, lmax = md.decode_gather.shape
            flat = md.decode_gather.reshape(-1)  # index_select beats advanced indexing
            kd = k_cache.index_select(0, flat).view(b, lmax, self.nkv, self.hd).transpose(1, 2)
            vd = v_cache.index_select(0, flat).view(b, lmax, self.nkv, self.hd).transpose(1, 2)
            od = F.scaled_dot_product_attention(
                qd, kd, vd, attn_mask=md.decode_mask, scale=self.scale, enable_gqa=True
            )
            out.index_copy_(0, md.decode_rows, od.squeeze(2))
        for seg in md.prefill:
            qs = q[seg.row : seg.row + seg.q_len].transpose(0, 1)  # [nh, q, hd]
            ks = k_cache.index_select(0, seg.slots).transpose(0, 1)  # [nkv, ctx, hd]
            vs = v_cache.index_select(0, seg.slots).transpose(0, 1)
            os_ = F.scaled_dot_product_attention(
                qs,
                ks,
                vs,
                attn_mask=seg.mask,
                is_causal=seg.mask is None,
                scale=self.scale,
                enable_gqa=True,
            )
            out[seg.row : seg.row + seg.q_len] = os_.transpose(0, 1)
        o: torch.Tensor = self.o_proj(out.view(t, self.q_size))
        return o if self.all_reduce is None else self.all_reduce(o)


class MLP(nn.Module):
    """SwiGLU; with TP, gate/up column-parallel and down row-parallel (then all-reduced)."""

    def __init__(self, cfg: config_mod.ModelConfig, shard: tp_mod.TPShard = tp_mod.SINGLE) -> None:
        super().__init__()
        self.ffn = tp_mod.local_sizes(cfg, shard)[2]
        self.all_reduce: AllReduce | None = None
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * self.ffn, bias=False)
        self.down_proj = nn.Linear(self.ffn, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.ffn, dim=-1)
        d: torch.Tensor = self.down_proj(F.silu(gate) * up)
        return d if self.all_reduce is None else self.all_reduce(d)


class DecoderLayer(nn.Module):
    def __init__(
        self, cfg: config_mod.ModelConfig, index: int, shard: tp_mod.TPShard = tp_mod.SINGLE
    ) -> None:
        super().__init__()
        self.index = index  # global layer index in the checkpoint
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, shard)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, shard)

    def forward(
        self, x: torch.Tensor, md: AttentionMetadata, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), md, k_cache, v_cache)
        return x + self.mlp(self.post_attention_layernorm(x))  # type: ignore[no-any-return]


class StageModel(nn.Module):
    """Decoder layers [start, end) of a checkpoint, plus embedding / head at the ends;
    with TP (`shard`), this rank's slice of every layer (see `tp.py`)."""

    def __init__(
        self,
        cfg: config_mod.ModelConfig,
        start: int,
        end: int,
        shard: tp_mod.TPShard = tp_mod.SINGLE,
    ) -> None:
        super().__init__()
        if not 0 <= start < end <= cfg.num_layers:
            raise ValueError(
                f"layer range [{start}, {end}) is outside the model's {cfg.num_layers} layers"
            )
        self.cfg, self.start, self.end, self.shard = cfg, start, end, shard
        self.is_first, self.is_last = start == 0, end == cfg.num_layers
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if self.is_first else None
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, shard) for i in range(start, end))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if self.is_last else None
        self.lm_head = (
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) if self.is_last else None
        )
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope), persistent=False)
        self.dtype_ = torch.float32  # parameter dtype, set by the loader

    def set_all_reduce(self, fn: AllReduce | None) -> None:
        """Install the TP group's all-reduce after every row-parallel projection."""
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            layer.self_attn.all_reduce = fn
            layer.mlp.all_reduce = fn

    def rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def forward(
        self, x: torch.Tensor, md: AttentionMetadata, kv: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """x: token ids [T] on the first stage, else hidden states [T, hidden]."""
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
        md.cos, md.sin = self.rope_tables(md.positions)
        for layer, (k_cache, v_cache) in zip(self.layers, kv, strict=True):
            x = layer(x, md, k_cache, v_cache)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head on the rows to sample (last stage only)."""
        if self.norm is None or self.lm_head is None:
            raise RuntimeError("logits() called on a stage that does not end the model")
        return self.lm_head(self.norm(hidden))  # type: ignore[no-any-return]
