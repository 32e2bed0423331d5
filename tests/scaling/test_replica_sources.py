"""Every new replica's sources (issue 32), no servers: the switch plan's parts for a
scale-out, refined by the target agent's host cache and the measured links.

A deployment serving one whole replica on agent `a` scales out to a second on agent `b`:
the load's parts come from `a` (a peer); units `b`'s host cache holds come from there.
Over gRPC (the transport the probe measures), a measured pair link slower than `b`'s
measured storage makes those parts storage, and with both measured storage takes the
share of the units that makes it finish with the peer (they run in parallel); links not
measured, and data-plane parts (at least as fast as the probe says), keep the plan's
choice. `links.measured` builds the model from the probes.
"""

from __future__ import annotations

from tessera import blocks, observed, routes_doc
from tessera.policies import links
from tessera.policies.scaling import replica_sources
from tessera.policies.transition import actions
from tessera.policies.transition import planner as transition
from tests.policies import transition_sim as sim


def _world(
    cache: tuple[observed.CachedPiece, ...] = (),
    link_model: links.LinkModel | None = None,
    store: str = "s",
) -> tuple[transition.World, transition.Target, blocks.Block]:
    """`a` serves r0, r1 goes to `b`; with `store` "", neither has a data plane (gRPC)."""
    r0 = sim.block("r0", 1, 0, 1, (0, 8), 80)
    r1 = sim.block("r1", 1, 0, 1, (0, 8), 80)
    dev = (observed.DeviceInfo("cpu:0", "cpu", 1000, 900),)
    obs = observed.Observed(
        (
            observed.AgentInfo("a", "a:1", True, dev, (r0,), store_address=store),
            observed.AgentInfo("b", "b:1", True, dev, (), store_address=store, host_cache=cache),
        )
    )
    pub = routes_doc.RoutesDoc((routes_doc.RouteReplica(r0.replica_id, "a:1"),), 1)
    world = transition.World(
        obs, sim.PREFIX, pub, 1000.0, links=link_model or links.LinkModel(), sourcing="switch"
    )
    target = transition.Target(
        1,
        (transition.Placed("a", "a:1", r0), transition.Placed("b", "b:1", r1)),
        (
            routes_doc.RouteReplica(r0.replica_id, "a:1"),
            routes_doc.RouteReplica(r1.replica_id, "b:1"),
        ),
    )
    return world, target, r1


def _parts(world: transition.World, target: transition.Target) -> list[tuple[tuple[int, int], str]]:
    t = transition.plan(world, target)
    loads = [s.action for s in t.steps if isinstance(s.action, actions.LoadBlock)]
    assert len(loads) == 1 and loads[0].agent == "b"
    return [
        (p.units, "storage" if p.source is None else f"{p.source.agent}/{p.source.transport}")
        for p in loads[0].parts
    ]


def test_scale_out_copies_from_the_serving_peer() -> None:
    world, target, _ = _world()
    assert _parts(world, target) == [((0, 10), "a/")]  # the data plane (both have stores)


def test_host_cache_units_come_from_the_host() -> None:
    cache = tuple(
        observed.CachedPiece(sim.MODEL, p, "float32", 10) for p in ("embed", "layer.0", "layer.1")
    )
    world, target, _ = _world(cache)
    assert _parts(world, target) == [((0, 3), "b/host"), ((3, 10), "a/")]
    t = transition.plan(world, target)
    load = next(s.action for s in t.steps if isinstance(s.action, actions.LoadBlock))
    assert "host cache" in load.describe()


def test_cache_of_another_model_or_dtype() -> None:
    cache = (
        observed.CachedPiece("/other", "layer.0", "float32", 10),
        observed.CachedPiece(sim.MODEL, "layer.1", "bfloat16", 10),
    )
    world, target, r1 = _world(cache)
    r1_f32 = blocks.Block(sim.MODEL, 0, 8, dtype="float32")
    assert replica_sources.cached_units(cache, r1_f32, 8) == frozenset()
    # a block served "auto" may take any dtype (the agent checks it): layer 1 from the host
    assert r1.dtype == "auto"
    assert _parts(world, target) == [((0, 2), "a/"), ((2, 3), "b/host"), ((3, 10), "a/")]


def test_measured_slow_link_reads_storage_and_unmeasured_keeps_the_plan() -> None:
    slow = links.measured(links.LinkModel(), {("a", "b"): 50e6}, {"b": 200e6})
    world, target, _ = _world(link_model=slow, store="")
    assert _parts(world, target) == [((0, 10), "storage")]
    world, target, _ = _world(link_model=slow)  # the data plane: the probe's rate is a floor
    assert _parts(world, target) == [((0, 10), "a/")]
    fast = links.measured(links.LinkModel(), {("a", "b"): 900e6}, {"b": 200e6})
    # both measured: storage takes the share that finishes with the peer (10 equal units)
    world, target, _ = _world(link_model=fast, store="")
    assert _parts(world, target) == [((0, 9), "a/grpc"), ((9, 10), "storage")]
    only_storage = links.measured(links.LinkModel(), {}, {"b": 200e6})
    assert _parts(_world(link_model=only_storage, store="")[0], target) == [((0, 10), "a/grpc")]


def test_measured_model_uses_medians_and_drops_failed_probes() -> None:
    m = links.measured(
        links.LinkModel(),
        {("a", "b"): 1e9, ("b", "a"): 3e9, ("a", "c"): 2e9, ("c", "a"): 0.0},
        {"a": 2e8, "b": 4e8},
    )
    assert m.network_bytes_per_s == 2e9 and m.storage_bytes_per_s == 3e8
    assert ("c", "a") not in m.pairs
    assert links.measured(links.LinkModel(), {}, {}) == links.LinkModel()


def test_equal_rates_split_the_block_between_peer_and_storage() -> None:
    even = links.measured(links.LinkModel(), {("a", "b"): 200e6}, {"b": 200e6})
    world, target, _ = _world(link_model=even, store="")
    assert _parts(world, target) == [((0, 5), "a/grpc"), ((5, 10), "storage")]
    cache = (observed.CachedPiece(sim.MODEL, "layer.0", "float32", 10),)
    world, target, _ = _world(cache, even, store="")  # the host's unit counts for neither
    assert _parts(world, target) == [
        ((0, 1), "a/grpc"),
        ((1, 2), "b/host"),
        ((2, 6), "a/grpc"),
        ((6, 10), "storage"),
    ]
