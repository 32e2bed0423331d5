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

import torch
import torch.nn.functional as F
from torch import nn

from tessera_agent.engine import attention, fused_norm, packed_linear
from tessera_agent.engine import config as config_mod
from tessera_agent.engine import tp as tp_mod

# Sums a row-parallel projection's partial outputs across the stage's TP ranks (in place).
AllReduce = Callable[[torch.Tensor], torch.Tensor]

# Per-step metadata lives with the attention paths (`attention.py`); re-exported here.
AttentionMetadata = attention.AttentionMetadata


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda or (x.dtype == torch.float32 and self.weight.dtype == torch.float32):
            # One fused kernel instead of seven; bitwise the same as the formula below in
            # float32 (tests/engine/test_fused_ops.py). In half precision on CUDA it rounds
            # once where transformers rounds twice (within the half-precision oracle,
            # `logprob_oracle.py`); the CPU keeps transformers' formula there.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
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


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with its first half negated, for `apply_rope`."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos and `signed_sin(sin)`: [T, head_dim].

    Hugging Face's `x * cos + rotate_half(x) * sin`, where rotate_half(x) = [-x2, x1], in
    four kernels instead of seven: roll(x) = [x2, x1] times [-sin1, sin2] gives the same
    bits, since negation is exact and moves freely through a product."""
    return x * cos[:, None, :] + x.roll(x.shape[-1] // 2, -1) * sin_signed[:, None, :]


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
        qkv = packed_linear.linear(self.qkv_proj, x, md.packed)
        # q and k heads sit side by side in the fused projection: one RoPE over both.
        qk = qkv[:, : self.q_size + self.kv_size].view(t, self.nh + self.nkv, self.hd)
        assert md.cos is not None and md.sin is not None
        qk = apply_rope(qk, md.cos, md.sin)
        q, k = qk[:, : self.nh], qk[:, self.nh :]
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.nkv, self.hd)
        out = attention.paged_attention(q, k, v, md, k_cache, v_cache, self.scale)
        o = packed_linear.linear(self.o_proj, out.view(t, self.q_size), md.packed)
        return o if self.all_reduce is None else self.all_reduce(o)


class MLP(nn.Module):
    """SwiGLU; with TP, gate/up column-parallel and down row-parallel (then all-reduced)."""

    def __init__(self, cfg: config_mod.ModelConfig, shard: tp_mod.TPShard = tp_mod.SINGLE) -> None:
        super().__init__()
        self.ffn = tp_mod.local_sizes(cfg, shard)[2]
        self.all_reduce: AllReduce | None = None
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * self.ffn, bias=False)
        self.down_proj = nn.Linear(self.ffn, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, packed: attention.PackedRows | None = None) -> torch.Tensor:
        gate, up = torch.split(packed_linear.linear(self.gate_up_proj, x, packed), self.ffn, -1)
        d = packed_linear.linear(self.down_proj, F.silu(gate) * up, packed)
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
        x, normed = fused_norm.add_rms_norm(
            x,
            self.self_attn(self.input_layernorm(x), md, k_cache, v_cache),
            self.post_attention_layernorm,
        )
        return x + self.mlp(normed, md.packed)  # type: ignore[no-any-return]


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
        self._rope_cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def set_all_reduce(self, fn: AllReduce | None) -> None:
        """Install the TP group's all-reduce after every row-parallel projection."""
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            layer.self_attn.all_reduce = fn
            layer.mlp.all_reduce = fn

    def rope_tables(
        self, positions: torch.Tensor, max_position: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and `signed_sin` of each position: [T, head_dim] each."""
        # cos/sin of every position are computed once (the same float ops per element as
        # computing them per step) and indexed per step: one gather instead of five ops.
        # Computed in float32 and rounded to the parameter dtype once, as transformers
        # does: q and k stay in the KV pool's dtype.
        cache = self._rope_cache
        if (
            cache is None
            or cache[0].device != positions.device
            or cache[0].dtype != self.dtype_
            or cache[0].shape[0] <= max_position
        ):
            size = max(self.cfg.max_positions, max_position + 1)
            pos = torch.arange(size, device=positions.device)
            freqs = pos.float()[:, None] * self.inv_freq.float().to(positions.device)[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos().to(self.dtype_), signed_sin(emb.sin()).to(self.dtype_)
            cache = self._rope_cache = (cos, sin)
        cos, sin = cache
        return cos.index_select(0, positions), sin.index_select(0, positions)

    def forward(
        self, x: torch.Tensor, md: AttentionMetadata, kv: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """x: token ids [T] on the first stage, else hidden states [T, hidden]."""
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
        md.cos, md.sin = self.rope_tables(md.positions, md.max_position)
        return self._run_layers(x, md, list(self.layers), kv)

    def forward_layers(
        self,
        x: torch.Tensor,
        md: AttentionMetadata,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        lo: int,
        hi: int,
    ) -> torch.Tensor:
        """Hidden states through local layers [lo, hi) only (`kv`: the whole stage's
        pools); a replicated layer run cuts the loop here (`layer_run.py`)."""
        md.cos, md.sin = self.rope_tables(md.positions, md.max_position)
        return self._run_layers(x, md, list(self.layers[lo:hi]), kv[lo:hi])

    def _run_layers(
        self,
        x: torch.Tensor,
        md: AttentionMetadata,
        layers: list[nn.Module],
        kv: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """`layers` over x: a step of many rows through the compiled prompt pieces when
        the stage's packs carry them (`prompt_graph.py`), else layer by layer eagerly."""
        packs = md.packed
        if packs is not None and packs.graph is not None and x.shape[0] >= packed_linear.MIN_ROWS:
            out = packs.graph.forward(layers, x, md, kv, packs)
            if out is not None:
                return out
        for layer, (k_cache, v_cache) in zip(layers, kv, strict=True):
            x = layer(x, md, k_cache, v_cache)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head on the rows to sample (last stage only)."""
        if self.norm is None or self.lm_head is None:
            raise RuntimeError("logits() called on a stage that does not end the model")
        return self.lm_head(self.norm(hidden))  # type: ignore[no-any-return]
