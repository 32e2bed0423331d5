"""Model configuration: the shape of a Llama-family checkpoint, read from HF `config.json`.

Called by the loader and the model code. Supports Llama, Mistral and Qwen2 (the families
whose decoder layer is RMSNorm → GQA attention with RoPE → RMSNorm → SwiGLU MLP). Both
the classic (`rope_theta` + `rope_scaling`) and the newer (`rope_parameters`) encodings
of RoPE settings are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera import model_facts

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")


class ConfigError(ValueError):
    """The checkpoint's config.json is missing, unsupported or inconsistent."""


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding settings: base, and llama3-style frequency scaling when set."""

    theta: float = 10000.0
    rope_type: str = "default"  # "default" or "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ("default", "llama3"):
            raise ConfigError(
                f"rope_scaling.rope_type: {self.rope_type!r} is not supported "
                "(supported: default, llama3)"
            )


@dataclass(frozen=True)
class ModelConfig:
    """Everything the engine needs to build any layer range of a checkpoint."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    max_positions: int
    tie_embeddings: bool
    qkv_bias: bool
    rope: RopeConfig = field(default_factory=RopeConfig)
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    torch_dtype: str = ""  # config.json's torch_dtype ("" when it names none)

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_TYPES:
            raise ConfigError(
                f"model_type: {self.model_type!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_TYPES)})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("num_key_value_heads must divide num_attention_heads")

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        try:
            model_type = str(cfg.get("model_type", ""))
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            rope = _rope(cfg)
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
            return cls(
                model_type=model_type,
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                vocab_size=int(cfg["vocab_size"]),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                max_positions=int(cfg.get("max_position_embeddings", 2048)),
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
                rope=rope,
                eos_token_ids=tuple(int(e) for e in eos_ids),
                bos_token_id=cfg.get("bos_token_id"),
                torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or ""),
            )
        except KeyError as exc:
            raise ConfigError(f"config.json: missing field {exc.args[0]!r}") from exc

    @classmethod
    def from_path(cls, model_path: str | Path) -> ModelConfig:
        return cls.from_dict(model_facts.read_config(model_path))


def _rope(cfg: dict[str, Any]) -> RopeConfig:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    src = scaling or params
    rope_type = str(src.get("rope_type", src.get("type", "default")))
    if rope_type == "default" or not src:
        return RopeConfig(theta=theta)
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(src.get("factor", 1.0)),
        low_freq_factor=float(src.get("low_freq_factor", 1.0)),
        high_freq_factor=float(src.get("high_freq_factor", 4.0)),
        original_max_positions=int(src.get("original_max_position_embeddings", 8192)),
    )
