"""The message that crosses every stage boundary: one scheduled step of a replica.

Built by the leader's scheduler (`scheduler.py`), executed by each stage's runner
(`runner.py`), and carried between agent processes by the stage stream RPC (the proto
mirror is `StageStep`; conversions live in `tessera_agent.convert`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tessera_agent.engine import sampling


@dataclass(frozen=True)
class SeqChunk:
    """The tokens of one sequence computed in this step."""

    seq_id: str
    start: int  # position of the chunk's first token (= tokens already in the KV cache)
    num_tokens: int  # chunk length: a prefill chunk, or 1 for a decode step
    block_table: tuple[int, ...]  # KV pages of the sequence, covering start + num_tokens
    sample: bool  # the chunk ends at the last known token: the last stage samples the next
    params: sampling.SamplingParams  # used by the last stage when `sample`
    variant: str = ""  # LoRA adapter the tokens run under ("" = the foundation alone)


@dataclass
class StepInput:
    """Input of one stage for one step."""

    step_id: int
    chunks: list[SeqChunk]
    token_ids: list[int] | None = None  # flat tokens of all chunks (first stage)
    hidden: torch.Tensor | None = None  # [sum num_tokens, hidden] (later stages)
    finished: list[str] = field(default_factory=list)  # drop per-sequence state for these
    result_on_link: bool = False  # the leader takes the sampled tokens over the data plane

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


@dataclass
class StepOutput:
    """Output of one stage for one step: hidden states, or sampled tokens on the last stage."""

    step_id: int
    hidden: torch.Tensor | None = None
    sampled: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, sampling.TokenLogprobs] = field(default_factory=dict)  # if asked
    tokens_on_link: bool = False  # `sampled` went to the leader over the data plane instead


def next_stage_input(inp: StepInput, out: StepOutput) -> StepInput:
    """The next stage's input: the same chunks, this stage's hidden states."""
    return StepInput(
        step_id=inp.step_id,
        chunks=inp.chunks,
        hidden=out.hidden,
        finished=inp.finished,
        result_on_link=inp.result_on_link,
    )
