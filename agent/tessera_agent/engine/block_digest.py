"""Content addresses of decoder layers: the key of the block zoo.

Fine-tunes of one foundation share most of their layers bit for bit (BlockLLM measures 92 %
redundancy across 15 applications). A layer's digest is a SHA-256 over its tensors —
checkpoint names with the layer index replaced by `*`, dtype, shape and raw bytes, in
name order — so the same layer has the same digest in every checkpoint that holds it,
whatever its file sharding, and any changed weight changes it. `diff_layers()` says which
layers of a fine-tune need blocks of their own; the rest are shared with the foundation.

Reads safetensors headers and tensor bytes; no model is built. Called by the block zoo
when a variant is loaded, and by `tessera variants diff`-style tooling and tests.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from tessera_agent.engine import config as config_mod
from tessera_agent.engine import loader

_LAYER = re.compile(r"^(model\.layers\.)(\d+)(\.)")


def layer_digests(model_path: Path, layers: Sequence[int] | None = None) -> dict[int, str]:
    """{layer index: hex digest} of the checkpoint's decoder layers (all by default)."""
    cfg = config_mod.ModelConfig.from_path(model_path)
    wanted = range(cfg.num_layers) if layers is None else layers
    wmap = loader.weight_map(model_path)
    out: dict[int, str] = {}
    handles: dict[Path, Any] = {}
    for i in wanted:
        names = sorted(n for n in loader.checkpoint_names(cfg, i, i + 1) if _LAYER.match(n))
        h = hashlib.sha256()
        for name in names:
            file = wmap[name]
            if file not in handles:
                handles[file] = safe_open(str(file), framework="pt")
            t = handles[file].get_tensor(name)
            h.update(_LAYER.sub(r"\1*\3", name).encode())
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.contiguous().view(-1).view(dtype=torch.uint8).numpy().tobytes())
        out[i] = h.hexdigest()
    return out


def diff_layers(foundation: Path, variant: Path) -> list[int]:
    """Layers whose weights differ between a full fine-tune and its foundation.

    Raises ValueError when the two are not the same architecture (different layer count
    or shapes), since then nothing can be shared.
    """
    a, b = config_mod.ModelConfig.from_path(foundation), config_mod.ModelConfig.from_path(variant)
    if (a.num_layers, a.hidden_size, a.intermediate_size, a.num_heads, a.num_kv_heads) != (
        b.num_layers,
        b.hidden_size,
        b.intermediate_size,
        b.num_heads,
        b.num_kv_heads,
    ):
        raise ValueError(
            f"{variant} is not the same architecture as {foundation}: layers, hidden, "
            "intermediate and head counts must all match to share blocks"
        )
    da, db = layer_digests(foundation), layer_digests(variant)
    return [i for i in sorted(da) if da[i] != db[i]]
