"""The operator's view of overload drops: status.overload, the Overloaded condition, events."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from tessera import blocks, observed, plan
from tessera.control import outcome
from tessera_operator import announced, overload_status, status

PLAN = plan.Plan(
    "/models/tiny",
    "float32",
    (
        plan.PlannedReplica("team.tiny.r0", "r0", (plan.PlannedStage("a", "cpu:0", 0, 8),)),
        plan.PlannedReplica("team.tiny.r1", "r1", (plan.PlannedStage("b", "cpu:0", 0, 8),)),
    ),
)


def _block(rid: str, i: int, n: int, start: int, end: int, pages: int) -> blocks.Block:
    return blocks.Block(
        "/models/tiny", start, end, rid, i, num_stages=n, kv_pages=pages, kv_bytes=pages
    )


def _outcome(dropped: bool) -> outcome.Outcome:
    if dropped:  # r1's block is stage 1 of r0: the overload loop merged them
        held = {
            "a": (_block("team.tiny.r0", 0, 2, 0, 4, 220),),
            "b": (_block("team.tiny.r0", 1, 2, 4, 8, 220),),
        }
    else:
        held = {
            "a": (_block("team.tiny.r0", 0, 1, 0, 8, 16),),
            "b": (_block("team.tiny.r1", 0, 1, 0, 8, 16),),
        }
    obs = observed.Observed(
        tuple(observed.AgentInfo(n, f"{n}:1", blocks=held[n]) for n in ("a", "b"))
    )
    out = outcome.Outcome("Serving", "serving", plan=PLAN, observed=obs)
    out.ready_replicas = ["team.tiny.r0"]
    return out


def _body(version: str) -> kopf.Body:
    return kopf.Body({"metadata": {"name": "tiny", "uid": "u", "resourceVersion": version}})


def _cond(st: dict[str, Any]) -> dict[str, Any]:
    return dict(status.condition(st, "Overloaded"))


def test_drop_and_restore_show_in_status_condition_and_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(
        announced.kopf, "info", lambda body, reason, message: posted.append((reason, message))
    )
    whole = status.build(_outcome(False), 1, {}, "T1", "")
    assert "overload" not in whole and _cond(whole) == {}  # never dropped: no condition

    dropped = status.build(_outcome(True), 1, whole, "T2", "")
    assert dropped["overload"] == {
        "groups": [
            {
                "head": "team.tiny.r0",
                "stages": [
                    {"agent": "a", "layers": [0, 4], "kvPages": 220},
                    {"agent": "b", "layers": [4, 8], "kvPages": 220},
                ],
            }
        ]
    }
    c = _cond(dropped)
    assert (c["status"], c["reason"]) == ("True", "LayersDropped")
    assert c["message"] == "team.tiny.r0: a [0, 4) 220 KV pages | b [4, 8) 220 KV pages"
    seen = overload_status.posted()
    seen.record(_body("1"), whole.get("overload") or {}, dropped["overload"])
    assert posted == [("OverloadDropped", c["message"])]
    # the overload tick writes the same two fields as a pass would
    tick = overload_status.patch(whole, dropped["overload"]["groups"], 1, "T2")
    assert tick["overload"] == dropped["overload"]
    assert _cond(tick) == c
    assert overload_status.patch(dropped, dropped["overload"]["groups"], 1, "T9") == {}

    back = status.build(_outcome(False), 1, dropped, "T3", "")
    assert status.merge_patch(dropped, back)["overload"] is None  # removed from the status
    c = _cond(back)
    assert (c["status"], c["reason"], c["lastTransitionTime"]) == ("False", "WholeReplicas", "T3")
    seen.record(_body("2"), dropped["overload"], back.get("overload") or {})
    assert posted[-1] == ("OverloadRestored", "team.tiny.r0: whole-model replicas again")
    # a second pass over the same stale body (its status still shows the group): no
    # second OverloadRestored; a body that caught up posts nothing either
    seen.record(_body("2"), dropped["overload"], back.get("overload") or {})
    seen.record(_body("3"), back.get("overload") or {}, back.get("overload") or {})
    assert [r for r, _ in posted].count("OverloadRestored") == 1
    tick = overload_status.patch(dropped, [], 1, "T3")
    assert tick["overload"] is None and _cond(tick) == c
    again = status.build(_outcome(False), 1, back, "T4", "")
    assert status.merge_patch(back, again) == {}  # converged: nothing to write
