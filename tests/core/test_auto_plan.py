"""`layout: auto` through the planner: analytic profiles for GPU agents, measured for CPU."""

from __future__ import annotations

import json
from pathlib import Path

from tessera import api, observed, plan
from tessera.cost import analytic, model_shape
from tessera.planner import auto

ROOT = Path(__file__).resolve().parents[2]
GiB = 1 << 30


def _shape() -> model_shape.ModelShape:
    cfg = json.loads((ROOT / "examples/models/llama-2-13b/config.json").read_text())
    return model_shape.from_hf_config(cfg, "llama-2-13b")


def _dep(**workload: object) -> api.ServingDeployment:
    return api.parse(
        {
            "apiVersion": "serving.tessera.dev/v1alpha1",
            "kind": "ServingDeployment",
            "metadata": {"name": "llama", "namespace": "serving"},
            "spec": {
                "model": {
                    "name": "llama-2-13b",
                    "path": "/models/llama-2-13b",
                    "dtype": "bfloat16",
                },
                "layout": {"mode": "auto"},
                "workload": {
                    "classes": [
                        {"name": "short", "inputTokens": 300, "outputTokens": 40, "rate": 4},
                        {"name": "long", "inputTokens": 1500, "outputTokens": 400, "rate": 1},
                    ]
                },
                "slo": {"ttftP99Ms": 2000, "tpotP99Ms": 100},
            },
        }
    )


def _gpu_agents(name: str = "NVIDIA H100 80GB HBM3") -> observed.Observed:
    return observed.Observed(
        tuple(
            observed.AgentInfo(
                f"node-{n}",
                f"10.0.0.{n}:50051",
                devices=tuple(
                    observed.DeviceInfo(f"cuda:{i}", "cuda", 80 * GiB, 80 * GiB, name)
                    for i in range(4)
                ),
            )
            for n in range(2)
        )
    )


def test_gpu_agents_use_the_analytic_planner() -> None:
    dep, shape = _dep(), _shape()
    p = plan.make_plan(
        dep, shape, _gpu_agents(), "/models/llama-2-13b", auto.default_auto_planner()
    )
    assert p.source == "auto:planner" and "analytic h100-80gb" in p.message
    used = [(s.agent, s.device) for r in p.replicas for s in r.stages]
    assert len(used) == len(set(used))  # no GPU holds two stages
    for r in p.replicas:
        assert r.stages[0].start == 0 and r.stages[-1].end == shape.num_layers
        assert all(a.end == b.start for a, b in zip(r.stages, r.stages[1:], strict=False))
        assert all(s.tp == 1 for s in r.stages)  # the engine runs tp = 1
    for cls in ("short", "long"):
        shares = p.class_shares[cls]
        assert set(shares) <= {r.replica_id for r in p.replicas}
        assert abs(sum(shares.values()) - 1.0) < 1e-6


def test_unknown_devices_fall_back_to_the_simple_plan() -> None:
    dep, shape = _dep(), _shape()
    p = plan.make_plan(dep, shape, _gpu_agents("Some Other GPU"), "/m", auto.default_auto_planner())
    assert p.source == "auto:simple"


def test_measured_profile_is_used_for_its_device_kind() -> None:
    dep, shape = _dep(), _shape()
    measured = analytic.analytic_profile(shape, "h100-80gb")  # stands in for a measured one
    obs = observed.Observed(
        tuple(
            observed.AgentInfo(
                f"n{i}",
                f"h:{i}",
                devices=(observed.DeviceInfo("cuda:0", "cuda", 80 * GiB, 80 * GiB, "lab gpu"),),
            )
            for i in range(2)
        )
    )
    p = plan.make_plan(dep, shape, obs, "/m", auto.default_auto_planner(measured))
    assert p.source == "auto:planner" and len({s.agent for r in p.replicas for s in r.stages}) == 2


def test_planned_tp_ranks_sit_on_one_agents_devices() -> None:
    """With TP allowed, every rank of a planned stage gets a device: the stage's agent (the
    planner's node) and one device per rank, so `reconcile` loads all tp blocks there."""
    dep, shape = _dep(), _shape()
    planner = auto.auto_planner(analytic.analytic_profile(shape, "h100-80gb"), max_tp=4)
    p = plan.make_plan(dep, shape, _gpu_agents(), "/models/llama-2-13b", planner)
    stages = [s for r in p.replicas for s in r.stages]
    assert any(s.tp > 1 for s in stages)
    for s in stages:
        places = s.placements()
        assert len(places) == s.tp and len(set(places)) == s.tp
        assert {a for a, _ in places} == {s.agent}
    used = [d for s in stages for d in s.placements()]
    assert len(used) == len(set(used))  # no GPU holds two ranks


def test_the_autoscalers_count_keeps_the_first_replicas_of_an_auto_plan() -> None:
    dep, shape = _dep(), _shape()
    obs = _gpu_agents("Some Other GPU")  # the simple plan: one replica per device
    full = plan.make_plan(dep, shape, obs, "/m", auto.default_auto_planner())
    assert len(full.replicas) == 8
    two = plan.make_plan(dep, shape, obs, "/m", auto.default_auto_planner(), replicas_cap=2)
    assert [r.name for r in two.replicas] == [r.name for r in full.replicas[:2]]
    one = plan.make_plan(dep, shape, obs, "/m", auto.default_auto_planner(), replicas_cap=0)
    assert len(one.replicas) == 1  # never below one
    capped = plan.make_plan(dep, shape, _gpu_agents(), "/m", auto.default_auto_planner(), 0, 1)
    kept = {r.replica_id for r in capped.replicas}
    assert len(kept) == 1 and all(set(s) <= kept for s in capped.class_shares.values())
