"""Whether the forecast workload pays for switching to the planner's new deployment.

Pure; :func:`decide` runs once per span in the operator's switching loop and ``tessera bench
adaptive``. Inputs: the modelled per-request latency of the current and the candidate
deployment at the forecast rates (``tessera.planner.latency``; ``inf`` when unservable),
the forecast rate, the switch plan's time, the hysteresis state. In request-seconds over
the span: ``expected_gain = rate * (span - switch) * (L_current - L_candidate)``,
``switch_cost = rate * switch * disruption * L_ref`` (``L_ref``: the current latency, the
candidate's when the current cannot serve). Rules, the first match gives the reason:
disabled; candidate is current; relative gain below ``minGain`` or, given the model's
measured errors ``e`` (`tessera.cost.calibration`), ``(1 + e_cand) / (1 - e_cur) - 1``;
switch takes a span or more; gain below cost; within ``cooldown_spans``; not won
``hold_spans`` in a row (both waived when the current cannot serve). Then ``active``
switches, ``advisory`` recommends. docs/switching.md, "The loop and its decision".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from tessera import api, fields

MODES: tuple[str, ...] = ("advisory", "active")
STAY, RECOMMEND, SWITCH = "stay", "recommend", "switch"
NEVER = 1 << 30  # spans since a switch when there was none


@dataclass(frozen=True)
class SwitchingConfig:
    """Knobs of the decision; ``spec.policies.switching`` sets the first four."""

    enabled: bool = False
    mode: str = "advisory"
    span_s: float = 60.0
    min_gain: float = 0.1  # the candidate must be at least 1 + min_gain times faster
    hold_spans: int = 2  # spans in a row the same candidate must win
    cooldown_spans: int = 2  # spans after a switch with no further switch
    disruption: float = 1.0  # extra latency during a switch, as a multiple of latency

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise fields.FieldError("mode", f"must be one of {', '.join(MODES)}")
        if not self.span_s > 0:
            raise fields.FieldError("spanSeconds", "must be > 0")
        if not self.min_gain >= 0:
            raise fields.FieldError("minGain", "must be >= 0")
        if self.hold_spans < 1:
            raise fields.FieldError("hold_spans", "must be >= 1")
        if self.cooldown_spans < 0:
            raise fields.FieldError("cooldown_spans", "must be >= 0")
        if not self.disruption >= 0:
            raise fields.FieldError("disruption", "must be >= 0")


def config_from_spec(spec: api.SwitchingSpec, **knobs: Any) -> SwitchingConfig:
    """The decision's config from ``spec.policies.switching`` (other knobs by keyword)."""
    return SwitchingConfig(
        enabled=spec.enabled,
        mode=spec.mode,
        span_s=spec.span_seconds,
        min_gain=spec.min_gain,
        **knobs,
    )


@dataclass(frozen=True)
class DeploymentCost:
    """A deployment's identity and its modelled latency at the forecast."""

    name: str  # e.g. the layout label; equal names mean the same deployment
    latency_s: float  # modelled per-request latency (P99); inf: cannot serve the forecast
    # the latency model's measured relative error for this deployment (calibration);
    # None: not measured, the decision falls back to minGain
    model_error: float | None = None

    def __post_init__(self) -> None:
        if not self.latency_s > 0:
            raise fields.FieldError("latency_s", "must be > 0 (inf when it cannot serve)")
        if self.model_error is not None and not 0 <= self.model_error < 1:
            raise fields.FieldError("model_error", "must be in [0, 1)")


def gain_threshold(
    config: SwitchingConfig, current: DeploymentCost, candidate: DeploymentCost
) -> float:
    """The relative gain a switch needs: what the model's error on both deployments
    could explain, or ``minGain`` when either error is unmeasured."""
    if current.model_error is None or candidate.model_error is None:
        return config.min_gain
    return (1.0 + candidate.model_error) / (1.0 - current.model_error) - 1.0


@dataclass(frozen=True)
class HysteresisState:
    """Carried from span to span (the operator keeps it in status)."""

    candidate: str | None = None  # the candidate that won the last spans
    streak: int = 0  # spans in a row it has won
    spans_since_switch: int = NEVER


@dataclass(frozen=True)
class SwitchDecision:
    """What to do this span, why, and the state for the next span."""

    action: str  # "stay", "recommend" (advisory) or "switch" (active)
    candidate: str
    relative_gain: float  # L_current / L_candidate - 1
    expected_gain: float  # request-seconds saved over the span
    switch_cost: float  # request-seconds lost to the switch
    switch_s: float
    reason: str
    state: HysteresisState

    def to_json(self) -> dict[str, Any]:
        """Status / event form."""

        def num(x: float) -> float | None:
            return None if math.isinf(x) or math.isnan(x) else round(x, 6)

        return {
            "action": self.action,
            "candidate": self.candidate,
            "relativeGain": num(self.relative_gain),
            "expectedGain": num(self.expected_gain),
            "switchCost": num(self.switch_cost),
            "switchSeconds": num(self.switch_s),
            "reason": self.reason,
        }


def _relative(current: float, candidate: float) -> float:
    if math.isinf(current):
        return math.inf if math.isfinite(candidate) else 0.0
    return current / candidate - 1.0


def decide(
    config: SwitchingConfig,
    state: HysteresisState,
    current: DeploymentCost,
    candidate: DeploymentCost,
    rate_rps: float,
    switch_s: float,
) -> SwitchDecision:
    """The decision for the coming span (module docstring)."""
    if not rate_rps >= 0 or not switch_s >= 0:
        raise fields.FieldError("rate_rps/switch_s", "must be >= 0")
    aged = replace(state, spans_since_switch=min(NEVER, state.spans_since_switch + 1))
    rel = _relative(current.latency_s, candidate.latency_s)
    urgent = math.isinf(current.latency_s) and math.isfinite(candidate.latency_s)
    useful = max(0.0, config.span_s - switch_s)
    if urgent:
        gain = math.inf
        cost = rate_rps * switch_s * config.disruption * candidate.latency_s
    else:
        gain = rate_rps * useful * (current.latency_s - candidate.latency_s)
        cost = rate_rps * switch_s * config.disruption * current.latency_s

    def out(action: str, reason: str, next_state: HysteresisState) -> SwitchDecision:
        return SwitchDecision(action, candidate.name, rel, gain, cost, switch_s, reason, next_state)

    reset = replace(aged, candidate=None, streak=0)
    if not config.enabled:
        return out(STAY, "switching is disabled", reset)
    if candidate.name == current.name:
        return out(STAY, "the current deployment is the planner's choice", reset)
    need = gain_threshold(config, current, candidate)
    if rel < need:
        what = (
            f"minGain {need:.0%}"
            if need == config.min_gain
            else f"the latency model's error on both ({need:.1%})"
        )
        return out(STAY, f"candidate is {rel:+.1%} faster, below {what}", reset)
    if switch_s >= config.span_s:
        return out(STAY, f"switch takes {switch_s:.1f} s, a whole span or more", reset)
    if not gain > cost:
        return out(
            STAY, f"gain {gain:.3g} req*s does not pay for the switch ({cost:.3g} req*s)", reset
        )
    streak = aged.streak + 1 if aged.candidate == candidate.name else 1
    held = replace(aged, candidate=candidate.name, streak=streak)
    if not urgent and aged.spans_since_switch < config.cooldown_spans:
        return out(
            STAY,
            f"cooling down: last switch {aged.spans_since_switch} span(s) ago, "
            f"{config.cooldown_spans} required",
            held,
        )
    if not urgent and streak < config.hold_spans:
        return out(STAY, f"candidate has won {streak} of {config.hold_spans} spans", held)
    why = (
        "the current deployment cannot serve the forecast"
        if urgent
        else (
            f"candidate is {rel:.1%} faster; gain {gain:.3g} req*s > switch cost {cost:.3g} req*s"
        )
    )
    if config.mode == "advisory":
        return out(RECOMMEND, f"{why} (advisory: nothing changed)", held)
    return out(SWITCH, why, HysteresisState(None, 0, 0))
