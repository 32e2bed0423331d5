"""The drain-or-move rule of a cut-over (`tessera.policies.transition.drain`), without servers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.policies.transition import drain


def _cfg(deadline: float = 10.0, elapsed: float = 0.0) -> drain.DrainConfig:
    return drain.DrainConfig(deadline_s=deadline, elapsed_s=elapsed)


def test_short_requests_drain_and_long_ones_move() -> None:
    short = drain.InFlight("short", "old", tokens=40, remaining=5, tokens_per_s=10)
    long = drain.InFlight("long", "old", tokens=40, remaining=500, tokens_per_s=10)
    out = drain.decide([short, long], [drain.Survivor("new", 100, 16)], _cfg())
    assert out.drain == ("short",)
    assert out.moves == (drain.Move("long", "old", "new", 40),)
    assert out.stranded == ()


def test_unknown_rate_uses_the_default_and_the_safety_margin() -> None:
    # 60 tokens at the default 10/s = 6 s; with the 1.5 margin 9 s fits a 10 s deadline...
    req = drain.InFlight("r", "old", tokens=8, remaining=60)
    assert drain.decide([req], [], _cfg(10.0)).drain == ("r",)
    # ...but not once 2 s of it have passed
    assert drain.decide([req], [], _cfg(10.0, elapsed=2.0)).stranded == ("r",)


def test_past_the_deadline_everything_moves() -> None:
    reqs = [drain.InFlight(f"q{i}", "old", 10, 1, 100.0) for i in range(3)]
    out = drain.decide(reqs, [drain.Survivor("new", 100, 16)], _cfg(5.0, elapsed=5.0))
    assert out.drain == () and {m.request_id for m in out.moves} == {"q0", "q1", "q2"}


def test_zero_deadline_moves_at_once() -> None:
    req = drain.InFlight("r", "old", 10, 1, 1000.0)
    assert drain.decide([req], [drain.Survivor("n", 4, 16)], _cfg(0.0)).moves


def test_moves_respect_free_pages_and_spread_load() -> None:
    # each request needs ceil((30 + 100) / 16) = 9 pages
    reqs = [drain.InFlight(f"q{i}", "old", 30, 100, 1.0) for i in range(4)]
    survivors = [drain.Survivor("a", 18, 16), drain.Survivor("b", 9, 16, in_flight=0)]
    out = drain.decide(reqs, survivors, _cfg(1.0))
    targets = sorted(m.target for m in out.moves)
    assert targets == ["a", "a", "b"]
    assert len(out.stranded) == 1


def test_page_size_of_the_target_counts() -> None:
    req = drain.InFlight("r", "old", 60, 4, 1.0)  # 64 tokens
    small = drain.Survivor("small-pages", 3, 16)  # needs 4 pages: does not fit
    big = drain.Survivor("big-pages", 1, 64)  # needs 1 page: fits
    out = drain.decide([req], [small, big], _cfg(0.0))
    assert out.moves == (drain.Move("r", "old", "big-pages", 60),)


def test_less_loaded_survivor_wins_ties_by_id() -> None:
    req = drain.InFlight("r", "old", 10, 10, 1.0)
    busy = drain.Survivor("a", 100, 16, in_flight=5)
    idle = drain.Survivor("b", 100, 16, in_flight=0)
    assert drain.decide([req], [busy, idle], _cfg(0.0)).moves[0].target == "b"
    twins = [drain.Survivor("z", 100, 16), drain.Survivor("y", 100, 16)]
    assert drain.decide([req], twins, _cfg(0.0)).moves[0].target == "y"


def test_a_request_with_no_token_yet_moves_at_once_with_nothing_copied() -> None:
    """Queued on a leaving replica (an overload drop's donor): it would wait for the
    replica's whole queue; it goes to the least loaded survivor even with no free page."""
    queued = drain.InFlight("q", "donor", tokens=40, remaining=24, started=False)
    short = drain.InFlight("s", "donor", tokens=40, remaining=2, tokens_per_s=50.0)
    full = [drain.Survivor("head", 0, 16, in_flight=3), drain.Survivor("other", 0, 16, 1)]
    d = drain.decide([queued, short], full, _cfg())
    assert d.moves == (drain.Move("q", "donor", "other", 0),) and d.drain == ("s",)
    # no survivor at all: it waits where it is
    assert drain.decide([queued], [], _cfg()).drain == ("q",)


def test_bad_inputs_are_rejected_with_the_field() -> None:
    with pytest.raises(ValueError, match="deadline_s"):
        drain.DrainConfig(deadline_s=-1, elapsed_s=0)
    with pytest.raises(ValueError, match="page_size"):
        drain.Survivor("s", 1, 0)
    with pytest.raises(ValueError, match="r:"):
        drain.InFlight("r", "old", -1, 0)


requests = st.lists(
    st.builds(
        drain.InFlight,
        request_id=st.uuids().map(str),
        replica_id=st.sampled_from(["old0", "old1"]),
        tokens=st.integers(0, 400),
        remaining=st.integers(0, 400),
        tokens_per_s=st.floats(0, 50),
    ),
    max_size=12,
    unique_by=lambda r: r.request_id,
)
survivors = st.lists(
    st.builds(
        drain.Survivor,
        replica_id=st.sampled_from(["a", "b", "c"]),
        free_pages=st.integers(0, 60),
        page_size=st.sampled_from([8, 16]),
        in_flight=st.integers(0, 4),
    ),
    max_size=3,
    unique_by=lambda s: s.replica_id,
)


@given(requests, survivors, st.floats(0, 30), st.floats(0, 40))
def test_every_request_is_decided_once_and_capacity_holds(
    reqs: list[drain.InFlight], surv: list[drain.Survivor], deadline: float, elapsed: float
) -> None:
    cfg = drain.DrainConfig(deadline, elapsed)
    out = drain.decide(reqs, surv, cfg)
    decided = list(out.drain) + [m.request_id for m in out.moves] + list(out.stranded)
    assert sorted(decided) == sorted(r.request_id for r in reqs)
    by_id = {r.request_id: r for r in reqs}
    for s in surv:
        used = sum(
            -(-(by_id[m.request_id].tokens + by_id[m.request_id].remaining) // s.page_size)
            for m in out.moves
            if m.target == s.replica_id
        )
        assert used <= s.free_pages
    for m in out.moves:
        assert m.tokens == by_id[m.request_id].tokens and m.source == by_id[m.request_id].replica_id
    if cfg.left_s == 0:
        assert out.drain == ()
    assert drain.decide(reqs, surv, cfg) == out  # deterministic
