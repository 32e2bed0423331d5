"""Tensor parallelism of one stage: which slice of every layer a TP rank holds.

Megatron-style sharding, decided here once and applied by the loader (`shard_tensors`), the
model (`StageModel(..., shard)` builds local shapes) and the KV cache (each rank stores its
KV heads only): q and KV heads split evenly (q/k/v column-parallel; `o_proj` row-parallel,
all-reduced); `gate_proj`/`up_proj` column-parallel, `down_proj` row-parallel, all-reduced;
embeddings, LM head and norms replicated (no vocab-parallel gather: each rank produces the
same logits without another collective). A tp that does not divide the heads, KV heads or MLP
width is refused with the reason (`check`). Pure shape logic: no process group is touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from tessera_agent.engine import config as config_mod

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class TPShard:
    """This rank's place in its stage's tensor-parallel group."""

    size: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"tp_size: must be >= 1, got {self.size}")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tp_rank: {self.rank} is outside [0, {self.size})")


SINGLE = TPShard()


def check(cfg: config_mod.ModelConfig, size: int) -> str | None:
    """Why `size` ranks cannot shard this model, or None when they can."""
    if size < 1:
        return f"tp: must be >= 1, got {size}"
    for what, n in (
        ("attention heads", cfg.num_heads),
        ("KV heads", cfg.num_kv_heads),
        ("MLP intermediate size", cfg.intermediate_size),
    ):
        if n % size:
            return f"tp={size} does not divide the model's {n} {what}"
    return None


def local_sizes(cfg: config_mod.ModelConfig, shard: TPShard) -> tuple[int, int, int]:
    """(q heads, KV heads, MLP width) held by one rank."""
    return (
        cfg.num_heads // shard.size,
        cfg.num_kv_heads // shard.size,
        cfg.intermediate_size // shard.size,
    )


def _rows(t: torch.Tensor, shard: TPShard) -> torch.Tensor:
    n = t.shape[0] // shard.size
    return t[shard.rank * n : (shard.rank + 1) * n]


def _cols(t: torch.Tensor, shard: TPShard) -> torch.Tensor:
    n = t.shape[1] // shard.size
    return t[:, shard.rank * n : (shard.rank + 1) * n]


# Checkpoint tensor suffix -> how it is split (None: replicated).
_SPLIT = {
    "self_attn.q_proj.weight": _rows,
    "self_attn.k_proj.weight": _rows,
    "self_attn.v_proj.weight": _rows,
    "self_attn.q_proj.bias": _rows,
    "self_attn.k_proj.bias": _rows,
    "self_attn.v_proj.bias": _rows,
    "self_attn.o_proj.weight": _cols,
    "mlp.gate_proj.weight": _rows,
    "mlp.up_proj.weight": _rows,
    "mlp.down_proj.weight": _cols,
}


def shard_shape(name: str, full: tuple[int, ...], shard: TPShard) -> tuple[int, ...]:
    """The shape of checkpoint tensor `name` (full shape `full`) on this rank."""
    m = _LAYER_RE.match(name)
    how = _SPLIT.get(m.group(2)) if m else None
    if how is None or shard.size == 1:
        return full
    if how is _rows:
        return (full[0] // shard.size, *full[1:])
    return (full[0], full[1] // shard.size)


def shard_tensors(
    cfg: config_mod.ModelConfig, tensors: dict[str, torch.Tensor], shard: TPShard
) -> dict[str, torch.Tensor]:
    """Slice every full checkpoint tensor to this rank's shard (others pass through)."""
    if shard.size == 1:
        return tensors
    out: dict[str, torch.Tensor] = {}
    full = layer_shapes(cfg)
    for name, t in tensors.items():
        m = _LAYER_RE.match(name)
        key = m.group(2) if m else name
        if key in _SPLIT and tuple(t.shape) == full.get(key):
            out[name] = _SPLIT[key](t, shard).contiguous()
        else:
            out[name] = t
    return out


def layer_shapes(cfg: config_mod.ModelConfig) -> dict[str, tuple[int, ...]]:
    """Full (unsharded) checkpoint shape of every per-layer tensor, by name suffix."""
    h, ffn = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {
        "input_layernorm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (q, h),
        "self_attn.k_proj.weight": (kv, h),
        "self_attn.v_proj.weight": (kv, h),
        "self_attn.q_proj.bias": (q,),
        "self_attn.k_proj.bias": (kv,),
        "self_attn.v_proj.bias": (kv,),
        "self_attn.o_proj.weight": (h, q),
        "mlp.gate_proj.weight": (ffn, h),
        "mlp.up_proj.weight": (ffn, h),
        "mlp.down_proj.weight": (h, ffn),
    }
