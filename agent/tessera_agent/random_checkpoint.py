"""Random-weight Llama checkpoints of real model shapes, written fast on any device.

`tessera bench gpu` makes its own checkpoints (no network): the 1B shape (Llama-3.2-1B's
layout with a 32,000-token vocabulary) and the Llama-3.2-3B shape, in bfloat16 with
`torch_dtype` set to match, plus a word-level tokenizer of the same vocabulary so the
gateway can serve them. Weights are drawn on the given device (a GPU draws the 3B shape in
well under a second) and written as one safetensors file. `tiny_checkpoint.py` stays the
deterministic CPU fixture of the tests; this module is for sizes the tests never load.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

from tessera import dtypes


@dataclass(frozen=True)
class Shape:
    """A Llama decoder's dimensions."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int = 32000
    max_positions: int = 8192
    tie_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def param_count(self) -> int:
        hd, h = self.head_dim, self.hidden
        per_layer = (
            2 * h  # the two norms
            + h * (self.heads + 2 * self.kv_heads) * hd  # q, k, v
            + self.heads * hd * h  # o
            + 3 * h * self.intermediate  # gate, up, down
        )
        head = 0 if self.tie_embeddings else self.vocab * h
        return self.vocab * h + self.layers * per_layer + h + head


# The shapes of issue 29's GPU check; "tiny" is its CPU smoke-test stand-in.
SHAPES: dict[str, Shape] = {
    "1b": Shape(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192),
    "3b": Shape(layers=28, hidden=3072, heads=24, kv_heads=8, intermediate=8192),
    "tiny": Shape(
        layers=2, hidden=128, heads=4, kv_heads=2, intermediate=256, vocab=512, max_positions=4096
    ),
}

BOS, EOS = 1, 2


def _tokenizer(vocab: int) -> Tokenizer:
    """Word-level: token i is the word `t<i>` (ids 0-2 are pad, BOS and EOS)."""
    words = {"<pad>": 0, "<s>": BOS, "</s>": EOS}
    words.update({f"t{i}": i for i in range(3, vocab)})
    tok = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<pad>", "<s>", "</s>"])
    return tok


def config(shape: Shape, dtype: str) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": shape.max_positions,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "vocab_size": shape.vocab,
        "tie_word_embeddings": shape.tie_embeddings,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": 0,
        "torch_dtype": dtype,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "use_cache": True,
    }


def make(
    out: Path, shape: Shape, dtype: str = "bfloat16", device: str = "cpu", seed: int = 0
) -> Path:
    """Write config.json, tokenizer.json and model.safetensors of `shape` into `out`."""
    dtypes.check(dtype)
    tdtype: torch.dtype = getattr(torch, dtype)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config(shape, dtype), indent=2) + "\n")
    _tokenizer(shape.vocab).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}) + "\n"
    )
    gen = torch.Generator(device=device).manual_seed(seed)
    h, hd, std = shape.hidden, shape.head_dim, 1.0 / math.sqrt(shape.hidden)

    def rand(*dims: int, scale: float = std) -> torch.Tensor:
        t = torch.randn(dims, generator=gen, device=device, dtype=torch.float32) * scale
        return t.to(tdtype).cpu()

    def norm() -> torch.Tensor:
        t = 1.0 + 0.1 * torch.randn(h, generator=gen, device=device)
        return t.to(tdtype).cpu()

    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rand(shape.vocab, h, scale=1.0)}
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm()
        w[p + "post_attention_layernorm.weight"] = norm()
        w[p + "self_attn.q_proj.weight"] = rand(shape.heads * hd, h)
        w[p + "self_attn.k_proj.weight"] = rand(shape.kv_heads * hd, h)
        w[p + "self_attn.v_proj.weight"] = rand(shape.kv_heads * hd, h)
        w[p + "self_attn.o_proj.weight"] = rand(h, shape.heads * hd)
        w[p + "mlp.gate_proj.weight"] = rand(shape.intermediate, h)
        w[p + "mlp.up_proj.weight"] = rand(shape.intermediate, h)
        w[p + "mlp.down_proj.weight"] = rand(
            h, shape.intermediate, scale=1 / math.sqrt(shape.intermediate)
        )
    w["model.norm.weight"] = norm()
    if not shape.tie_embeddings:
        w["lm_head.weight"] = rand(shape.vocab, h)
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
