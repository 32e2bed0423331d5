"""One span of the predictive switching loop: forecast, plan, decide (OServe §5; pure).

Called every ``spanSeconds`` by the operator's switching loop (``tessera.control.switching``)
and by ``tessera bench adaptive``. Inputs: per-span per-class arrival counts (oldest first),
the current deployment's name, the candidates, ``price(name, demand)`` (modelled P99 latency
in s, ``inf`` when unservable), ``switch_seconds(from, to)``, the config, the hysteresis
state, optionally ``model_error(name)``. Forecast: the method with the lowest pooled RRMSE
over the last ``window`` spans (``workload.selector``'s rule; no state kept but the
hysteresis; `regime_mean` pools the spans since the counts last changed). Plan: the lowest
modelled latency, each deployment priced at the worse of the forecast and the last span
observed when that differs beyond its noise (`plausible`; the current wins ties). Decide:
``switching.gain.decide``. Returns a :class:`LoopStep` whose ``to_json`` is the operator's
``status.switching``. docs/switching.md, "The step".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from tessera.policies.switching import gain as switching
from tessera.workload import baselines, forecaster, rrmse

DEFAULT_WINDOW = 5  # validation spans a method is judged on

Price = Callable[[str, tuple[float, ...]], float]
SwitchSeconds = Callable[[str, str], float]
FloatArray = npt.NDArray[np.float64]


def default_methods() -> dict[str, forecaster.Forecaster]:
    """Fresh forecasters, cheapest first (ties go to the earlier)."""
    return {
        "last_value": baselines.LastValue(),
        "moving_average": baselines.MovingAverage(),
        "exp_smoothing": baselines.ExpSmoothing(),
        "seasonal": baselines.Seasonal(),
        "regime_mean": baselines.RegimeMean(),
    }


@dataclass(frozen=True)
class Forecast:
    """The next span's per-class arrivals and how every method did on the window."""

    counts: tuple[float, ...]  # [class] arrivals expected in the next span
    method: str  # the method that made it
    rrmse: Mapping[str, float]  # method -> pooled RRMSE on the window (nan: unscored)
    window: int  # validation spans used (0 while history is too short)

    def to_json(self) -> dict[str, Any]:
        return {
            "counts": [round(c, 3) for c in self.counts],
            "method": self.method,
            "rrmse": {k: None if math.isnan(v) else round(v, 4) for k, v in self.rrmse.items()},
            "window": self.window,
        }


def forecast(
    history: Sequence[Sequence[float]] | FloatArray,
    window: int = DEFAULT_WINDOW,
    methods: Callable[[], dict[str, forecaster.Forecaster]] = default_methods,
) -> Forecast:
    """Step 1 of the module docstring; ``history`` is (spans, classes), oldest first."""
    h = np.asarray(history, dtype=np.float64)
    forecaster.check_history(h)
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    models = methods()
    if not models:
        raise ValueError("no forecasting method")
    n = len(h)
    w = min(window, n - 1)
    if w < 1:
        first = next(iter(models))
        return Forecast(tuple(float(v) for v in h[-1]), first, {}, 0)
    fit_end = n - w
    scores: dict[str, float] = {}
    for name, model in models.items():
        model.fit(h[:fit_end])
        predicted = np.asarray([model.predict(h[:t]) for t in range(fit_end, n)])
        scores[name] = rrmse.overall(h[fit_end:], predicted)
    ranked = [math.inf if math.isnan(s) else s for s in scores.values()]
    best = list(models)[int(np.argmin(ranked))]
    nxt = np.maximum(models[best].predict(h), 0.0)
    return Forecast(tuple(float(v) for v in nxt), best, scores, w)


def plausible(
    demand: tuple[float, ...],
    history: Sequence[Sequence[float]] | FloatArray,
    span_s: float,
) -> tuple[tuple[float, ...], ...]:
    """The demands a span's price covers: the forecast, then the last span's observed
    req/s when its counts are evidence of other rates (`baselines.same_regime` rejects
    them as Poisson counts of the forecast; each deployment is priced at the worse)."""
    counts = np.asarray(history, dtype=np.float64)[-1]
    last = tuple(float(v) / span_s for v in counts)
    if last == demand or sum(last) <= 0:
        return (demand,)
    # the last span's counts drawn from the forecast's rates are its noise, not a new mix
    forecast_counts = np.asarray(demand, dtype=np.float64) * span_s
    return (demand,) if baselines.same_regime(counts, forecast_counts) else (demand, last)


@dataclass(frozen=True)
class LoopStep:
    """One span's forecast, plan and decision."""

    forecast: Forecast
    demand_rps: tuple[float, ...]  # [class] forecast req/s
    latencies: Mapping[str, float]  # candidate -> modelled P99 latency at the forecast
    current: str
    decision: switching.SwitchDecision

    @property
    def state(self) -> switching.HysteresisState:
        return self.decision.state

    def to_json(self) -> dict[str, Any]:
        """The operator's ``status.switching`` body (docs/switching.md)."""
        st = self.decision.state
        return {
            "current": self.current,
            "forecast": self.forecast.to_json(),
            "demandRps": [round(d, 4) for d in self.demand_rps],
            "latencies": {
                k: None if math.isinf(v) else round(v, 6) for k, v in self.latencies.items()
            },
            "lastDecision": self.decision.to_json(),
            "hysteresis": {
                "candidate": st.candidate,
                "streak": st.streak,
                "spansSinceSwitch": None
                if st.spans_since_switch >= switching.NEVER
                else st.spans_since_switch,
            },
        }


def state_from_json(doc: Mapping[str, Any] | None) -> switching.HysteresisState:
    """The hysteresis state back from ``LoopStep.to_json()["hysteresis"]``."""
    if not doc:
        return switching.HysteresisState()
    since = doc.get("spansSinceSwitch")
    return switching.HysteresisState(
        candidate=doc.get("candidate"),
        streak=int(doc.get("streak") or 0),
        spans_since_switch=switching.NEVER if since is None else int(since),
    )


def step(
    config: switching.SwitchingConfig,
    state: switching.HysteresisState,
    history: Sequence[Sequence[float]] | FloatArray,
    current: str,
    candidates: Sequence[str],
    price: Price,
    switch_seconds: SwitchSeconds,
    window: int = DEFAULT_WINDOW,
    methods: Callable[[], dict[str, forecaster.Forecaster]] = default_methods,
    model_error: Callable[[str], float | None] | None = None,
) -> LoopStep:
    """Forecast, plan and decide one span (module docstring)."""
    if not candidates:
        raise ValueError("no candidate deployment")
    f = forecast(history, window, methods)
    demand = tuple(c / config.span_s for c in f.counts)
    names = list(dict.fromkeys([current, *candidates]))
    if sum(demand) <= 0:
        lat = {n: math.nan for n in names}
        same = switching.DeploymentCost(current, 1.0)  # nothing to price: stay, age state
        decision = switching.decide(config, state, same, same, 0.0, 0.0)
        decision = replace(decision, reason="no demand forecast for the next span")
        return LoopStep(f, demand, lat, current, decision)
    # priced at its worst over the forecast and the last span as observed: a forecast
    # lags a change of mix, and a routing planned for one mix can overload a replica
    # under the other (docs/switching.md, "The step")
    lat = {
        n: max(float(price(n, d)) for d in plausible(demand, history, config.span_s)) for n in names
    }
    for n, v in lat.items():
        if not v > 0:
            raise ValueError(f"price({n!r}) = {v}: a latency must be > 0 (inf: cannot serve)")
    best = min(candidates, key=lambda n: (lat[n], n != current))
    seconds = 0.0 if best == current else float(switch_seconds(current, best))
    err = model_error or (lambda name: None)
    decision = switching.decide(
        config,
        state,
        switching.DeploymentCost(current, lat[current], err(current)),
        switching.DeploymentCost(best, lat[best], err(best)),
        sum(demand),
        seconds,
    )
    return LoopStep(f, demand, lat, current, decision)
