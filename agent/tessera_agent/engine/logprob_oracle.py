"""The half-precision correctness oracle: teacher-forced log-probabilities against transformers.

Greedy tokens are too strict a test in bfloat16 / float16 (random weights leave near-ties
that rounding flips), so the oracle compares log-probabilities on the same sequences: the
engine generates greedily with `logprobs` asked, and `transformers` is run teacher-forced
on exactly those sequences in float32 and in the engine's half dtype. The engine passes
when its mean absolute difference from float32 is at most `MAX_RATIO` times transformers'
own half-precision one. Called by the engine tests (`tests/engine/test_half_precision.py`)
and `tessera bench gpu` (`bench_gpu.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from tessera_agent.engine import sampling

MAX_RATIO = 1.5

# (position whose logits predict, token id, engine log-probability)
Entry = tuple[int, int, float]


@dataclass(frozen=True)
class Comparison:
    engine_mad: float  # mean |engine - transformers float32| over the compared entries
    hf_half_mad: float  # mean |transformers half - transformers float32| over the same
    entries: int

    @property
    def ratio(self) -> float:
        return self.engine_mad / max(self.hf_half_mad, 1e-12)


def entries(
    prompt_len: int, tokens: Sequence[int], steps: Sequence[sampling.TokenLogprobs]
) -> list[Entry]:
    """The engine's log-probabilities of one generated sequence: at each step t, the chosen
    token's and the top alternatives' (the logits of position prompt_len - 1 + t)."""
    out: list[Entry] = []
    for t, (token, lp) in enumerate(zip(tokens, steps, strict=True)):
        pos = prompt_len - 1 + t
        out.append((pos, token, lp.logprob))
        out.extend((pos, tok, val) for tok, val in lp.top if tok != token)
    return out


@torch.inference_mode()
def teacher_forced(
    model: torch.nn.Module, seq: Sequence[int], device: torch.device | str
) -> torch.Tensor:
    """float32 log-softmax of a transformers model's logits at every position: [len, vocab]."""
    ids = torch.tensor([list(seq)], device=device)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
    return torch.log_softmax(logits.float(), dim=-1).cpu()


def load_hf(path: Path | str, dtype: torch.dtype, device: torch.device | str) -> torch.nn.Module:
    """transformers' own model of the checkpoint in `dtype` on `device`."""
    from transformers import AutoModelForCausalLM

    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.to(device)
    return model.eval()


def compare(
    per_seq: Sequence[list[Entry]],
    hf32: Sequence[torch.Tensor],
    hf_half: Sequence[torch.Tensor],
) -> Comparison:
    """Mean absolute differences from transformers float32 of the engine and of
    transformers' half precision, over the same (sequence, position, token) entries."""
    eng, half, n = 0.0, 0.0, 0
    for ents, ref, hh in zip(per_seq, hf32, hf_half, strict=True):
        for pos, tok, val in ents:
            r = float(ref[pos, tok])
            eng += abs(val - r)
            half += abs(float(hh[pos, tok]) - r)
            n += 1
    if n == 0:
        raise ValueError("no log-probabilities to compare")
    return Comparison(eng / n, half / n, n)


def against_hf(
    path: Path | str,
    dtype: torch.dtype,
    sequences: Sequence[Sequence[int]],
    per_seq: Sequence[list[Entry]],
    device: torch.device | str = "cpu",
    load: Callable[[torch.dtype], torch.nn.Module] | None = None,
) -> Comparison:
    """`compare` with transformers run here (float32, then `dtype`) on `sequences`;
    `load(dtype)` builds the reference model when it is not the plain checkpoint (a
    fine-tune with its LoRA adapter, say)."""
    refs: list[list[torch.Tensor]] = []
    for dt in (torch.float32, dtype):
        model = load(dt) if load is not None else load_hf(path, dt, device)
        refs.append([teacher_forced(model, s, device) for s in sequences])
        del model
    return compare(per_seq, refs[0], refs[1])
