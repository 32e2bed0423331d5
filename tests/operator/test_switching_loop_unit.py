"""The operator's switching step without servers: what `switching_loop.decide` writes to
status (and patches) for each situation, and a gateway that cannot be read."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from tessera import api
from tessera.policies.switching import current as switching_current
from tessera_operator import switching_loop

A = [{"name": "r0", "stages": [{"agent": "agent-0", "device": "cpu:0", "layers": [0, 8]}]}]
B = [
    {
        "name": "r0",
        "stages": [
            {"agent": "agent-0", "device": "cpu:0", "layers": [0, 4]},
            {"agent": "agent-1", "device": "cpu:0", "layers": [4, 8]},
        ],
    }
]


def _dep(mode: str, auto: bool = False) -> tuple[api.ServingDeployment, dict[str, Any]]:
    spec = {
        "model": {"name": "m", "path": "/models/m"},
        "layout": {"mode": "auto"} if auto else {"mode": "explicit", "replicas": A},
        "policies": {"switching": {"enabled": True, "mode": mode, "spanSeconds": 10}},
    }
    doc = {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": "ServingDeployment",
        "metadata": {"name": "d", "namespace": "ns"},
        "spec": spec,
    }
    return api.parse(doc), spec


def _cands(b_latency: float = 1.0) -> switching_loop.SwitchingCandidates:
    return switching_loop.SwitchingCandidates(
        {"A": A, "B": B}, lambda n, d: 3.0 if n == "A" else b_latency, lambda a, b: 1.0
    )


SNAP = {"spanSeconds": 10.0, "classes": ["c"], "spans": [[30]] * 3}
HELD = {"hysteresis": {"candidate": "B", "streak": 1, "spansSinceSwitch": None}}


def test_recommend_in_advisory_and_switch_in_active() -> None:
    dep, spec = _dep("advisory")
    out = switching_loop.decide(dep, spec, HELD, False, SNAP, _cands(), "t")
    assert out.layout is None and out.event is not None and out.event[0] == "SwitchRecommended"
    assert out.status["reason"] == "Recommend" and out.status["current"] == "A"
    assert out.status["recommended"] == {"name": "B", "replicas": B}
    dep, spec = _dep("active")
    out = switching_loop.decide(dep, spec, HELD, False, SNAP, _cands(), "t")
    assert out.layout == {"mode": "explicit", "replicas": B}
    assert out.event is not None and out.event[0] == "SwitchApplied"
    assert out.status["lastSwitch"] == {
        "from": "A",
        "to": "B",
        "time": "t",
        "layoutWas": "explicit",
    }
    assert out.status["specLayout"] == "explicit"
    assert out.status["hysteresis"]["spansSinceSwitch"] == 0


def test_first_win_only_holds() -> None:
    dep, spec = _dep("active")
    out = switching_loop.decide(dep, spec, {}, False, SNAP, _cands(), "t")
    assert out.layout is None and out.event is None and out.status["reason"] == "Stay"
    assert out.status["hysteresis"] == {"candidate": "B", "streak": 1, "spansSinceSwitch": None}


def test_no_switch_while_a_transition_runs() -> None:
    dep, spec = _dep("active")
    out = switching_loop.decide(dep, spec, HELD, True, SNAP, _cands(), "t")
    assert out.layout is None and out.status["reason"] == "TransitionRunning"
    assert out.status["hysteresis"] == HELD["hysteresis"]


@pytest.mark.parametrize(
    ("snap", "cands", "reason"),
    [
        ({"spans": []}, _cands(), "WaitingForArrivals"),
        (SNAP, None, "NoCandidates"),
        (SNAP, switching_loop.SwitchingCandidates({"B": B}, max, max), "CurrentNotACandidate"),
        (SNAP, _cands(b_latency=0.0), "StepFailed"),
    ],
)
def test_why_no_step(
    snap: dict[str, Any], cands: switching_loop.SwitchingCandidates | None, reason: str
) -> None:
    dep, spec = _dep("active")
    out = switching_loop.decide(dep, spec, HELD, False, snap, cands, "t")
    assert out.status["reason"] == reason and out.layout is None and out.event is None
    assert out.status["hysteresis"] == HELD["hysteresis"]  # kept for the next span


async def test_unreadable_gateway_is_a_value_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ValueError, match=r"GET http://127\.0\.0\.1"):
        await switching_loop.fetch_arrivals(f"http://127.0.0.1:{port}/admin/v1/arrivals")


async def test_default_candidates_say_why_there_are_none() -> None:
    from tessera.control import agents
    from tessera_operator import config

    dep, _ = _dep("advisory")  # its model path (/models/m) has no config.json
    cfg = config.OperatorConfig(agents=(agents.AgentRef("agent-0", "127.0.0.1:1"),))
    with pytest.raises(ValueError, match="model not readable"):
        await switching_loop.default_candidates(cfg, None, dep, ["c"])
    with pytest.raises(ValueError, match="no Kubernetes client"):
        await switching_loop.default_candidates(config.OperatorConfig(), None, dep, ["c"])


# what the reconcile pass wrote for an auto spec: A's placement, other replica names
PLAN = {
    "source": "auto:planner",
    "generation": 1,
    "replicas": [
        {
            "name": "x",
            "replicaId": "ns.d.x.g1",
            "generation": 1,
            "stages": [{"agent": "agent-0", "device": "cpu:0", "layers": [0, 8], "tp": 1}],
        }
    ],
}


def test_an_auto_spec_is_priced_as_placed_and_switching_makes_it_explicit() -> None:
    placed = switching_current.placed_replicas(PLAN)
    assert placed == [{"name": "x", "stages": [A[0]["stages"][0]]}]
    dep, spec = _dep("advisory", auto=True)
    out = switching_loop.decide(dep, spec, HELD, False, SNAP, _cands(), "t", placed)
    assert out.status["current"] == "A" and out.status["reason"] == "Recommend"
    assert out.status["specLayout"] == "auto" and out.layout is None
    dep, spec = _dep("active", auto=True)
    out = switching_loop.decide(dep, spec, HELD, False, SNAP, _cands(), "t", placed)
    assert out.layout == {"mode": "explicit", "replicas": B}
    assert out.status["lastSwitch"]["layoutWas"] == "auto"
    assert out.event is not None and "now owns spec.layout" in out.event[1]


def test_an_auto_spec_without_its_placement_waits() -> None:
    dep, spec = _dep("active", auto=True)
    assert switching_current.placed_replicas({**PLAN, "source": "explicit"}) is None
    assert switching_current.placed_replicas({"source": "auto:simple", "replicas": [{}]}) is None
    out = switching_loop.decide(dep, spec, HELD, False, SNAP, _cands(), "t", None)
    assert out.status["reason"] == "CurrentNotACandidate" and "status.plan" in out.status["message"]
    other = [{"name": "y", "stages": [{"agent": "agent-1", "device": "cpu:0", "layers": [0, 8]}]}]
    out = switching_loop.decide(dep, spec, HELD, False, SNAP, _cands(), "t", other)
    assert out.status["reason"] == "CurrentNotACandidate" and out.layout is None
    assert "auto planner" in out.status["message"]


def test_the_models_error_sets_the_hysteresis() -> None:
    """A 15 % gain passes minGain (10 %) but not the threshold two 10 %-wrong prices set
    ((1.1 / 0.9) - 1 = 22 %, issue 34); a 2 % error on both lets it through."""
    dep, spec = _dep("active")
    gain15 = 3.0 / 1.15

    def cands(err: float | None) -> switching_loop.SwitchingCandidates:
        c = _cands(gain15)
        return switching_loop.SwitchingCandidates(
            c.layouts, c.price, c.switch_seconds, None if err is None else (lambda n: err)
        )

    out = switching_loop.decide(dep, spec, HELD, False, SNAP, cands(None), "t")
    assert out.layout is not None
    out = switching_loop.decide(dep, spec, HELD, False, SNAP, cands(0.10), "t")
    assert out.layout is None and out.status["reason"] == "Stay"
    assert "22" in out.status["message"], out.status["message"]
    out = switching_loop.decide(dep, spec, HELD, False, SNAP, cands(0.02), "t")
    assert out.layout is not None


def test_a_calibration_file_round_trips_and_reaches_the_operator(tmp_path: Any) -> None:
    import json

    from tessera.cli import calibrate_cmd, main
    from tessera.cost import calibration

    samples = [
        {"layout": "A", "predicted_s": 10.0, "measured_s": 12.0, "split": "fit"},
        {"layout": "A", "predicted_s": 10.0, "measured_s": 11.0, "split": "eval"},
        {"layout": "B", "predicted_s": 10.0, "measured_s": 9.0, "split": "fit"},
        {"layout": "B", "predicted_s": 10.0, "measured_s": 10.0, "split": "eval"},
    ]
    src, out = tmp_path / "s.json", tmp_path / "cal.json"
    src.write_text(json.dumps(samples))
    args = main.build_parser().parse_args(["calibrate", "--samples", str(src), "--out", str(out)])
    assert args.func(args) == 0
    cal = calibration.load(json.loads(out.read_text()))
    assert cal.price("A", 10.0) == pytest.approx(12.0)
    assert cal.error("A") == pytest.approx(1 / 11)
    assert cal.error("B") == pytest.approx(0.1)
    assert calibrate_cmd.samples_from_json(samples)[0].layout == "A"
    op = main.build_parser().parse_args(["operator", "--switching-calibration", str(out)])
    from tessera.cli import operator_cmd

    cfg = operator_cmd.build_config(op)
    assert cfg.switching_calibration.error("B") == pytest.approx(0.1)
