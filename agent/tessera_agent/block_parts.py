"""A Hugging Face causal LM cut into blocks that run one after another, each with its own
KV cache: the unit that speculation (`speculate.py`) and stitching (`stitch.py`) chain.

`cut(model, bounds)` gives one `Part` per decoder-layer range: the first holds the token
embedding, the last the final norm and LM head; between parts flow hidden states (the
pre-norm residual stream). Each part is a `transformers` model of its own, made from the
same config with fewer layers and loaded with the same tensors, so a chain of parts runs
exactly the operations of the whole model (its greedy tokens are `transformers`' own).
A part's cache can be cut back to an earlier length (`crop`), which is how a speculative
step that missed is undone. Callers: `speculate`, `stitch`, their benches and tests.
"""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Sequence
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache


class Part:
    """Decoder layers `[start, end)` of a model, with the embedding and/or head when it
    holds the first or last layer; `delay_s` makes it slow on purpose (benches, tests)."""

    def __init__(self, model: Any, start: int, end: int, delay_s: float = 0.0) -> None:
        cfg = copy.deepcopy(model.config)
        total = cfg.num_hidden_layers
        if not 0 <= start < end <= total:
            raise ValueError(f"layers [{start}, {end}) outside the model's {total}")
        cfg.num_hidden_layers = end - start
        if isinstance(getattr(cfg, "layer_types", None), list):
            cfg.layer_types = cfg.layer_types[start:end]
        self.first, self.last = start == 0, end == total
        self.start, self.end, self.delay_s = start, end, delay_s
        auto: Any = AutoModelForCausalLM
        sub = auto.from_config(cfg, dtype=torch.float32)
        state = model.state_dict()
        mine: dict[str, torch.Tensor] = {}
        for name, tensor in state.items():
            if name.startswith("model.layers."):
                idx, rest = name[len("model.layers.") :].split(".", 1)
                if start <= int(idx) < end:
                    mine[f"model.layers.{int(idx) - start}.{rest}"] = tensor
            else:
                mine[name] = tensor
        sub.load_state_dict(mine, strict=False)
        # what this part does not serve is dropped: the embedding (hidden states come in)
        # and the final norm and head (hidden states go out)
        if not self.first:
            sub.model.embed_tokens = torch.nn.Identity()
        if not self.last:
            sub.model.norm = torch.nn.Identity()
            sub.lm_head = torch.nn.Identity()
        self.model = sub.eval()
        self.cache: Any = DynamicCache(config=cfg)

    @torch.inference_mode()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (first part) or hidden states in; hidden states or logits (last) out."""
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.first:
            out = self.model.model(input_ids=x, cache=self.cache, use_cache=True)
        else:
            out = self.model.model(inputs_embeds=x, cache=self.cache, use_cache=True)
        h: torch.Tensor = out.last_hidden_state
        if self.last:
            logits: torch.Tensor = self.model.lm_head(h)
            return logits
        return h

    def length(self) -> int:
        """Tokens the cache holds."""
        return int(self.cache.get_seq_length())

    def crop(self, length: int) -> None:
        """Forget the cache past `length` tokens (a speculative step undone)."""
        extra = self.length() - length
        if length == 0:
            self.reset()
        elif extra > 0:
            self.cache.crop(-extra)  # this transformers takes the count to remove

    def reset(self) -> None:
        """An empty cache (a new sequence)."""
        self.cache = DynamicCache(config=self.model.config)

    @property
    def param_bytes(self) -> int:
        """Bytes of the parameters this part holds: its layers, and the embedding or the
        final norm and head when it holds the first or the last layer."""
        seen: set[int] = set()
        total = 0
        for p in self.model.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel() * p.element_size()
        return total


def cut(model: Any, bounds: Sequence[int]) -> list[Part]:
    """Parts at `bounds` (e.g. [0, 2, 4, 8] gives layers 0-1, 2-3, 4-7)."""
    return [Part(model, a, b) for a, b in itertools.pairwise(bounds)]


def greedy(parts: Sequence[Part], prompt: Sequence[int], max_new: int) -> list[int]:
    """Greedy tokens through the parts, one after another (no speculation)."""
    for p in parts:
        p.reset()
    x = torch.tensor([list(prompt)])
    out: list[int] = []
    for _ in range(max_new):
        for p in parts:
            x = p(x)
        tok = int(x[0, -1].argmax())
        out.append(tok)
        x = torch.tensor([[tok]])
    return out
