"""Ready means warm: an agent's load with the compiled decode on answers only once the
stage's graphs exist, says so (`compile` in its block report, a Prometheus gauge), and a
load that finds its graphs in the compile cache (`engine/compile_cache.py`) says `cached`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import types
from pathlib import Path

import pytest
import torch
import torch._dynamo.utils

from tessera import blocks
from tessera.rpc import blocks as rpc_blocks
from tessera_agent import booking, devices, hosted, hosting, load_config, metrics, tiny_checkpoint
from tessera_agent.engine import compile_cache, compile_policy, options, rehearsal

MiB = 1 << 20


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One layer: compiling is all this test pays for, and it grows with the layers.
    spec = tiny_checkpoint.TinySpec(layers=1, seed=11)
    return tiny_checkpoint.make_tiny(tmp_path_factory.mktemp("ckpt") / "one", spec)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh compile cache for this test only (Inductor's folder set back after; the
    local caches it turns on are torch 2.13's defaults)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "unused"))
    return compile_cache.configure(tmp_path / "cache", os.environ)


# an agent's default (warm before ready), the decode graph alone (faster)
ON = options.EngineOptions(compile_decode="on", pack_prompts=False)


def _hosting(engine: options.EngineOptions = ON) -> tuple[hosting.Hosting, devices.Device]:
    dev = devices.Device("cpu:0", "cpu", "virtual CPU device", 256 * MiB)
    hs = hosting.Hosting(
        "a0",
        booking.Booking("a0", [dev]),
        load_config.LoadDefaults(engine=engine),
        concurrent.futures.ThreadPoolExecutor(1),
    )
    return hs, dev


def test_cache_folder_and_probe(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert compile_cache.default_root(env) == tmp_path / "xdg" / "tessera" / "compile"
    env[compile_cache.ENV] = str(tmp_path / "mine")
    assert compile_cache.default_root(env) == tmp_path / "mine"
    assert compile_cache.folder(tmp_path).name == f"torch-{torch.__version__}"
    ind = torch._dynamo.utils.counters["inductor"]
    with compile_cache.Probe() as p:
        ind["fxgraph_cache_hit"] += 2
    assert (p.hits, p.misses, p.outcome) == (2, 0, "cached")
    with compile_cache.Probe() as p:
        ind["fxgraph_cache_hit"] += 1
        ind["fxgraph_cache_bypass"] += 1  # a frozen graph: compiled, whatever the cache
    assert p.outcome == "warm"
    with compile_cache.Probe() as p:
        pass
    assert p.outcome == "warm"  # nothing looked up: nothing came from the cache


def test_cache_folder_is_the_agents_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What the cache holds is run (saved decode graphs, Inductor's code): `configure`
    makes the folder its owner's only, and warns about one that others can write."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "unused"))
    env: dict[str, str] = {}
    own = compile_cache.configure(tmp_path / "own", env)
    assert own.stat().st_mode & 0o077 == 0 and compile_cache.trust_problems(own) == []
    shared = compile_cache.folder(tmp_path / "shared")
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    with caplog.at_level("WARNING", logger=compile_cache.__name__):
        assert compile_cache.configure(tmp_path / "shared", env) == shared
    assert "writable by its group or others (mode 777)" in caplog.text
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(shared)  # a warning, not a refusal


def test_load_answers_once_the_heap_is_settled(
    one_layer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collector's pass after a load (`gc_heap.settle`, hundreds of ms after a compile)
    runs before the load answers, not under the first requests routed to the stage."""
    settled: list[str] = []
    monkeypatch.setattr(hosting.gc_heap, "settle", lambda reason, *a: settled.append(reason))
    hs = hosting.Hosting(
        "a0",
        booking.Booking("a0", [devices.Device("cpu:0", "cpu", "virtual", 256 * MiB)]),
        load_config.LoadDefaults(gc_settle=True),
        concurrent.futures.ThreadPoolExecutor(1),
    )

    async def run() -> None:
        await hs.load(blocks.Block(str(one_layer), 0, 1, replica_id="r0"))
        assert settled == ["loaded r0/0"]

    asyncio.run(run())


def test_background_mode_answers_at_once() -> None:
    cpu = torch.device("cpu")

    def opts(raw: str) -> options.EngineOptions:
        return options.EngineOptions.from_env({options.COMPILE_ENV: raw}, compile_default=True)

    bg = opts("background")
    assert compile_policy.enabled(bg, cpu) and not compile_policy.warm_before_ready(bg, cpu)
    assert compile_policy.warm_before_ready(opts("1"), cpu)
    assert not compile_policy.warm_before_ready(opts("0"), cpu)


@pytest.mark.slow
def test_load_answers_once_warm_and_reports_it(one_layer: Path, cache: Path) -> None:
    """The load answers with the graph built (not on a background thread still
    compiling): state ready, graphs counted, `compile` "warm" in the block report and
    the gauge; a frozen graph bypasses Inductor's caches, so it is never "cached"."""
    hs, dev = _hosting()

    async def run() -> None:
        spec = blocks.Block(str(one_layer), 0, 1, replica_id="r0")

        # A retried load (its first call timed out) must not answer before the warm-up
        # either: "already loaded" waits for it too.
        async def load() -> tuple[hosting.Loaded, str]:
            got = await hs.load(spec)  # the compile state at the moment it answered:
            g = got.hosted.stage.runner.decode_graph
            return got, "none" if g is None else g.status

        (loaded, said), (again, said_again) = await asyncio.gather(load(), load())
        assert {loaded.how, again.how} == {"loaded", "already loaded"}
        assert said == said_again == "warm"
        g = loaded.hosted.stage.runner.decode_graph
        assert g is not None and g.state == "ready" and g.warmed and g.compiles >= 2
        assert g.warmup_s > 0 and g.status == "warm"
        # and rehearsed: every decode batch size 1..BATCH ran once, through the graph
        assert g.calls == rehearsal.BATCH and loaded.hosted.stage.runner.block_tables == {}
        info = rpc_blocks.to_proto(hosted.observed(loaded.hosted))
        assert info.compile == "warm" and rpc_blocks.from_proto(info).compile == "warm"
        state = types.SimpleNamespace(
            agent_id="a0", devices={dev.id: dev}, hosted=hs.hosted, compute=None
        )
        fams = {f.name: f for f in metrics._StateCollector(state).collect()}
        (sample,) = fams["tessera_agent_stage_compile"].samples
        assert sample.labels["compile"] == "warm" and sample.value == 1.0
        await hs.unload("r0", 0)

    asyncio.run(run())


@pytest.mark.slow
def test_second_load_with_the_same_cache_reports_cached(one_layer: Path, cache: Path) -> None:
    """Unfrozen graphs (`TESSERA_COMPILE_FREEZE=0`) are kept by Inductor's caches: the
    first load compiles them ("warm"), a second load of the same shape finds them all in
    the cache folder ("cached") and is faster."""
    hs, _ = _hosting(dataclasses.replace(ON, compile_freeze=False))

    async def run() -> None:
        first = await hs.load(blocks.Block(str(one_layer), 0, 1, replica_id="r0"))
        g1 = first.hosted.stage.runner.decode_graph
        assert g1 is not None and g1.status == "warm"
        await hs.unload("r0", 0)
        again = await hs.load(blocks.Block(str(one_layer), 0, 1, replica_id="r1"))
        g2 = again.hosted.stage.runner.decode_graph
        assert g2 is not None and g2.status == "cached"
        assert hosted.observed(again.hosted).compile == "cached"
        assert g2.warmup_s < g1.warmup_s
        await hs.unload("r1", 0)

    asyncio.run(run())
    assert any(cache.rglob("*")), "nothing was written to the compile cache folder"
