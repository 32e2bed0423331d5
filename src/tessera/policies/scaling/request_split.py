"""Sticky per-request split of a replicated run of layers (CoCoServe §3.1, made correct).

Input: the holders of a replicated run (origin and replicas) with measured speeds, the current
assignment of running requests, and the requests that joined or left. Output: a `Split` mapping
every running request to the holder whose KV cache serves it at that run. Invariant: a request
keeps its holder for life, since its K/V for the run lives there (the paper leaves this open).
New requests go to the holder furthest below its speed-proportional share (ties to the earlier
holder); an evicted holder hands its requests back to the origin, which receives their KV.
Called by the engine's replicated run (`tessera_agent.engine.layer_run`) and tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Split:
    holders: tuple[str, ...]  # origin first
    assignment: Mapping[str, str]  # request -> holder

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(self.holders, 0)
        for h in self.assignment.values():
            out[h] += 1
        return out


def assign(
    holders: Sequence[str],
    speeds: Mapping[str, float],
    current: Mapping[str, str],
    joined: Sequence[str] = (),
    left: Sequence[str] = (),
) -> Split:
    """Keep every running request where it is; place joiners by speed-proportional
    deficit; requests of holders no longer listed go back to the origin (`holders[0]`)."""
    if not holders:
        raise ValueError("holders: need at least the origin")
    if any(not speeds.get(h, 0.0) > 0 for h in holders):
        raise ValueError("speeds: every holder needs a measured speed > 0")
    gone = set(left)
    out = {r: (h if h in holders else holders[0]) for r, h in current.items() if r not in gone}
    counts = dict.fromkeys(holders, 0)
    for h in out.values():
        counts[h] += 1
    total_speed = sum(speeds[h] for h in holders)
    for r in joined:
        if r in out or r in gone:
            continue
        n = len(out) + 1
        h = max(
            holders,
            key=lambda h: (n * speeds[h] / total_speed - counts[h], -holders.index(h)),
        )
        out[r] = h
        counts[h] += 1
    return Split(tuple(holders), out)
