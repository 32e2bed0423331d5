"""Request arrivals for a simulation: trace replay (time- and rate-scaled) and synthetic
Poisson and bursty streams.

Input: a trace read by `tessera.workload.traces` (the shared Azure conversation trace or
any supported format) or the parameters of a synthetic stream. Output: a list of
`Arrival` sorted by time. Called by `tessera.sim.setup`, the CLI and the bench.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.workload.traces import Request


@dataclass(frozen=True)
class Arrival:
    """One simulated request."""

    time: float  # seconds from the start of the simulation
    prompt: int  # prompt tokens
    output: int  # tokens to generate (the trace's output length; max_tokens)
    tag: str = ""  # what the request asks for beyond its lengths (a model variant, a class)


def replay(
    requests: Sequence[Request],
    *,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    duration: float | None = None,
    seed: int = 0,
) -> list[Arrival]:
    """Replay a trace: timestamps divided by `time_scale` (2.0 = twice as fast), then
    the rate multiplied by `rate_scale` by superposing round(rate_scale) shifted copies
    (fractional parts thinned at random), cut at `duration` seconds."""
    if time_scale <= 0 or rate_scale <= 0:
        raise ValueError("time_scale and rate_scale must be > 0")
    if not requests:
        return []
    rng = random.Random(seed)
    t0 = min(r.timestamp for r in requests)
    base = [((r.timestamp - t0) / time_scale, r) for r in requests]
    span = max(t for t, _ in base) or 1.0
    out: list[Arrival] = []
    copies = int(rate_scale) + (1 if rate_scale % 1 else 0)
    frac = rate_scale - int(rate_scale)
    for c in range(copies):
        shift = 0.0 if c == 0 else rng.uniform(0.0, span / max(1, len(base)))
        for t, r in base:
            if c == copies - 1 and frac and rng.random() >= frac:
                continue
            when = t + shift * c
            if duration is not None and when >= duration:
                continue
            out.append(Arrival(when, max(1, r.input_tokens), max(1, r.output_tokens)))
    out.sort(key=lambda a: a.time)
    return out


def tile(requests: Sequence[Request], duration: float, time_scale: float = 1.0) -> list[Request]:
    """Repeat a trace end to end until it covers `duration` seconds (after time scaling)."""
    if not requests:
        return []
    t0 = min(r.timestamp for r in requests)
    span = (max(r.timestamp for r in requests) - t0) / time_scale + 1e-3
    out: list[Request] = []
    k = 0
    while k * span < duration:
        for r in requests:
            ts = (r.timestamp - t0) / time_scale + k * span
            if ts < duration:
                out.append(Request(ts, r.input_tokens, r.output_tokens, r.cls))
        k += 1
    return out


def poisson(
    rate: float,
    duration: float,
    mix: Sequence[tuple[float, int, int]],
    seed: int = 0,
) -> list[Arrival]:
    """Poisson arrivals at `rate` req/s for `duration` s; each request's (prompt, output)
    drawn from `mix`: (weight, prompt tokens, output tokens) rows."""
    if rate <= 0 or duration <= 0:
        return []
    rng = random.Random(seed)
    weights = [w for w, _, _ in mix]
    out: list[Arrival] = []
    t = rng.expovariate(rate)
    while t < duration:
        _, p, o = rng.choices(mix, weights)[0]
        out.append(Arrival(t, p, o))
        t += rng.expovariate(rate)
    return out


def bursty(
    base_rate: float,
    burst_rate: float,
    duration: float,
    bursts: Sequence[tuple[float, float]],
    mix: Sequence[tuple[float, int, int]],
    seed: int = 0,
) -> list[Arrival]:
    """Poisson at `base_rate`, plus `burst_rate` extra during each (start, length) burst."""
    out = poisson(base_rate, duration, mix, seed)
    for i, (start, length) in enumerate(bursts):
        extra = poisson(burst_rate, min(length, max(0.0, duration - start)), mix, seed + 1 + i)
        out += [Arrival(a.time + start, a.prompt, a.output) for a in extra]
    out.sort(key=lambda a: a.time)
    return out
