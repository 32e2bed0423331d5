"""One co-step: the steps of several chains run layer by layer, shared instances batched.

Given several `StageRunner`s' steps and a `block_batching.CoStep` plan, runs every pass in
order. A pass over a shared instance concatenates the steps' hidden rows and runs norms,
projections and MLP once; attention stays per chain (own KV cache, positions, RoPE); LoRA
deltas apply to their own chain's rows only. A single-step pass calls the chain's own layer
module. Last stages batch a shared final norm + LM head, then sample per chain.
Guarantee: each step computes what `StageRunner.execute` computes alone (same greedy tokens;
the oracle tests check). The compiled decode graph is not used here. Called on the compute
thread by `cobatch.CoBatchExecutor`; `uses()` describes a runner's instances for the plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tessera.policies.serving import block_batching as bb
from tessera_agent.engine import attention, lora, sampling, step
from tessera_agent.engine import model as model_mod
from tessera_agent.engine import runner as runner_mod


def _base(mod: nn.Module) -> nn.Module:
    return mod.base if isinstance(mod, lora.LoraLinear) else mod


def _ident(*params: object) -> str:
    return ".".join(f"{id(p):x}" for p in params if p is not None)


def _layer_piece(layer: model_mod.DecoderLayer) -> str:
    a, m = layer.self_attn, layer.mlp
    qkv = _base(a.qkv_proj)
    return _ident(
        layer.input_layernorm.weight,
        qkv.weight,
        getattr(qkv, "bias", None),
        _base(a.o_proj).weight,
        layer.post_attention_layernorm.weight,
        _base(m.gate_up_proj).weight,
        _base(m.down_proj).weight,
    )


def eligible(r: runner_mod.StageRunner) -> bool:
    """Runs in co-steps: a plain single-rank stage without replicated layer runs."""
    m = r.model
    return (
        type(r) is runner_mod.StageRunner
        and not r.runs
        and m.shard.size == 1
        and all(isinstance(layer, model_mod.DecoderLayer) for layer in m.layers)
    )


def uses(r: runner_mod.StageRunner) -> tuple[bb.Use, ...]:
    """The block instances a step of `r` runs, in order (() when not `eligible`)."""
    if not eligible(r):
        return ()
    m = r.model
    out = [
        bb.Use(layer.index, f"layer.{layer.index}", _layer_piece(layer))  # type: ignore[arg-type]
        for layer in m.layers
    ]
    if m.norm is not None and m.lm_head is not None:
        out.append(bb.Use(m.cfg.num_layers, "final", _ident(m.norm.weight, m.lm_head.weight)))
    return tuple(out)


@dataclass
class _Lane:
    """One chain's step inside the co-step."""

    runner: runner_mod.StageRunner
    inp: step.StepInput
    md: attention.AttentionMetadata
    x: torch.Tensor  # hidden rows as of the last pass it took part in
    layers: dict[int, tuple[model_mod.DecoderLayer, int]]  # global index -> (module, local)

    @property
    def rows(self) -> int:
        return int(self.x.shape[0])


def _lane(r: runner_mod.StageRunner, inp: step.StepInput) -> _Lane:
    """What `StageRunner.execute` does before its forward, and the first stage's embedding."""
    r.forget_finished(inp.finished)
    md, x = r.step_input(inp)
    m = r.model
    if m.is_first:
        assert m.embed_tokens is not None
        x = m.embed_tokens(x)
    md.cos, md.sin = m.rope_tables(md.positions, md.max_position)
    layers = {layer.index: (layer, i) for i, layer in enumerate(m.layers)}
    return _Lane(r, inp, md, x, layers)  # type: ignore[arg-type]


def _proj(
    mods: Sequence[nn.Module], x: torch.Tensor, spans: Sequence[tuple[int, int]]
) -> torch.Tensor:
    """The shared base projection over all rows, then each chain's LoRA on its rows."""
    y: torch.Tensor = _base(mods[0])(x)
    for mod, (r0, r1) in zip(mods, spans, strict=True):
        if isinstance(mod, lora.LoraLinear):
            mod.add_delta(x[r0:r1], y[r0:r1])
    return y


def _attend(a: model_mod.Attention, qkv: torch.Tensor, lane: _Lane, local: int) -> torch.Tensor:
    """`Attention.forward` after its qkv projection, on one chain's rows (mirrors it)."""
    t = qkv.shape[0]
    md = lane.md
    assert md.cos is not None and md.sin is not None
    qk = qkv[:, : a.q_size + a.kv_size].view(t, a.nh + a.nkv, a.hd)
    qk = model_mod.apply_rope(qk, md.cos, md.sin)
    q, k = qk[:, : a.nh], qk[:, a.nh :]
    v = qkv[:, a.q_size + a.kv_size :].view(t, a.nkv, a.hd)
    k_cache, v_cache = lane.runner.cache.layers()[local]
    out = attention.paged_attention(q, k, v, md, k_cache, v_cache, a.scale)
    return out.view(t, a.q_size)


def _shared_layer(slot: int, lanes: Sequence[_Lane], x: torch.Tensor) -> torch.Tensor:
    """`DecoderLayer.forward` of one instance over several chains' rows (mirrors it)."""
    mods = [lane.layers[slot] for lane in lanes]
    spans, r0 = [], 0
    for lane in lanes:
        spans.append((r0, r0 + lane.rows))
        r0 += lane.rows
    lead = mods[0][0]
    attn = [m.self_attn for m, _ in mods]
    mlp = [m.mlp for m, _ in mods]
    h = lead.input_layernorm(x)
    qkv = _proj([a.qkv_proj for a in attn], h, spans)
    outs = [
        _attend(a, qkv[s0:s1], lane, local)
        for a, lane, (s0, s1), (_, local) in zip(attn, lanes, spans, mods, strict=True)
    ]
    x = x + _proj([a.o_proj for a in attn], torch.cat(outs), spans)
    h = lead.post_attention_layernorm(x)
    gate, up = torch.split(_proj([p.gate_up_proj for p in mlp], h, spans), lead.mlp.ffn, -1)
    return x + _proj([p.down_proj for p in mlp], F.silu(gate) * up, spans)


@torch.inference_mode()
def run(
    jobs: Mapping[int, tuple[runner_mod.StageRunner, step.StepInput]], plan: bb.CoStep
) -> dict[int, step.StepOutput | Exception]:
    """Each admitted job's output (or the error its step raised), by the plan's keys.

    A step whose input is refused (an unknown variant, a missing input) fails alone
    before any layer runs; an error inside a pass fails the steps of that co-step."""
    lanes: dict[int, _Lane] = {}
    results: dict[int, step.StepOutput | Exception] = {}
    for k in plan.steps:
        if k not in jobs:  # cancelled before it ran
            continue
        try:
            lanes[k] = _lane(*jobs[k])
        except Exception as exc:  # handed to that step's caller
            results[k] = exc
    try:
        for p in plan.passes:
            group = [lanes[k] for k in p.steps if k in lanes]
            if p.label == "final" or not group:
                continue  # the final piece runs after every layer
            if len(group) == 1:
                lane = group[0]
                layer, local = lane.layers[p.slot]
                k_cache, v_cache = lane.runner.cache.layers()[local]
                lane.x = layer(lane.x, lane.md, k_cache, v_cache)
                continue
            x = _shared_layer(p.slot, group, torch.cat([lane.x for lane in group]))
            for lane, part in zip(
                group, torch.split(x, [lane.rows for lane in group]), strict=True
            ):
                lane.x = part
        for p in plan.passes:
            keys = [k for k in p.steps if k in lanes]
            if p.label == "final" and keys:
                results.update(zip(keys, _final([lanes[k] for k in keys]), strict=True))
    except Exception as exc:
        return {k: results.get(k, exc) for k in plan.steps if k in jobs}
    for k, lane in lanes.items():
        results.setdefault(k, step.StepOutput(step_id=lane.inp.step_id, hidden=lane.x))
    return results


def _final(lanes: Sequence[_Lane]) -> list[step.StepOutput]:
    """Final norm + LM head once over the rows every chain samples, then each chain's
    sampler on its rows (mirrors the end of `StageRunner.execute`)."""
    picks: list[tuple[list[str], list[sampling.SamplingParams], torch.Tensor]] = []
    for lane in lanes:
        rows, ids, params = runner_mod.sample_rows(lane.inp.chunks)
        dev = lane.runner.device
        picks.append((ids, params, lane.x[torch.tensor(rows, dtype=torch.long, device=dev)]))
    hidden = torch.cat([p[2] for p in picks])
    logits = lanes[0].runner.model.logits(hidden).float() if hidden.shape[0] else hidden
    outs = []
    for lane, (ids, params, _), part in zip(
        lanes, picks, torch.split(logits, [len(p[0]) for p in picks]), strict=True
    ):
        step_id = lane.inp.step_id
        outs.append(
            lane.runner.sampled(step_id, part, ids, params) if ids else step.StepOutput(step_id)
        )
    return outs
