"""A loaded block's weights addressed by checkpoint tensor name, both ways.

The engine fuses q/k/v and gate/up projections, so a checkpoint tensor such as
`model.layers.3.self_attn.k_proj.weight` is a row slice of the block's `qkv_proj`. Here:
`shapes()` gives the checkpoint shape of every tensor a layer range needs (from
`config.json` alone, so a block copied from a peer is checked without the checkpoint),
and `tensor()` returns the named tensor as a view of a loaded `StageModel`. Used by the
agent's `FetchTensors` (serving a block to a peer) and by the loader (checking what a peer
sent).
"""

from __future__ import annotations

import re

import torch

from tessera_agent.engine import config as config_mod
from tessera_agent.engine import errors, loader, tp
from tessera_agent.engine import model as model_mod

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def shapes(
    cfg: config_mod.ModelConfig, start: int, end: int, shard: tp.TPShard = tp.SINGLE
) -> dict[str, tuple[int, ...]]:
    """Checkpoint shape of every tensor layer range [start, end) needs, in load order, as
    held by TP rank `shard` (the full shapes when tp=1)."""
    h = cfg.hidden_size
    per_layer = tp.layer_shapes(cfg)
    fixed = {
        "model.embed_tokens.weight": (cfg.vocab_size, h),
        "lm_head.weight": (cfg.vocab_size, h),
        "model.norm.weight": (h,),
    }
    out: dict[str, tuple[int, ...]] = {}
    for name in loader.checkpoint_names(cfg, start, end):
        m = _LAYER_RE.match(name)
        out[name] = tp.shard_shape(name, per_layer[m.group(2)] if m else fixed[name], shard)
    return out


def nbytes(
    cfg: config_mod.ModelConfig,
    start: int,
    end: int,
    dtype: torch.dtype,
    shard: tp.TPShard = tp.SINGLE,
) -> int:
    """Parameter bytes of the range at `dtype` on TP rank `shard`, from the config alone
    (tied head once)."""
    elem = torch.tensor([], dtype=dtype).element_size()
    total = 0
    for shape in shapes(cfg, start, end, shard).values():
        n = 1
        for d in shape:
            n *= d
        total += n * elem
    return total


def check(
    cfg: config_mod.ModelConfig,
    start: int,
    end: int,
    tensors: dict[str, torch.Tensor],
    shard: tp.TPShard = tp.SINGLE,
) -> None:
    """FailedPreconditionError naming the first tensor missing or of the wrong shape; a
    tensor may come whole or already sliced to `shard` (a peer holding the same rank)."""
    whole = shapes(cfg, start, end)
    for name, shape in shapes(cfg, start, end, shard).items():
        got = tensors.get(name)
        if got is None:
            raise errors.FailedPreconditionError(f"tensor missing from the copy: {name}")
        if tuple(got.shape) not in (shape, whole[name]):
            raise errors.FailedPreconditionError(
                f"tensor {name} has shape {tuple(got.shape)}, but config.json implies {shape}"
            )


def not_held(model: model_mod.StageModel, name: str) -> errors.NotFoundError:
    """The error for a tensor the block does not hold, naming the layers it does."""
    return errors.NotFoundError(
        f"tensor not held: {name} (the block holds layers [{model.start}, {model.end}) "
        f"of {model.cfg.num_layers})"
    )


def tensor(model: model_mod.StageModel, name: str) -> torch.Tensor:
    """The checkpoint tensor `name` as held by the loaded block (a view, not a copy);
    `name` must be one of `loader.checkpoint_names` of the block's range."""
    if name == "model.embed_tokens.weight":
        src = model.embed_tokens if model.embed_tokens is not None else model.lm_head
        assert src is not None  # a tied head stands in for the embedding
        return src.weight.detach()
    if name == "lm_head.weight":
        assert model.lm_head is not None
        return model.lm_head.weight.detach()
    if name == "model.norm.weight":
        assert model.norm is not None
        return model.norm.weight.detach()
    m = _LAYER_RE.match(name)
    assert m is not None
    layer = model.layers[int(m.group(1)) - model.start]
    assert isinstance(layer, model_mod.DecoderLayer)
    part = m.group(2)
    attn, mlp = layer.self_attn, layer.mlp
    q, kv = attn.q_size, attn.kv_size
    rows = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}
    if part in ("input_layernorm.weight", "post_attention_layernorm.weight"):
        norm = getattr(layer, part.split(".")[0])
        assert isinstance(norm, model_mod.RMSNorm)
        return norm.weight.detach()
    if part.startswith("self_attn.") and part[10] in rows and part[11:17] == "_proj.":
        a, b = rows[part[10]]
        fused = attn.qkv_proj.weight if part.endswith("weight") else attn.qkv_proj.bias
        assert fused is not None
        return fused.detach()[a:b]
    if part == "self_attn.o_proj.weight":
        return attn.o_proj.weight.detach()
    if part in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
        gate_up = mlp.gate_up_proj.weight.detach()
        return gate_up[: mlp.ffn] if part.startswith("mlp.gate") else gate_up[mlp.ffn :]
    assert part == "mlp.down_proj.weight", part
    return mlp.down_proj.weight.detach()
