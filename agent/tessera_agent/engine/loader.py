"""Reads exactly the tensors of one layer range from a (possibly sharded) safetensors checkpoint.

Called by `stage.py` when an agent loads a block. Only the tensors the range needs are
read: the embedding when the range starts at 0, the final norm and LM head (or the tied
embedding) when it ends at the last layer. `checkpoint_names()` and `block_bytes()` answer
what a range holds and how large it is without reading any tensor data, so the agent can
refuse a block that does not fit before allocating anything.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open

from tessera_agent.engine import config as config_mod
from tessera_agent.engine import errors
from tessera_agent.engine import model as model_mod
from tessera_agent.engine import tp as tp_mod

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def weight_map(model_path: Path) -> dict[str, Path]:
    """Map every tensor name in the checkpoint to the safetensors file that holds it."""
    index = model_path / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        return {name: model_path / fname for name, fname in data["weight_map"].items()}
    single = model_path / "model.safetensors"
    if not single.is_file():
        raise errors.NotFoundError(
            f"model not found: no model.safetensors or model.safetensors.index.json in {model_path}"
        )
    with safe_open(str(single), framework="pt") as f:
        return {name: single for name in f.keys()}


def checkpoint_names(cfg: config_mod.ModelConfig, start: int, end: int) -> list[str]:
    """Checkpoint tensor names that layer range [start, end) needs, in load order."""
    names: list[str] = []
    if start == 0:
        names.append("model.embed_tokens.weight")
    for i in range(start, end):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        for proj in ("q_proj", "k_proj", "v_proj"):
            names.append(f"{p}self_attn.{proj}.weight")
            if cfg.qkv_bias:
                names.append(f"{p}self_attn.{proj}.bias")
        names += [
            p + "self_attn.o_proj.weight",
            p + "mlp.gate_proj.weight",
            p + "mlp.up_proj.weight",
            p + "mlp.down_proj.weight",
        ]
    if end == cfg.num_layers:
        names.append("model.norm.weight")
        head = "model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"
        if head not in names:
            names.append(head)
    return names


def block_bytes(
    model_path: Path, cfg: config_mod.ModelConfig, start: int, end: int, dtype: torch.dtype
) -> int:
    """Parameter bytes of the range at `dtype`, from safetensors headers only."""
    wmap = weight_map(model_path)
    elem = torch.tensor([], dtype=dtype).element_size()
    total = 0
    by_file = _group(wmap, checkpoint_names(cfg, start, end))
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt") as f:
            for name in names:
                shape = f.get_slice(name).get_shape()
                n = 1
                for d in shape:
                    n *= d
                total += n * elem
    return total  # a tied head shares the embedding's storage: counted once


def read_tensors(model_path: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """Read only `names` from the checkpoint; NotFoundError names the first missing one."""
    wmap = weight_map(model_path)
    out: dict[str, torch.Tensor] = {}
    for path, group in _group(wmap, names).items():
        with safe_open(str(path), framework="pt") as f:
            for name in group:
                out[name] = f.get_tensor(name)
    return out


def load_stage(
    model_path: Path,
    cfg: config_mod.ModelConfig,
    start: int,
    end: int,
    dtype: torch.dtype,
    device: torch.device,
    tensors: dict[str, torch.Tensor] | None = None,
    shard: tp_mod.TPShard = tp_mod.SINGLE,
) -> model_mod.StageModel:
    """Build a StageModel for [start, end) and fill it from the checkpoint, or from
    `tensors` (checkpoint names to tensors, e.g. copied from a peer) when given; with TP,
    only TP rank `shard`'s slice of each layer is kept."""
    if tensors is None:
        tensors = read_tensors(model_path, checkpoint_names(cfg, start, end))
    tensors = tp_mod.shard_tensors(cfg, tensors, shard)
    with torch.device("meta"):
        stage = model_mod.StageModel(cfg, start, end, shard)
    # Unsharded: the parameters are the given tensors themselves (moved or cast only when
    # they are not already on `device` in `dtype`), not copies into fresh memory: a load
    # allocates and writes its weights once, not twice (issue 32: time to ready).
    assign = shard == tp_mod.SINGLE
    if not assign:
        stage = stage.to_empty(device=device).to(dtype)
    stage.dtype_ = dtype
    stage.inv_freq = model_mod.rope_inv_freq(cfg.head_dim, cfg.rope).to(device)
    state: dict[str, torch.Tensor] = {}
    if stage.embed_tokens is not None:
        state["embed_tokens.weight"] = tensors["model.embed_tokens.weight"]
    state.update(layer_state(cfg, start, end, tensors))
    if stage.is_last:
        state["norm.weight"] = tensors["model.norm.weight"]
        head = "model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"
        state["lm_head.weight"] = tensors[head]
    if assign:
        state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    missing, unexpected = stage.load_state_dict(state, strict=False, assign=assign)
    missing = [m for m in missing if m != "inv_freq"]
    if missing or unexpected:
        raise errors.FailedPreconditionError(
            f"checkpoint/model mismatch: missing {missing}, unexpected {unexpected}"
        )
    if cfg.tie_embeddings and stage.embed_tokens is not None and stage.lm_head is not None:
        stage.lm_head.weight = stage.embed_tokens.weight  # share storage, as the checkpoint does
    stage.eval()
    return stage


def layer_state(
    cfg: config_mod.ModelConfig, start: int, end: int, tensors: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The decoder layers' state dict (local names `layers.<i>.…`, q/k/v and gate/up fused)
    from checkpoint-named tensors; shared by `load_stage` and layer-run replicas
    (`layer_run.RunModel`)."""
    state: dict[str, torch.Tensor] = {}
    for local, layer in enumerate(range(start, end)):
        p, q = f"model.layers.{layer}.", f"layers.{local}."
        state[q + "input_layernorm.weight"] = tensors[p + "input_layernorm.weight"]
        state[q + "post_attention_layernorm.weight"] = tensors[
            p + "post_attention_layernorm.weight"
        ]
        state[q + "self_attn.qkv_proj.weight"] = fused(
            [tensors[f"{p}self_attn.{x}_proj.weight"] for x in "qkv"]
        )
        if cfg.qkv_bias:
            state[q + "self_attn.qkv_proj.bias"] = fused(
                [tensors[f"{p}self_attn.{x}_proj.bias"] for x in "qkv"]
            )
        state[q + "self_attn.o_proj.weight"] = tensors[p + "self_attn.o_proj.weight"]
        state[q + "mlp.gate_up_proj.weight"] = fused(
            [tensors[p + "mlp.gate_proj.weight"], tensors[p + "mlp.up_proj.weight"]]
        )
        state[q + "mlp.down_proj.weight"] = tensors[p + "mlp.down_proj.weight"]
    return state


def fused(parts: list[torch.Tensor]) -> torch.Tensor:
    """`parts` concatenated along dim 0: a view of their memory when they already lie one
    after the other in one storage (received into one buffer by a peer copy, or views of
    a held block's fused weight), else a copy (`torch.cat`)."""
    first = parts[0]
    offset = first.storage_offset()
    adjacent = all(
        t.is_contiguous()
        and t.dtype == first.dtype
        and t.device == first.device
        and t.shape[1:] == first.shape[1:]
        and t.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        for t in parts
    )
    for t in parts if adjacent else ():
        adjacent = adjacent and t.storage_offset() == offset
        offset += t.numel()
    if not adjacent:
        return torch.cat(parts)
    rows = sum(t.shape[0] for t in parts)
    return first.as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())


def _group(wmap: dict[str, Path], names: list[str]) -> dict[Path, list[str]]:
    by_file: dict[Path, list[str]] = defaultdict(list)
    for name in names:
        if name not in wmap:
            raise errors.NotFoundError(f"tensor not found in checkpoint: {name}")
        by_file[wmap[name]].append(name)
    return by_file
