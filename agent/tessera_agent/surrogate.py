"""Surrogates of a block for speculative execution: a low-rank linear model of the block's
residual update, fitted to mimic it on calibration sequences.

`fit_low_rank(parts, k, sequences, rank)` runs the calibration token sequences through the
chain, collects block `k`'s input and output hidden states, fits the update
`out - in ~= (in - mean_in) W + mean_update` by least squares and keeps the best rank-`rank`
part of `W` (truncated SVD): two thin matmuls instead of the block's attention and MLP.
The fit's quality is measured on the last sequence, held out (cosine of the guessed and
real outputs, and the largest absolute difference). Callers: `tessera bench speculate`,
tests. BlockLLM's other surrogate kinds (pruned blocks with a LoRA, a smaller model's
equivalent block) plug in the same way: any callable hidden -> hidden.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tessera_agent import block_parts


class LowRank:
    """`x + (x - mean_in) @ a @ b + mean_update` (module docstring)."""

    def __init__(
        self, mean_in: torch.Tensor, a: torch.Tensor, b: torch.Tensor, mean_up: torch.Tensor
    ) -> None:
        self.mean_in, self.a, self.b, self.mean_up = mean_in, a, b, mean_up

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + ((x - self.mean_in) @ self.a) @ self.b + self.mean_up
        return out


@dataclass(frozen=True)
class Fit:
    """A fitted surrogate and how well it mimics the block on the held-out sequence."""

    surrogate: LowRank
    rank: int
    cosine: float  # mean over tokens of cos(guess, real output)
    max_abs_diff: float  # largest |guess - real| over the held-out tokens


def block_io(
    parts: Sequence[block_parts.Part], k: int, sequences: Sequence[Sequence[int]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block `k`'s inputs and outputs (tokens x hidden) over the sequences (prefill)."""
    ins, outs = [], []
    for seq in sequences:
        for p in parts:
            p.reset()
        x = torch.tensor([list(seq)])
        for i, part in enumerate(parts[: k + 1]):
            if i == k:
                ins.append(x[0])
            x = part(x)
        outs.append(x[0])
    for p in parts:
        p.reset()
    return torch.cat(ins), torch.cat(outs)


def fit_low_rank(
    parts: Sequence[block_parts.Part], k: int, sequences: Sequence[Sequence[int]], rank: int
) -> Fit:
    """Fit on all sequences but the last; measure on the last (module docstring)."""
    if k == 0 or k >= len(parts) - 1:
        raise ValueError(f"block {k}: a surrogate needs hidden states in and out")
    if len(sequences) < 2:
        raise ValueError("need at least two calibration sequences (one is held out)")
    x, y = block_io(parts, k, sequences[:-1])
    up = y - x
    mean_in, mean_up = x.mean(0), up.mean(0)
    w = torch.linalg.lstsq(x - mean_in, up - mean_up).solution
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    r = min(rank, s.numel())
    sur = LowRank(mean_in, u[:, :r] * s[:r], vh[:r], mean_up)
    hx, hy = block_io(parts, k, sequences[-1:])
    guess = sur(hx)
    cos = torch.nn.functional.cosine_similarity(guess, hy, dim=-1).mean()
    return Fit(sur, r, float(cos), float((guess - hy).abs().max()))
