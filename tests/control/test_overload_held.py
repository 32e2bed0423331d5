"""Which groups the agents hold, and how a shift cut short converges (pure; issue 30)."""

from __future__ import annotations

import pytest

from tessera import blocks, observed, routes_doc
from tessera.control import gateway_load
from tessera.control import overload as control
from tessera.policies.overload import held as overload_held
from tessera.policies.overload import steps as overload_steps

A0, A1 = "127.0.0.1:1", "127.0.0.1:2"
MEMBERS = [
    overload_held.Member("r0", "agent-0", A0),
    overload_held.Member("r1", "agent-1", A1),
]


def _block(rid: str, idx: int, start: int, end: int, stages: int) -> blocks.Block:
    span = end - start
    return blocks.Block(
        "/m",
        start,
        end,
        replica_id=rid,
        stage_index=idx,
        num_stages=stages,
        kv_bytes=(1 << 20) + (8 - span) * 1000,
        kv_pages=8,
        param_bytes=span * 1000,
    )


def _obs(b0: list[blocks.Block], b1: list[blocks.Block]) -> observed.Observed:
    return observed.Observed(
        (
            observed.AgentInfo("agent-0", A0, blocks=tuple(b0)),
            observed.AgentInfo("agent-1", A1, blocks=tuple(b1)),
        )
    )


def test_whole_replicas() -> None:
    held = overload_held.read(
        MEMBERS, _obs([_block("r0", 0, 0, 8, 1)], [_block("r1", 0, 0, 8, 1)]), 8
    )
    assert held == overload_held.Held(whole=("r0", "r1"))
    steps = overload_held.takeover_steps(held, MEMBERS)
    assert steps == (
        overload_steps.Resume(overload_steps.BlockRef(A0, "r0", 0)),
        overload_steps.Resume(overload_steps.BlockRef(A1, "r1", 0)),
    )


def test_a_dropped_group_names_its_donor_and_pre_drop_pool() -> None:
    obs = _obs([_block("r0", 0, 0, 4, 2)], [_block("r0", 1, 4, 8, 2)])
    held = overload_held.read(MEMBERS, obs, 8)
    (g,) = held.groups
    assert (held.whole, held.strays, held.unknown) == ((), (), ())
    assert g.group.members == ("r0", "r1")
    assert [(s.replica, s.start, s.end) for s in g.group.stages] == [("r0", 0, 4), ("r1", 4, 8)]
    # two pools grown by the 4 layers each dropped, less one copy of the model
    assert g.pre_drop_kv_bytes == 2 * ((1 << 20) + 4000) - 8000
    pause, resume = overload_held.takeover_steps(held, MEMBERS)
    assert pause == overload_steps.Pause(overload_steps.BlockRef(A0, "r0", 0))
    assert resume == overload_steps.Resume(overload_steps.BlockRef(A0, "r0", 0), num_pages=8)


def test_a_drop_cut_short_gives_the_stage_back_and_resumes_the_head() -> None:
    # the donor shifted; the head did not (it holds [0, 8) still, paused)
    obs = _obs([_block("r0", 0, 0, 8, 1)], [_block("r0", 1, 4, 8, 2)])
    held = overload_held.read(MEMBERS, obs, 8)
    (stray,) = held.strays
    assert held.groups == () and held.whole == ()
    h = overload_steps.BlockRef(A0, "r0", 0)
    assert overload_held.stray_steps(stray, 8) == (
        overload_steps.Resume(h),
        overload_steps.Shift(
            "restore",
            overload_steps.BlockRef(A1, "r0", 1),
            0,
            8,
            overload_steps.BlockRef(A1, "r1", 0),
            1,
            "",
            ((h, 0, 8),),
        ),
        overload_steps.Routes(add=("r1",), reopen=("r0",)),  # the drop had closed r0
    )


def test_a_stage_with_no_donor_on_its_agent_is_left_alone() -> None:
    obs = _obs([_block("r0", 0, 0, 4, 2), _block("r0", 1, 4, 8, 2)], [_block("r1", 0, 0, 8, 1)])
    held = overload_held.read(MEMBERS, obs, 8)
    assert held.groups == () and held.strays == () and held.unknown == ("r0",)
    assert held.whole == ("r1",)


def test_queued_calls_are_those_the_agent_says_wait() -> None:
    calls = [
        gateway_load.Call(10, 5, False),
        gateway_load.Call(20, 5, True),
        gateway_load.Call(30, 5, True),
    ]
    assert gateway_load.queued(calls, 0) == calls[:1]
    assert gateway_load.queued(calls, 2) == calls[:2]
    doc = {"replicas": {"r0": {"inFlight": 3, "calls": [[10, 5, 0], [20, 5, 1]]}}}
    assert gateway_load.parse(doc) == {"r0": tuple(calls[:2])}


def test_routes_change_keeps_the_version() -> None:
    doc = routes_doc.RoutesDoc(
        (routes_doc.RouteReplica("r0", A0), routes_doc.RouteReplica("r1", A1)), version=3
    )
    out = control.routes_change(doc, overload_steps.Routes(remove=("r1",)), {})
    assert out.replica_ids == ("r0",) and out.version == 3
    back = control.routes_change(out, overload_steps.Routes(add=("r1",)), {"r1": A1})
    assert back == doc


def test_routes_change_closes_a_drops_head_and_reopens_it() -> None:
    """The drop's first routes step closes the head (no new requests while another
    replica is routable) as it removes the donor; the last one opens it again; both in
    the document the gateway reads, at the same version."""
    doc = routes_doc.RoutesDoc(
        tuple(routes_doc.RouteReplica(f"r{i}", f"127.0.0.1:{i + 1}") for i in range(3)), version=3
    )
    out = control.routes_change(doc, overload_steps.Routes(remove=("r1",), close=("r0",)), {})
    assert [(r.id, r.closed) for r in out.replicas] == [("r0", True), ("r2", False)]
    assert routes_doc.parse(out.to_json()) == out  # the flag survives the document
    again = control.routes_change(out, overload_steps.Routes(reopen=("r0",)), {})
    assert [(r.id, r.closed) for r in again.replicas] == [("r0", False), ("r2", False)]
    assert "closed" not in again.to_json()["replicas"][0]  # older gateways read it as before


def test_a_failed_restore_leaves_no_head_paused() -> None:
    """A restore whose steps fail after pausing the head (e.g. Compact: more pages held
    than the whole pool) must not leave it paused: the next tick takes the group over
    again, which resumes the head."""
    import asyncio

    from tessera.control import overload_driver
    from tessera.policies.overload import monitor as overload

    ran: list[tuple[overload_steps.Step, ...]] = []

    class Driver(overload_driver.Driver):
        async def run(self, steps: object) -> overload_driver.Report:
            got = tuple(steps)  # type: ignore[call-overload]
            ran.append(got)
            if any(isinstance(s, overload_steps.Compact) for s in got):
                raise overload_driver.DriveError("Compact: RESOURCE_EXHAUSTED")
            return overload_driver.Report()

    obs = _obs([_block("r0", 0, 0, 4, 2)], [_block("r0", 1, 4, 8, 2)])
    obs = observed.Observed(
        (
            observed.AgentInfo(
                "agent-0", A0, blocks=obs.agents[0].blocks, kv=(observed.ReplicaLoad("r0", 8, 0),)
            ),
            obs.agents[1],
        )
    )
    loop = control.OverloadLoop(Driver(tls=None))
    cfg = overload.OverloadConfig(enabled=True, restore_hold_s=0.0)

    async def ticks() -> None:
        first = await loop.tick(MEMBERS, cfg, 8, obs, {})
        assert [e.reason for e in first.events] == ["OverloadRestoreFailed"]
        assert not loop.taken_over
        await loop.tick(MEMBERS, cfg, 8, obs, {})

    asyncio.run(ticks())
    takeovers = [s for s in ran if any(isinstance(x, overload_steps.Resume) for x in s)]
    assert len(takeovers) >= 2  # the first tick's takeover, then again after the failure
    head = overload_steps.BlockRef(A0, "r0", 0)
    assert overload_steps.Resume(head, num_pages=8) in ran[2]


def test_a_restore_waits_until_demand_stayed_low_for_the_hold() -> None:
    """A group whose demand just fell is not restored at once (a lull between arrivals
    would restore it and the next arrivals drop it again); it is once demand stayed low
    for `restore_hold_s`, and demand rising in between starts the hold again."""
    import asyncio

    from tessera.control import overload_driver
    from tessera.policies.overload import monitor as overload

    ran: list[tuple[overload_steps.Step, ...]] = []

    class Driver(overload_driver.Driver):
        async def run(self, steps: object) -> overload_driver.Report:
            ran.append(tuple(steps))  # type: ignore[call-overload]
            return overload_driver.Report()

    def obs(used: int) -> observed.Observed:
        o = _obs([_block("r0", 0, 0, 4, 2)], [_block("r0", 1, 4, 8, 2)])
        load = (observed.ReplicaLoad("r0", 8, used),)
        return observed.Observed(
            (observed.AgentInfo("agent-0", A0, blocks=o.agents[0].blocks, kv=load), o.agents[1])
        )

    now = [100.0]
    loop = control.OverloadLoop(Driver(tls=None), clock=lambda: now[0])
    cfg = overload.OverloadConfig(enabled=True, restore_hold_s=1.0)

    def restores() -> int:
        return sum(any(isinstance(s, overload_steps.Compact) for s in r) for r in ran)

    async def ticks() -> None:
        assert (await loop.tick(MEMBERS, cfg, 8, obs(0), {})).restores == 0  # low since 100
        now[0] = 100.6
        assert (await loop.tick(MEMBERS, cfg, 8, obs(8), {})).restores == 0  # high again
        now[0] = 101.2
        assert (await loop.tick(MEMBERS, cfg, 8, obs(0), {})).restores == 0  # low since 101.2
        now[0] = 102.0
        assert (await loop.tick(MEMBERS, cfg, 8, obs(0), {})).restores == 0
        now[0] = 102.3
        assert (await loop.tick(MEMBERS, cfg, 8, obs(0), {})).restores == 1

    asyncio.run(ticks())
    assert restores() == 1


def test_the_groups_of_one_plan_drop_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan of two groups drops them concurrently (they share no member): a request
    queued on the second group's head does not wait for the first group's drain (a
    donor finishing its running requests). The fake driver holds the first group's drop
    until the second's has run; run one after the other, the first one times out."""
    import asyncio

    from tessera.control import overload_driver
    from tessera.policies.overload import monitor as overload

    members = [overload_held.Member(f"r{i}", f"agent-{i}", f"127.0.0.1:{i + 1}") for i in range(4)]
    agents = tuple(
        observed.AgentInfo(
            m.agent,
            m.address,
            blocks=(
                blocks.Block(
                    "/m",
                    0,
                    8,
                    replica_id=m.replica_id,
                    kv_bytes=1 << 20,
                    kv_pages=8,
                    param_bytes=8 << 21,
                ),
            ),
            kv=(observed.ReplicaLoad(m.replica_id, 8, 8),),
        )
        for m in members
    )
    obs = observed.Observed(agents)
    calls = {m.replica_id: (gateway_load.Call(64, 256, False),) * 2 for m in members}
    heads: list[str] = []
    done: dict[str, asyncio.Event] = {}
    waited_out: list[str] = []

    class Driver(overload_driver.Driver):
        async def run(self, steps: object) -> overload_driver.Report:
            got = tuple(steps)  # type: ignore[call-overload]
            pause = [s for s in got if isinstance(s, overload_steps.Pause)]
            if not pause:
                return overload_driver.Report()  # the takeover of the first tick
            head = pause[0].block.replica_id
            heads.append(head)
            done.setdefault(head, asyncio.Event())
            if len(heads) == 1:  # the first group's drain lasts until the other dropped
                other = asyncio.Event()
                done["other"] = other
                try:
                    await asyncio.wait_for(other.wait(), 1.0)
                except TimeoutError:
                    waited_out.append(head)
            else:
                done["other"].set()
            return overload_driver.Report()

    from tessera.observability import control as recorder

    def drops_recorded() -> int:
        return sum(r.loop == "overload" and r.action == "drop" for r in recorder.current().recent())

    monkeypatch.setattr(recorder._Process, "recorder", recorder.Recorder())  # its own window
    before = drops_recorded()
    loop = control.OverloadLoop(Driver(tls=None))
    cfg = overload.OverloadConfig(enabled=True)
    out = asyncio.run(loop.tick(members, cfg, 8, obs, calls))
    assert out.drops == 2, out.events
    assert len(heads) == 2
    assert waited_out == []
    assert drops_recorded() - before == 2  # each group's drop is a recorded control action


def test_drops_and_restores_are_recorded_control_actions(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drop and a restore the loop drives are `overload/drop` and `overload/restore`
    actions of the process's recorder (the dashboard's "Overload drops and restores"
    panel and the traces read them); the takeover's resume is not one."""
    import asyncio

    from tessera.control import overload_driver
    from tessera.observability import control as recorder
    from tessera.policies.overload import monitor as overload

    class Driver(overload_driver.Driver):
        async def run(self, steps: object) -> overload_driver.Report:
            tuple(steps)  # type: ignore[call-overload]
            return overload_driver.Report()

    def seen() -> list[tuple[str, str, str]]:
        return [
            (r.loop, r.action, r.outcome)
            for r in recorder.current().recent()
            if r.loop == "overload"
        ]

    monkeypatch.setattr(recorder._Process, "recorder", recorder.Recorder())  # its own window
    before = len(seen())
    # a dropped group whose demand is low: restored (no hold)
    o = _obs([_block("r0", 0, 0, 4, 2)], [_block("r0", 1, 4, 8, 2)])
    load = (observed.ReplicaLoad("r0", 8, 0),)
    obs = observed.Observed(
        (observed.AgentInfo("agent-0", A0, blocks=o.agents[0].blocks, kv=load), o.agents[1])
    )
    loop = control.OverloadLoop(Driver(tls=None))
    cfg = overload.OverloadConfig(enabled=True, restore_hold_s=0.0)
    assert asyncio.run(loop.tick(MEMBERS, cfg, 8, obs, {})).restores == 1
    assert seen()[before:] == [("overload", "restore", "ok")]
