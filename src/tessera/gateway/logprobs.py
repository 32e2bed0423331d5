"""Token log-probabilities in OpenAI's two response shapes (pure).

Called by `app.py` for responses whose request asked for them. Completions use the
legacy shape (`tokens`, `token_logprobs`, `top_logprobs` as {token text: logprob},
`text_offset`); chat uses `{"content": [{token, logprob, bytes, top_logprobs}]}`. A
token's text is its own decoding with special tokens kept; a token holding part of a
multi-byte character decodes to U+FFFD, while its `bytes` are the raw bytes it stands for
(so clients can rebuild the character from consecutive tokens, as with OpenAI).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tessera.gateway import dispatch

TokenText = Callable[[int], str]
TokenBytes = Callable[[int], bytes]


def completion(
    entries: Sequence[dispatch.TokenLogprob], text: TokenText, offset: int = 0
) -> dict[str, Any]:
    """Legacy completions shape; `offset` is where the first token's text starts."""
    tokens = [text(e.token_id) for e in entries]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{text(i): lp for i, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


def chat(
    entries: Sequence[dispatch.TokenLogprob], text: TokenText, raw: TokenBytes
) -> dict[str, Any]:
    def item(token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": text(token_id), "logprob": logprob, "bytes": list(raw(token_id))}

    return {
        "content": [
            {**item(e.token_id, e.logprob), "top_logprobs": [item(i, lp) for i, lp in e.top]}
            for e in entries
        ]
    }
