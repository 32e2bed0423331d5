"""`tessera profile` measures a real agent, and the profile drives `layout: auto`."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tessera import api, observed, plan
from tessera.cli import main as cli
from tessera.cost import model_shape, profile
from tessera.planner import auto
from tests.agent.test_agent_rpc import load_replica

pytestmark = pytest.mark.slow


def test_profile_then_plan(
    agents_factory: Callable[..., list],
    tiny_llama: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (agent,) = agents_factory(1)
    load_replica([agent], tiny_llama, [(0, 8)])  # --model defaults to the agent's block
    out = tmp_path / "cpu.json"
    assert (
        cli.main(
            [
                "profile",
                "--agent",
                agent.address,
                "--out",
                str(out),
                "--repeats",
                "2",
                "--prefill",
                "8,32,64,128",
                "--batches",
                "1,2,4,8",
                "--contexts",
                "16,64",
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["source"] == "measured" and doc["device"] == "cpu"
    assert len(doc["measurement"]["samples"]) == 4 + 4 * 2 + 4
    prof = profile.profile_from_json(doc)
    assert prof.prefill.seconds(128, 1) > prof.prefill.seconds(8, 1) > 0
    shape = dataclasses.replace(
        model_shape.from_hf_config(json.loads((tiny_llama / "config.json").read_text()), "tiny"),
        dtype_bytes=4,
    )
    dep = api.parse(
        {
            "apiVersion": "serving.tessera.dev/v1alpha1",
            "kind": "ServingDeployment",
            "metadata": {"name": "t"},
            "spec": {
                "model": {"name": "tiny", "path": str(tiny_llama)},
                "layout": {"mode": "auto"},
            },
        }
    )
    obs = observed.Observed(
        tuple(
            observed.AgentInfo(
                f"a{i}", f"h:{i}", devices=(observed.DeviceInfo("cpu:0", "cpu", 1 << 30, 1 << 30),)
            )
            for i in range(2)
        )
    )
    p = plan.make_plan(dep, shape, obs, str(tiny_llama), auto.default_auto_planner(prof))
    assert p.source == "auto:planner" and "measured cpu" in p.message
    assert {s.agent for r in p.replicas for s in r.stages} == {"a0", "a1"}
