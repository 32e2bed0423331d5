"""Calibration of the planner's latency model against measured latencies, per layout.

The planner prices a layout with `planner.latency.LatencyModel`; where that price is
wrong, the switching loop switches to a worse layout. Input: samples `(layout, predicted
P99, measured P99, split)` ("fit" or held-out "eval"), each with an optional `point` (class
shares, then load as a share of the sustainable rate). `fit` keeps measured / predicted
ratios per layout, interpolated in the load within the nearest calibrated mix. It reports
per layout the corrected and raw held-out errors (a sample that is the mean of several
runs: also its worst single run, `run_max`); `error(layout)`, the larger of the two maxima,
is the switching hysteresis (`policies.switching.gain_threshold`). `lookup` serves planner
labels calibrated shape by shape (`cost.profile_calibration`). `dump` / `load`: JSON. Pure;
called by the simulator's Table 2, `tessera bench sim`, `tessera calibrate`, the operator.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SPLITS = ("fit", "eval")


@dataclass(frozen=True)
class Sample:
    """One layout at one demand: the model's P99 and the measured one."""

    layout: str
    predicted_s: float
    measured_s: float
    split: str = "fit"
    note: str = ""  # e.g. the mix and the rate
    point: tuple[float, ...] = ()  # where in demand space (class shares, load share)
    runs: tuple[float, ...] = ()  # each run's P99 when measured_s is their mean

    def __post_init__(self) -> None:
        if not (self.predicted_s > 0 and self.measured_s > 0):
            raise ValueError(f"{self.layout}: latencies must be > 0")
        if self.split not in SPLITS:
            raise ValueError(f"split: must be one of {', '.join(SPLITS)}")


@dataclass(frozen=True)
class LayoutError:
    """The model's error on one layout (relative: |price - measured| / measured)."""

    layout: str
    factor: float  # measured / predicted, fitted
    fit_samples: int
    eval_samples: int
    median: float  # corrected model, on the held-out samples (fit samples when none)
    max: float
    raw_median: float  # the uncorrected model, same samples
    raw_max: float
    held_out: bool  # the errors are on eval samples
    # the corrected model against each single run of those samples (a switch is paid on
    # one run's P99, not on a mean over arrival seeds); None: one run per sample
    run_max: float | None = None

    @property
    def decision_error(self) -> float:
        """The error a switching decision must cover: the worst single run's."""
        return self.max if self.run_max is None else max(self.max, self.run_max)

    def to_json(self) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "factor": round(self.factor, 4),
            "fit_samples": self.fit_samples,
            "eval_samples": self.eval_samples,
            "error_median": round(self.median, 4),
            "error_max": round(self.max, 4),
            "raw_error_median": round(self.raw_median, 4),
            "raw_error_max": round(self.raw_max, 4),
            "held_out": self.held_out,
            **({} if self.run_max is None else {"error_max_single_run": round(self.run_max, 4)}),
        }


@dataclass(frozen=True)
class Calibration:
    """Per-layout factors and errors; the fallback for a layout never measured."""

    layouts: Mapping[str, LayoutError] = field(default_factory=dict)
    unseen_error: float = 0.0  # the largest raw error measured on any layout
    # per layout: (point, measured / predicted) of each fit sample
    ratios: Mapping[str, tuple[tuple[tuple[float, ...], float], ...]] = field(default_factory=dict)

    def lookup(self, layout: str) -> LayoutError | None:
        """`layout`'s calibration; a deployment named by its replica shapes (a planner
        label such as `2x[tp1pp1 tp1pp2]`) calibrated per shape (`tp1pp2`: real agents'
        step profiles, `cost.profile_calibration`) takes its shapes' mean factor and
        their largest errors. None: not calibrated."""
        e = self.layouts.get(layout)
        if e is not None:
            return e
        shapes = sorted(set(re.findall(r"tp\d+pp\d+(?:@\d+n)?", layout)))
        found = [self.layouts[s] for s in shapes if s in self.layouts]
        if not shapes or len(found) != len(shapes):
            return None
        return LayoutError(
            layout,
            statistics.mean(x.factor for x in found),
            sum(x.fit_samples for x in found),
            sum(x.eval_samples for x in found),
            max(x.median for x in found),
            max(x.max for x in found),
            max(x.raw_median for x in found),
            max(x.raw_max for x in found),
            all(x.held_out for x in found),
            max((x.run_max for x in found if x.run_max is not None), default=None),
        )

    def factor(self, layout: str, point: tuple[float, ...] = ()) -> float:
        """The correction of `layout`'s price at `point` (module docstring)."""
        e = self.lookup(layout)
        if e is None:
            return 1.0
        near = [(p, r) for p, r in self.ratios.get(layout, ()) if len(p) == len(point) and p]
        if not point or not near:
            return e.factor
        mixes: dict[tuple[float, ...], list[tuple[float, float]]] = {}
        for p, r in near:
            mixes.setdefault(p[:-1], []).append((p[-1], r))
        mix = min(mixes, key=lambda m: (math.dist(m, point[:-1]), m))
        return _interpolate(sorted(mixes[mix]), point[-1])

    def price(self, layout: str, predicted_s: float, point: tuple[float, ...] = ()) -> float:
        """The model's price of `layout` (at `point`), corrected."""
        return predicted_s * self.factor(layout, point)

    def error(self, layout: str) -> float:
        """The relative error to expect of `price` on `layout` in one run: the held-out
        max, or its worst single run's where a sample is a mean of runs."""
        e = self.lookup(layout)
        return min(0.99, e.decision_error if e is not None else self.unseen_error)

    def to_json(self) -> dict[str, Any]:
        errs = [e.max for e in self.layouts.values()]
        meds = [e.median for e in self.layouts.values()]
        return {
            "layouts": [e.to_json() for e in self.layouts.values()],
            "unseen_error": round(self.unseen_error, 4),
            "error_median_of_medians": round(statistics.median(meds), 4) if meds else None,
            "error_max": round(max(errs), 4) if errs else None,
        }


def _interpolate(xs: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear through (x, y) sorted by x; the end values outside."""
    if x <= xs[0][0]:
        return xs[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(xs):
        if x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return xs[-1][1]


def _rel(price: float, measured: float) -> float:
    return abs(price - measured) / measured


def fit(samples: Iterable[Sample]) -> Calibration:
    """One factor per layout from its fit samples; errors on its eval samples."""
    by: dict[str, list[Sample]] = {}
    for s in samples:
        by.setdefault(s.layout, []).append(s)
    out: dict[str, LayoutError] = {}
    raw_all: list[float] = []
    ratios = {
        layout: tuple(
            (s.point, s.measured_s / s.predicted_s)
            for s in ss
            if s.split == "fit" or not any(x.split == "fit" for x in ss)
        )
        for layout, ss in by.items()
    }
    for layout, ss in sorted(by.items()):
        fit_ = [s for s in ss if s.split == "fit"] or ss
        ev = [s for s in ss if s.split == "eval"]
        factor = statistics.median(s.measured_s / s.predicted_s for s in fit_)
        on = ev or fit_
        partial = Calibration(
            {layout: LayoutError(layout, factor, 0, 0, 0, 0, 0, 0, False)}, 0.0, ratios
        )
        err = [_rel(partial.price(layout, s.predicted_s, s.point), s.measured_s) for s in on]
        runs = [_rel(partial.price(layout, s.predicted_s, s.point), r) for s in on for r in s.runs]
        raw = [_rel(s.predicted_s, s.measured_s) for s in on]
        raw_all += [_rel(s.predicted_s, s.measured_s) for s in ss]
        out[layout] = LayoutError(
            layout,
            factor,
            len([s for s in ss if s.split == "fit"]),
            len(ev),
            statistics.median(err),
            max(err),
            statistics.median(raw),
            max(raw),
            bool(ev),
            max(runs) if runs else None,
        )
    return Calibration(out, max(raw_all) if raw_all else 0.0, ratios)


def dump(c: Calibration) -> dict[str, Any]:
    """The calibration as JSON, every field `load` needs (ratios included)."""
    exact = [
        {
            **e.to_json(),
            "error_median": e.median,
            "error_max": e.max,
            "raw_error_median": e.raw_median,
            "raw_error_max": e.raw_max,
            **({} if e.run_max is None else {"error_max_single_run": e.run_max}),
        }
        for e in c.layouts.values()
    ]
    return {
        **c.to_json(),
        "layouts": exact,  # unrounded: the error is the switching threshold
        "unseen_error": c.unseen_error,
        "factors": {k: e.factor for k, e in c.layouts.items()},
        "ratios": {
            k: [{"point": list(p), "ratio": r} for p, r in rs] for k, rs in c.ratios.items()
        },
    }


def load(doc: Mapping[str, Any]) -> Calibration:
    """A calibration from `dump`'s JSON (ValueError when it is not one)."""
    try:
        factors = {str(k): float(v) for k, v in doc["factors"].items()}
        layouts = {}
        for e in doc["layouts"]:
            name = str(e["layout"])
            layouts[name] = LayoutError(
                name,
                factors.get(name, float(e["factor"])),
                int(e["fit_samples"]),
                int(e["eval_samples"]),
                float(e["error_median"]),
                float(e["error_max"]),
                float(e["raw_error_median"]),
                float(e["raw_error_max"]),
                bool(e["held_out"]),
                None if e.get("error_max_single_run") is None else float(e["error_max_single_run"]),
            )
        ratios = {
            str(k): tuple((tuple(float(x) for x in r["point"]), float(r["ratio"])) for r in rs)
            for k, rs in (doc.get("ratios") or {}).items()
        }
        return Calibration(layouts, float(doc["unseen_error"]), ratios)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a calibration document: {exc!r}") from exc
