"""The one sampling message from the HTTP layer to the agent proto, and its one converter.

`Sampling` is what the gateway parses from a request body (`gateway.request_params`),
what a `dispatch.Job` carries to a replica, and what the CLI's benchmarks and launchers
send to agents. `to_proto` is the only place that builds a `pb.SamplingParams`; the agent
turns it into its engine's `SamplingParams` in `tessera_agent.convert.sampling_from_proto`
(the only converter on that side). Fields marked "gateway only" never travel: the gateway
answers them itself (`n` choices, stop strings matched on text).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.rpc.v1 import agent_pb2 as pb


@dataclass(frozen=True)
class Sampling:
    """How to choose tokens and when to stop, for one request."""

    max_tokens: int | None  # None: up to the end of the context (resolved before sending)
    temperature: float = 0.0  # 0 = greedy (the HTTP parser applies OpenAI's default, 1.0)
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None  # None: unseeded
    stop: tuple[str, ...] = ()  # gateway only: stop strings, matched on the decoded text
    stop_token_ids: tuple[int, ...] = ()  # the stop strings that are one token (gateway fills)
    ignore_eos: bool = False
    logprobs: int | None = None  # None: not asked; N: each token's and the top N's
    n: int = 1  # gateway only: choices, each its own generation (seed + index when seeded)


def to_proto(s: Sampling) -> pb.SamplingParams:
    """The agent's message; raises ValueError while `max_tokens` is unresolved."""
    if s.max_tokens is None:
        raise ValueError("max_tokens: must be resolved before a request is sent")
    return pb.SamplingParams(
        max_tokens=s.max_tokens,
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        has_seed=s.seed is not None,
        seed=s.seed or 0,
        stop_token_ids=list(s.stop_token_ids),
        ignore_eos=s.ignore_eos,
        has_logprobs=s.logprobs is not None,
        logprobs=s.logprobs or 0,
    )
