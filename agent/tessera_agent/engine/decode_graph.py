"""Compiled decode: a stage's pure-decode forward through `torch.compile` (opt-in).

A decode step runs the same few dozen small ops per layer every step; eager PyTorch
dispatches each from Python. Compiled, Inductor fuses the elementwise work (RMSNorm,
RoPE, residuals, SiLU x up) into generated kernels and runs the step with one guard check
instead of hundreds of dispatches. On a CUDA device the step is compiled with
`mode="reduce-overhead"`, i.e. captured as CUDA graphs and replayed (the GPU path; no GPU
was lent while this was written, so it has not been exercised).

Opt-in, because compiling costs tens of seconds per process on a small CPU (the FX graph
cache in the temporary directory makes later processes faster): set
`TESSERA_COMPILE_DECODE=1` in the environment of the agent (or of `tessera bench engine`,
which also has `--compile`). Only steps whose every row is a decode, on stages without
LoRA adapters or tensor parallelism, take this path; every other step runs eagerly, so the
result is the same model. Compiled kernels may order float reductions differently from
eager ones (logits agree to ~1e-6); greedy tokens are checked against `transformers` in
`tests/engine/test_decode_graph.py`.

Called by `runner.py` (`StageRunner.execute`).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from tessera_agent.engine import attention
from tessera_agent.engine import model as model_mod

ENV = "TESSERA_COMPILE_DECODE"


def enabled_from_env() -> bool:
    """Whether `TESSERA_COMPILE_DECODE` asks for the compiled decode path."""
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def is_pure_decode(md: attention.AttentionMetadata) -> bool:
    """Every row of the step is one decode token, in order (no prefill of any kind)."""
    return (
        md.decode_leading
        and not md.prefill
        and not md.fresh
        and md.decode_rows.numel() == md.positions.numel()
    )


def _forward(
    model: model_mod.StageModel,
    x: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    decode_rows: torch.Tensor,
    gather: torch.Tensor,
    mask: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv: list[tuple[torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """The layers of `StageModel.forward` for a pure-decode step (traced by dynamo)."""
    md = attention.AttentionMetadata(
        positions=positions,
        slot_mapping=slot_mapping,
        decode_rows=decode_rows,
        decode_gather=gather,
        decode_mask=mask,
        prefill=[],
        decode_leading=True,
        cos=cos,
        sin=sin,
    )
    if model.embed_tokens is not None:
        x = model.embed_tokens(x)
    for layer, (k_cache, v_cache) in zip(model.layers, kv, strict=True):
        x = layer(x, md, k_cache, v_cache)
    return x


class CompiledDecode:
    """The compiled pure-decode forward of one stage model (compiled on first use)."""

    def __init__(self, model: model_mod.StageModel, device: torch.device) -> None:
        self.model = model
        mode = "reduce-overhead" if device.type == "cuda" else None  # CUDA graphs on GPU
        self._fn: Any = torch.compile(_forward, dynamic=True, mode=mode)
        self.calls = 0
        self.first_call_s = 0.0  # wall time of the first call: mostly compiling

    @staticmethod
    def usable(model: model_mod.StageModel, has_lora: bool) -> bool:
        """Stages this path serves: no LoRA wrappers, no TP all-reduce inside a layer."""
        return not has_lora and model.shard.size == 1

    def __call__(
        self,
        x: torch.Tensor,
        md: attention.AttentionMetadata,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        model = self.model
        cos, sin = model.rope_tables(md.positions, md.max_position)
        t0 = time.perf_counter()
        out: torch.Tensor = self._fn(
            model,
            x,
            md.positions,
            md.slot_mapping,
            md.decode_rows,
            md.decode_gather,
            md.decode_mask,
            cos,
            sin,
            kv,
        )
        if self.calls == 0:
            self.first_call_s = time.perf_counter() - t0
        self.calls += 1
        return out
