"""A peer copy writes each weight once (issue 32): the receiver allocates one buffer per
decoder layer in the header's order (`block_copy.buffers`), so q/k/v and gate/up lie one
after the other and the loader fuses them as views (`loader.fused`), not copies; tensors
that do not lie so are concatenated as before."""

from __future__ import annotations

import torch

from tessera_agent.engine import loader
from tessera_agent.transfer import block_copy


def _header(layers: int) -> list[tuple[str, str, tuple[int, ...]]]:
    out = [("model.embed_tokens.weight", "float32", (32, 8))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", "float32", (8,)),
            (p + "self_attn.q_proj.weight", "float32", (8, 8)),
            (p + "self_attn.k_proj.weight", "float32", (4, 8)),
            (p + "self_attn.v_proj.weight", "float32", (4, 8)),
            (p + "mlp.gate_proj.weight", "float32", (16, 8)),
            (p + "mlp.up_proj.weight", "float32", (16, 8)),
        ]
    return out


def test_buffers_share_one_allocation_per_layer_in_header_order() -> None:
    header = _header(2)
    bufs = block_copy.buffers(header, torch.device("cpu"))
    assert list(bufs) == [n for n, _, _ in header]
    assert all(tuple(bufs[n].shape) == s for n, _, s in header)

    def storage(name: str) -> int:
        return bufs[name].untyped_storage().data_ptr()

    layer0 = {storage(n) for n in bufs if n.startswith("model.layers.0.")}
    layer1 = {storage(n) for n in bufs if n.startswith("model.layers.1.")}
    assert len(layer0) == len(layer1) == 1 and layer0 != layer1
    assert storage("model.embed_tokens.weight") not in layer0 | layer1


def test_fused_is_a_view_when_adjacent_and_a_copy_otherwise() -> None:
    bufs = block_copy.buffers(_header(1), torch.device("cpu"))
    for t in bufs.values():
        t.copy_(torch.randn(t.shape))
    p = "model.layers.0."
    qkv = [bufs[p + f"self_attn.{x}_proj.weight"] for x in "qkv"]
    got = loader.fused(qkv)
    assert torch.equal(got, torch.cat(qkv))
    assert got.data_ptr() == qkv[0].data_ptr()  # no copy
    gate_up = [bufs[p + "mlp.gate_proj.weight"], bufs[p + "mlp.up_proj.weight"]]
    assert loader.fused(gate_up).data_ptr() == gate_up[0].data_ptr()
    apart = [torch.randn(8, 8), torch.randn(4, 8)]  # separate allocations
    copied = loader.fused(apart)
    assert torch.equal(copied, torch.cat(apart)) and copied.data_ptr() != apart[0].data_ptr()
    gap = [qkv[0], qkv[2]]  # same storage, not adjacent
    assert torch.equal(loader.fused(gap), torch.cat(gap))
    assert loader.fused(gap).data_ptr() != qkv[0].data_ptr()
