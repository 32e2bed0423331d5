"""Step time of a simulated replica: one continuous-batching step through tp x pp GPUs.

Input: the cost profile (`tessera.cost`, analytic or measured with `tessera profile`), the
replica's stages (layers, first/last, hop link) and its tp degree; per step the decode
count, their summed context, and the prefill chunks. Output: seconds. Called by
`tessera.sim.replica` for every (macro-)step. Per stage and microbatch: the profile's
per-layer terms times the stage's layers, the TP all-reduce, the LM head on the last
stage and the hop (`cost.latency.stage_cost`, which the planner's latency model prices a
prompt's stall with); a chunk of n tokens after k cached ones costs ((k+n)^2 - k^2) of
the attention term; decode and prefill in one step share one weight read. Pipeline: m =
min(pp, sequences) microbatches back to back; a round takes max(sum_s t_s, m max_s t_s),
so with fewer microbatches than stages the difference is the pipeline bubble.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera.cost.latency import StageCost, StageSpec, stage_cost
from tessera.cost.profile import Link, Profile

__all__ = ["StageCost", "StepModel", "layer_and_head", "scaled", "stage_cost"]


class StepModel:
    """Step times of one replica (tp x pp, its stages)."""

    def __init__(self, profile: Profile, stages: Sequence[StageSpec], tp: int, intra: Link):
        self.stages = tuple(stage_cost(profile, s, tp, intra) for s in stages)
        self.pp, self.tp = len(self.stages), tp

    def seconds(
        self, decodes: int, ctx_sum: float, chunks: Sequence[tuple[int, int]], logits: int
    ) -> float:
        """One step: `decodes` sequences with `ctx_sum` context tokens in all, prefill
        `chunks` of (new tokens, cached tokens), `logits` rows sampled."""
        tokens = decodes + sum(n for n, _ in chunks)
        pairs = sum((k + n) * (k + n) - k * k for n, k in chunks)
        seqs = decodes + len(chunks)
        m = max(1, min(self.pp, seqs))
        total = worst = 0.0
        for s in self.stages:
            t = (
                s.const
                + (
                    s.per_token * tokens
                    + s.per_pair * pairs
                    + s.per_ctx * ctx_sum
                    + s.per_logit * logits
                )
                / m
            )
            total += t
            worst = t if t > worst else worst
        return max(total, m * worst)


def layer_and_head(profile: Profile, tp: int, intra: Link) -> tuple[StageCost, StageCost]:
    """One decoder layer's coefficients (no hop, no LM head) and the LM head's, for
    replicas whose step is assembled per layer (layer replication, per-variant blocks)."""
    head = stage_cost(profile, StageSpec(0, False, True, None), tp, intra)
    one = stage_cost(profile, StageSpec(1, False, True, None), tp, intra)
    layer = StageCost(
        one.const - head.const,
        one.per_token - head.per_token,
        one.per_pair - head.per_pair,
        one.per_ctx - head.per_ctx,
        0.0,
    )
    return layer, head


def scaled(c: StageCost, layers: int) -> StageCost:
    """`layers` copies of a per-layer cost (no LM head)."""
    return StageCost(
        c.const * layers, c.per_token * layers, c.per_pair * layers, c.per_ctx * layers, 0.0
    )
