"""Tiny variants of a tiny checkpoint, made locally for tests, demos and benches: LoRA
adapters in PEFT's on-disk format and full fine-tunes that differ in chosen layers.

`make_tiny_lora(base, out, ...)` writes `adapter_config.json` and
`adapter_model.safetensors` for a checkpoint made by `tiny_checkpoint.make_tiny`, with
deterministic random A *and* B matrices (PEFT's default zero-initialised B would make every
adapter a no-op, and an oracle that cannot fail). PEFT itself loads these files
(`PeftModel.from_pretrained`), which the tests use as the reference. Needs no PEFT install.

`make_tiny_finetune(base, out, layers=...)` copies a checkpoint and perturbs the weights of
the given decoder layers only, so the block zoo must share every other layer.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tessera_agent.engine import config as config_mod
from tessera_agent.engine import lora

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_tiny_lora(
    base: Path,
    out: Path,
    *,
    r: int = 4,
    alpha: float = 8.0,
    targets: Sequence[str] = ALL_TARGETS,
    layers: Sequence[int] | None = None,
    seed: int = 0,
    std: float = 0.05,
) -> Path:
    """Write a PEFT LoRA adapter for `base` into `out`; returns `out`."""
    cfg = config_mod.ModelConfig.from_path(base)
    shapes = lora._shapes(cfg)
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(cfg.num_layers) if layers is None else layers:
        for name in targets:
            fin, fout = shapes[name]
            part = "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            key = f"base_model.model.model.layers.{layer}.{part}.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(r, fin, generator=g) * std
            tensors[f"{key}.lora_B.weight"] = torch.randn(fout, r, generator=g) * std
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    doc = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": r,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": list(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
    }
    if layers is not None:
        doc["layers_to_transform"] = list(layers)
    (out / "adapter_config.json").write_text(json.dumps(doc, indent=2) + "\n")
    return out


def make_tiny_finetune(
    base: Path, out: Path, *, layers: Sequence[int], seed: int = 0, std: float = 0.02
) -> Path:
    """Copy `base` to `out`, adding seeded noise to every weight of `layers` only."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(base, out)
    g = torch.Generator().manual_seed(seed)
    prefixes = tuple(f"model.layers.{i}." for i in layers)
    for file in sorted(out.glob("*.safetensors")):
        tensors = load_file(str(file))
        changed = False
        for name, t in tensors.items():
            if name.startswith(prefixes):
                noise = torch.randn(t.shape, generator=g, dtype=torch.float32) * std
                tensors[name] = (t.float() + noise).to(t.dtype)
                changed = True
        if changed:
            save_file(tensors, str(file), metadata={"format": "pt"})
    return out
