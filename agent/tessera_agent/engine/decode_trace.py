"""What the compiled decode traces and warms up on: the pure-decode forward and its inputs.

`forward` is `StageModel.forward`'s layers for a pure-decode step (every row one decode
token, in order: `is_pure_decode`), the function Dynamo traces; `fingerprint` names the
layers it was traced over. `shapes` and `synthetic` make the warm-up's steps: a batch
size, context and scratch pool unlike each other and every fixed dimension (so Dynamo's
duck sizing ties none of them), and a step over a scratch pool made the way the real one
is. Called by `decode_graph.CompiledDecode` and `runner.py`.
"""

from __future__ import annotations

import torch

from tessera_agent.engine import attention, packed_linear
from tessera_agent.engine import model as model_mod

KV = list[tuple[torch.Tensor, torch.Tensor]]  # a stage's pool: (K, V) per local layer


def is_pure_decode(md: attention.AttentionMetadata) -> bool:
    """Every row of the step is one decode token, in order (no prefill of any kind)."""
    return (
        md.decode_leading
        and not md.prefill
        and not md.fresh
        and md.decode_rows.numel() == md.positions.numel()
    )


def forward(
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
    fused: bool,
    packs: packed_linear.GraphPacks | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The layers of `StageModel.forward` for a pure-decode step (traced by dynamo): the
    hidden states, and on a last stage every row's logits (`StageModel.logits`: a decode
    step samples every row, and its final norm and LM head compiled with the layers
    cost a fraction of running them eagerly after the graph)."""
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
        decode_fused=fused,
        packed=packs,
    )
    if model.embed_tokens is not None:
        x = model.embed_tokens(x)
    for layer, (k_cache, v_cache) in zip(model.layers, kv, strict=True):
        x = layer(x, md, k_cache, v_cache)
    if model.norm is None or model.lm_head is None:
        return x, None
    return x, model.logits(x)


def fingerprint(model: model_mod.StageModel) -> tuple[int, ...]:
    """The identity of the stage's layers: it changes when a drop or shift swaps them."""
    return (id(model.embed_tokens), id(model.lm_head), *(id(layer) for layer in model.layers))


def distinct(start: int, taken: set[int]) -> int:
    """The least integer >= `start` not in `taken`."""
    n = start
    while n in taken:
        n += 1
    return n


def shapes(
    model: model_mod.StageModel, page_size: int, kv: list[tuple[torch.Tensor, torch.Tensor]]
) -> tuple[int, int, int]:
    """A general batch size, context length and scratch pool size: unlike each other
    and every fixed input dimension, so Dynamo's duck sizing ties none of them."""
    _, nkv, hd = kv[0][0].shape
    taken = {0, 1, nkv, hd, model.cfg.hidden_size, page_size}
    b = distinct(2, taken)
    ctx = distinct(page_size + 3, taken | {b})
    pages = -(-ctx // page_size) + 1
    slots = distinct(pages * page_size, taken | {b, ctx})
    return b, ctx, slots


def synthetic(
    model: model_mod.StageModel,
    page_size: int,
    device: torch.device,
    kv_like: KV,
    b: int,
    ctx: int,
    slots: int,
) -> tuple[torch.Tensor, attention.AttentionMetadata, KV]:
    """A pure-decode step of `b` rows at context `ctx` over a scratch pool of `slots`."""
    ps = page_size
    k0 = kv_like[0][0]
    # Made the way the real pool is (outside inference mode): Dynamo guards on the
    # tensors' dispatch keys, and an inference tensor's differ.
    with torch.inference_mode(k0.is_inference()):
        scratch = [
            (
                torch.zeros(slots, *k0.shape[1:], dtype=k0.dtype, device=k0.device),
                torch.zeros(slots, *k0.shape[1:], dtype=k0.dtype, device=k0.device),
            )
            for _ in kv_like
        ]
    table = tuple(range(-(-ctx // ps)))
    chunks = [attention.ChunkGeometry(ctx - 1, 1, table) for _ in range(b)]
    md = attention.build_metadata(chunks, ps, device)
    if model.is_first:
        x = torch.zeros(b, dtype=torch.long, device=device)
    else:
        x = torch.zeros(b, model.cfg.hidden_size, dtype=model.dtype_)
        x = x.to(device)
    return x, md, scratch
