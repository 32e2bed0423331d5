"""Text ↔ token ids for the served model, with the `tokenizers` library (not transformers).

Loaded from the checkpoint's `tokenizer.json` by `server.start_gateway`; used by the HTTP
handlers (prompts, stop strings) and, through `decode`, by `detokenize.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer


class TextCodec:
    """A loaded tokenizer. Decoding skips special tokens (BOS, EOS, chat markers)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer

    @classmethod
    def load(cls, model_path: str | Path) -> TextCodec:
        path = Path(model_path) / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"{path}: not found (the gateway needs a tokenizers JSON file)")
        return cls(Tokenizer.from_file(str(path)))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` runs the post-processor (adds BOS)."""
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def single_token(self, text: str) -> int | None:
        """The id of `text` if it is exactly one token (stop strings become stop tokens)."""
        ids = self.encode(text, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None
