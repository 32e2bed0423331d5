"""Torch dtypes of the served dtype names (`tessera.dtypes`), and of a block's spec.

The agent's one map from names to `torch.dtype`: the stage loader, KV pool, block and KV
transfers and the memory accounting call `torch_dtype`; `of_spec` resolves a spec's
"auto" against the checkpoint's config.
"""

from __future__ import annotations

import torch

from tessera import dtypes as names
from tessera_agent.engine import config as config_mod
from tessera_agent.engine import errors

TORCH: dict[str, torch.dtype] = {n: getattr(torch, n) for n in names.NAMES}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a served name; InvalidArgumentError naming them otherwise."""
    key = name.removeprefix("torch.")
    if key not in TORCH:
        raise errors.InvalidArgumentError(f"dtype: {name!r} is not one of {list(TORCH)}")
    return TORCH[key]


def name_of(dtype: torch.dtype) -> str:
    """ "bfloat16" for torch.bfloat16: the name that crosses the wire."""
    return str(dtype).removeprefix("torch.")


def resolve(name: str, cfg: config_mod.ModelConfig) -> str:
    """A spec's dtype name made concrete ("auto": the checkpoint's torch_dtype)."""
    try:
        return names.resolve(name, {"torch_dtype": cfg.torch_dtype})
    except ValueError as exc:
        raise errors.InvalidArgumentError(str(exc)) from exc


def of_spec(name: str, cfg: config_mod.ModelConfig) -> torch.dtype:
    """The torch dtype a block of this spec dtype is served in."""
    return torch_dtype(resolve(name, cfg))
