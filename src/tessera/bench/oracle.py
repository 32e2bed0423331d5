"""Greedy `transformers` decodes: the correctness oracle of served tokens.

`greedy_tokens` decodes each (prompt ids, new tokens) pair with the checkpoint's Hugging
Face model in float32, EOS ignored, one thread (the bench's agents share the machine),
each distinct pair once; `greedy_texts` detokenizes them; `matches` says for each
completed stream whether its text is that decode. Imports torch and transformers when
called. Called by the serving benchmarks after their replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tessera.bench import client


def greedy_tokens(model: Path, requests: Sequence[tuple[Sequence[int], int]]) -> list[list[int]]:
    """transformers' greedy new tokens for each (prompt ids, max new tokens), EOS ignored."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)  # one thread: no spinning against the agents on a busy host
    hf: Any = AutoModelForCausalLM.from_pretrained(str(model))
    hf.generation_config.eos_token_id = None
    memo: dict[tuple[tuple[int, ...], int], list[int]] = {}
    out = []
    for prompt, new in requests:
        key = (tuple(prompt), new)
        if key not in memo:
            ids = torch.tensor([list(prompt)])
            with torch.no_grad():
                seq = hf.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=False,
                    max_new_tokens=new,
                    pad_token_id=0,
                )
            memo[key] = seq[0, len(prompt) :].tolist()
        out.append(memo[key])
    return out


def greedy_texts(model: Path, requests: Sequence[tuple[Sequence[int], int]]) -> list[str]:
    """transformers' greedy text for each (prompt ids, max new tokens), EOS ignored."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    return [tok.decode(t, skip_special_tokens=True) for t in greedy_tokens(model, requests)]


def matches(model: Path, streams: Sequence[client.Stream]) -> list[bool]:
    """Whether each stream's text is transformers' greedy decode of its prompt."""
    want = greedy_texts(model, [(s.prompt, s.max_tokens) for s in streams])
    return [w == s.text for w, s in zip(want, streams, strict=True)]
