"""The switching loop's default candidates (pure): planner layouts on the observed agents
become explicit `spec.layout` replicas that parse and pass the semantic checks, the spec's
own layout is a candidate priced like the planner's identical one, classes follow the
arrivals' order, and every way of having no candidates says why (model output)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import pytest

from tessera import api, api_semantics, observed
from tessera.cost import analytic
from tessera.planner.deployment import Deployment, ReplicaPlan, StagePlan
from tessera.policies.switching import candidates as sc
from tests.planner import planner_helpers as helpers

GiB = 1 << 30
SHAPE = helpers.shape("llama-2-13b")
NAMES = ["chat", "doc"]
WHOLE = [
    {
        "name": f"w{i}",
        "stages": [{"agent": f"node-{i // 2}", "device": f"cuda:{i % 2}", "layers": [0, 40]}],
    }
    for i in range(4)
]


def _obs(kind: str = "cuda", name: str = "NVIDIA H100 80GB HBM3") -> observed.Observed:
    return observed.Observed(
        tuple(
            observed.AgentInfo(
                f"node-{n}",
                f"10.0.0.{n}:50051",
                devices=tuple(
                    observed.DeviceInfo(f"{kind}:{i}", kind, 80 * GiB, 80 * GiB, name)
                    for i in range(2)
                ),
            )
            for n in range(2)
        )
    )


def _dep(layout: dict[str, Any] | None = None) -> api.ServingDeployment:
    return api.parse(
        {
            "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
            "kind": "ServingDeployment",
            "metadata": {"name": "llama", "namespace": "serving"},
            "spec": {
                "model": {"name": "llama-2-13b", "path": "/models/llama-2-13b"},
                "layout": layout or {"mode": "explicit", "replicas": WHOLE},
                "workload": {
                    "classes": [
                        {"name": "doc", "inputTokens": 6000, "outputTokens": 20, "rate": 1},
                        {"name": "chat", "inputTokens": 200, "outputTokens": 100, "rate": 1},
                    ]
                },
                "slo": {"ttftP99Ms": 2000, "tpotP99Ms": 100},
            },
        }
    )


@pytest.fixture(scope="module")
def made() -> sc.Candidates:
    return sc.build(_dep(), SHAPE, _obs(), NAMES)


def _structure(replicas: list[dict[str, Any]]) -> list[list[tuple[str, str, tuple[int, int]]]]:
    spec = api.parse_spec(
        {"model": {"name": "m", "path": "/m"}, "layout": {"mode": "explicit", "replicas": replicas}}
    )
    return sorted(
        [(p.agent, p.device, s.layers) for s in r.stages for p in s.placements()]
        for r in spec.layout.replicas
    )


def test_planner_layouts_become_valid_explicit_replicas(made: sc.Candidates) -> None:
    assert sc.SPEC in made.layouts and len(made.layouts) > 3
    facts = SHAPE
    for name, replicas in made.layouts.items():
        spec = api.parse_spec(
            {
                "model": {"name": "m", "path": "/m"},
                "layout": {"mode": "explicit", "replicas": replicas},
            }
        )
        assert api_semantics.check_semantics(spec, facts, ["node-0", "node-1"]) == [], name
        for r in spec.layout.replicas:  # each replica covers every layer once, in order
            bounds = [s.layers for s in r.stages]
            assert bounds[0][0] == 0 and bounds[-1][1] == SHAPE.num_layers
            assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
        devices = [
            (p.agent, p.device)
            for s in spec.layout.replicas
            for x in s.stages
            for p in x.placements()
        ]
        assert len(devices) == len(set(devices)) <= 4  # no device used twice
    # the planner's deployment and its replicas agree stage by stage
    planned = made.planned.deployments
    for name, dep in planned.items():
        if name != sc.SPEC:
            got = [[(st["agent"], st["layers"]) for st in r["stages"]] for r in made.layouts[name]]
            want = [[(s.gpus[0][0], list(s.layers)) for s in r.stages] for r in dep.replicas]
            assert got == want


def test_the_spec_layout_is_priced_like_the_same_planner_layout(made: sc.Candidates) -> None:
    twins = [
        n for n, r in made.layouts.items() if n != sc.SPEC and _structure(r) == _structure(WHOLE)
    ]
    assert len(twins) == 1, "the planner enumerates four whole replicas"
    for demand in ((4.0, 0.5), (0.5, 2.0)):
        assert made.planned.price(sc.SPEC, demand) == made.planned.price(twins[0], demand)
    assert made.planned.switch_seconds(sc.SPEC, twins[0]) == 0.0
    split = next(n for n, r in made.layouts.items() if all(len(x["stages"]) == 2 for x in r))
    assert 0.0 < made.planned.switch_seconds(split, sc.SPEC) < math.inf


def test_classes_follow_the_arrivals_order(made: sc.Candidates) -> None:
    assert [c.name for c in made.planned.problem.classes] == NAMES
    flipped = sc.build(_dep(), SHAPE, _obs(), NAMES[::-1])
    assert [c.name for c in flipped.planned.problem.classes] == NAMES[::-1]
    assert flipped.planned.price(sc.SPEC, (0.5, 4.0)) == pytest.approx(
        made.planned.price(sc.SPEC, (4.0, 0.5))
    )


def test_no_candidates_says_why() -> None:
    with pytest.raises(ValueError, match="arrival classes"):
        sc.build(_dep(), SHAPE, _obs(), ["chat", "other"])
    with pytest.raises(ValueError, match="no cost profile"):
        sc.build(_dep(), SHAPE, _obs("cpu", "cpu"), NAMES)
    with pytest.raises(ValueError, match="no cost profile"):
        sc.build(_dep(), SHAPE, _obs(name="NVIDIA L4"), NAMES)
    other = analytic.analytic_profile(helpers.shape("llama-2-7b"), "h100-80gb")
    cpu = dataclasses.replace(other, device="cpu", source="measured")
    with pytest.raises(ValueError, match="shape differs"):
        sc.build(_dep(), SHAPE, _obs("cpu", "cpu"), NAMES, measured=cpu)


def test_a_measured_profile_plans_cpu_agents() -> None:
    stand_in = analytic.analytic_profile(SHAPE, "h100-80gb")  # stands in for a measured one
    cpu = dataclasses.replace(stand_in, device="cpu", source="measured")
    made = sc.build(_dep({"mode": "auto"}), SHAPE, _obs("cpu", "cpu"), NAMES, measured=cpu)
    assert sc.SPEC not in made.layouts and sc.AUTO not in made.layouts  # no placement given
    used = {st["device"] for rs in made.layouts.values() for r in rs for st in r["stages"]}
    assert used == {"cpu:0", "cpu:1"}


def test_tp_ranks_are_written_only_when_not_consecutive() -> None:
    def dep(gpus: tuple[tuple[str, int], ...]) -> Deployment:
        stage = StagePlan((0, 40), gpus)
        replica = ReplicaPlan("r0", 2, 1, gpus, (stage,), (1.0,))
        return Deployment(
            "m", "cuda", "analytic", "x", ("c",), (1.0,), (replica,), ((1.0,),), (0.5,), 1.0, 1.0
        )

    ids = {"node-0": ["cuda:0", "cuda:1", "cuda:3"]}
    plain = sc.replicas_json(dep((("node-0", 0), ("node-0", 1))), ids)
    assert plain == [
        {
            "name": "r0",
            "stages": [{"agent": "node-0", "device": "cuda:0", "layers": [0, 40], "tp": 2}],
        }
    ]
    gap = sc.replicas_json(dep((("node-0", 1), ("node-0", 2))), ids)
    assert gap[0]["stages"][0]["ranks"] == [{"agent": "node-0", "device": "cuda:3"}]
    assert _structure(gap) == [[("node-0", "cuda:1", (0, 40)), ("node-0", "cuda:3", (0, 40))]]
