"""Deployment search: heterogeneous replicas co-optimized with the class assignment.

Entry point for the operator's reconcile core (``layout: auto``) and the CLI: :func:`plan`
returns a :class:`~tessera.planner.deployment.Deployment`. The objective is the largest
multiple of the demand mix served within the SLO (``tessera.planner.evaluate``). Methods:
``heuristic`` (default) starts from the best few homogeneous layouts and applies
flow-guided moves (``tessera.planner.moves``) by predicted dual-value gain, accepting only
strict improvements, until ``patience`` non-improving candidates in a row or a whole
neighbourhood fails; ties are broken by a seeded RNG, so a seed fixes the result.
``exhaustive`` tries every layout (small clusters only); ``homogeneous`` copies the best
single shape. docs/planner.md, "Deployment search".
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from tessera import fields
from tessera.planner import capacity_table, deployment, exhaustive, homogeneous, moves
from tessera.planner.capacity_table import CapacityTable
from tessera.planner.deployment import Deployment
from tessera.planner.evaluate import Evaluation, Evaluator
from tessera.planner.layout import Layout
from tessera.planner.problem import PlanningProblem

METHODS: tuple[str, ...] = ("heuristic", "exhaustive", "homogeneous")


@dataclass(frozen=True)
class SearchOptions:
    """Knobs of the deployment search."""

    method: str = "heuristic"
    seed: int = 0  # orders equally promising moves
    patience: int = 60  # K: non-improving candidates in a row before stopping
    starts: int = 3  # best homogeneous layouts refined (multi-start)
    max_evaluations: int = 50_000  # safety cap on scored candidates per start

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise fields.FieldError("method", f"must be one of {', '.join(METHODS)}")
        if self.patience < 1:
            raise fields.FieldError("patience", "must be >= 1")
        if self.starts < 1:
            raise fields.FieldError("starts", "must be >= 1")


@dataclass(frozen=True)
class SearchResult:
    """Best layout found and search statistics."""

    layout: Layout
    evaluation: Evaluation
    candidates: int  # candidate layouts scored (cache hits included)
    accepted: int  # improving moves applied


def _improves(new: Evaluation, old: Evaluation) -> bool:
    return new.score > old.score + 1e-9 * max(1.0, abs(old.score))


def _prices(table: CapacityTable, evaluation: Evaluation, classes: int) -> tuple[float, ...]:
    """Class prices of the makespan LP; without one, the inverse mean capacity."""
    if evaluation.assignment is not None and any(p > 0 for p in evaluation.assignment.class_prices):
        return evaluation.assignment.class_prices
    out = []
    for j in range(classes):
        rates = [table.rates(s)[j] for s in table.kept if table.rates(s)[j] > 0]
        out.append(len(rates) / sum(rates) if rates else 0.0)
    return tuple(out)


def refine(
    table: CapacityTable,
    evaluator: Evaluator,
    start: Layout,
    options: SearchOptions,
    rng: random.Random,
) -> SearchResult:
    """Local search from ``start`` with flow-guided moves (see module docstring)."""
    current, score = start, evaluator(start)
    classes = len(evaluator.demand)
    candidates = accepted = stale = 0
    while candidates < options.max_evaluations:
        prices = _prices(table, score, classes)
        neighbourhood = moves.neighbours(table, current, prices)
        keyed = [(-move.gain, rng.random(), i) for i, move in enumerate(neighbourhood)]
        keyed.sort()
        improved = False
        for _, _, i in keyed:
            move = neighbourhood[i]
            trial = moves.apply(current, move, 1)
            result = evaluator(trial)
            candidates += 1
            if not _improves(result, score):
                stale += 1
                if stale >= options.patience or candidates >= options.max_evaluations:
                    return SearchResult(current, score, candidates, accepted)
                continue
            m = 2
            while m <= move.available:  # grow the move while it keeps paying
                bigger = moves.apply(current, move, m)
                bigger_result = evaluator(bigger)
                candidates += 1
                if not _improves(bigger_result, result):
                    break
                trial, result = bigger, bigger_result
                m *= 2
            current, score = trial, result
            accepted += 1
            stale = 0
            improved = True
            break
        if not improved:
            break
    return SearchResult(current, score, candidates, accepted)


def search_layout(
    table: CapacityTable, evaluator: Evaluator, options: SearchOptions
) -> tuple[SearchResult, homogeneous.Candidate]:
    """Run the configured method; also return the best homogeneous layout (baseline)."""
    ranked = homogeneous.ranked(table, evaluator)
    if not ranked:
        raise fields.FieldError(
            "spec.resources", "no replica shape fits the GPUs (weights plus one sequence's KV)"
        )
    baseline = ranked[0]
    if options.method == "homogeneous":
        return SearchResult(baseline.layout, baseline.evaluation, len(ranked), 0), baseline
    if options.method == "exhaustive":
        found = exhaustive.search(table, evaluator)
        return SearchResult(found.layout, found.evaluation, found.layouts, 0), baseline
    rng = random.Random(options.seed)
    best: SearchResult | None = None
    total = accepted = 0
    for start in ranked[: options.starts]:
        result = refine(table, evaluator, start.layout, options, rng)
        total += result.candidates
        accepted += result.accepted
        if best is None or _improves(result.evaluation, best.evaluation):
            best = result
    assert best is not None
    return SearchResult(best.layout, best.evaluation, total, accepted), baseline


def plan(
    problem: PlanningProblem,
    options: SearchOptions | None = None,
    table: CapacityTable | None = None,
) -> Deployment:
    """Plan a deployment for ``problem``; pass ``table`` to reuse priced shapes."""
    opts = options if options is not None else SearchOptions()
    began = time.perf_counter()
    priced = table if table is not None else capacity_table.build_table(problem)
    evaluator = Evaluator(priced, problem.demand)
    result, baseline = search_layout(priced, evaluator, opts)
    stats = (
        ("seconds", time.perf_counter() - began),
        ("candidates", float(result.candidates)),
        ("lp_solves", float(evaluator.calls)),
        ("accepted_moves", float(result.accepted)),
        ("shapes_priced", float(len(priced.infos))),
        ("shapes_kept", float(len(priced.kept))),
        ("homogeneous_scale", baseline.evaluation.scale),
        ("seed", float(opts.seed)),
    )
    return deployment.materialize(
        problem, priced, result.layout, result.evaluation, opts.method, stats
    )
