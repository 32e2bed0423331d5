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


# ----- sharing beyond identity (the opt-in `shareEquivalent`) -----------------------------

CALIBRATION = "uniform-ids-seed0-4x32"  # the name the report carries of the set below
_CALIB_SEQS, _CALIB_LEN = 4, 32


def calibration_set(vocab: int) -> list[list[int]]:
    """The deterministic calibration set of `share_report`: 4 sequences of 32 token ids
    drawn uniformly from the vocabulary by `torch.Generator().manual_seed(0)`."""
    g = torch.Generator().manual_seed(0)
    return [
        torch.randint(0, vocab, (_CALIB_LEN,), generator=g).tolist() for _ in range(_CALIB_SEQS)
    ]


@dataclass(frozen=True)
class LayerShare:
    """One decoder layer of a fine-tune judged for sharing with the foundation's."""

    layer: int
    identical: bool  # bit-identical: shared always (the zoo's content address)
    cosine: float  # logit-lens cosine, the foundation's layer swapped in on the same input
    shared: bool  # identical, or cosine >= threshold (served from the foundation's piece)


@dataclass(frozen=True)
class ShareReport:
    """What the opt-in decided for a fine-tune, and the quality measured for the result."""

    threshold: float
    layers: tuple[LayerShare, ...]
    final_cosine: float  # next-token distributions: shared configuration vs fine-tune alone
    top1_agreement: float  # share of calibration positions with the same argmax token
    calibration: str
    calibration_tokens: int

    @property
    def shared_layers(self) -> tuple[int, ...]:
        """Layers served from the foundation's pieces (identical or equivalent)."""
        return tuple(s.layer for s in self.layers if s.shared)

    @property
    def equivalent_layers(self) -> tuple[int, ...]:
        """Layers shared only because the user opted in (not bit-identical)."""
        return tuple(s.layer for s in self.layers if s.shared and not s.identical)

    def to_json(self) -> dict[str, object]:
        return {
            "threshold": self.threshold,
            "layers": [
                {
                    "layer": s.layer,
                    "cosine": round(s.cosine, 6),
                    "identical": s.identical,
                    "shared": s.shared,
                }
                for s in self.layers
            ],
            "finalCosine": round(self.final_cosine, 6),
            "top1Agreement": round(self.top1_agreement, 6),
            "calibration": self.calibration,
            "calibrationTokens": self.calibration_tokens,
        }


def _swapped(model: Any, donor: Any, layers: Sequence[int]) -> list[dict[str, torch.Tensor]]:
    """Copy `donor`'s decoder layers `layers` into `model`'s weights; returns the originals.

    Weights are copied, not modules: transformers captures hidden states with hooks bound
    to each model's own layer modules, so a module moved across models reports wrongly."""
    old = []
    for i in layers:
        mine = model.model.layers[i]
        old.append({k: v.clone() for k, v in mine.state_dict().items()})
        mine.load_state_dict(donor.model.layers[i].state_dict())
    return old


def _restore(model: Any, layers: Sequence[int], old: Sequence[dict[str, torch.Tensor]]) -> None:
    for i, state in zip(layers, old, strict=True):
        model.model.layers[i].load_state_dict(state)


@torch.inference_mode()
def share_report(
    foundation: Path,
    variant: Path,
    threshold: float = THRESHOLD,
    calibration: Sequence[Sequence[int]] | None = None,
) -> ShareReport:
    """Which decoder layers of `variant` may be served by the foundation's, and the quality
    of serving it that way.

    Layer i is judged where it would be swapped: the fine-tune's own hidden states enter
    layer i, once through the fine-tune's layer and once through the foundation's, and the
    two outputs go through the fine-tune's logit lens (final norm, LM head, softmax); the
    mean cosine over the calibration tokens is the layer's score. (`report` compares the two
    whole models layer by layer instead, where one changed layer lowers every later score.)
    The quality is then measured on the composition actually served (every shared layer
    swapped at once) against the fine-tune alone. The embedding and the final norm + head
    are shared only when identical."""
    from transformers import AutoModelForCausalLM

    fa: Any = AutoModelForCausalLM.from_pretrained(str(foundation))
    va: Any = AutoModelForCausalLM.from_pretrained(str(variant))
    fa.eval()
    va.eval()
    n = fa.config.num_hidden_layers
    if va.config.num_hidden_layers != n:
        raise ValueError("the variant and the foundation have different layer counts")
    calib = calibration_set(va.config.vocab_size) if calibration is None else calibration
    differ = set(block_digest.diff_layers(foundation, variant))
    sims: dict[int, list[float]] = {i: [] for i in differ}
    for seq in calib:
        ids = torch.tensor([list(seq)])
        own = _lens(va, ids)
        for i in sorted(differ):
            old = _swapped(va, fa, [i])
            try:
                swap = _lens(va, ids)[i]
            finally:
                _restore(va, [i], old)
            cos = torch.nn.functional.cosine_similarity(own[i], swap, dim=-1)
            sims[i].extend(cos.tolist())
    layers = []
    for i in range(n):
        if i not in differ:
            layers.append(LayerShare(i, True, 1.0, True))
            continue
        cosine = sum(sims[i]) / len(sims[i])
        layers.append(LayerShare(i, False, cosine, cosine >= threshold))
    swap_in = [s.layer for s in layers if s.shared and not s.identical]
    cos_all: list[float] = []
    agree = total = 0
    for seq in calib:
        ids = torch.tensor([list(seq)])
        want = torch.softmax(va(input_ids=ids).logits.float()[0], dim=-1)
        old = _swapped(va, fa, swap_in)
        try:
            got = torch.softmax(va(input_ids=ids).logits.float()[0], dim=-1)
        finally:
            _restore(va, swap_in, old)
        cos_all.extend(torch.nn.functional.cosine_similarity(want, got, dim=-1).tolist())
        agree += int((want.argmax(-1) == got.argmax(-1)).sum())
        total += want.shape[0]
    return ShareReport(
        threshold,
        tuple(layers),
        sum(cos_all) / len(cos_all),
        agree / total,
        CALIBRATION if calibration is None else "custom",
        total,
    )
