"""Compiled decode: a stage's pure-decode forward through `torch.compile` (opt-in).

A decode step runs the same few dozen small ops per layer every step; eager PyTorch
dispatches each from Python. Compiled, Inductor fuses the elementwise work (RMSNorm,
RoPE, residuals, SiLU x up) into generated kernels and runs the step with one guard check
instead of hundreds of dispatches. On CPU it compiles with Inductor's `freezing`: the
weights become constants of the graph, prepacked once for MKL's matmul instead of being
packed on every call (the larger share of the gain at batch 8). The frozen graph holds
that packed copy beside the parameters (about the stage's parameter bytes again, not
booked against the agent's memory budget) and would not see weights changed in place, so
a `CompiledDecode` is tied to the layer objects it first ran: when a memory shift swaps
them, it starts over (and its compiled code, with its copy, is dropped with it). On a CUDA
device the step is compiled with
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

import contextlib
import os
import time
import types
from typing import Any

import torch
import torch._inductor.config as inductor_config

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


def _fingerprint(model: model_mod.StageModel) -> tuple[int, ...]:
    return (id(model.embed_tokens), id(model.lm_head), *(id(layer) for layer in model.layers))


class CompiledDecode:
    """The compiled pure-decode forward of one stage model (compiled on first use)."""

    def __init__(self, model: model_mod.StageModel, device: torch.device) -> None:
        self.model, self.device = model, device
        self.calls = 0
        self.first_call_s = 0.0  # wall time of the first call: mostly compiling
        self._build()

    def _build(self) -> None:
        # A private copy of the code object: dynamo keeps compiled code per code object,
        # so this instance's graphs (and frozen weights) live and die with it.
        fn = types.FunctionType(_forward.__code__.replace(), _forward.__globals__, "_forward")
        if self.device.type == "cuda":  # CUDA graphs captured and replayed per shape
            self._fn: Any = torch.compile(fn, dynamic=True, mode="reduce-overhead")
        else:
            self._fn = torch.compile(fn, dynamic=True)
        self._for = _fingerprint(self.model)

    def _config(self) -> contextlib.AbstractContextManager[Any]:
        # Compiling happens inside the call (first call, new shapes); `freezing` must be
        # set then (passed as `torch.compile(options=...)` it did not take effect here).
        if self.device.type == "cuda":
            return contextlib.nullcontext()
        patched: contextlib.AbstractContextManager[Any] = inductor_config.patch(freezing=True)
        return patched

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
        if _fingerprint(model) != self._for:  # layers dropped or added since compiling
            self._build()
        cos, sin = model.rope_tables(md.positions, md.max_position)
        t0 = time.perf_counter()
        with self._config():
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
