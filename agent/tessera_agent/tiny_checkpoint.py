"""Writes tiny Llama-family checkpoints with random weights and a locally trained tokenizer.

Called by `tessera model make-tiny` and by tests, which generate checkpoints at run time
(none are committed). The output is an ordinary Hugging Face directory that
`AutoModelForCausalLM` / `AutoTokenizer` load offline. Everything is a function of the
arguments: the same seed gives byte-identical files.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
PAD = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

# Default chat template shipped in tokenizer_config.json (ChatML-style, as Qwen2 uses).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# A small fixed corpus so the tokenizer is trained locally and deterministically.
_CORPUS = """
Tessera serves large language models one block at a time. A block is a range of decoder
layers; agents load blocks, copy them between devices and drop them when memory is short.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Once upon a time there was a little robot who wanted to learn how to write poems.
The planner chooses how many replicas to run and which requests each replica serves.
Kubernetes reconciles the desired state with the observed state, again and again.
def add(a, b):
    return a + b
for i in range(10):
    print(i * i)
{"model": "tiny", "prompt": "Hello, world!", "max_tokens": 16, "temperature": 0.0}
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828 42.
Questions? Answers! Colons: semicolons; dashes - and (parentheses) [brackets] {braces}.
"""


@dataclass(frozen=True)
class TinySpec:
    """Shape of a tiny checkpoint; defaults follow the issue (8 layers, hidden 256, ...)."""

    arch: str = "llama"
    layers: int = 8
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 512
    seed: int = 0
    intermediate: int = 0  # 0 = derive from hidden (Llama's ~2.75x rounded to 32)
    head_dim: int = 0  # 0 = hidden // heads; set it for q/o widths other than hidden
    max_positions: int = 1024
    rope_scaling: str = "none"  # "none" or "llama3"
    tie_embeddings: bool | None = None  # None = arch default (qwen2 ties, llama does not)
    shards: int = 1
    init_std: float = 0.0  # 0 = 1/sqrt(hidden)
    extra: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.arch not in ("llama", "qwen2", "mistral"):
            raise ValueError(f"arch: {self.arch!r} is not one of llama, qwen2, mistral")
        for name in ("layers", "hidden", "heads", "kv_heads", "vocab", "shards"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1")
        if self.head_dim < 0:
            raise ValueError("head_dim: must be >= 0 (0 = hidden // heads)")
        if not self.head_dim and self.hidden % self.heads:
            raise ValueError(f"hidden: {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads: {self.kv_heads} does not divide heads {self.heads}")
        if self.vocab < 300:
            raise ValueError("vocab: must be >= 300 (256 byte tokens plus specials and merges)")
        if self.rope_scaling not in ("none", "llama3"):
            raise ValueError(f"rope_scaling: {self.rope_scaling!r} is not none or llama3")

    @property
    def tied(self) -> bool:
        return self.arch == "qwen2" if self.tie_embeddings is None else self.tie_embeddings

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def ffn(self) -> int:
        if self.intermediate:
            return self.intermediate
        return int(math.ceil(self.hidden * 2.75 / 32) * 32)


def train_tokenizer(vocab: int) -> Tokenizer:
    """Train a byte-level BPE tokenizer of exactly `vocab` entries on the built-in corpus."""
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials = [BOS, EOS, PAD, IM_START, IM_END]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=1,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def _config(spec: TinySpec, tok: Tokenizer) -> dict[str, object]:
    arch_class = {
        "llama": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "mistral": "MistralForCausalLM",
    }[spec.arch]
    cfg: dict[str, object] = {
        "architectures": [arch_class],
        "model_type": spec.arch,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.hd,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_positions,
        "rms_norm_eps": 1e-5 if spec.arch != "qwen2" else 1e-6,
        "rope_theta": 10000.0 if spec.arch != "qwen2" else 1000000.0,
        "vocab_size": spec.vocab,
        "tie_word_embeddings": spec.tied,
        "bos_token_id": tok.token_to_id(BOS),
        "eos_token_id": tok.token_to_id(EOS),
        "pad_token_id": tok.token_to_id(PAD),
        "torch_dtype": "float32",
        "initializer_range": 0.02,
        "use_cache": True,
    }
    if spec.arch == "llama":
        cfg["attention_bias"] = False
        cfg["mlp_bias"] = False
    if spec.arch == "qwen2":
        cfg["use_sliding_window"] = False
        cfg["sliding_window"] = None
        cfg["max_window_layers"] = spec.layers
    if spec.arch == "mistral":
        cfg["sliding_window"] = None
    if spec.rope_scaling == "llama3":
        cfg["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": max(spec.max_positions // 8, 16),
        }
    cfg.update(spec.extra)
    return cfg


def _weights(spec: TinySpec) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(spec.seed)
    std = spec.init_std or 1.0 / math.sqrt(spec.hidden)
    hd = spec.hd
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab, spec.hidden)}
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (spec.hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (spec.hidden,)
        shapes[p + "self_attn.q_proj.weight"] = (spec.heads * hd, spec.hidden)
        shapes[p + "self_attn.k_proj.weight"] = (spec.kv_heads * hd, spec.hidden)
        shapes[p + "self_attn.v_proj.weight"] = (spec.kv_heads * hd, spec.hidden)
        shapes[p + "self_attn.o_proj.weight"] = (spec.hidden, spec.heads * hd)
        if spec.arch == "qwen2":
            shapes[p + "self_attn.q_proj.bias"] = (spec.heads * hd,)
            shapes[p + "self_attn.k_proj.bias"] = (spec.kv_heads * hd,)
            shapes[p + "self_attn.v_proj.bias"] = (spec.kv_heads * hd,)
        shapes[p + "mlp.gate_proj.weight"] = (spec.ffn, spec.hidden)
        shapes[p + "mlp.up_proj.weight"] = (spec.ffn, spec.hidden)
        shapes[p + "mlp.down_proj.weight"] = (spec.hidden, spec.ffn)
    shapes["model.norm.weight"] = (spec.hidden,)
    if not spec.tied:
        shapes["lm_head.weight"] = (spec.vocab, spec.hidden)
    out: dict[str, torch.Tensor] = {}
    for name in sorted(shapes):  # fixed order: the seed fully determines every tensor
        shape = shapes[name]
        if name.endswith("norm.weight"):
            out[name] = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith("embed_tokens.weight"):
            # Tied heads read logits off the embedding: keep it small so the decoder
            # layers, not the last token's own embedding, decide the next token.
            scale = 0.05 if spec.tied else 1.0
            out[name] = scale * torch.randn(shape, generator=gen)
        else:
            out[name] = std * torch.randn(shape, generator=gen)
    return out


def make_tiny(out: Path, spec: TinySpec) -> Path:
    """Write a complete HF checkpoint directory for `spec` into `out`; return `out`."""
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(spec.vocab)
    if tok.get_vocab_size() != spec.vocab:
        raise ValueError(
            f"vocab: the corpus yields only {tok.get_vocab_size()} tokens; use a smaller vocab"
        )
    tok.save(str(out / "tokenizer.json"))
    cfg = _config(spec, tok)
    _write_json(out / "config.json", cfg)
    _write_json(
        out / "generation_config.json",
        {
            "bos_token_id": cfg["bos_token_id"],
            "eos_token_id": cfg["eos_token_id"],
            "pad_token_id": cfg["pad_token_id"],
            "do_sample": False,
        },
    )
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": PAD,
            "add_bos_token": True,
            "model_max_length": spec.max_positions,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
        },
    )
    _write_json(
        out / "special_tokens_map.json",
        {
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": PAD,
        },
    )
    weights = _weights(spec)
    for stale in list(out.glob("model*.safetensors")) + list(out.glob("*.index.json")):
        stale.unlink()
    if spec.shards == 1:
        save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        names = sorted(weights)
        per = math.ceil(len(names) / spec.shards)
        weight_map: dict[str, str] = {}
        total = 0
        for s in range(spec.shards):
            fname = f"model-{s + 1:05d}-of-{spec.shards:05d}.safetensors"
            part = {n: weights[n] for n in names[s * per : (s + 1) * per]}
            save_file(part, str(out / fname), metadata={"format": "pt"})
            for n, t in part.items():
                weight_map[n] = fname
                total += t.numel() * t.element_size()
        _write_json(
            out / "model.safetensors.index.json",
            {"metadata": {"total_size": total}, "weight_map": weight_map},
        )
    return out


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
