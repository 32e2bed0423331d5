"""Drift and restarts: the resync timer repairs what changed behind the operator's back.

An agent killed → Degraded=True (AgentUnreachable); restarted empty on the same port →
the timer reloads its blocks and the deployment is Ready again on its own. The operator
stopped in the middle of a load (a frozen agent keeps one LoadBlock hanging) → a new
operator finishes the job without loading any block twice.
"""

from __future__ import annotations

import collections
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.cli import local_agents
from tests.operator.conftest import (
    condition,
    create,
    events,
    get_sd,
    wait_for,
)
from tests.operator.test_operator_lifecycle import TWO_REPLICAS, blocks, manifest, ready, refs

pytestmark = pytest.mark.slow
_LOADED = re.compile(r"\bloaded (\S+) layers")
Start = Callable[..., list[local_agents.AgentProcess]]


def test_agent_killed_then_restarted(
    agents_factory: Start,
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
) -> None:
    procs = agents_factory(2)
    start_operator(refs(procs))
    create(kube, manifest("drift", tiny_llama, TWO_REPLICAS))
    wait_for("Ready=True", lambda: ready(kube, "drift"))
    port = int(procs[1].address.rsplit(":", 1)[1])
    local_agents.stop_agent(procs[1])

    obj = wait_for(
        "Degraded=True",
        lambda: (
            (o := get_sd(kube, "drift")) and condition(o, "Degraded").get("status") == "True" and o
        ),
    )
    degraded, ready_c = condition(obj, "Degraded"), condition(obj, "Ready")
    assert degraded["reason"] == "AgentUnreachable" and "agent-1" in degraded["message"]
    assert (ready_c["status"], ready_c["reason"]) == ("False", "AgentUnreachable")
    assert obj["status"]["readyReplicas"] == 1 and obj["status"]["phase"] == "Degraded"
    assert ("AgentUnreachable", ready_c["message"]) in events(kube, "drift")

    back = local_agents.start_agent("agent-1", "cpu:1x512MiB", 1, port=port)
    try:
        obj = wait_for("Ready again", lambda: ready(kube, "drift"))
        assert blocks(back) == [("default.drift.r1.g1", 1, 4, 8)]
        assert condition(obj, "Degraded")["status"] == "False"
        assert obj["status"]["readyReplicas"] == 2
    finally:
        local_agents.stop_agent(back)


def test_operator_restarted_mid_load_loads_nothing_twice(
    agents_factory: Start,
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
) -> None:
    a0, a1 = agents_factory(2)
    # Loads go last stage first: r0/0 on agent-1, then r1/1 on agent-1, then r1/0 on
    # agent-0. Freezing agent-0 once agent-1 holds a block leaves the operator hanging
    # in a LoadBlock call (or, at the latest, about to make one).
    layout = [
        {"name": "r0", "stages": [{"agent": "agent-1", "device": "cpu:0", "layers": [0, 8]}]},
        {
            "name": "r1",
            "stages": [
                {"agent": "agent-0", "device": "cpu:0", "layers": [0, 4]},
                {"agent": "agent-1", "device": "cpu:0", "layers": [4, 8]},
            ],
        },
    ]
    first = start_operator(refs([a0, a1]), resync_seconds=30.0)
    create(kube, manifest("restart", tiny_llama, layout))
    wait_for("agent-1's first block", lambda: blocks(a1), every=0.005)
    os.kill(a0.proc.pid, signal.SIGSTOP)
    try:
        assert condition(get_sd(kube, "restart"), "Ready").get("status") != "True"
        first.stop()  # kopf cancels the handler stuck in LoadBlock
    finally:
        os.kill(a0.proc.pid, signal.SIGCONT)
    assert condition(get_sd(kube, "restart"), "Ready").get("status") != "True"

    start_operator(refs([a0, a1]), resync_seconds=30.0)
    wait_for("Ready after the restart", lambda: ready(kube, "restart"))
    assert blocks(a0) == [("default.restart.r1.g1", 0, 0, 4)]
    assert blocks(a1) == [("default.restart.r0.g1", 0, 0, 8), ("default.restart.r1.g1", 1, 4, 8)]
    # The agents log every block they really load (an idempotent repeat is not logged).
    loaded = collections.Counter(
        m.group(1) for a in (a0, a1) for line in a.output if (m := _LOADED.search(line))
    )
    assert sorted(loaded) == [
        "default.restart.r0.g1/0",
        "default.restart.r1.g1/0",
        "default.restart.r1.g1/1",
    ], loaded
    assert set(loaded.values()) == {1}, loaded  # no block was loaded twice
    # Events posted by the operators agree (the first one's last events may be lost
    # with it: kopf posts them in the background).
    fresh = collections.Counter(
        m.split(" on ")[0]
        for r, m in events(kube, "restart")
        if r == "BlockLoaded" and "already loaded" not in m
    )
    assert set(fresh.values()) <= {1}, fresh
