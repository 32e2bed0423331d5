"""Text ↔ token ids for the served model, with the `tokenizers` library (not transformers).

Loaded from the checkpoint's `tokenizer.json` by `server.start_gateway`; used by the HTTP
handlers (prompts, stop strings) and, through `decode`, by `detokenize.py`.
`max_token_chars` bounds the characters one token can stand for (the longest vocabulary
entry, at most `MAX_CHARS_PER_TOKEN`): the handlers refuse longer texts before tokenizing.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece byte fallback
MAX_CHARS_PER_TOKEN = 32  # the budget's bound even where a vocabulary has longer entries


@functools.cache
def _byte_level_decoder() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's printable stand-ins for the 256 bytes)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TextCodec:
    """A loaded tokenizer. Decoding skips special tokens (BOS, EOS, chat markers)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        longest = max((len(p) for p in tokenizer.get_vocab(with_added_tokens=True)), default=1)
        self.max_token_chars = max(1, min(longest, MAX_CHARS_PER_TOKEN))

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

    def token_text(self, token_id: int) -> str:
        """One token's own text, special tokens included (for log-probability listings)."""
        return str(self._tok.decode([token_id], skip_special_tokens=False))

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token stands for, even when they are part of a character."""
        piece = self._tok.id_to_token(token_id) or ""
        table = _byte_level_decoder()
        if isinstance(self._tok.decoder, decoders.ByteLevel) and all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        if m := _BYTE_TOKEN.fullmatch(piece):
            return bytes([int(m.group(1), 16)])
        return self.token_text(token_id).encode()

    def single_token(self, text: str) -> int | None:
        """The id of `text` if it is exactly one token (stop strings become stop tokens)."""
        ids = self.encode(text, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None
