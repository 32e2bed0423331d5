"""Split a model's decoder layers into pipeline stages balanced by cost, not by count.

The first stage also holds the token embedding and the last the final norm and lm_head,
so an even split by count overloads the last stage (a 32k x 5120 lm_head costs about half
a Llama-2-13B layer per decode step; a 128k-vocabulary head costs more than two layers of
Llama-3-8B). :func:`balance_layers` minimizes the largest stage's normalized cost, where
a stage's cost is the larger of its share of decode time and its share of weight bytes,
by dynamic programming over contiguous ranges (ties broken by the sum of squared
costs). Called by ``tessera.planner.capacity_table``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera import fields
from tessera.cost.profile import Profile


@dataclass(frozen=True)
class StageCosts:
    """Per-layer and extra costs at the reference operating point."""

    layer_time: float  # decode time of one layer
    layer_bytes: float  # weight bytes of one layer
    first_time: float  # extra time on the first stage (embedding lookup: ~0)
    first_bytes: float  # embedding bytes
    last_time: float  # lm_head decode time
    last_bytes: float  # lm_head bytes


def reference_costs(profile: Profile, batch: float = 32.0, context: float = 1024.0) -> StageCosts:
    """Costs at a representative decode step (``batch`` sequences of ``context`` tokens)."""
    return StageCosts(
        layer_time=profile.decode.seconds(batch, context, 1),
        layer_bytes=float(profile.memory.layer_param_bytes),
        first_time=0.0,
        first_bytes=float(profile.memory.embedding_param_bytes),
        last_time=profile.lm_head_decode.seconds(batch, 0.0, 1),
        last_bytes=float(profile.memory.lm_head_param_bytes),
    )


def balance_layers(layers: int, pp: int, costs: StageCosts) -> tuple[tuple[int, int], ...]:
    """Return ``pp`` contiguous ``[start, end)`` ranges covering ``range(layers)``, each
    non-empty, minimizing the largest stage's max(time share, memory share)."""
    if not 1 <= pp <= layers:
        raise fields.FieldError("pp", f"must be between 1 and the {layers} layers, got {pp}")
    total_time = layers * costs.layer_time + costs.first_time + costs.last_time
    total_bytes = layers * costs.layer_bytes + costs.first_bytes + costs.last_bytes
    time_unit = total_time / pp if total_time > 0 else 1.0
    byte_unit = total_bytes / pp if total_bytes > 0 else 1.0

    def cost(count: int, first: bool, last: bool) -> float:
        t = count * costs.layer_time
        b = count * costs.layer_bytes
        if first:
            t, b = t + costs.first_time, b + costs.first_bytes
        if last:
            t, b = t + costs.last_time, b + costs.last_bytes
        return max(t / time_unit, b / byte_unit)

    # best[s][i]: (max stage cost, sum of squared costs) over splits of the first i layers
    # into s stages, compared lexicographically: the square sum spreads the slack evenly.
    inf = (math.inf, math.inf)
    best = [[inf] * (layers + 1) for _ in range(pp + 1)]
    cut = [[0] * (layers + 1) for _ in range(pp + 1)]
    best[0][0] = (0.0, 0.0)
    for s in range(1, pp + 1):
        last = s == pp
        for i in range(s, layers - (pp - s) + 1):
            if last and i != layers:
                continue
            for j in range(s - 1, i):
                prev = best[s - 1][j]
                if prev[0] == math.inf:
                    continue
                c = cost(i - j, s == 1, last)
                value = (max(prev[0], c), prev[1] + c * c)
                if value[0] < best[s][i][0] - 1e-9 or (
                    value[0] <= best[s][i][0] + 1e-9 and value[1] < best[s][i][1] - 1e-12
                ):
                    best[s][i] = value
                    cut[s][i] = j
    bounds = [layers]
    i = layers
    for s in range(pp, 0, -1):
        i = cut[s][i]
        bounds.append(i)
    bounds.reverse()
    return tuple((bounds[s], bounds[s + 1]) for s in range(pp))
