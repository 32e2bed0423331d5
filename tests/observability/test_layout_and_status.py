"""The layout picture (pure), `tessera plan --svg`, the control recorder, and the status
page's routes and keys on a gateway in this process (no agents needed)."""

from __future__ import annotations

import base64
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import aiohttp
import pytest

from tessera import blocks, observed
from tessera import plan as plan_mod
from tessera.gateway import config
from tessera.observability import control, layout_svg
from tests.gateway import helpers

ROOT = Path(__file__).resolve().parents[2]
SVG = "{http://www.w3.org/2000/svg}"


def _stages(svg: str) -> list[dict[str, str]]:
    return [dict(g.attrib) for g in ET.fromstring(svg).iter(f"{SVG}g") if g.get("class") == "stage"]


def test_a_plan_is_drawn_stage_by_stage_with_tp_ranks() -> None:
    p = plan_mod.Plan(
        "m",
        "float32",
        (
            plan_mod.PlannedReplica(
                "ns.d.r0.g1",
                "r0",
                (
                    plan_mod.PlannedStage("a0", "cuda:0", 0, 20, tp=2, ranks=(("a0", "cuda:1"),)),
                    plan_mod.PlannedStage("a1", "cuda:0", 20, 40),
                ),
            ),
            plan_mod.PlannedReplica(
                "ns.d.r1.g1", "r1", (plan_mod.PlannedStage("a1", "cuda:1", 0, 40),)
            ),
        ),
        generation=1,
    )
    svg = layout_svg.render(
        layout_svg.from_plan(p), {"chat": {"ns.d.r0.g1": 0.25, "ns.d.r1.g1": 0.75}}
    )
    got = {
        (g["data-replica"], g["data-stage"], g["data-agent"], g["data-device"], g["data-layers"])
        for g in _stages(svg)
    }
    assert got == {
        ("ns.d.r0.g1", "0", "a0", "cuda:0", "0-20"),
        ("ns.d.r0.g1", "0", "a0", "cuda:1", "0-20"),
        ("ns.d.r0.g1", "1", "a1", "cuda:0", "20-40"),
        ("ns.d.r1.g1", "0", "a1", "cuda:1", "0-40"),
    }
    assert "chat 75%" in svg and "tp1/2" in svg


def test_observed_blocks_show_kv_use_shared_layers_and_stack_when_they_overlap() -> None:
    b = [
        blocks.Block("m", 0, 8, "x.d.r0.g1", 0, "cpu:0"),
        blocks.Block("m", 0, 4, "x.d.r1.g2", 0, "cpu:0", num_stages=2),
    ]
    obs = observed.Observed(
        (
            observed.AgentInfo(
                "agent-0",
                "h:1",
                devices=(observed.DeviceInfo("cpu:0", "cpu", 1 << 30, 1 << 29),),
                blocks=tuple(b),
                kv=(observed.ReplicaLoad("x.d.r0.g1", 100, 25),),
            ),
        )
    )
    shared = {("agent-0", "x.d.r1.g2", 0, 0): 4096}
    layout = layout_svg.from_observed(obs, ["x.d.r1.g2"], shared_bytes=shared)
    lanes, per_device = layout.lanes()
    assert per_device[("agent-0", "cpu:0")] == 2 and sorted(lanes.values()) == [0, 1]
    svg = layout_svg.render(layout)
    by = {g["data-replica"]: g for g in _stages(svg)}
    assert by["x.d.r1.g2"]["data-shared"] == "1" and by["x.d.r1.g2"]["data-leaving"] == "1"
    assert by["x.d.r0.g1"]["data-shared"] == "0"
    assert 'data-kv="25/100"' in svg
    # without the agents' shared bytes, overlapping layers of one checkpoint count as shared
    guessed = layout_svg.from_observed(obs)
    assert all(x.shared for x in guessed.boxes)


def test_tessera_plan_draws_the_svg(tmp_path: Path) -> None:
    out = tmp_path / "plan.svg"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tessera.cli.main",
            "plan",
            "-f",
            str(ROOT / "examples/planner/llama2-13b-h100.yaml"),
            "--cluster",
            str(ROOT / "examples/clusters/2x8-h100.yaml"),
            "--svg",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    stages = _stages(out.read_text())
    assert stages and {s["data-replica"] for s in stages} >= {"r0", "r1"}


async def test_the_recorder_counts_times_and_keeps_actions() -> None:
    rec = control.Recorder(keep=3)
    with rec.action("transition", "relayout", deployment="d") as h:
        h.note("2 loads")
    with pytest.raises(ValueError), rec.action("overload", "drop"):
        raise ValueError("boom")
    rec.note("switching", "switch", "to layout B")
    rec.outcome("ns.d", "Loading")
    rec.outcome("ns.d", "Serving")
    text = rec.registry

    def value(name: str, **labels: str) -> float | None:
        return text.get_sample_value(name, labels)

    assert (
        value("tessera_control_actions_total", loop="overload", action="drop", outcome="error") == 1
    )
    assert (
        value("tessera_control_action_duration_seconds_count", loop="transition", action="relayout")
        == 1
    )
    assert value("tessera_control_reconcile_reason", deployment="ns.d", reason="Loading") == 0
    assert value("tessera_control_reconcile_reason", deployment="ns.d", reason="Serving") == 1
    assert value("tessera_control_condition", deployment="ns.d", type="Ready", status="True") == 1
    last = rec.last_per_loop()
    assert last["overload"].outcome == "error" and "boom" in last["overload"].detail
    assert last["transition"].detail == "2 loads"
    rec.note("wake", "wake")
    assert len(rec.recent()) == 3  # keeps the last `keep`

    class Dep:
        namespace, name = "ns", "e"

    class Out:
        reason, message = "InsufficientCapacity", "no device fits"

    @control.reconcile_pass
    async def converge(dep: Dep) -> Out:
        return Out()

    await converge(Dep())
    cur = control.current().registry
    assert (
        cur.get_sample_value(
            "tessera_control_reconcile_reason",
            {"deployment": "ns.e", "reason": "InsufficientCapacity"},
        )
        == 1
    )


async def test_status_page_needs_a_key_when_keys_are_on_and_serves_control_metrics(
    tiny_llama: Path, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("ops sk-status\n")
    gw = await helpers.start(
        str(tiny_llama),
        config.ReplicaEndpoint("ns.d.r0.g1", helpers.dead_address()),
        api_keys_file=str(keys),
    )
    gw.set_class_shares({"chat": {"ns.d.r0.g1": 1.0}})
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(gw.url + "/status") as r:
                assert r.status == 401 and "Basic" in r.headers["WWW-Authenticate"]
            async with s.get(
                gw.url + "/admin/v1/status", headers={"Authorization": "Bearer nope"}
            ) as r:
                assert r.status == 401
            basic = "Basic " + base64.b64encode(b"me:sk-status").decode()
            async with s.get(gw.url + "/status", headers={"Authorization": basic}) as r:
                assert r.status == 200
                page = await r.text()
            assert '<tr data-replica="ns.d.r0.g1">' in page and "unreachable" in page
            assert 'http-equiv="refresh"' in page
            assert '<tr data-class="chat"><td>chat</td><td>ns.d.r0.g1: 100%</td></tr>' in page
            bearer = {"Authorization": "Bearer sk-status"}
            async with s.get(gw.url + "/admin/v1/status", headers=bearer) as r:
                doc = await r.json()
            assert doc["replicas"]["ns.d.r0.g1"]["ready"] is False
            assert doc["agents"][0]["reachable"] is False
            assert doc["classShares"] == {"chat": {"ns.d.r0.g1": 1.0}}
            async with s.get(gw.url + "/status/layout.svg", headers=bearer) as r:
                assert r.content_type == "image/svg+xml"
                ET.fromstring(await r.text())
            with control.current().action("transition", "relayout"):
                pass
            async with s.get(gw.url + "/metrics") as r:
                assert 'tessera_control_actions_total{action="relayout"' in await r.text()
    finally:
        await gw.stop()
