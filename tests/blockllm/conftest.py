"""Shared fixtures: one tiny random-weight checkpoint per session, loaded in float32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from tessera_agent import tiny_checkpoint as tc

    path: Path = tmp_path_factory.mktemp("spec") / "tiny"
    tc.make_tiny(path, tc.TinySpec(layers=6, hidden=64, heads=4, kv_heads=2, vocab=512))
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def family(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny two-width family, trained briefly (80 steps each)."""
    import torch

    from tessera_agent import tiny_family

    torch.set_num_threads(1)
    out: Path = tmp_path_factory.mktemp("family")
    tiny_family.make_family(out, steps=80)
    return out
