"""Calibrate the cost model to real agents' measured step profiles, with its error per layout.

Input: `tessera profile` documents (per-layer timings and the measured pipeline hop) split
into fit and held-out profiles, and the layouts to judge (`tpXppY`, stages split as the
planner splits them). The cost profile is fitted to the fit profiles (`cost.fit.fit_profile`,
the one model the planner and simulator price with); for every layout and measured point
the fitted model's step time is compared with the step composed from the measurement
(stage layers, lm_head, one hop per stage boundary; timed layers, not a timed pipeline
run). `cost.calibration.fit` turns the points into a correction per layout and its
held-out error, the switching hysteresis once the calibration is written and read by the
operator (`--switching-calibration`). Pure; called by `tessera calibrate --profiles`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera import fields
from tessera.cost import calibration as cal_
from tessera.cost import fit, latency, profile

DEFAULT_MAX_PP = 4


@dataclass(frozen=True)
class Measured:
    """One measured profile: its per-layer timings and pipeline-hop latency."""

    name: str  # where it came from (a file), for the report
    timings: tuple[fit.LayerTiming, ...]
    hop_latency_s: float
    profile: profile.Profile  # the document's own fit (its model, device and links)


def measured_from_json(doc: Mapping[str, Any], name: str = "") -> Measured:
    """A `tessera profile` document's measurement (FieldError when it has none)."""
    prof = profile.profile_from_json(doc)
    meas = doc.get("measurement")
    if prof.source != "measured" or not isinstance(meas, Mapping):
        raise fields.FieldError(name or "profile", "not a measured profile (no measurement)")
    try:
        timings = tuple(
            fit.LayerTiming(
                str(s["kind"]),
                int(s["size"]),
                int(s.get("context_len", 0)),
                int(s.get("tp", 1)),
                float(s["seconds_per_layer"]),
            )
            for s in meas["samples"]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise fields.FieldError(f"{name or 'profile'}.measurement.samples", str(exc)) from exc
    hop = float(meas.get("pp_hop_latency_s") or prof.comm.intra_node.latency_s)
    return Measured(name, timings, hop, prof)


def layer_split(layers: int, pp: int) -> tuple[int, ...]:
    """Decoder layers per stage, as even as possible (earlier stages take the remainder)."""
    if not 1 <= pp <= layers:
        raise fields.FieldError("pp", f"must be in [1, {layers}], got {pp}")
    base, extra = divmod(layers, pp)
    return tuple(base + (1 if i < extra else 0) for i in range(pp))


def layouts(num_layers: int, max_pp: int = DEFAULT_MAX_PP, tp: int = 1) -> tuple[str, ...]:
    """The one-replica layouts `tp{tp}pp1` .. `tp{tp}pp{max_pp}` (names as the planner's)."""
    return tuple(f"tp{tp}pp{pp}" for pp in range(1, min(max_pp, num_layers) + 1))


def _pp(layout: str) -> tuple[int, int]:
    head, _, pp = layout.removeprefix("tp").partition("pp")
    try:
        return int(head), int(pp)
    except ValueError:
        raise fields.FieldError("layout", f"expected tpXppY, got {layout!r}") from None


def _stages(prof: profile.Profile, pp: int) -> tuple[latency.StageSpec, ...]:
    split = layer_split(prof.model.num_layers, pp)
    hop = prof.comm.intra_node
    return tuple(
        latency.StageSpec(n, i == 0, i == pp - 1, None if i == pp - 1 else hop)
        for i, n in enumerate(split)
    )


def predicted_step(prof: profile.Profile, layout: str, t: fit.LayerTiming) -> float:
    """The fitted model's step time of `layout` at the point `t` measured."""
    tp, pp = _pp(layout)
    stages = _stages(prof, pp)
    intra = prof.comm.intra_node
    if t.kind == "prefill":
        return sum(latency.stage_prefill_seconds(prof, s, t.size, tp, intra) for s in stages)
    return sum(
        latency.stage_decode_seconds(prof, s, t.size, t.context_len, tp, intra) for s in stages
    )


def measured_step(m: Measured, layout: str, t: fit.LayerTiming) -> float | None:
    """`layout`'s step time at `t` composed from `m`'s timings (None: no lm_head timing
    at that batch; a prefill's logits are one position's, the lm_head at batch 1)."""
    _, pp = _pp(layout)
    batch = 1 if t.kind == "prefill" else t.size
    head = [x.seconds_per_layer for x in m.timings if x.kind == "lm_head" and x.size == batch]
    if not head:
        return None
    prof = m.profile
    hop = profile.Link(prof.comm.intra_node.bandwidth_bytes_per_s, m.hop_latency_s)
    hops = (pp - 1) * hop.transfer_seconds(t.size * prof.memory.activation_bytes_per_token)
    return prof.model.num_layers * t.seconds_per_layer + head[0] + hops


def step_samples(
    fitted: profile.Profile, measured: Sequence[Measured], names: Sequence[str], split: str
) -> list[cal_.Sample]:
    """Per layout and per measured layer point: the fitted model's step vs the measured."""
    out = []
    for m in measured:
        for t in m.timings:
            if t.kind == "lm_head":
                continue
            for layout in names:
                got = measured_step(m, layout, t)
                if got is None or got <= 0:
                    continue
                note = f"{m.name}: {t.kind} {t.size}" + (
                    f" at context {t.context_len}" if t.kind == "decode" else ""
                )
                pred = predicted_step(fitted, layout, t)
                out.append(cal_.Sample(layout, pred, got, split, note))
    return out


@dataclass(frozen=True)
class Result:
    """The fitted cost profile, its calibration per layout and the samples behind it."""

    profile: profile.Profile
    calibration: cal_.Calibration
    samples: tuple[cal_.Sample, ...]


def calibrate(
    fit_on: Sequence[Measured],
    held_out: Sequence[Measured],
    names: Sequence[str] = (),
) -> Result:
    """Fit the cost profile to `fit_on`, judge it per layout on `held_out` (module
    docstring); `names` defaults to `layouts(num_layers)` of the fitted model."""
    if not fit_on or not held_out:
        raise fields.FieldError("profiles", "need at least one fit and one held-out profile")
    first = fit_on[0].profile
    models = {m.profile.model.name for m in (*fit_on, *held_out)}
    if len(models) != 1:
        raise fields.FieldError("profiles", f"profiles of different models: {sorted(models)}")
    hop = statistics.median(m.hop_latency_s for m in fit_on)
    link = profile.Link(first.comm.intra_node.bandwidth_bytes_per_s, hop)
    comm = profile.CommSpec(intra_node=link, inter_node=link, allreduce_per_layer=0)
    timings = [t for m in fit_on for t in m.timings]
    fitted = fit.fit_profile(timings, first.model, first.device, comm)
    names = tuple(names) or layouts(first.model.num_layers)
    samples = step_samples(fitted, fit_on, names, "fit") + step_samples(
        fitted, held_out, names, "eval"
    )
    return Result(fitted, cal_.fit(samples), tuple(samples))
