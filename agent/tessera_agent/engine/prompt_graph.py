"""Compiled prompt rows: the row-wise parts of every layer of a many-row eager step through
two small `torch.compile`d functions shared by all layers, attention eager between them.

Per layer, `_pre` (RMSNorm, qkv projection, RoPE) and `_post` (o projection, residual,
RMSNorm, gate/up, SiLU x up, down, residual) are compiled around eager
`attention.paged_attention`, as vLLM splits its CPU model. Weights and packs are inputs,
so one compiled pair serves every layer of the same shapes (`_shared`); projections run
through the stage's packs (`packed_linear.run_packed`, the `tessera::packed_linear` op).
Warmed up by `CompiledDecode.warm_up` when the packs exist and
`compile_policy.compile_prompts` says so; carried by `StagePacks.graph`. Unpacked layers
run eagerly; a failed warm-up leaves rows eager, logged. Measured gains: docs
(benchmarks-log, "Issue 16 (prefill path)"). Checked against `transformers` in
`tests/engine/test_prompt_graph.py`. Called by `model.py` (`StageModel._run_layers`).
"""

from __future__ import annotations

import logging
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tessera_agent.engine import attention, compile_policy, packed_linear
from tessera_agent.engine import model as model_mod

log = logging.getLogger(__name__)

KV = list[tuple[torch.Tensor, torch.Tensor]]


@torch.library.custom_op("tessera::packed_linear", mutates_args=())
def _packed_linear_op(
    x: torch.Tensor, pack: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    return packed_linear.run_packed(x, pack, bias)


@_packed_linear_op.register_fake
def _(x: torch.Tensor, pack: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], pack.shape[0])


def _pre(
    h: torch.Tensor,
    ln: torch.Tensor,
    qkv_pack: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    nh: int,
    nkv: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm, qkv projection and RoPE of one layer: q [T, nh, hd], k and v [T, nkv, hd]."""
    t, hd = h.shape[0], cos.shape[-1]
    qkv = _packed_linear_op(F.rms_norm(h, ln.shape, ln, eps), qkv_pack, qkv_bias)
    qk = model_mod.apply_rope(qkv[:, : (nh + nkv) * hd].view(t, nh + nkv, hd), cos, sin)
    return qk[:, :nh], qk[:, nh:], qkv[:, (nh + nkv) * hd :].view(t, nkv, hd)


def _post(
    attn: torch.Tensor,
    h: torch.Tensor,
    o_pack: torch.Tensor,
    ln: torch.Tensor,
    gate_up_pack: torch.Tensor,
    down_pack: torch.Tensor,
    eps: float,
    ffn: int,
) -> torch.Tensor:
    """o projection and residual, then the SwiGLU MLP and its residual: the layer's output."""
    h = h + _packed_linear_op(attn, o_pack, None)
    gu = _packed_linear_op(F.rms_norm(h, ln.shape, ln, eps), gate_up_pack, None)
    down: torch.Tensor = _packed_linear_op(F.silu(gu[:, :ffn]) * gu[:, ffn:], down_pack, None)
    return h + down


# ln1, qkv pack, qkv bias, o pack, ln2, gate_up pack, down pack
LayerArgs = tuple[
    torch.Tensor,
    torch.Tensor,
    torch.Tensor | None,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
]


def layer_args(layer: model_mod.DecoderLayer, packs: attention.PackedRows) -> LayerArgs | None:
    """What `_pre`/`_post` take of one layer, or None when it must run eagerly (a
    projection not packed, e.g. swapped or LoRA-wrapped; a TP all-reduce)."""
    a, m = layer.self_attn, layer.mlp
    if a.all_reduce is not None or m.all_reduce is not None:
        return None
    qkv, o, gu, down = (packs.get(p) for p in (a.qkv_proj, a.o_proj, m.gate_up_proj, m.down_proj))
    if qkv is None or o is None or gu is None or down is None:
        return None
    bias = a.qkv_proj.bias
    return (
        layer.input_layernorm.weight.detach(),
        qkv,
        None if bias is None else bias.detach(),
        o,
        layer.post_attention_layernorm.weight.detach(),
        gu,
        down,
    )


class _Compiled:
    """One compiled `_pre`/`_post` pair (a private copy of their code: Dynamo keeps
    compiled code, and its recompile budget, per code object)."""

    def __init__(self) -> None:
        self.compiles = 0  # graphs Inductor built (2 per warm-up of a new shape)
        backend = compile_policy.counting_backend(self)
        self.pre = torch.compile(_private(_pre), backend=backend, dynamic=False)
        self.post = torch.compile(_private(_post), backend=backend, dynamic=False)


def _private(fn: Callable[..., Any]) -> Callable[..., Any]:
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)


# One compiled pair per layer shape in the process: stages of one model share it.
_shared: dict[tuple[object, ...], _Compiled] = {}
_shared_lock = threading.Lock()


def _shape_key(model: model_mod.StageModel) -> tuple[object, ...]:
    cfg, a = model.cfg, model.layers[0].self_attn
    assert isinstance(a, model_mod.Attention)
    return (cfg.hidden_size, a.nh, a.nkv, cfg.head_dim, cfg.intermediate_size, cfg.qkv_bias)


class PromptGraph:
    """The compiled row-wise layer parts of one stage (`_Compiled` shared by shape)."""

    def __init__(self, model: model_mod.StageModel) -> None:
        with _shared_lock:
            self._c = _shared.setdefault(_shape_key(model), _Compiled())
        self.state = "cold"  # cold -> ready (warm_up); failures leave it cold, logged
        self.warmup_s = 0.0
        self.calls = 0  # steps run through it
        self._warmed = 0  # compiles when warm-up ended; more later are logged

    @property
    def compiles(self) -> int:
        return self._c.compiles

    def warm_up(self, model: model_mod.StageModel, packs: packed_linear.StagePacks) -> float:
        """Compile both functions over synthetic rows of the stage's first layer (the row
        count marked dynamic); returns the seconds it took. Raises what compiling raises."""
        t0 = time.perf_counter()
        layer = model.layers[0]
        assert isinstance(layer, model_mod.DecoderLayer)
        args = layer_args(layer, packs)
        if args is None:
            raise RuntimeError("the stage's first layer is not packed")
        cfg, a = model.cfg, layer.self_attn
        # Rows unlike every fixed size, so that Dynamo ties the row count to none of them.
        taken = {cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, a.q_size}
        t = 3 * packed_linear.ROW_BUCKET
        while t in taken or 2 * t in taken:
            t += packed_linear.ROW_BUCKET
        with torch.inference_mode():
            h = torch.zeros(t, cfg.hidden_size, dtype=model.dtype_)
            cos, sin = model.rope_tables(torch.arange(t), t)
            attn = torch.zeros(t, a.q_size, dtype=model.dtype_)
            for x in (h, cos, sin, attn):
                torch._dynamo.mark_dynamic(x, 0)
            self._layer(layer, args, h, cos, sin, attn)
        took = time.perf_counter() - t0
        self.state, self.warmup_s, self._warmed = "ready", took, self.compiles
        return took

    def _layer(
        self,
        layer: model_mod.DecoderLayer,
        args: LayerArgs,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: torch.Tensor,
    ) -> None:
        ln1, qkv, bias, o, ln2, gu, down = args
        a = layer.self_attn
        self._c.pre(h, ln1, qkv, bias, cos, sin, layer.input_layernorm.eps, a.nh, a.nkv)
        self._c.post(attn, h, o, ln2, gu, down, layer.post_attention_layernorm.eps, layer.mlp.ffn)

    def forward(
        self,
        layers: list[model_mod.DecoderLayer],
        x: torch.Tensor,
        md: attention.AttentionMetadata,
        kv: KV,
        packs: attention.PackedRows,
    ) -> torch.Tensor | None:
        """Hidden states through `layers` (`kv`: their pools), or None: run them eagerly
        (not warmed up, a layer not packed)."""
        if self.state != "ready":
            return None
        plan = [layer_args(layer, packs) for layer in layers]
        if any(args is None for args in plan):
            return None
        assert md.cos is not None and md.sin is not None  # set by the model's forward
        if not x.is_inference():  # Dynamo guards on it: the warm-up's rows were
            x = x.clone()
        t = x.shape[0]
        pre, post = self._c.pre, self._c.post
        for layer, args, (k_cache, v_cache) in zip(layers, plan, kv, strict=True):
            assert args is not None
            ln1, qkv, bias, o, ln2, gu, down = args
            a, eps = layer.self_attn, layer.input_layernorm.eps
            q, k, v = pre(x, ln1, qkv, bias, md.cos, md.sin, eps, a.nh, a.nkv)
            out = attention.paged_attention(q, k, v, md, k_cache, v_cache, a.scale)
            eps = layer.post_attention_layernorm.eps
            x = post(out.view(t, a.q_size), x, o, ln2, gu, down, eps, layer.mlp.ffn)
        self.calls += 1
        if self.compiles != self._warmed:
            log.warning(
                "compiled prompt rows recompiled on a step (%d rows): %d graphs since warm-up",
                t,
                self.compiles - self._warmed,
            )
            self._warmed = self.compiles
        return x
