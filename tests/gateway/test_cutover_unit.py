"""`gateway.cutover.Cutover` without servers: the switch is atomic, leaving replicas are
tracked with their in-flight requests, moves copy the KV then redirect, short requests
drain, stale versions are ignored."""

from __future__ import annotations

import asyncio

from tessera.control import kv_move
from tessera.gateway import config, cutover, inflight, metrics, replicas, routes, stage_chain


class _Call:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> bool:
        self.cancelled = True
        return True


def _ep(rid: str) -> config.ReplicaEndpoint:
    return config.ReplicaEndpoint(rid, f"10.0.0.{ord(rid[-1]) % 200}:50051")


def _routes(version: int, deadline: float, *ids: str) -> routes.Routes:
    return routes.Routes(tuple(_ep(r) for r in ids), version=version, drain_deadline_s=deadline)


class _Harness:
    def __init__(self) -> None:
        self.now = 0.0
        self.gauges = metrics.GatewayMetrics()
        self.replicas = replicas.ReplicaSet(self.gauges, clock=lambda: self.now, tls=None)
        self.table = inflight.InFlightTable()
        self.moves: list[tuple[tuple[int, ...], str, str]] = []
        self.cut = cutover.Cutover(
            self.replicas,
            self.table,
            self.gauges,
            clock=lambda: self.now,
            tick_s=3600,  # the test drives tick() itself
            resolve=self._resolve,
            move_prefix=self._move,
        )

    async def _resolve(self, rid: str, leader: str) -> stage_chain.Layout:
        return stage_chain.Layout((kv_move.StageRef(leader, rid, 0, 0, 8),), 16)

    async def _move(
        self,
        tokens: tuple[int, ...],
        src: tuple[kv_move.StageRef, ...],
        dst: tuple[kv_move.StageRef, ...],
    ) -> kv_move.Moved:
        self.moves.append((tokens, src[0].replica_id, dst[0].replica_id))
        return kv_move.Moved(len(tokens) // 16 * 16, len(tokens) // 16, 8)

    def ready(self, rid: str, pages_free: int) -> None:
        st = self.replicas.states()[rid]
        st.ready, st.pages_total, st.pages_used = True, 100, 100 - pages_free

    def attempt(self, rid: str, remaining: int, generated: int = 10) -> inflight.Attempt:
        total = generated + remaining
        a = inflight.Attempt(f"req-{rid}-{remaining}", rid, tuple(range(40)), total, 0.0)
        a.observe(range(generated), 0.0)
        a.call = _Call()
        self.table.add(a)
        return a

    def count(self, outcome: str) -> float:
        return self.gauges.cutover_requests.labels(outcome)._value.get()


async def test_switch_is_atomic_and_leaving_replicas_keep_their_requests() -> None:
    h = _Harness()
    assert h.cut.apply(_routes(1, 30, "a", "b"))
    h.ready("a", 50)
    h.ready("b", 50)
    h.attempt("b", remaining=5)
    assert h.cut.apply(_routes(2, 30, "a", "c"))
    # new requests only see the new version, at once
    assert sorted(e.replica_id for e in h.replicas.endpoints) == ["a", "c"]
    assert "b" not in h.replicas.ready_ids()
    assert h.cut.snapshot().to_json() == {
        "version": 2,
        "revision": 0,
        "replicas": ["a", "c"],
        "leaving": {"b": 1},
    }
    # an older document is stale: ignored, nothing changes
    assert not h.cut.apply(_routes(1, 30, "b"))
    assert h.cut.snapshot().version == 2
    await h.cut.close()


async def test_long_request_moves_to_the_survivor_then_is_redirected() -> None:
    h = _Harness()
    h.cut.apply(_routes(1, 30, "a", "b"))
    h.ready("a", 2)  # too small for the request: (50 + 200) / 16 = 16 pages
    short = h.attempt("b", remaining=3)
    long = h.attempt("b", remaining=200)
    h.cut.apply(_routes(2, 5.0, "a", "c"))
    h.ready("c", 60)
    long.first_token_at, long.last_token_at = 0.0, 1.0  # 9 tokens/s: 200 left do not fit 5 s
    short.first_token_at, short.last_token_at = 0.0, 1.0
    await h.cut.tick()
    await asyncio.gather(*h.cut._moves)
    assert h.moves == [(long.tokens, "b", "c")]
    assert long.target == "c" and long.call.cancelled
    assert short.target is None and not short.call.cancelled
    assert h.count("moved") == 1
    # the dispatcher's attempts end; the leaving replica is left
    h.table.remove(long)
    h.table.remove(short)
    await h.cut.tick()
    assert h.cut.snapshot().leaving == {}
    assert h.count("drained") == 1  # the short one finished where it ran
    await h.cut.close()


async def test_past_the_deadline_everything_moves_and_failed_copies_recompute() -> None:
    h = _Harness()
    h.cut.apply(_routes(1, 30, "a", "b"))

    async def broken(*_: object) -> kv_move.Moved:
        raise kv_move.MoveError("reserve pages on the target: RESOURCE_EXHAUSTED")

    h.cut._move_prefix = broken
    a = h.attempt("b", remaining=1)
    h.cut.apply(_routes(2, 1.0, "a"))
    h.ready("a", 50)
    h.now = 2.0  # the deadline has passed
    await h.cut.tick()
    await asyncio.gather(*h.cut._moves)
    assert a.target == "a" and h.count("recomputed") == 1
    await h.cut.close()
