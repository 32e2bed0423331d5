"""What the gateway needs to know about the served checkpoint, read once from its directory.

`ModelInfo.load(path)` reads `config.json` (context length, vocabulary size; through
`tessera.model_facts`, the one reader),
`tokenizer_config.json` (chat template, BOS/EOS strings) and, if present,
`chat_template.jinja`. Called by `server.start_gateway`; the tokenizer itself is loaded by
`tokenizer.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera import model_facts


@dataclass(frozen=True)
class ModelInfo:
    """Served-model metadata (no weights)."""

    path: str
    context_len: int  # config.json max_position_embeddings: prompt + completion limit
    vocab_size: int
    chat_template: str | None  # None: the gateway's documented default template is used
    bos_token: str
    eos_token: str

    def __post_init__(self) -> None:
        if self.context_len < 2:
            raise ValueError(f"context_len: {self.context_len} is too small")
        if self.vocab_size < 1:
            raise ValueError("vocab_size: must be >= 1")

    @classmethod
    def load(cls, path: str | Path) -> ModelInfo:
        """Read the checkpoint directory; ValueError naming the file when it is unusable."""
        root = Path(path)
        cfg = _read_json(root / model_facts.CONFIG, required=True)
        tok_cfg = _read_json(root / "tokenizer_config.json", required=False)
        context = cfg.get("max_position_embeddings") or tok_cfg.get("model_max_length")
        if not isinstance(context, int):
            raise ValueError(f"{root / 'config.json'}: no integer max_position_embeddings")
        vocab = cfg.get("vocab_size")
        if not isinstance(vocab, int):
            raise ValueError(f"{root / 'config.json'}: no integer vocab_size")
        template = _chat_template(tok_cfg.get("chat_template"))
        jinja_file = root / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        return cls(
            path=str(root),
            context_len=context,
            vocab_size=vocab,
            chat_template=template,
            bos_token=_token_text(tok_cfg.get("bos_token")),
            eos_token=_token_text(tok_cfg.get("eos_token")),
        )


def _read_json(path: Path, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise ValueError(f"{path}: not found (is this a Hugging Face checkpoint directory?)")
        return {}
    return model_facts.read_object(path)


def _chat_template(value: object) -> str | None:
    """A string, or HF's list form `[{"name": "default", "template": ...}, ...]`."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list):
        named = {
            t.get("name"): t.get("template")
            for t in value
            if isinstance(t, dict) and isinstance(t.get("template"), str)
        }
        chosen = named.get("default")
        return chosen if isinstance(chosen, str) else None
    return None


def _token_text(value: object) -> str:
    """Special tokens are strings or `{"content": ...}` objects in tokenizer_config.json."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return ""
