"""Block equivalence report of a full fine-tune against its foundation (BlockLLM §4.1).

For every layer range (block) of the fine-tune, the same calibration tokens go through both
models; each block's output is turned into vocabulary probabilities with that model's own
final norm, LM head and softmax (the "logit lens"), and the cosine similarity of the two
distributions, averaged over the calibration tokens, says how equivalent the blocks are.
Blocks whose weights are bit-identical (equal content digests) are shared always; blocks
that merely score above the threshold (0.98, as in the paper) are shared only when the user
opts in, and the report carries the measured similarity so the choice is visible.

Random-weight models give near-uniform distributions (every cosine near 1), so the tests
use checkpoints made peaked on purpose and perturbed by known amounts.
Uses `transformers` for the forward passes; called by the variants CLI and tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tessera_agent.engine import block_digest

THRESHOLD = 0.98


@dataclass(frozen=True)
class BlockReport:
    start: int
    end: int
    identical: bool  # every layer's weights are bit-identical to the foundation's
    cosine: float  # mean logit-lens cosine similarity of the block outputs
    equivalent: bool  # identical, or cosine >= threshold

    def to_json(self) -> dict[str, object]:
        return {
            "layers": [self.start, self.end],
            "identical": self.identical,
            "cosine": round(self.cosine, 6),
            "equivalent": self.equivalent,
        }


def _lens(model: Any, ids: torch.Tensor) -> list[torch.Tensor]:
    """Vocabulary distributions [tokens, vocab] after each decoder layer (1..L)."""
    out = model(input_ids=ids, output_hidden_states=True)
    hs = out.hidden_states  # embeddings, then after each layer (the last may be normed)
    inner = model.model
    probs = []
    last = len(hs) - 1
    for i in range(1, last + 1):
        h = hs[i]
        normed = inner.norm(h)
        logits = model.lm_head(normed)
        if i == last and not torch.allclose(logits, out.logits, atol=1e-4):
            logits = model.lm_head(h)  # transformers already applied the final norm
        probs.append(torch.softmax(logits.float(), dim=-1).reshape(-1, logits.shape[-1]))
    return probs


@torch.inference_mode()
def report(
    foundation: Path,
    variant: Path,
    calibration: Sequence[Sequence[int]],
    blocks: Sequence[tuple[int, int]] | None = None,
    threshold: float = THRESHOLD,
) -> list[BlockReport]:
    """One `BlockReport` per block (default: one block per layer)."""
    from transformers import AutoModelForCausalLM

    fa: Any = AutoModelForCausalLM.from_pretrained(str(foundation))
    va: Any = AutoModelForCausalLM.from_pretrained(str(variant))
    fa.eval()
    va.eval()
    n = fa.config.num_hidden_layers
    if va.config.num_hidden_layers != n:
        raise ValueError("the variant and the foundation have different layer counts")
    blocks = [(i, i + 1) for i in range(n)] if blocks is None else blocks
    differ = set(block_digest.diff_layers(foundation, variant))
    sims: dict[int, list[float]] = {}
    for seq in calibration:
        ids = torch.tensor([list(seq)])
        pf, pv = _lens(fa, ids), _lens(va, ids)
        for layer in range(n):
            cos = torch.nn.functional.cosine_similarity(pf[layer], pv[layer], dim=-1)
            sims.setdefault(layer, []).extend(cos.tolist())
    out = []
    for a, b in blocks:
        vals = sims[b - 1]  # the block's output is its last layer's
        cosine = sum(vals) / len(vals)
        identical = not any(a <= i < b for i in differ)
        out.append(BlockReport(a, b, identical, cosine, identical or cosine >= threshold))
    return out
