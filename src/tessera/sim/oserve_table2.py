"""OServe Table 2 through the simulator: shifting class mixes, re-planned every span by the
operator's switching step.

Input: the analytic profile, the quadrant classes and the paper's traces T1-T4 (mixes from
`tessera.planner.table1`, set up by `sim.oserve`). Output: the rows of `oserve_table2` for
`tessera bench sim`. Every figure is a simulation. Each run drives the operator's
switching loop (`sim.oserve_switcher.Switcher`) over the trace; with a calibration
(`table2`: `sim.oserve_calibrate` then `cost.calibration.fit`) it prices layouts with the
corrected model and takes the hysteresis from its error.
Called by `tessera.sim.bench`; split out of `sim/oserve.py` (Table 1 and shared setup).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tessera.cost import calibration as calibration_
from tessera.cost.capacity import RequestClass, Slo
from tessera.cost.profile import Profile
from tessera.planner import table1
from tessera.policies.switching import gain as switching
from tessera.sim import engine, oserve_calibrate, oserve_switcher
from tessera.sim.oserve import (
    GPUS,
    LOAD,
    NODES,
    TRACES,
    _shares,
    _stats,
    build,
    built_label,
    mix_arrivals,
    router,
    trace_cv,
)

# how a run applies switches and prices layouts: (row key, through the transition planner,
# with the calibrated latency model)
MODES: tuple[tuple[str, bool, bool], ...] = (
    ("switching", False, True),
    ("switching_transition", True, True),
    ("switching_transition_raw", True, False),
)


def table2(
    profile: Profile,
    base: tuple[RequestClass, ...],
    slo: Slo,
    quick: bool,
    only: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The latency model calibrated on Table 1's mixes (`model_error`), then Table 2's
    rows with it (`only`: those traces): `{"planner_model_error", "oserve_table2"}`."""
    cal, error = model_error(profile, base, slo, quick)
    return {
        "planner_model_error": error,
        "oserve_table2": table2_rows(profile, base, slo, quick, cal, only),
    }


def model_error(
    profile: Profile, base: tuple[RequestClass, ...], slo: Slo, quick: bool
) -> tuple[calibration_.Calibration, dict[str, Any]]:
    """The latency model calibrated on the mixes of Table 2's traces
    (`sim.oserve_calibrate`, then `cost.calibration.fit`), and its error per layout as
    JSON (`tessera bench sim --parts oserve_model_error` runs only this)."""
    traces_ = (TRACES[0], TRACES[-1]) if quick else TRACES
    levels = sorted({lv for _, lvs, _, _ in traces_ for lv in lvs})
    samples = oserve_calibrate.samples(profile, base, slo, quick, levels)
    cal = calibration_.fit(samples)
    return cal, {
        "label": "simulation: the planner's latency model vs simulated runs of the same "
        "layouts (fit at two loads, one seed; errors on held-out runs at another load: "
        "the mean P99 of three other seeds)",
        **cal.to_json(),
        "samples": [
            {
                "layout": x.layout,
                "split": x.split,
                "at": x.note,
                "model_p99_s": round(x.predicted_s, 3),
                "sim_p99_s": x.measured_s,
                **({"sim_p99_by_seed": list(x.runs)} if x.runs else {}),
            }
            for x in samples
        ],
    }


def table2_rows(
    profile: Profile,
    base: tuple[RequestClass, ...],
    slo: Slo,
    quick: bool,
    cal: calibration_.Calibration | None = None,
    only: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """OServe Table 2: each trace's mixes in consecutive phases at one rate (LOAD x the
    lowest sustainable rate among its mixes); static = the best homogeneous layout for
    the trace's mean mix with least-outstanding routing; switching = the planner's
    heterogeneous layout for the first mix, re-routed and re-planned every span
    through `switching.decide` (active mode), once per `MODES` entry (the calibrated
    ones only with `cal`); `only`: those traces (e.g. `("T2",)`). Each run also reports
    the P99 of the requests arriving in each span (`p99_by_span_s`)."""
    traces_ = (TRACES[0], TRACES[-1]) if quick else TRACES
    if only is not None:
        unknown = set(only) - {t[0] for t in TRACES}
        if unknown:
            raise ValueError(f"unknown Table 2 trace(s): {', '.join(sorted(unknown))}")
        traces_ = tuple(t for t in TRACES if t[0] in only)
    span_s, per_phase = (30.0, 3) if quick else (60.0, 4)
    phase = span_s * per_phase
    cfg = switching.SwitchingConfig(
        enabled=True, mode="active", span_s=span_s, hold_spans=1, cooldown_spans=1
    )
    rows = []
    for name, levels, paper_cv, paper_speedup in traces_:
        mixes = [_shares(lv) for lv in levels]
        rates = []
        for shares in mixes:
            problem, table = table1.mix_problem(
                profile, table1.mixed(base, shares), slo, NODES, GPUS, True
            )
            rates.append(table1.sustainable_rps(problem, table))
        rate = LOAD * min(rates)
        arr = mix_arrivals(base, [(phase, m) for m in mixes], rate)
        end = phase * len(mixes)
        mean = tuple(float(v) for v in np.mean(np.asarray(mixes), axis=0))
        problem, table = table1.mix_problem(
            profile, table1.mixed(base, mean), slo, NODES, GPUS, True
        )
        static = table1.choose(problem, table, tuple(rate * w for w in mean))
        built = build(static, static.homo, "")
        res_static = engine.Engine(built.replicas, router(base, None)).run(arr, until=end)
        first = mixes[0]
        problem, table = table1.mix_problem(
            profile, table1.mixed(base, first), slo, NODES, GPUS, True
        )
        start = table1.choose(problem, table, tuple(rate * w for w in first))
        window = (span_s, end)
        st = _stats(res_static, window)
        row: dict[str, Any] = {
            "trace": name,
            "label": "simulation",
            "levels": list(levels),
            "cv": round(trace_cv(levels), 3),
            "paper_cv": paper_cv,
            "total_rps": round(rate, 3),
            "span_s": span_s,
            "paper_speedup": paper_speedup,
            "static": {
                "layout": built_label(static),
                **st,
                "p99_by_span_s": _by_span(res_static, span_s, end),
            },
        }
        plans: dict[tuple[int | float, ...], table1.Choice] = {}
        for key, use_transition, calibrated in MODES:
            if calibrated and cal is None:
                continue
            # the first layout is a planner decision too: with the calibrated model, the
            # heterogeneous layout only when it beats the best homogeneous one by more than
            # the model's error on both (the switching rule, homogeneous as the incumbent)
            begin = start.hetero
            if calibrated and cal is not None and start.homo[1].groups:
                at = oserve_calibrate.point(first, LOAD * min(rates) / rates[0])
                price = {
                    w[0].label(): cal.price(w[0].label(), w[1].p99_latency_s, at)
                    for w in (start.hetero, start.homo)
                }
                het, hom = start.hetero[0].label(), start.homo[0].label()
                need = switching.gain_threshold(
                    cfg,
                    switching.DeploymentCost(hom, price[hom], cal.error(hom)),
                    switching.DeploymentCost(het, price[het], cal.error(het)),
                )
                if price[hom] / price[het] - 1.0 <= need:
                    begin = start.homo
            built = build(start, begin, "g0-")
            sw = oserve_switcher.Switcher(
                profile,
                base,
                slo,
                built,
                begin[0],
                cfg,
                use_transition=use_transition,
                shared_cache=plans,
                calibration=cal if calibrated else None,
            )
            eng = engine.Engine(built.replicas, router(base, built.shares), [sw], 1.0)
            res_sw = eng.run(arr, until=end)
            so = _stats(res_sw, window)
            assert sw.decisions is not None
            switched = [d for d in sw.decisions if d["action"] == switching.SWITCH]
            row[key] = {
                "applied_by": "policies.transition plan and its steps' modelled delays"
                if use_transition
                else "the switch plan's time, KV handed over",
                "latency_model": "calibrated" if calibrated else "raw (minGain 10 %)",
                "start_layout": begin[0].label(),
                **so,
                "speedup_sim": round(st["p99_latency_s"] / so["p99_latency_s"], 3)
                if so["p99_latency_s"]
                else None,
                "mean_latency_speedup_sim": _mean_speedup(res_static, res_sw, window),
                "p99_by_span_s": _by_span(res_sw, span_s, end),
                "switch_decisions": len(switched),
                "switch_plan_s": [d["switchSeconds"] for d in switched],
                "deployments": [a for _, a in res_sw.actions if a.startswith("switch:")],
                "transitions": sw.transitions,
                "switches_blocked": sum(1 for t in sw.transitions if t.get("blocked")),
                "decisions": sw.decisions,
            }
        for key, out in (
            ("switching", "speedup_sim"),
            ("switching_transition", "speedup_transition_sim"),
            ("switching_transition_raw", "speedup_transition_raw_sim"),
        ):
            if key in row:
                row[out] = row[key]["speedup_sim"]
        tr = row.get("switching_transition") or row["switching_transition_raw"]
        row["speedup"] = tr["speedup_sim"]
        row["switches_blocked"] = tr["switches_blocked"]
        rows.append(row)
    return rows


def _by_span(res: engine.SimResult, span_s: float, end: float) -> list[float | None]:
    """P99 latency of the requests arriving in each span after the first (None: none)."""
    out: list[float | None] = []
    for k in range(1, round(end / span_s)):
        a, b = k * span_s, (k + 1) * span_s
        xs = [d.finish - d.arrival for d in res.done if a <= d.arrival < b]
        out.append(round(float(np.percentile(xs, 99)), 3) if xs else None)
    return out


def _mean_speedup(a: engine.SimResult, b: engine.SimResult, window: tuple[float, float]) -> float:
    def mean(res: engine.SimResult) -> float:
        xs = [d.finish - d.arrival for d in res.done if window[0] <= d.arrival < window[1]]
        return sum(xs) / len(xs) if xs else math.inf

    return round(mean(a) / mean(b), 3)
