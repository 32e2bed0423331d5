"""The switching loop's candidates for an `auto` spec, across spans and on large pools
(pure, model output): the auto planner's placement (`status.plan`) is priced as the current
candidate ``auto``; the planner candidates are built once per planning problem and reused;
the candidate count is capped by the documented rule; and why tp stays 1 (one TP rank per
agent)."""

from __future__ import annotations

from typing import Any

import pytest

from tessera import api, api_semantics, plan
from tessera.cost.capacity import RequestClass
from tessera.planner import capacity_table, exhaustive
from tessera.planner.evaluate import Evaluator
from tessera.policies.switching import candidates as sc
from tessera.policies.switching import current as switching_current
from tessera.policies.switching import planner as switching_planner
from tests.planner import planner_helpers as helpers
from tests.policies.test_switching_candidates import NAMES, SHAPE, WHOLE, _dep, _obs

AUTO = {"mode": "auto"}


def _status_plan(replicas: list[dict[str, Any]]) -> dict[str, Any]:
    """`status.plan` as the reconcile pass writes it for an auto placement of ``replicas``."""
    planned = plan.Plan(
        "/models/m",
        "float16",
        tuple(
            plan.PlannedReplica(
                f"serving.llama.p{i}.g1",
                f"p{i}",
                tuple(
                    plan.PlannedStage(st["agent"], st["device"], *st["layers"], st.get("tp", 1))
                    for st in r["stages"]
                ),
                1,
            )
            for i, r in enumerate(replicas)
        ),
        source="auto:planner",
    )
    return {"source": planned.source, "generation": 1, "replicas": planned.to_status()}


def test_the_auto_placement_is_the_current_candidate() -> None:
    placed = switching_current.placed_replicas(_status_plan(WHOLE))
    assert placed is not None and [r["name"] for r in placed] == ["p0", "p1", "p2", "p3"]
    made = sc.build(_dep(AUTO), SHAPE, _obs(), NAMES, placed=placed)
    assert sc.AUTO in made.layouts and sc.SPEC not in made.layouts
    # the planner enumerates four whole replicas too: that twin comes first and is current
    current = switching_current.current_of(placed, made.layouts.items())
    assert current is not None and current != sc.AUTO
    for demand in ((4.0, 0.5), (0.5, 2.0)):
        assert made.planned.price(sc.AUTO, demand) == made.planned.price(current, demand)
    assert made.planned.switch_seconds(sc.AUTO, current) == 0.0
    # a placement the planner does not enumerate (three whole replicas) is current as "auto"
    three = switching_current.placed_replicas(_status_plan(WHOLE[:3]))
    assert three is not None
    made = sc.build(_dep(AUTO), SHAPE, _obs(), NAMES, placed=three)
    assert switching_current.current_of(three, made.layouts.items()) == sc.AUTO
    assert 0 < made.planned.price(sc.AUTO, (1.0, 1.0)) > made.planned.price(current, (1.0, 1.0))


def test_candidates_are_built_once_per_problem() -> None:
    cache = sc.CandidateCache(size=2)
    placed = switching_current.placed_replicas(_status_plan(WHOLE))
    first = sc.build(_dep(AUTO), SHAPE, _obs(), NAMES, placed=placed, cache=cache)
    first.planned.price(sc.AUTO, (1.0, 1.0))
    split = next(n for n, r in first.layouts.items() if all(len(x["stages"]) == 2 for x in r))
    seconds = first.planned.switch_seconds(sc.AUTO, split)
    twin = switching_current.current_of(WHOLE, first.layouts.items())
    assert twin is not None and twin != sc.AUTO
    between = first.planned.switch_seconds(split, twin)  # two cached candidates: kept
    again = sc.build(_dep(AUTO), SHAPE, _obs(), NAMES, placed=placed, cache=cache)
    assert cache.builds == 1 and again.planned.table is first.planned.table
    assert again.planned._model is first.planned._model  # the latency model's facts too
    # per-span candidates ("auto", "spec") never leave their switch times in the cache
    assert all(sc.AUTO not in key for key in again.planned._switch)
    assert again.planned._switch[(split, twin)] == between > 0
    assert again.planned.switch_seconds(sc.AUTO, split) == seconds
    sc.build(_dep(), SHAPE, _obs(), NAMES[::-1], cache=cache)  # another class order
    sc.build(_dep(), SHAPE, _obs(), NAMES, cache=cache, max_candidates=3)  # another cap
    assert cache.builds == 3 and len(cache._items) == 2  # least recently used dropped


def test_the_candidate_count_is_capped_by_the_rule() -> None:
    classes = (RequestClass("chat", 200, 100, 1.0), RequestClass("doc", 6000, 20, 1.0))
    problem = helpers.problem(classes=classes, nodes=2, gpus=8)
    table = capacity_table.build_table(problem)
    every = list(exhaustive.layouts(table))
    assert len(every) == 66
    kept = switching_planner.cap(problem, table, every, 7)
    assert len(kept) == 7 == len(set(kept))
    assert kept == switching_planner.cap(problem, table, every, 7)  # deterministic
    for mix in (problem.demand, (1.0, 0.0), (0.0, 1.0)):  # each mix's best is kept
        evaluator = Evaluator(table, mix)
        best = max(evaluator(layout).score for layout in every)
        assert max(evaluator(layout).score for layout in kept) == best
    assert switching_planner.cap(problem, table, every, 100) == every
    made = switching_planner.candidates(problem, table, max_candidates=7)
    assert len(made.deployments) == 7
    with pytest.raises(ValueError, match="max_candidates"):
        switching_planner.cap(problem, table, every, 0)


def test_tp_candidates_are_valid_layouts() -> None:
    """llama-2-70b (fp16, ~138 GB) fits no single 80 GB H100, so with tp allowed the
    planner proposes tp > 1 stages whose ranks sit on one agent's devices; agents host
    several ranks, one per device (issue 12), so the operator's semantic check accepts
    them. The default (tp 1, as `layout: auto`) gives only valid tp-1 layouts."""
    shape = helpers.shape("llama-2-70b")
    dep = api.parse(
        {
            "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
            "kind": "ServingDeployment",
            "metadata": {"name": "big", "namespace": "serving"},
            "spec": {
                "model": {"name": "llama-2-70b", "path": "/models/llama-2-70b"},
                "workload": {
                    "classes": [
                        {"name": "chat", "inputTokens": 200, "outputTokens": 100, "rate": 1},
                        {"name": "doc", "inputTokens": 6000, "outputTokens": 20, "rate": 1},
                    ]
                },
            },
        }
    )
    facts = shape

    def errors(replicas: list[dict[str, Any]]) -> list[str]:
        layout = {"mode": "explicit", "replicas": replicas}
        spec = api.parse_spec({"model": {"name": "m", "path": "/m"}, "layout": layout})
        return [str(e) for e in api_semantics.check_semantics(spec, facts, ["node-0", "node-1"])]

    with_tp = sc.build(dep, shape, _obs(), NAMES, max_tp=0)  # 2 nodes x 2 H100
    tp_layouts = [
        r
        for r in with_tp.layouts.values()
        if any(st.get("tp", 1) > 1 for x in r for st in x["stages"])
    ]
    assert tp_layouts
    assert all(errors(r) == [] for r in tp_layouts)
    default = sc.build(dep, shape, _obs(), NAMES)
    assert default.layouts and all(errors(r) == [] for r in default.layouts.values())
    tps = {st.get("tp", 1) for rs in default.layouts.values() for r in rs for st in r["stages"]}
    assert tps == {1}
